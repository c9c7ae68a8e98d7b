"""The ingress database's schema, as numbered migrations applied on start.

Each migration is a list of statements valid in SQLite and PostgreSQL (``DIALECT_SQL``
overrides one where they differ). ``migrate`` applies the missing ones in order, each in
its own transaction together with the version bump, so a crash leaves the schema at a
version it can resume from. A database whose version is newer than the code's is refused:
an older otela must not write rows a newer one would misread.

Several ingress nodes starting at once on one PostgreSQL database serialise on an advisory
lock, so a migration runs once.
"""

from __future__ import annotations

from ingress.database import Database, DatabaseError

# Version N is MIGRATIONS[N - 1]. Append only; never edit a released migration.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE api_keys (
            id TEXT PRIMARY KEY,
            secret_hash TEXT NOT NULL UNIQUE,
            name TEXT NOT NULL DEFAULT '',
            owner TEXT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL,
            expires_at DOUBLE PRECISION,
            revoked_at DOUBLE PRECISION,
            models TEXT,
            providers TEXT,
            rpm BIGINT,
            tpm BIGINT,
            max_concurrent BIGINT,
            budget_tokens BIGINT,
            updated_at DOUBLE PRECISION NOT NULL
        )""",
        "CREATE INDEX api_keys_updated ON api_keys (updated_at)",
        """CREATE TABLE usage (
            id TEXT PRIMARY KEY,
            request_id TEXT NOT NULL,
            key_id TEXT,
            model TEXT NOT NULL,
            route TEXT NOT NULL,
            provider TEXT NOT NULL,
            node_peer TEXT NOT NULL,
            node_session TEXT NOT NULL,
            prompt_tokens INTEGER NOT NULL,
            completion_tokens INTEGER NOT NULL,
            status INTEGER NOT NULL,
            error TEXT,
            stream INTEGER NOT NULL,
            latency_ms DOUBLE PRECISION NOT NULL,
            ttft_ms DOUBLE PRECISION,
            started_at DOUBLE PRECISION NOT NULL,
            finished_at DOUBLE PRECISION NOT NULL,
            ingress TEXT NOT NULL,
            recorded_at DOUBLE PRECISION NOT NULL
        )""",
        "CREATE INDEX usage_key_time ON usage (key_id, finished_at)",
        "CREATE INDEX usage_time ON usage (finished_at)",
        "CREATE INDEX usage_recorded ON usage (recorded_at)",
    ),
    (
        # The refresh's scan of others' recent rows (``usage.recent_by_others``) skips this
        # ingress's own rows in the index, without reading each row.
        "DROP INDEX usage_recorded",
        "CREATE INDEX usage_recorded_by ON usage (recorded_at, ingress)",
    ),
    (
        # Every change of a key: who, when, what (``ingress.keystore``: create, update,
        # revoke, rotate; ``changes`` is JSON, field -> [old, new]). Keys made before this
        # version have no history before it.
        """CREATE TABLE api_key_audit (
            id TEXT PRIMARY KEY,
            key_id TEXT NOT NULL,
            at DOUBLE PRECISION NOT NULL,
            actor TEXT NOT NULL,
            action TEXT NOT NULL,
            changes TEXT NOT NULL
        )""",
        "CREATE INDEX api_key_audit_key ON api_key_audit (key_id, at)",
    ),
    (
        # Fair sharing (docs/scheduling.md): a key's team and weight, the best priority
        # class it may use and the longest it may wait in the ingress queue; each team's
        # weight (a team not listed weighs 1).
        "ALTER TABLE api_keys ADD COLUMN team TEXT",
        "ALTER TABLE api_keys ADD COLUMN weight DOUBLE PRECISION",
        "ALTER TABLE api_keys ADD COLUMN priority TEXT",
        "ALTER TABLE api_keys ADD COLUMN queue_wait DOUBLE PRECISION",
        """CREATE TABLE teams (
            name TEXT PRIMARY KEY,
            weight DOUBLE PRECISION NOT NULL,
            updated_at DOUBLE PRECISION NOT NULL
        )""",
    ),
    (
        # The OpenAI Batch API (``ingress.files``, ``ingress.batch_store``). An uploaded
        # file's content is in the row (TEXT: JSONL is UTF-8); a batch's output and error
        # files have none: they are the results in ``batch_lines``, read in line order.
        """CREATE TABLE batch_files (
            id TEXT PRIMARY KEY,
            key_id TEXT NOT NULL,
            purpose TEXT NOT NULL,
            filename TEXT NOT NULL,
            bytes BIGINT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL,
            content TEXT,
            batch_id TEXT,
            outcome TEXT
        )""",
        "CREATE INDEX batch_files_key ON batch_files (key_id, created_at, id)",
        """CREATE TABLE batches (
            id TEXT PRIMARY KEY,
            key_id TEXT NOT NULL,
            endpoint TEXT NOT NULL,
            input_file_id TEXT NOT NULL,
            completion_window TEXT NOT NULL,
            status TEXT NOT NULL,
            metadata TEXT,
            errors TEXT,
            output_file_id TEXT,
            error_file_id TEXT,
            total BIGINT NOT NULL DEFAULT 0,
            completed BIGINT NOT NULL DEFAULT 0,
            failed BIGINT NOT NULL DEFAULT 0,
            created_at DOUBLE PRECISION NOT NULL,
            expires_at DOUBLE PRECISION NOT NULL,
            in_progress_at DOUBLE PRECISION,
            finalizing_at DOUBLE PRECISION,
            completed_at DOUBLE PRECISION,
            failed_at DOUBLE PRECISION,
            expired_at DOUBLE PRECISION,
            cancelling_at DOUBLE PRECISION,
            cancelled_at DOUBLE PRECISION,
            runner TEXT,
            lease_until DOUBLE PRECISION
        )""",
        "CREATE INDEX batches_key ON batches (key_id, created_at, id)",
        "CREATE INDEX batches_status ON batches (status)",
        # One row per input line; ``outcome`` NULL until its result is recorded (``ok``:
        # the output file, ``error``: the error file), written once (``... AND outcome IS
        # NULL``), in the transaction that counts it.
        """CREATE TABLE batch_lines (
            batch_id TEXT NOT NULL,
            line INTEGER NOT NULL,
            custom_id TEXT,
            request TEXT,
            outcome TEXT,
            result TEXT,
            result_bytes BIGINT,
            PRIMARY KEY (batch_id, line)
        )""",
    ),
    (
        # Prices and spend (``ingress.prices``): a model's price per million prompt and
        # completion tokens, for one provider or ('') any; each usage row's spend at the
        # prices of its time (NULL: no price was set), and the team of its key then, so
        # usage groups by team as it was when the request ran.
        """CREATE TABLE prices (
            model TEXT NOT NULL,
            provider TEXT NOT NULL,
            input_per_mtok DOUBLE PRECISION NOT NULL,
            output_per_mtok DOUBLE PRECISION NOT NULL,
            updated_at DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (model, provider)
        )""",
        "ALTER TABLE usage ADD COLUMN spend DOUBLE PRECISION",
        # Budgets (``ingress.budgets``): in money as well as tokens, per day, month or
        # lifetime (NULL), for a key and for a team.
        "ALTER TABLE api_keys ADD COLUMN budget_spend DOUBLE PRECISION",
        "ALTER TABLE api_keys ADD COLUMN budget_period TEXT",
        "ALTER TABLE teams ADD COLUMN budget_tokens BIGINT",
        "ALTER TABLE teams ADD COLUMN budget_spend DOUBLE PRECISION",
        "ALTER TABLE teams ADD COLUMN budget_period TEXT",
        # A team's own limits, shared by its keys, and the models and providers all its
        # keys are held to (a key's own settings apply too: the tighter wins).
        "ALTER TABLE teams ADD COLUMN models TEXT",
        "ALTER TABLE teams ADD COLUMN providers TEXT",
        "ALTER TABLE teams ADD COLUMN rpm BIGINT",
        "ALTER TABLE teams ADD COLUMN tpm BIGINT",
        "ALTER TABLE teams ADD COLUMN max_concurrent BIGINT",
        "ALTER TABLE usage ADD COLUMN team TEXT",
        # The prompt's text, only where the operator opted in ([ingress] log_prompts).
        "ALTER TABLE usage ADD COLUMN prompt TEXT",
        # Usage past the retention ([ingress] usage_retention), summed per UTC day, key,
        # team, model, provider and status (``ingress.retention``): budgets and reports
        # keep counting it once its rows are gone. Several rows may sum one day.
        """CREATE TABLE usage_rollup (
            day DOUBLE PRECISION NOT NULL,
            key_id TEXT,
            team TEXT,
            model TEXT NOT NULL,
            provider TEXT NOT NULL,
            status INTEGER NOT NULL,
            requests BIGINT NOT NULL,
            prompt_tokens BIGINT NOT NULL,
            completion_tokens BIGINT NOT NULL,
            errors BIGINT NOT NULL,
            latency_sum DOUBLE PRECISION NOT NULL,
            latency_n BIGINT NOT NULL,
            ttft_sum DOUBLE PRECISION NOT NULL,
            ttft_n BIGINT NOT NULL,
            spend DOUBLE PRECISION NOT NULL,
            unpriced BIGINT NOT NULL
        )""",
        "CREATE INDEX usage_rollup_key_day ON usage_rollup (key_id, day)",
        "CREATE INDEX usage_team_time ON usage (team, finished_at)",
    ),
    (
        # Single sign-on for the dashboard (``ingress.sso``): users made from an OpenID
        # provider's claims on their first sign-in (one per issuer and subject), their
        # dashboard sessions, and sign-ins under way (state, nonce and PKCE verifier
        # between /ui/login and /ui/callback). Sessions and sign-ins are stored by the
        # SHA-256 of their cookie's secret, so a database read alone cannot sign anyone in.
        """CREATE TABLE users (
            id TEXT PRIMARY KEY,
            issuer TEXT NOT NULL,
            subject TEXT NOT NULL,
            email TEXT,
            name TEXT,
            team TEXT,
            admin INTEGER NOT NULL DEFAULT 0,
            created_at DOUBLE PRECISION NOT NULL,
            last_login_at DOUBLE PRECISION NOT NULL,
            UNIQUE (issuer, subject)
        )""",
        """CREATE TABLE ui_sessions (
            secret_hash TEXT PRIMARY KEY,
            user_id TEXT NOT NULL,
            csrf TEXT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL,
            expires_at DOUBLE PRECISION NOT NULL
        )""",
        "CREATE INDEX ui_sessions_expiry ON ui_sessions (expires_at)",
        """CREATE TABLE sso_logins (
            secret_hash TEXT PRIMARY KEY,
            state TEXT NOT NULL,
            nonce TEXT NOT NULL,
            verifier TEXT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL,
            expires_at DOUBLE PRECISION NOT NULL
        )""",
    ),
    (
        # Keys of single sign-on users (``ingress.sso.users``): a key may belong to a user
        # (NULL: to nobody signed in, as every key made before this version), and each
        # usage row keeps the user of its key then, as it keeps the team, so usage groups
        # by user as it was when the request ran (roll-ups too).
        "ALTER TABLE api_keys ADD COLUMN user_id TEXT REFERENCES users (id)",
        "CREATE INDEX api_keys_user ON api_keys (user_id)",
        "ALTER TABLE usage ADD COLUMN user_id TEXT",
        "ALTER TABLE usage_rollup ADD COLUMN user_id TEXT",
        "CREATE INDEX usage_user_time ON usage (user_id, finished_at)",
    ),
    (
        # A team's priority: the best class its keys' requests may use (NULL: any); a
        # key's own applies too, the tighter wins (``ingress.access``).
        "ALTER TABLE teams ADD COLUMN priority TEXT",
    ),
    (
        # Budget leases (``ingress.leases``): per account and period window, what is spoken
        # for (the window's use before its first lease, plus every share handed out since,
        # less what was given back), and each ingress's share, which counts until it is
        # given back or, for an ingress that stopped renewing it (killed), expires.
        """CREATE TABLE budget_windows (
            kind TEXT NOT NULL,
            name TEXT NOT NULL,
            period TEXT NOT NULL,
            window_start DOUBLE PRECISION NOT NULL,
            tokens BIGINT NOT NULL,
            spend DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (kind, name, period, window_start)
        )""",
        """CREATE TABLE budget_leases (
            kind TEXT NOT NULL,
            name TEXT NOT NULL,
            period TEXT NOT NULL,
            window_start DOUBLE PRECISION NOT NULL,
            ingress TEXT NOT NULL,
            tokens BIGINT NOT NULL,
            spend DOUBLE PRECISION NOT NULL,
            expires_at DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (kind, name, period, window_start, ingress)
        )""",
        "CREATE INDEX budget_leases_ingress ON budget_leases (ingress)",
    ),
)
LATEST = len(MIGRATIONS)
_LOCK_ID = 0x6F74656C61  # "otela": the advisory lock migrating PostgreSQL databases


class SchemaTooNew(DatabaseError):
    """The database was written by a newer otela."""


def has_schema(db: Database) -> bool:
    """Whether ``db`` is an ingress database (migrated at least once): read only."""
    if db.dialect == "postgresql":
        rows = db.query_sync("SELECT to_regclass('otela_schema') IS NOT NULL")
    else:
        rows = db.query_sync("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND "
                             "name = 'otela_schema'")
    return bool(rows and rows[0][0])


def open_existing(db: Database) -> None:
    """For commands that only read: refuse a database otela never set up (a mistyped
    ``--db`` naming another file or database) instead of creating tables in it; bring an
    older schema up to date."""
    if not has_schema(db):
        raise DatabaseError(f"{db.url.display()} is not an otela ingress database (no "
                            "otela_schema table): check --db")
    migrate(db)


def current_version(db: Database) -> int:
    db.run_sync("CREATE TABLE IF NOT EXISTS otela_schema (version INTEGER NOT NULL)")
    rows = db.query_sync("SELECT MAX(version) FROM otela_schema")
    return int(rows[0][0] or 0) if rows else 0


def migrate(db: Database) -> int:
    """Bring ``db`` to ``LATEST``; the version it was at. Raises ``SchemaTooNew``."""
    if db.dialect == "postgresql":
        db.run_sync("SELECT pg_advisory_lock(?)", (_LOCK_ID,))
    try:
        found = current_version(db)
        if found > LATEST:
            raise SchemaTooNew(
                f"the ingress database {db.url.display()} has schema version {found}, newer "
                f"than this otela's {LATEST}: upgrade otela on this node (or use another "
                "database); refusing to write to it")
        for version in range(found + 1, LATEST + 1):
            with db.transaction() as cursor:
                for statement in MIGRATIONS[version - 1]:
                    cursor.execute(statement)
                cursor.execute("INSERT INTO otela_schema (version) VALUES (?)", (version,))
        return found
    finally:
        if db.dialect == "postgresql":
            db.run_sync("SELECT pg_advisory_unlock(?)", (_LOCK_ID,))

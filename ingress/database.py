"""One connection to the ingress service's database: SQLite (default) or PostgreSQL.

otela's queries are written once, in the SQL both dialects understand, with ``?``
placeholders; this module turns them into psycopg's ``%s`` for PostgreSQL. The drivers are
blocking, so async callers run each call in a trio worker thread (``trio.to_thread``,
supervised by trio: no thread outlives the call), one at a time per connection.

SQLite runs in WAL mode with ``synchronous=NORMAL``: a committed transaction survives the
process being killed (the usage accounting relies on that), readers never wait for the
writer, and several processes (data-path workers, the ``otela keys`` command) can use the
same file. PostgreSQL is for several ingress nodes sharing one database.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from otela.services import ServiceError

Row = tuple[Any, ...]
DEFAULT_FILE = "ingress.db"
# Rows per INSERT on SQLite: 1 to 32 rows make at most 32 statement texts, all kept in the
# driver's statement cache; 32 x 20 values stays far below SQLite's 32,766 limit.
_SQLITE_CHUNK = 32


class DatabaseError(ServiceError):
    """The database cannot be used (unreachable, wrong URL, schema from a newer otela)."""


class Cursor(Protocol):
    def execute(self, sql: str, params: Sequence[Any] = ...) -> Any: ...
    def executemany(self, sql: str, params: Sequence[Sequence[Any]]) -> Any: ...
    def fetchall(self) -> list[Row]: ...
    @property
    def rowcount(self) -> int: ...


@dataclass(frozen=True)
class DatabaseUrl:
    """Where the database is: ``sqlite`` with a file path, or a ``postgresql`` URL."""

    dialect: str  # "sqlite" | "postgresql"
    target: str  # the file path, or the URL psycopg connects to

    @classmethod
    def parse(cls, text: str, home: Path | None = None) -> DatabaseUrl:
        """``postgresql://...``/``postgres://...``, ``sqlite:///abs/path``, a plain path,
        or ``""`` for ``ingress.db`` in the node's home."""
        text = text.strip()
        if text.startswith(("postgresql://", "postgres://")):
            return cls("postgresql", text)
        if text.startswith("sqlite:"):
            text = text.removeprefix("sqlite:").removeprefix("//")
        if not text:
            if home is None:
                raise DatabaseError("no database given: pass a path or a postgresql:// URL")
            return cls("sqlite", str(home / DEFAULT_FILE))
        if "://" in text:
            raise DatabaseError(f"unsupported database URL {text.split('://')[0]}://... "
                                "(use a SQLite file path or postgresql://...)")
        return cls("sqlite", str(Path(text).expanduser()))

    def display(self) -> str:
        """The URL without its password, for logs and messages."""
        if self.dialect != "postgresql" or "@" not in self.target:
            return self.target
        scheme, rest = self.target.split("://", 1)
        auth, host = rest.rsplit("@", 1)
        return f"{scheme}://{auth.split(':', 1)[0]}:***@{host}" if ":" in auth else \
            self.target


class Database:
    """A connection and the dialect's quirks. ``run``/``query`` are for trio code;
    ``run_sync``/``query_sync`` for the command line and startup."""

    def __init__(self, url: DatabaseUrl, connection: Any) -> None:
        self.url = url
        self.dialect = url.dialect
        self._connection = connection
        self._lock = threading.Lock()  # one statement at a time on this connection
        # For the async calls; made on the first (``_async_lock``): the command line
        # never makes one and so never imports trio (~0.15 s of every ``otela keys``).
        self._trio_lock: Any = None

    # -- connecting --------------------------------------------------------------------

    @classmethod
    def connect(cls, url: DatabaseUrl, create: bool = True) -> Database:
        """Open the database; ``create=False`` (read-only commands) refuses a SQLite file
        that does not exist rather than making an empty one where a path was mistyped.

        A new SQLite file is created readable by its owner only (0600) before SQLite opens
        it: it holds every key's hash and every request's metadata, and SQLite makes its
        ``-wal`` and ``-shm`` files with the database file's own permissions."""
        if url.dialect == "sqlite":
            path = Path(url.target)
            if not create and not path.is_file():
                raise DatabaseError(f"no ingress database at {path}: check --db (or "
                                    "OTELA_INGRESS_DB, or [ingress] db in the config file)")
            try:
                if create and not path.exists():
                    path.parent.mkdir(parents=True, exist_ok=True)
                    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
                connection: Any = sqlite3.connect(path, timeout=10.0, isolation_level=None,
                                             check_same_thread=False)
                connection.execute("PRAGMA journal_mode=WAL")
                connection.execute("PRAGMA synchronous=NORMAL")
                connection.execute("PRAGMA busy_timeout=10000")
            except (sqlite3.Error, OSError) as exc:
                raise DatabaseError(f"cannot open the SQLite database {path}: {exc}") from None
            return cls(url, connection)
        try:
            import psycopg
        except ImportError:  # pragma: no cover - a dependency of otela
            raise DatabaseError("PostgreSQL needs psycopg 3 (pip install 'psycopg[binary]')") \
                from None
        try:
            connection = psycopg.connect(url.target, autocommit=True, connect_timeout=10)
        except psycopg.Error as exc:
            raise DatabaseError(f"cannot connect to {url.display()}: "
                                f"{str(exc).strip().splitlines()[0]}") from None
        return cls(url, connection)

    def close(self) -> None:
        with self._lock:
            self._connection.close()

    def _live(self) -> Any:
        """The connection, opened again if the server dropped it (a PostgreSQL restart or
        failover): the statement that saw the drop failed, the next one reconnects."""
        connection = self._connection
        if self.dialect == "postgresql" and (connection.closed or connection.broken):
            self._connection = Database.connect(self.url)._connection
        return self._connection

    # -- statements --------------------------------------------------------------------

    @property
    def now_sql(self) -> str:
        """An SQL expression for the database server's clock, in unix seconds: rows that
        several ingress nodes write are ordered by one clock, not by each node's."""
        if self.dialect == "postgresql":
            return "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"
        return "((julianday('now') - 2440587.5) * 86400.0)"

    def now(self) -> float:
        """The database server's clock (``now_sql``)."""
        return float(self.query_sync(f"SELECT {self.now_sql}")[0][0])

    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s") if self.dialect == "postgresql" else sql

    @contextmanager
    def transaction(self) -> Iterator[Cursor]:
        """A cursor inside one transaction: committed on success, rolled back on error."""
        with self._lock:
            cursor = self._live().cursor()
            cursor.execute("BEGIN IMMEDIATE" if self.dialect == "sqlite" else "BEGIN")
            try:
                yield _Translating(cursor, self._sql, self.dialect)
            except BaseException:
                cursor.execute("ROLLBACK")
                raise
            cursor.execute("COMMIT")

    def insert_new(self, table: str, columns: Sequence[str], rows: Sequence[Row],
                   computed: Sequence[tuple[str, str]] = (), unique: str = "id") -> None:
        """Insert ``rows`` (values for ``columns``) in one transaction, skipping any whose
        ``unique`` column is already there (a retried batch is written once); ``computed``
        adds (column, SQL expression) pairs evaluated by the database.

        SQLite inserts ``_SQLITE_CHUNK`` rows per statement: the driver lets go of the GIL
        around each statement, and every hand-over between this worker thread and the
        event loop's costs a context switch, so a statement per row cost the request path
        more than the insert itself. PostgreSQL streams the rows with ``COPY`` into a
        temporary table of this session, then moves them in one ``INSERT ... SELECT``:
        half the client CPU of a statement per row."""
        names = ", ".join(columns)
        extra_names = "".join(f", {column}" for column, _ in computed)
        extra_values = "".join(f", {expression}" for _, expression in computed)
        conflict = f"ON CONFLICT ({unique}) DO NOTHING"
        if self.dialect == "sqlite":
            one = f"({', '.join('?' * len(columns))}{extra_values})"
            with self.transaction() as cursor:
                for start in range(0, len(rows), _SQLITE_CHUNK):
                    chunk = rows[start:start + _SQLITE_CHUNK]
                    cursor.execute(f"INSERT INTO {table} ({names}{extra_names}) VALUES "
                                   f"{', '.join([one] * len(chunk))} {conflict}",
                                   [value for row in chunk for value in row])
            return
        staging = f"{table}_incoming"
        with self._lock:
            connection = self._live()
            with connection.transaction():
                cursor = connection.cursor()
                # Per session; ON COMMIT DELETE ROWS empties it at each commit.
                cursor.execute(f"CREATE TEMP TABLE IF NOT EXISTS {staging} ON COMMIT DELETE "
                               f"ROWS AS SELECT {names} FROM {table} WITH NO DATA")
                with cursor.copy(f"COPY {staging} ({names}) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(row)
                cursor.execute(f"INSERT INTO {table} ({names}{extra_names}) SELECT {names}"
                               f"{extra_values} FROM {staging} {conflict}")

    def query_sync(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        with self._lock:
            cursor = self._live().cursor()
            cursor.execute(self._sql(sql), tuple(params))
            return list(cursor.fetchall()) if cursor.description else []

    def run_sync(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Execute one statement (autocommit); the number of rows it changed."""
        with self._lock:
            cursor = self._live().cursor()
            cursor.execute(self._sql(sql), tuple(params))
            return int(cursor.rowcount or 0)

    async def query(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        rows: list[Row] = await self.in_thread(self.query_sync, sql, params)
        return rows

    async def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        return int(await self.in_thread(self.run_sync, sql, params))

    async def in_thread(self, work: Any, *args: Any) -> Any:
        """Run ``work(*args)`` (blocking, using this database) in a worker thread."""
        import trio

        if self._trio_lock is None:
            self._trio_lock = trio.Lock()
        async with self._trio_lock:
            return await trio.to_thread.run_sync(work, *args)


class _Translating:
    """A cursor that takes ``?`` placeholders in either dialect."""

    def __init__(self, cursor: Any, translate: Any, dialect: str = "sqlite") -> None:
        self._cursor = cursor
        self._translate = translate
        self.dialect = dialect

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self._cursor.execute(self._translate(sql), tuple(params))

    def executemany(self, sql: str, params: Sequence[Sequence[Any]]) -> Any:
        return self._cursor.executemany(self._translate(sql), [tuple(p) for p in params])

    def fetchall(self) -> list[Row]:
        return list(self._cursor.fetchall())

    @property
    def rowcount(self) -> int:
        return int(self._cursor.rowcount or 0)

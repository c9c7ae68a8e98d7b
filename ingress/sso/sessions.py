"""Dashboard sessions and sign-ins under way, kept server side (``ui_sessions``,
``sso_logins``).

The browser holds only a random secret in an HttpOnly cookie; the database holds its
SHA-256. Server side rather than a signed cookie because a session must end when its user
signs out (a signed cookie stays valid until it expires, wherever it was copied to), and
because every ingress sharing the database then knows every session without sharing a
signing key. A sign-in under way (between ``/ui/login`` and ``/ui/callback``) is kept the
same way: its state, nonce and PKCE verifier never leave this side, and it is used once
(taking it deletes it), so a callback URL replayed later finds nothing.

Each session also has a CSRF token: the dashboard reads it from ``/ui/session`` (same
origin only) and sends it in ``x-otela-csrf`` with every call it makes with the cookie
(``ingress.sso.gate``). Blocking; callers run these in a worker thread.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from ingress.database import Database
from ingress.keys import hash_secret
from ingress.sso.users import COLUMNS, User

# Sign-ins under way at once, at most: anyone may open /ui/login, and each keeps a row for
# ten minutes, so strangers must not be able to fill the database with them.
MAX_PENDING_LOGINS = 10_000
SESSION_COOKIE = "otela_session"
LOGIN_COOKIE = "otela_sso_login"
CSRF_HEADER = "x-otela-csrf"


class TooManySignIns(Exception):
    """``MAX_PENDING_LOGINS`` sign-ins are under way: refuse another for now."""


def new_secret() -> str:
    return secrets.token_urlsafe(32)  # 256 bits


@dataclass(frozen=True)
class Session:
    user: User
    csrf: str
    expires_at: float

    def expired(self, now: float) -> bool:
        return now >= self.expires_at


@dataclass(frozen=True)
class PendingLogin:
    state: str
    nonce: str
    verifier: str


def open_session(db: Database, user: User, ttl: float, now: float) -> tuple[str, Session]:
    """A new session of ``user`` for ``ttl`` seconds: (the cookie's secret, the session).
    Expired sessions of anyone are deleted on the way."""
    secret, csrf = new_secret(), new_secret()
    with db.transaction() as cursor:
        cursor.execute("DELETE FROM ui_sessions WHERE expires_at <= ?", (now,))
        cursor.execute("INSERT INTO ui_sessions (secret_hash, user_id, csrf, created_at, "
                       "expires_at) VALUES (?, ?, ?, ?, ?)",
                       (hash_secret(secret), user.id, csrf, now, now + ttl))
    return secret, Session(user, csrf, now + ttl)


def find_session(db: Database, secret: str, now: float) -> Session | None:
    """The live session whose cookie holds ``secret`` (``None``: unknown or expired)."""
    user_columns = ", ".join(f"u.{c.strip()}" for c in COLUMNS.split(","))
    rows = db.query_sync(
        f"SELECT s.csrf, s.expires_at, {user_columns} FROM ui_sessions s JOIN users u "
        "ON u.id = s.user_id WHERE s.secret_hash = ?", (hash_secret(secret),))
    if not rows:
        return None
    session = Session(User.from_row(rows[0][2:]), str(rows[0][0]), float(rows[0][1]))
    return None if session.expired(now) else session


def close_session(db: Database, secret: str) -> bool:
    """Sign out: the session is gone, on every ingress (whether it existed)."""
    return db.run_sync("DELETE FROM ui_sessions WHERE secret_hash = ?",
                       (hash_secret(secret),)) > 0


def begin_login(db: Database, login: PendingLogin, ttl: float, now: float) -> str:
    """Keep a sign-in under way for ``ttl`` seconds; the secret for its cookie. Raises
    ``TooManySignIns`` when ``MAX_PENDING_LOGINS`` are."""
    secret = new_secret()
    with db.transaction() as cursor:
        cursor.execute("DELETE FROM sso_logins WHERE expires_at <= ?", (now,))
        cursor.execute("SELECT COUNT(*) FROM sso_logins")
        if int(cursor.fetchall()[0][0]) >= MAX_PENDING_LOGINS:
            raise TooManySignIns
        cursor.execute("INSERT INTO sso_logins (secret_hash, state, nonce, verifier, "
                       "created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?)",
                       (hash_secret(secret), login.state, login.nonce, login.verifier,
                        now, now + ttl))
    return secret


def take_login(db: Database, secret: str, now: float) -> PendingLogin | None:
    """The sign-in under way whose cookie holds ``secret``, once: it is deleted here, so
    a second callback with the same cookie (a replayed code) finds nothing. ``None``:
    unknown, already taken or expired."""
    # One statement (SQLite 3.35+, PostgreSQL): of two callbacks racing with the same
    # cookie, on one ingress or two, only one gets the row.
    rows = db.query_sync("DELETE FROM sso_logins WHERE secret_hash = ? RETURNING state, "
                         "nonce, verifier, expires_at", (hash_secret(secret),))
    if not rows or now >= float(rows[0][3]):
        return None
    return PendingLogin(str(rows[0][0]), str(rows[0][1]), str(rows[0][2]))

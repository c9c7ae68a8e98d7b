"""Dashboard users in the ingress database (``users``), made from an OpenID provider's
claims on their first sign-in and brought up to date on every later one.

A user is one subject of one issuer (``UNIQUE (issuer, subject)``): an email address is
not an identity (it may be reassigned), the provider's ``sub`` is. The team and the admin
flag are the claims' at the last sign-in: take someone out of the admin group at the
provider and they are no admin from their next sign-in (a session lasts at most
``sso_session_ttl``). Blocking; callers run these in a worker thread.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from ingress.database import Database, Row
from ingress.sso.claims import Profile

COLUMNS = "id, issuer, subject, email, name, team, admin, created_at, last_login_at"


@dataclass(frozen=True)
class User:
    id: str
    issuer: str
    subject: str
    email: str | None
    name: str | None
    team: str | None
    admin: bool
    created_at: float
    last_login_at: float

    @classmethod
    def from_row(cls, row: Row) -> User:
        return cls(str(row[0]), str(row[1]), str(row[2]), row[3], row[4], row[5],
                   bool(row[6]), float(row[7]), float(row[8]))

    def label(self) -> str:
        """How the user is named in keys' histories and logs."""
        return self.email or self.name or f"{self.subject} at {self.issuer}"

    def to_dict(self) -> dict[str, Any]:
        return {"object": "user", "id": self.id, "email": self.email, "name": self.name,
                "team": self.team, "admin": self.admin, "created_at": self.created_at,
                "last_login_at": self.last_login_at}


def new_id() -> str:
    return "user_" + secrets.token_hex(6)


def record_sign_in(db: Database, issuer: str, profile: Profile, now: float) -> User:
    """Create the user of ``profile`` (first sign-in) or update it (later ones), in one
    statement: two first sign-ins of one person at once make one user."""
    db.run_sync(
        "INSERT INTO users (id, issuer, subject, email, name, team, admin, created_at, "
        "last_login_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (issuer, subject) "
        "DO UPDATE SET email = excluded.email, name = excluded.name, team = excluded.team, "
        "admin = excluded.admin, last_login_at = excluded.last_login_at",
        (new_id(), issuer, profile.subject, profile.email, profile.name, profile.team,
         int(profile.admin), now, now))
    user = find(db, issuer, profile.subject)
    assert user is not None
    return user


def find(db: Database, issuer: str, subject: str) -> User | None:
    rows = db.query_sync(f"SELECT {COLUMNS} FROM users WHERE issuer = ? AND subject = ?",
                         (issuer, subject))
    return User.from_row(rows[0]) if rows else None


def all_users(db: Database) -> list[User]:
    return [User.from_row(r) for r in
            db.query_sync(f"SELECT {COLUMNS} FROM users ORDER BY created_at, id")]

"""The dashboard's single sign-on tables on PostgreSQL (several ingress nodes share one
database, so users, sessions and sign-ins must work in its dialect too): a real server
(``otela.testing.localpg``), a fresh database per test."""

from __future__ import annotations

import pytest

from ingress.database import Database, DatabaseUrl
from ingress.migrations import migrate
from ingress.sso import sessions, users
from ingress.sso.claims import Profile
from ingress.sso.sessions import PendingLogin

pytestmark = pytest.mark.slow  # a PostgreSQL server

ISSUER = "https://sso.uni.example/realms/uni"


def test_users_sessions_and_sign_ins_on_postgresql(postgres_db):
    db = Database.connect(DatabaseUrl.parse(postgres_db))
    other = Database.connect(DatabaseUrl.parse(postgres_db))  # a second ingress
    try:
        migrate(db)
        first = users.record_sign_in(db, ISSUER, Profile("u1", "a@uni.example", "Ann",
                                                    "physics-lab", False), 100.0)
        again = users.record_sign_in(other, ISSUER, Profile("u1", "ann@uni.example", "Ann",
                                                       None, True), 200.0)
        assert again.id == first.id and (again.team, again.admin) == (None, True)
        assert (again.created_at, again.last_login_at) == (100.0, 200.0)

        secret, _ = sessions.open_session(db, again, 60.0, 150.0)
        seen = sessions.find_session(other, secret, 160.0)
        assert seen is not None and seen.user.admin
        assert sessions.close_session(other, secret)  # signed out through the other one
        assert sessions.find_session(db, secret, 160.0) is None

        login = sessions.begin_login(db, PendingLogin("s", "n", "v"), 600.0, 100.0)
        assert sessions.take_login(other, login, 200.0) == PendingLogin("s", "n", "v")
        assert sessions.take_login(db, login, 200.0) is None  # used once, anywhere
    finally:
        db.close()
        other.close()

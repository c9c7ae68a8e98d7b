"""Keys of single sign-on users, on real databases: the migrations from the schema before
them (version 7; then teams' priority) on SQLite and PostgreSQL keep every key, team and
row; a key is given a user by id or email (an unknown or ambiguous one is refused and
writes nothing); usage rows keep the key's user of their time, through roll-ups too, and
group and filter by user in reports, the request log and ``otela usage``/``otela
requests``; and a signed-in user's own keys (``/ui/keys``) through the real session gate
and routes: listed, revoked, and made only where the operator allows it, in the user's
team."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from fastapi import FastAPI
from typer.testing import CliRunner

from ingress import keystore, retention, usage
from ingress.access import Access
from ingress.database import Database, DatabaseUrl
from ingress.keys import ApiKey
from ingress.keystore import KeySpec, UserNotFound
from ingress.migrations import LATEST, MIGRATIONS, migrate
from ingress.sso import own_keys, sessions, users
from ingress.sso.claims import Profile
from ingress.sso.gate import SessionGate
from ingress.sso.settings import SsoSettings
from ingress.usage import UsageWriter
from otela.api.errors import install_error_handlers
from otela.cli import app as otela_app
from otela.dataplane.exchange import Exchange, UsageTap

ISSUER = "https://sso.uni.example/realms/uni"
BEFORE_USERS = 7  # the schema version before keys had users


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "ingress.db")
    return str(request.getfixturevalue("postgres_db"))


def at_version(url: str, version: int) -> Database:
    """A database as the otela of schema ``version`` left it."""
    db = Database.connect(DatabaseUrl.parse(url))
    db.run_sync("CREATE TABLE otela_schema (version INTEGER NOT NULL)")
    for number, statements in enumerate(MIGRATIONS[:version], start=1):
        with db.transaction() as cursor:
            for statement in statements:
                cursor.execute(statement)
            cursor.execute("INSERT INTO otela_schema (version) VALUES (?)", (number,))
    return db


def sign_in(db: Database, subject: str, email: str | None, team: str | None = None
            ) -> users.User:
    return users.record_sign_in(db, ISSUER, Profile(subject, email, subject.title(), team,
                                                    False), time.time())


def served(key_id: str, tokens: tuple[int, int], finished: float) -> Exchange:
    exchange = Exchange(route="/v1/chat/completions", request_id="r", model="m",
                        status=200, node_peer="peer-1", node_provider="prov",
                        api_key=key_id)
    exchange.arrival = finished
    exchange.tap = UsageTap(False)
    exchange.tap.prompt_tokens, exchange.tap.completion_tokens = tokens
    return exchange


def record(db: Database, exchanges: list[Exchange]) -> None:
    """Write usage rows as a running ingress does: its writer, its key cache."""
    access = Access(db, "ingress-1")
    access.load()
    writer = UsageWriter(db, "ingress-1", context=access)
    for exchange in exchanges:
        writer.finished(exchange)
    trio.run(writer.flush)
    assert writer.written == len(exchanges)


def test_the_migration_keeps_every_key_and_row_and_keys_then_take_users(db_url: str) -> None:
    db = at_version(db_url, BEFORE_USERS)
    try:
        db.run_sync("INSERT INTO api_keys (id, secret_hash, owner, name, created_at, "
                    "updated_at, team, rpm) VALUES ('key_00000000000a', 'h1', 'ann', 'old', "
                    "1, 1, 'physics', 60)")
        db.run_sync("INSERT INTO usage (id, request_id, key_id, model, route, provider, "
                    "node_peer, node_session, prompt_tokens, completion_tokens, status, "
                    "stream, latency_ms, started_at, finished_at, ingress, recorded_at, "
                    "team) VALUES ('u1', 'r', 'key_00000000000a', 'm', "
                    "'/v1/chat/completions', 'p', 'n', 's', 5, 6, 200, 0, 1.0, 10, 11, 'i', "
                    "11, 'physics')")
        db.run_sync("INSERT INTO usage_rollup (day, key_id, team, model, provider, status, "
                    "requests, prompt_tokens, completion_tokens, errors, latency_sum, "
                    "latency_n, ttft_sum, ttft_n, spend, unpriced) VALUES (0, "
                    "'key_00000000000a', 'physics', 'm', 'p', 200, 3, 30, 30, 0, 3, 3, 0, 0, "
                    "0, 3)")
        db.run_sync("INSERT INTO teams (name, weight, updated_at, rpm) VALUES "
                    "('physics', 2, 1, 600)")
        ann = sign_in(db, "ann", "Ann@Uni.example", "physics")

        assert migrate(db) == BEFORE_USERS and LATEST > BEFORE_USERS
        physics = keystore.teams(db)["physics"]
        assert (physics.weight, physics.rpm, physics.priority) == (2.0, 600, None)
        old = keystore.get(db, "key_00000000000a")
        assert (old.owner, old.team, old.rpm, old.user_id) == ("ann", "physics", 60, None)
        assert usage.used_tokens(db) == {"key_00000000000a": 71}
        assert [(t.group, t.requests) for t in usage.aggregate(db, "user")] == [(None, 4)]
        assert users.find(db, ISSUER, "ann") == ann

        # By email, in any case: the id is stored, the change recorded with it.
        linked = keystore.update(db, old.id, {"user_id": "ann@uni.example"}, actor="t")
        assert linked.user_id == ann.id == keystore.get(db, old.id).user_id
        assert keystore.history(db, old.id)[-1].changes == {"user_id": [None, ann.id]}
        assert [k.id for k in keystore.keys_of_user(db, ann.id)] == [old.id]
    finally:
        db.close()


def test_a_key_names_its_user_by_id_or_email_and_an_unknown_one_writes_nothing(
        db_url: str) -> None:
    db = Database.connect(DatabaseUrl.parse(db_url))
    try:
        migrate(db)
        ann = sign_in(db, "ann", "ann@uni.example")
        made, _ = keystore.create(db, KeySpec(owner="lab", user_id=ann.id))
        assert made.user_id == ann.id
        by_email, _ = keystore.create(db, KeySpec(owner="lab", user_id="ANN@uni.example"))
        assert by_email.user_id == ann.id
        before = keystore.all_keys(db)
        with pytest.raises(UserNotFound) as unknown:
            keystore.create(db, KeySpec(owner="lab", user_id="nobody@uni.example"))
        assert "no user has the id or email" in str(unknown.value)
        with pytest.raises(UserNotFound):
            keystore.update(db, made.id, {"user_id": "user_000000000000", "rpm": 5})
        assert keystore.all_keys(db) == before  # nothing made, nothing changed
        assert [c.action for c in keystore.history(db, made.id)] == ["create"]

        # The same email at two users (another issuer, or reassigned): name the id.
        users.record_sign_in(db, "https://other.example", Profile("x", "ann@uni.example",
                                                                  None, None, False), 1.0)
        with pytest.raises(UserNotFound) as ambiguous:
            keystore.update(db, made.id, {"user_id": "ann@uni.example"})
        assert ambiguous.value.ambiguous and "by id" in str(ambiguous.value)
        assert keystore.update(db, made.id, {"user_id": None}).user_id is None
    finally:
        db.close()


def test_usage_keeps_the_users_of_its_time_and_groups_and_filters_by_them(
        db_url: str) -> None:
    db = Database.connect(DatabaseUrl.parse(db_url))
    try:
        migrate(db)
        ann = sign_in(db, "ann", "ann@uni.example", "physics")
        bob = sign_in(db, "bob", None, "physics")  # no email: named by name
        key, _ = keystore.create(db, KeySpec(owner="lab", team="physics", user_id=ann.id))
        loose, _ = keystore.create(db, KeySpec(owner="nobody's"))
        day = 86400.0
        record(db, [served(key.id, (10, 5), 2 * day), served(loose.id, (1, 1), 2 * day)])
        keystore.update(db, key.id, {"user_id": bob.id})  # the key changes hands
        record(db, [served(key.id, (100, 50), 3 * day)])

        by_user = {t.group: (t.label, t.requests, t.prompt_tokens)
                   for t in usage.aggregate(db, "user")}
        assert by_user == {ann.id: ("ann@uni.example", 1, 10), bob.id: ("Bob", 1, 100),
                           None: (None, 1, 1)}
        only_ann = usage.aggregate(db, "key", filters={"user": ann.id})
        assert [(t.group, t.prompt_tokens) for t in only_ann] == [(key.id, 10)]
        entries, more = usage.request_log(db, filters={"user": bob.id})
        assert [(e["key_id"], e["user_id"], e["prompt_tokens"]) for e in entries] == [
            (key.id, bob.id, 100)] and not more

        # Past the retention, the day's totals keep each request's user.
        assert retention.roll_up(db, 2.5 * day) == 2
        assert usage.request_log(db)[0] == entries
        by_user_after = {t.group: (t.requests, t.prompt_tokens)
                         for t in usage.aggregate(db, "user")}
        assert by_user_after == {ann.id: (1, 10), bob.id: (1, 100), None: (1, 1)}
    finally:
        db.close()


# -- the command line ---------------------------------------------------------------------

@pytest.fixture
def otela(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("OTELA_HOME", str(tmp_path))
    for name in ("OTELA_INGRESS_DB", "OTELA_ADMIN_TOKEN", "OTELA_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    runner = CliRunner()

    def invoke(*args: str) -> tuple[int, str, str]:
        result = runner.invoke(otela_app, list(args))
        return result.exit_code, result.stdout, result.stderr
    return invoke


def test_otela_keys_usage_and_requests_by_user(otela: Any, tmp_path: Path) -> None:
    db = Database.connect(DatabaseUrl.parse(str(tmp_path / "ingress.db")))  # the home's
    migrate(db)
    ann = sign_in(db, "ann", "ann@uni.example", "physics")

    code, out, err = otela("keys", "create", "--owner", "lab", "--user", "ann@uni.example",
                           "--json")
    assert code == 0, err
    made = json.loads(out)
    assert made["user_id"] == ann.id and made["user"]["email"] == "ann@uni.example"
    code, out, err = otela("keys", "create", "--owner", "lab", "--user", "eve@uni.example")
    assert code == 1 and err.startswith("otela: no user has the id or email") and not out
    assert len(json.loads(otela("keys", "list", "--json")[1])) == 1
    code, out, _ = otela("keys", "list")
    assert "ann@uni.example" in out
    code, out, err = otela("keys", "update", made["id"], "--clear", "user", "--json")
    assert code == 0 and json.loads(out)["user"] is None, err
    code, out, err = otela("keys", "update", made["id"], "--user", ann.id, "--json")
    assert code == 0 and json.loads(out)["user_id"] == ann.id, err

    record(db, [served(made["id"], (7, 3), time.time())])
    code, out, err = otela("usage", "--by", "user", "--format", "json")
    assert code == 0, err
    assert [(r["group"], r["label"], r["prompt_tokens"]) for r in json.loads(out)["data"]] \
        == [(ann.id, "ann@uni.example", 7)]
    code, out, _ = otela("usage", "--by", "user", "--format", "csv")
    assert out.splitlines()[0].startswith("user,label,requests")
    code, out, _ = otela("usage", "--user", "ann@uni.example", "--format", "json")
    assert [r["group"] for r in json.loads(out)["data"]] == [made["id"]]
    code, out, err = otela("usage", "--user", "eve@uni.example")
    assert code == 1 and "no user has the id or email" in err
    code, out, _ = otela("requests", "--user", ann.id, "--format", "json")
    assert [e["user_id"] for e in json.loads(out)["data"]] == [ann.id]
    db.close()


# -- a signed-in user's own keys: the real gate and routes, in process -----------------------

SETTINGS = SsoSettings(issuer=ISSUER, client_id="otela", redirect_base="http://127.0.0.1")


class Dashboard:
    """The node's API app as far as a user's own keys go, on a real SQLite file."""

    def __init__(self, path: Path, user_keys: bool) -> None:
        self.db = Database.connect(DatabaseUrl.parse(str(path)))
        migrate(self.db)
        self.remembered: list[ApiKey] = []
        self.app = FastAPI()
        install_error_handlers(self.app)
        own_keys.install(self.app, self.db, SsoSettings(**{**SETTINGS.__dict__,
                                                           "user_keys": user_keys}),
                         "ingress-1", self.remember)
        self.app.add_middleware(SessionGate, db=self.db)

    async def remember(self, keys: list[ApiKey]) -> None:
        self.remembered.extend(keys)

    def session(self, user: users.User) -> dict[str, str]:
        """A signed-in browser's headers: its session cookie and CSRF token."""
        secret, session = sessions.open_session(self.db, user, 600.0, time.time())
        return {"cookie": f"otela_session={secret}", "x-otela-csrf": session.csrf}

    def call(self, method: str, path: str, headers: dict[str, str],
             body: Any = None) -> httpx.Response:
        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://n") as client:
                return await client.request(method, path, headers=headers, json=body)
        return trio.run(go)


@pytest.fixture
def dashboard(tmp_path: Path) -> Iterator[Any]:
    made: list[Dashboard] = []

    def make(user_keys: bool) -> Dashboard:
        made.append(Dashboard(tmp_path / f"ui-{len(made)}.db", user_keys))
        return made[-1]
    yield make
    for each in made:
        each.db.close()


def test_a_user_lists_and_revokes_their_own_keys_and_nobody_elses(dashboard: Any) -> None:
    ui = dashboard(False)
    ann, bob = sign_in(ui.db, "ann", "ann@uni.example", "physics"), sign_in(ui.db, "bob", None)
    given, _ = keystore.create(ui.db, KeySpec(owner="ann", user_id=ann.id))
    bobs, _ = keystore.create(ui.db, KeySpec(owner="bob", user_id=bob.id))
    keystore.create(ui.db, KeySpec(owner="lab", team="physics"))  # the team's, not hers
    as_ann = ui.session(ann)

    listed = ui.call("GET", "/ui/keys", as_ann)
    assert listed.status_code == 200, listed.text
    mine = listed.json()
    assert [k["id"] for k in mine["data"]] == [given.id] and mine["can_create"] is False
    assert mine["data"][0]["user"] == {"id": ann.id, "email": "ann@uni.example",
                                       "name": "Ann"} and "key" not in mine["data"][0]

    # Someone else's key is "no such key", as an unknown one is; it stays as it was.
    for other in (bobs.id, "key_000000000000", "nonsense"):
        refused = ui.call("POST", f"/ui/keys/{other}/revoke", as_ann)
        assert refused.status_code == 404 and refused.json()["error"]["code"] == \
            "key_not_found"
    assert keystore.get(ui.db, bobs.id).revoked_at is None
    revoked = ui.call("POST", f"/ui/keys/{given.id}/revoke", as_ann)
    assert revoked.status_code == 200 and revoked.json()["status"] == "revoked"
    assert keystore.get(ui.db, given.id).revoked_at is not None
    assert [k.id for k in ui.remembered] == [given.id]  # this node's cache knows at once
    change = keystore.history(ui.db, given.id)[-1]
    assert change.action == "revoke" and change.actor.startswith(
        f"ann@uni.example ({ann.id}, signed in, own key)")

    # Where the operator has not allowed it, users make no keys.
    made = ui.call("POST", "/ui/keys", as_ann, {"name": "mine"})
    assert made.status_code == 403 and made.json()["error"]["code"] == "user_keys_disabled"


def test_users_make_keys_in_their_team_only_where_allowed(dashboard: Any) -> None:
    ui = dashboard(True)
    ann = sign_in(ui.db, "ann", "ann@uni.example", "physics")
    loner = sign_in(ui.db, "lone", "lone@uni.example", None)
    as_ann = ui.session(ann)
    assert ui.call("GET", "/ui/keys", as_ann).json()["can_create"] is True
    made = ui.call("POST", "/ui/keys", as_ann, {"name": "laptop", "expires_in": 3600})
    assert made.status_code == 200, made.text
    key = made.json()
    assert key["key"].startswith("otela-") and key["name"] == "laptop"
    assert (key["owner"], key["user_id"], key["scheduling"]["team"]) == (
        "ann@uni.example", ann.id, "physics")
    assert key["expires_at"] == pytest.approx(time.time() + 3600, abs=60)

    # Limits, budgets, models and the like are an admin's to set.
    for field, value in (("rpm", 1000), ("team", "chem"), ("user", "lone@uni.example"),
                         ("owner", "someone")):
        refused = ui.call("POST", "/ui/keys", as_ann, {field: value})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == field
    bad = ui.call("POST", "/ui/keys", as_ann, {"name": "x" * 201})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "name"
    no_team = ui.call("POST", "/ui/keys", ui.session(loner), {})
    assert no_team.status_code == 403 and no_team.json()["error"]["code"] == "no_team"
    assert ui.call("GET", "/ui/keys", ui.session(loner)).json()["can_create"] is False

    for _ in range(own_keys.MAX_LIVE_KEYS - 1):
        assert ui.call("POST", "/ui/keys", as_ann, {}).status_code == 200
    full = ui.call("POST", "/ui/keys", as_ann, {})
    assert full.status_code == 403 and full.json()["error"]["code"] == "too_many_keys"
    ui.call("POST", f"/ui/keys/{key['id']}/revoke", as_ann)
    assert ui.call("POST", "/ui/keys", as_ann, {}).status_code == 200  # room again
    assert len(keystore.keys_of_user(ui.db, ann.id)) == own_keys.MAX_LIVE_KEYS + 1


def test_own_keys_need_a_live_session_and_its_csrf_token(dashboard: Any) -> None:
    ui = dashboard(True)
    ann = sign_in(ui.db, "ann", "ann@uni.example", "physics")
    as_ann = ui.session(ann)
    for headers, status, code in (
            ({}, 401, "not_signed_in"),
            ({"authorization": "Bearer otela-some-api-key", "cookie": as_ann["cookie"]},
             401, "not_signed_in"),  # an API key manages no keys here, cookie or not
            ({"cookie": as_ann["cookie"]}, 403, "csrf_token_invalid"),
            ({"cookie": "otela_session=gone", "x-otela-csrf": "x"}, 401, "session_expired")):
        for method, path in (("GET", "/ui/keys"), ("POST", "/ui/keys")):
            answer = ui.call(method, path, headers, {} if method == "POST" else None)
            assert (answer.status_code, answer.json()["error"]["code"]) == (status, code), \
                (headers, method)
    assert keystore.all_keys(ui.db) == []

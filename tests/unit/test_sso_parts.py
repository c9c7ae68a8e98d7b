"""The dashboard's single sign-on, part by part: claims to team and admin, the settings'
checks, users, sessions and sign-ins on a real SQLite file, the session gate's cookie and
CSRF rules, and the ID token checks (tokens signed here with real RSA keys by joserfc,
checked by the same code that checks a provider's)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import trio

from ingress.database import Database, DatabaseUrl
from ingress.migrations import migrate
from ingress.sso import sessions, users
from ingress.sso.claims import claim_values, is_admin, profile, team_of
from ingress.sso.gate import SessionGate, cookie_value
from ingress.sso.sessions import PendingLogin
from ingress.sso.settings import SsoConfigError, SsoSettings
from otela.config import NodeConfig

ISSUER = "https://sso.uni.example/realms/uni"
SETTINGS = SsoSettings(
    issuer=ISSUER, client_id="otela", redirect_base="https://llm.uni.example",
    client_secret="not-a-real-secret", team_claim="groups",
    teams={"/physics": "physics-lab", "/chemistry": "chem"},
    admin_claim="realm_access.roles", admin_values=frozenset({"otela-admin"}))


def sqlite(path: Path) -> Database:
    db = Database.connect(DatabaseUrl.parse(str(path)))
    migrate(db)
    return db


# -- claims -> team and admin ------------------------------------------------------------

def test_the_first_mapped_group_names_the_team_in_the_operators_order():
    claims = {"sub": "u1", "groups": ["/chemistry", "/staff", "/physics"]}
    assert team_of(claims, SETTINGS) == "physics-lab"  # /physics is listed first
    assert team_of({"groups": "/chemistry"}, SETTINGS) == "chem"  # a string claim
    assert team_of({"groups": ["/staff"]}, SETTINGS) is None
    assert team_of({}, SETTINGS) is None
    assert team_of({"groups": [1, None, {"x": 1}]}, SETTINGS) is None  # not strings


def test_admin_comes_from_a_nested_claim_and_nothing_else():
    assert is_admin({"realm_access": {"roles": ["user", "otela-admin"]}}, SETTINGS)
    assert not is_admin({"realm_access": {"roles": ["user"]}}, SETTINGS)
    assert not is_admin({"groups": ["otela-admin"]}, SETTINGS)  # another claim
    assert not is_admin({"realm_access": "otela-admin"}, SETTINGS)  # not an object
    assert not is_admin({"realm_access": {"roles": ["otela-admin"]}},
                        replace(SETTINGS, admin_values=frozenset()))  # nobody configured
    assert claim_values({"a": {"b": {"c": "x"}}}, "a.b.c") == ["x"]


def test_a_profile_needs_a_subject_and_ignores_an_unverified_email():
    who = profile({"sub": "u1", "email": "a@uni.example", "name": " Ann ",
                   "groups": ["/physics"]}, SETTINGS)
    assert (who.subject, who.email, who.name, who.team, who.admin) == \
        ("u1", "a@uni.example", "Ann", "physics-lab", False)
    unverified = profile({"sub": "u1", "email": "boss@uni.example", "email_verified": False,
                          "preferred_username": "ann"}, SETTINGS)
    assert unverified.email is None and unverified.name == "ann"
    with pytest.raises(ValueError, match="subject"):
        profile({"email": "a@uni.example"}, SETTINGS)


# -- settings -----------------------------------------------------------------------------

def config(**fields: Any) -> NodeConfig:
    return replace(NodeConfig(), **fields)


def test_sso_is_off_unless_an_issuer_is_set_and_half_settings_stop_the_node(tmp_path):
    assert SsoSettings.from_config(config()) is None
    base = {"sso_issuer": ISSUER + "/", "sso_client_id": "otela",
            "sso_redirect_base": "https://llm.uni.example/"}
    for missing in ("sso_client_id", "sso_redirect_base"):
        with pytest.raises(SsoConfigError, match=missing):
            SsoSettings.from_config(config(**{**base, missing: None}))
    with pytest.raises(SsoConfigError, match="https"):  # keys and codes in clear text
        SsoSettings.from_config(config(**{**base, "sso_issuer": "http://sso.uni.example"}))
    secret_file = tmp_path / "secret"
    secret_file.write_text("from-a-file\n")
    settings = SsoSettings.from_config(config(**base, sso_client_secret_file=secret_file,
                                              sso_scopes=["email", "groups"]))
    assert settings is not None
    assert settings.issuer == ISSUER and settings.redirect_uri == \
        "https://llm.uni.example/ui/callback"
    assert settings.client_secret == "from-a-file" and settings.secure_cookies
    assert settings.scopes == ("openid", "email", "groups")
    assert "from-a-file" not in repr(settings)  # never in a log line or a traceback
    loopback = SsoSettings.from_config(config(**{**base, "sso_issuer": "http://127.0.0.1:9",
                                                 "sso_redirect_base": "http://127.0.0.1:8"}))
    assert loopback is not None and not loopback.secure_cookies
    secret_file.write_text("")
    with pytest.raises(SsoConfigError, match="empty"):
        SsoSettings.from_config(config(**base, sso_client_secret_file=secret_file))


# -- users, sessions, sign-ins on SQLite -------------------------------------------------

def test_users_are_made_on_first_sign_in_and_updated_later(tmp_path):
    db = sqlite(tmp_path / "u.db")
    first = users.record_sign_in(db, ISSUER, profile(
        {"sub": "u1", "email": "a@uni.example", "groups": ["/physics"]}, SETTINGS), 100.0)
    later = users.record_sign_in(db, ISSUER, profile(
        {"sub": "u1", "email": "ann@uni.example", "groups": ["/chemistry"],
         "realm_access": {"roles": ["otela-admin"]}}, SETTINGS), 200.0)
    assert later.id == first.id and later.created_at == 100.0 and later.last_login_at == 200.0
    assert (later.email, later.team, later.admin) == ("ann@uni.example", "chem", True)
    other = users.record_sign_in(db, "https://other.example", profile({"sub": "u1"}, SETTINGS), 1)
    assert other.id != first.id  # the same subject at another issuer: someone else
    assert len(users.all_users(db)) == 2


def test_sessions_expire_end_on_sign_out_and_store_no_secret(tmp_path):
    path = tmp_path / "s.db"
    db = sqlite(path)
    user = users.record_sign_in(db, ISSUER, profile({"sub": "u1"}, SETTINGS), 100.0)
    secret, session = sessions.open_session(db, user, 60.0, 100.0)
    assert session.expires_at == 160.0 and session.csrf != secret
    assert secret not in path.read_bytes().decode("latin-1")  # only its hash is stored
    found = sessions.find_session(db, secret, 159.0)
    assert found is not None and found.user.id == user.id and found.csrf == session.csrf
    assert sessions.find_session(db, secret, 160.0) is None  # expired
    assert sessions.find_session(db, secret + "x", 100.0) is None
    assert sessions.close_session(db, secret)
    assert sessions.find_session(db, secret, 100.0) is None  # signed out
    # Opening a session clears the expired ones.
    sessions.open_session(db, user, 1.0, 100.0)
    sessions.open_session(db, user, 1.0, 500.0)
    assert db.query_sync("SELECT COUNT(*) FROM ui_sessions") == [(1,)]


def test_a_sign_in_under_way_is_taken_once_and_expires(tmp_path):
    db = sqlite(tmp_path / "l.db")
    pending = PendingLogin("state", "nonce", "verifier")
    secret = sessions.begin_login(db, pending, 600.0, 100.0)
    assert sessions.take_login(db, secret, 200.0) == pending
    assert sessions.take_login(db, secret, 200.0) is None  # a replayed callback
    late = sessions.begin_login(db, pending, 600.0, 100.0)
    assert sessions.take_login(db, late, 700.0) is None


def test_strangers_cannot_fill_the_database_with_sign_ins(tmp_path, monkeypatch):
    db = sqlite(tmp_path / "m.db")
    monkeypatch.setattr(sessions, "MAX_PENDING_LOGINS", 3)
    pending = PendingLogin("state", "nonce", "verifier")
    for _ in range(3):
        sessions.begin_login(db, pending, 600.0, 100.0)
    with pytest.raises(sessions.TooManySignIns):
        sessions.begin_login(db, pending, 600.0, 100.0)
    sessions.begin_login(db, pending, 600.0, 700.0)  # the old ones expired: room again
    assert db.query_sync("SELECT COUNT(*) FROM sso_logins") == [(1,)]


# -- the session gate ---------------------------------------------------------------------

def test_cookie_values_are_read_strictly():
    assert cookie_value("a=1; otela_session=abc; b=2", "otela_session") == "abc"
    assert cookie_value("otela_session=", "otela_session") is None
    assert cookie_value(None, "otela_session") is None
    assert cookie_value('bad"cookie', "otela_session") is None


def run_gate(db: Database, path: str, headers: dict[str, str],
             method: str = "GET") -> tuple[int, dict[str, Any]]:
    """One request through ``SessionGate`` in front of an app that answers 200 and
    records the state it saw: (status, that state or the refusal's body)."""
    seen: dict[str, Any] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.update(scope.get("state", {}))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    scope = {"type": "http", "path": path, "method": method,
             "headers": [(k.encode(), v.encode()) for k, v in headers.items()]}
    trio.run(SessionGate(app, db), scope, receive, send)
    status = sent[0]["status"]
    if status != 200:
        import orjson
        return status, orjson.loads(sent[1]["body"])
    return status, seen


def test_the_gate_wants_a_live_session_and_its_csrf_token(tmp_path):
    db = sqlite(tmp_path / "g.db")
    user = users.record_sign_in(db, ISSUER, profile({"sub": "u1"}, SETTINGS), time.time())
    secret, session = sessions.open_session(db, user, 60.0, time.time())
    cookie = {"cookie": f"otela_session={secret}"}
    # The session read hands out the token; everything else needs it.
    status, state = run_gate(db, "/ui/session", cookie)
    assert status == 200 and state["ui_session"].user.id == user.id
    status, body = run_gate(db, "/v1/admin/keys", cookie)
    assert status == 403 and body["error"]["code"] == "csrf_token_invalid"
    status, body = run_gate(db, "/v1/admin/keys", {**cookie, "x-otela-csrf": "guess"}, "POST")
    assert status == 403
    status, state = run_gate(db, "/v1/admin/keys", {**cookie, "x-otela-csrf": session.csrf})
    assert status == 200 and state["ui_session"].csrf == session.csrf
    # An Authorization header wins: the cookie is not even looked at.
    status, state = run_gate(db, "/v1/admin/keys", {**cookie, "authorization": "Bearer x"})
    assert status == 200 and "ui_session" not in state
    # Paths other than the admin API and /ui/session|logout never see a session.
    status, state = run_gate(db, "/v1/chat/completions", cookie, "POST")
    assert status == 200 and state == {}
    # A session that is gone: 401 on the admin API, "expired" for the page.
    sessions.close_session(db, secret)
    status, body = run_gate(db, "/v1/admin/keys", {**cookie, "x-otela-csrf": session.csrf})
    assert status == 401 and body["error"]["code"] == "session_expired"
    status, state = run_gate(db, "/ui/session", cookie)
    assert status == 200 and state == {"ui_session_expired": True}


# -- ID token checks ----------------------------------------------------------------------

pytest.importorskip("joserfc", reason="joserfc is not installed (the sso extra)")


def signed_client(**overrides: Any) -> tuple[Any, Any, dict[str, Any]]:
    """An ``OpenIDClient`` that trusts a fresh RSA key (as if read from a provider's
    JWKS), the key, and the claims of a valid ID token for nonce ``n1``."""
    from joserfc.jwk import KeySet, RSAKey

    from ingress.sso.oidc import OpenIDClient

    key = RSAKey.generate_key(2048, parameters={"kid": "k1", "alg": "RS256", "use": "sig"})
    client = OpenIDClient(SETTINGS)
    client._metadata = {"issuer": ISSUER, "id_token_signing_alg_values_supported":
                        ["RS256", "HS256", "none"]}
    client._keys = KeySet([RSAKey.import_key(key.as_dict(private=False))])
    client._read_at = time.monotonic()
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": "otela", "sub": "u1", "iat": now, "exp": now + 300,
              "nonce": "n1", **overrides}
    return client, key, claims


def verify(client: Any, token: str, nonce: str = "n1") -> dict[str, Any]:
    return trio.run(client.verify_id_token, token, nonce)


def test_a_valid_id_token_passes_and_each_wrong_claim_is_refused():
    from joserfc import jwt

    from ingress.sso.oidc import ProviderError

    client, key, claims = signed_client()
    token = jwt.encode({"alg": "RS256", "kid": "k1"}, claims, key)
    assert verify(client, token)["sub"] == "u1"
    with pytest.raises(ProviderError, match="verification"):
        verify(client, token, nonce="another sign-in's")
    for change in ({"iss": "https://evil.example"}, {"aud": "someone-else"},
                   {"exp": int(time.time()) - 3600}, {"sub": None}):
        bad = {k: v for k, v in {**claims, **change}.items() if v is not None}
        with pytest.raises(ProviderError) as refused:
            verify(client, jwt.encode({"alg": "RS256", "kid": "k1"}, bad, key))
        assert refused.value.code == "id_token_invalid", change
    # Several audiences: only when this client is the authorized party.
    several = {**claims, "aud": ["otela", "other"], "azp": "other"}
    with pytest.raises(ProviderError, match="azp"):
        verify(client, jwt.encode({"alg": "RS256", "kid": "k1"}, several, key))


def test_a_token_signed_by_another_key_or_with_the_client_secret_is_refused():
    from joserfc import jwt
    from joserfc.jwk import OctKey, RSAKey

    from ingress.sso.oidc import ProviderError

    client, _, claims = signed_client()

    async def no_refresh(refresh: bool = False) -> Any:
        return client._keys  # the provider's keys, read again: still not the forger's

    client._key_set = no_refresh
    forger = RSAKey.generate_key(2048, parameters={"kid": "k1"})
    with pytest.raises(ProviderError):
        verify(client, jwt.encode({"alg": "RS256", "kid": "k1"}, claims, forger))
    # HS256 with the client secret as the key (the provider announces it: still refused).
    hmac_key = OctKey.import_key("not-a-real-secret" * 2)
    with pytest.raises(ProviderError):
        verify(client, jwt.encode({"alg": "HS256"}, claims, hmac_key,
                                  algorithms=["HS256"]))


def test_the_documented_keycloak_config_file_gives_these_settings(tmp_path):
    """docs/ingress.md#single-sign-on's example, read as ``otela start`` reads a file."""
    from otela.config.layers import resolve

    (tmp_path / "secret").write_text("s3\n")
    path = tmp_path / "config.toml"
    path.write_text(f"""[ingress]
db = "default"
sso_issuer = "{ISSUER}"
sso_client_id = "otela-dashboard"
sso_client_secret_file = "{tmp_path / 'secret'}"
sso_redirect_base = "https://llm.uni.example"
sso_scopes = ["openid", "email", "profile"]
sso_team_claim = "groups"
sso_teams = {{ "/physics" = "physics-lab", "/chemistry" = "chem" }}
sso_admin_claim = "realm_access.roles"
sso_admin_values = ["otela-admin"]
sso_session_ttl = "8h"
""")
    settings = SsoSettings.from_config(resolve({}, env={}, config_flag=path).config)
    assert settings is not None
    assert dict(settings.teams) == {"/physics": "physics-lab", "/chemistry": "chem"}
    assert settings.admin_values == {"otela-admin"} and settings.session_ttl == 8 * 3600
    assert settings.client_secret == "s3"
    who = profile({"sub": "k1", "groups": ["/chemistry"],
                   "realm_access": {"roles": ["otela-admin"]}}, settings)
    assert (who.team, who.admin) == ("chem", True)

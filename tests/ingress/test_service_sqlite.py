"""The public ingress service on a real SQLite file, through real otela processes and the
official ``openai`` client: keys, errors, usage rows, streams' usage, limits, the admin
API and revocation."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator

import httpx
import openai
import pytest

from otela.testing.localfed import (
    LocalFederation,
    LocalNode,
    echo_engine_command,
    free_port,
    wait_for,
)

pytestmark = pytest.mark.slow

MODEL = "echo-keys"
OTHER = "echo-other"
ADMIN = "admin-token-for-tests-0123456789"


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalNode, str]]:
    root = tmp_path_factory.mktemp("ingress-sqlite")
    federation = LocalFederation(root)
    db = root / "ingress.db"
    try:
        ingress = federation.start_node(
            "ingress", ingress=True, extra_args=["--ingress-db", str(db)],
            extra_env={"OTELA_ADMIN_TOKEN": ADMIN})
        with federation.together():
            nodes = {name: federation.start_node(
                name, bootstrap=[ingress], provider_id=provider,
                process=echo_engine_command(free_port(), [model]))
                for name, model, provider in (("server", MODEL, "prov-a"),
                                              ("other", OTHER, "prov-b"))}
        for name, node in nodes.items():
            wait_for(lambda n=node: ingress.states().get(n.session_id) == "SERVING", 20,
                     f"{name} to serve")
        yield ingress, str(db)
    finally:
        federation.close()


def admin(node: LocalNode, method: str, path: str, **kwargs: object) -> httpx.Response:
    headers = {"authorization": f"Bearer {ADMIN}", "content-type": "application/json"}
    return httpx.request(method, f"{node.http_url}/v1/admin{path}", trust_env=False,
                         timeout=10, headers=headers, **kwargs)  # type: ignore[arg-type]


def new_key(node: LocalNode, **spec: object) -> dict:
    created = admin(node, "POST", "/keys", json={"owner": "alice", **spec})
    assert created.status_code == 200, created.text
    return created.json()


def client(node: LocalNode, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{node.http_url}/v1", api_key=key, max_retries=0,
                         timeout=20, http_client=httpx.Client(trust_env=False))


def usage_rows(db: str, key_id: str) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT model, prompt_tokens, completion_tokens, status, provider, "
                            "node_session, stream FROM usage WHERE key_id = ? ORDER BY "
                            "finished_at", (key_id,)).fetchall()


def test_keys_are_required_and_wrong_ones_get_the_same_401(fed):
    ingress, _ = fed
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    for headers in ({}, {"authorization": "Bearer otela-nope"}, {"authorization": "Basic x"}):
        answer = httpx.post(f"{ingress.http_url}/v1/chat/completions", json=body,
                            headers=headers, trust_env=False, timeout=10)
        assert answer.status_code == 401
        assert answer.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        client(ingress, "otela-wrong").chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}])


def test_a_key_works_with_the_openai_client_and_every_request_is_counted(fed):
    ingress, db = fed
    key = new_key(ingress, name="first")
    assert key["key"].startswith("otela-") and key["status"] == "active"
    api = client(ingress, key["key"])
    answer = api.chat.completions.create(model=MODEL,
                                         messages=[{"role": "user", "content": "one two"}])
    assert answer.usage is not None
    chunks = list(api.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "three"}], stream=True))
    # the ingress asked the engine for usage; the client did not, so it sees no usage chunk
    assert chunks and all(c.usage is None for c in chunks)
    assert all(c.choices for c in chunks)
    wait_for(lambda: len(usage_rows(db, key["id"])) == 2, 5, "two usage rows")
    (model, prompt, completion, status, provider, session, stream), second = \
        usage_rows(db, key["id"])
    assert (model, status, provider, stream) == (MODEL, 200, "prov-a", 0)
    assert (prompt, completion) == (answer.usage.prompt_tokens,
                                    answer.usage.completion_tokens)
    assert session
    assert second[3] == 200 and second[6] == 1 and second[2] > 0  # the stream's tokens
    shown = admin(ingress, "GET", f"/keys/{key['id']}").json()
    assert shown["used_tokens"] == prompt + completion + second[1] + second[2]
    assert "key" not in shown and "secret_hash" not in shown


def test_a_stream_that_asked_for_usage_keeps_it(fed):
    ingress, _ = fed
    api = client(ingress, new_key(ingress)["key"])
    chunks = list(api.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], stream=True,
        stream_options={"include_usage": True}))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_model_allowlist_trust_set_and_budget(fed):
    ingress, _ = fed
    only = client(ingress, new_key(ingress, models=[MODEL])["key"])
    assert [m.id for m in only.models.list().data] == [MODEL]  # the catalog it may use
    assert {m.id for m in client(ingress, new_key(ingress)["key"]).models.list().data} \
        == {MODEL, OTHER}
    with pytest.raises(openai.AuthenticationError):
        client(ingress, "otela-wrong").models.list()
    with pytest.raises(openai.PermissionDeniedError) as denied:
        only.chat.completions.create(model=OTHER, messages=[{"role": "user", "content": "x"}])
    assert denied.value.code == "model_not_allowed"
    trusting_a = client(ingress, new_key(ingress, providers=["prov-a"])["key"])
    assert [m.id for m in trusting_a.models.list().data] == [MODEL]
    with pytest.raises(openai.APIStatusError) as untrusted:
        trusting_a.chat.completions.create(model=OTHER,
                                           messages=[{"role": "user", "content": "x"}])
    assert untrusted.value.status_code == 503
    assert untrusted.value.code == "no_trusted_node"
    assert "prov-b" not in untrusted.value.message
    budget = new_key(ingress, budget_tokens=5)
    capped = client(ingress, budget["key"])
    capped.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])

    def refused() -> bool:
        try:
            capped.chat.completions.create(model=MODEL,
                                           messages=[{"role": "user", "content": "x"}])
        except openai.PermissionDeniedError as exc:
            return exc.code == "budget_exceeded"
        return False
    wait_for(refused, 5, "the budget to be used up")


def test_request_rate_limit_answers_429_with_retry_after(fed):
    ingress, _ = fed
    key = new_key(ingress, rpm=18)["key"]  # holds 10 s of it: 3
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
    statuses = []
    for _ in range(4):
        answer = httpx.post(f"{ingress.http_url}/v1/chat/completions", json=body,
                            headers={"authorization": f"Bearer {key}"}, trust_env=False,
                            timeout=10)
        statuses.append(answer.status_code)
    assert statuses == [200, 200, 200, 429]
    assert int(answer.headers["retry-after"]) >= 1
    assert answer.json()["error"]["code"] == "rate_limit_exceeded"


def test_revoked_and_rotated_keys_stop_working(fed):
    ingress, _ = fed
    key = new_key(ingress)
    api = client(ingress, key["key"])
    api.models.list()
    api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    rotated = admin(ingress, "POST", f"/keys/{key['id']}/rotate").json()
    with pytest.raises(openai.AuthenticationError):
        api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    fresh = client(ingress, rotated["key"])
    fresh.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    assert admin(ingress, "POST", f"/keys/{key['id']}/revoke").json()["status"] == "revoked"
    with pytest.raises(openai.AuthenticationError):
        fresh.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])


def test_admin_api_refuses_bad_tokens_and_bad_input_and_writes_nothing(fed):
    ingress, db = fed
    with sqlite3.connect(db) as conn:
        before = conn.execute("SELECT COUNT(*) FROM api_keys").fetchone()[0]
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": ADMIN}):
        answer = httpx.get(f"{ingress.http_url}/v1/admin/keys", trust_env=False,
                           headers=headers)
        assert answer.status_code == 401
        assert answer.json()["error"]["code"] == "invalid_admin_token"
    bad_bodies = [b"not json", b"[]", b'{"owner": ""}', b'{"owner": 3}',
                  b'{"owner": "a", "rpm": -1}', b'{"owner": "a", "rpm": true}',
                  b'{"owner": "a", "models": []}', b'{"owner": "a", "surprise": 1}',
                  b'{"owner": "a", "expires_at": 1}', b'{"owner": "' + b"x" * 500 + b'"}',
                  b"{" * 10000]
    for body in bad_bodies:
        answer = admin(ingress, "POST", "/keys", content=body)
        assert 400 <= answer.status_code < 500, body[:40]
        assert "error" in answer.json()
    for path in ("/keys/key_000000000000", "/keys/nonsense", "/keys/../../etc"):
        assert admin(ingress, "GET", path).status_code == 404
    assert admin(ingress, "POST", "/keys/key_000000000000/revoke").status_code == 404
    assert admin(ingress, "GET", "/usage?by=colour").status_code == 400
    assert admin(ingress, "GET", "/usage?since=yesterday").status_code == 400
    backwards = admin(ingress, "GET", "/usage?since=2000&until=1000")  # as /v1/me/usage
    assert backwards.status_code == 400 and backwards.json()["error"]["param"] == "since"
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM api_keys").fetchone()[0] == before


def test_usage_report_and_me(fed):
    ingress, _ = fed
    key = new_key(ingress, name="reporter")
    api = client(ingress, key["key"])
    for _ in range(3):
        api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    headers = {"authorization": f"Bearer {key['key']}"}

    def my_requests() -> int:
        me = httpx.get(f"{ingress.http_url}/v1/me/usage", headers=headers, trust_env=False)
        return int(me.json()["totals"]["requests"])
    wait_for(lambda: my_requests() == 3, 5, "three requests in /v1/me/usage")
    me = httpx.get(f"{ingress.http_url}/v1/me", headers=headers, trust_env=False).json()
    assert me["id"] == key["id"] and me["used_tokens"] > 0
    by_key = {row["group"]: row for row in admin(ingress, "GET", "/usage?by=key").json()["data"]}
    assert by_key[key["id"]]["requests"] == 3
    by_model = admin(ingress, "GET", "/usage?by=model").json()["data"]
    assert MODEL in {row["group"] for row in by_model}
    metrics = httpx.get(f"{ingress.http_url}/metrics", trust_env=False,  # per-key: admin's
                        headers={"authorization": f"Bearer {ADMIN}"}).text
    assert f'otela_api_key_requests_total{{key="{key["id"]}",status="200"}} 3' in metrics
    assert f'otela_api_key_tokens_total{{key="{key["id"]}",kind="completion"}}' in metrics
    assert key["key"] not in metrics


def test_keys_of_single_sign_on_users_through_the_admin_api_and_me(fed):
    """A key given to a user (by email) through the admin API; unknown users are 400s
    that make nothing; the key holder's ``/v1/me`` names the user; its requests are the
    user's in the usage report and the request log, filtered by id or email."""
    from ingress.database import Database, DatabaseUrl
    from ingress.sso import users
    from ingress.sso.claims import Profile

    ingress, path = fed
    db = Database.connect(DatabaseUrl.parse(path))
    try:
        ann = users.record_sign_in(db, "https://sso.uni.example", Profile(
            "ann-sub", "ann@uni.example", "Ann", None, False), 1.0)
    finally:
        db.close()
    before = len(admin(ingress, "GET", "/keys").json()["data"])
    for user, code in (("eve@uni.example", "user_not_found"), ("", "invalid_request")):
        refused = admin(ingress, "POST", "/keys", json={"owner": "x", "user": user})
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["code"] == code
        assert refused.json()["error"]["param"] == "user"
    assert len(admin(ingress, "GET", "/keys").json()["data"]) == before
    key = new_key(ingress, name="ann's", user="ann@uni.example")
    assert key["user_id"] == ann.id and key["user"]["email"] == "ann@uni.example"
    unlinked = admin(ingress, "PATCH", f"/keys/{key['id']}", json={"user": None}).json()
    assert unlinked["user_id"] is None and unlinked["user"] is None
    relinked = admin(ingress, "PATCH", f"/keys/{key['id']}", json={"user": ann.id})
    assert relinked.status_code == 200 and relinked.json()["user"]["id"] == ann.id
    unknown = admin(ingress, "PATCH", f"/keys/{key['id']}", json={"user": "user_0123456789ab"})
    assert unknown.status_code == 400 and unknown.json()["error"]["code"] == "user_not_found"

    headers = {"authorization": f"Bearer {key['key']}"}
    wait_for(lambda: httpx.get(f"{ingress.http_url}/v1/me", headers=headers,
                               trust_env=False).json().get("user_id") == ann.id,
             5, "the relinked key in the ingress's cache")
    me = httpx.get(f"{ingress.http_url}/v1/me", headers=headers, trust_env=False).json()
    assert me["user"] == {"id": ann.id, "email": "ann@uni.example", "name": "Ann"}
    client(ingress, key["key"]).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}])

    def ann_requests() -> int:
        rows = admin(ingress, "GET", "/usage?by=user").json()["data"]
        return sum(r["requests"] for r in rows if r["group"] == ann.id)
    wait_for(lambda: ann_requests() == 1, 5, "the request counted as Ann's")
    row = next(r for r in admin(ingress, "GET", "/usage?by=user").json()["data"]
               if r["group"] == ann.id)
    assert row["label"] == "ann@uni.example"
    for who in (ann.id, "ann@uni.example"):
        logged = admin(ingress, "GET", f"/requests?user={who}").json()["data"]
        assert [(e["key_id"], e["user_id"]) for e in logged] == [(key["id"], ann.id)]
    nobody = admin(ingress, "GET", "/usage?user=eve@uni.example")
    assert nobody.status_code == 400 and nobody.json()["error"]["code"] == "user_not_found"


def test_a_teams_priority_caps_its_keys_class(fed):
    """A team's priority class and a key's: the tighter wins, and the answer says which
    class a request was served in."""
    ingress, _ = fed
    key = new_key(ingress, team="night-shift", priority="interactive")

    def served_in(asked: str) -> str:
        answer = httpx.post(f"{ingress.http_url}/v1/chat/completions", trust_env=False,
                            timeout=20, headers={"authorization": f"Bearer {key['key']}",
                                                 "x-otela-priority": asked},
                            json={"model": MODEL, "messages": [
                                {"role": "user", "content": "x"}]})
        assert answer.status_code == 200, answer.text
        return answer.headers["x-otela-priority"]
    assert served_in("interactive") == "interactive"  # the key's own class
    team = admin(ingress, "PUT", "/teams/night-shift", json={"priority": "batch"})
    assert team.status_code == 200 and team.json()["priority"] == "batch"
    assert served_in("interactive") == "batch"  # the team's is tighter
    assert served_in("batch") == "batch"
    admin(ingress, "PATCH", f"/keys/{key['id']}", json={"priority": None})
    wait_for(lambda: served_in("default") == "batch", 5, "the team's class without the key's")
    admin(ingress, "PUT", "/teams/night-shift", json={"priority": None})
    assert served_in("interactive") == "interactive"
    bad = admin(ingress, "PUT", "/teams/night-shift", json={"priority": "Not A Class"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "priority"


def test_data_path_workers_check_keys_and_count_usage(tmp_path):
    """With --workers, each data-path process runs the key gate and writes usage rows of its
    own; a key created, and a revocation made, through the control's admin API is in force
    on every worker when the call returns (not a refresh interval later)."""
    db = tmp_path / "workers.db"
    with LocalFederation(tmp_path) as federation:
        node = federation.start_node(
            "ingress", ingress=True, provider_id="prov-w",
            process=echo_engine_command(free_port(), [MODEL]),
            extra_args=["--ingress-db", str(db), "--workers", "2"],
            extra_env={"OTELA_ADMIN_TOKEN": ADMIN})
        wait_for(lambda: node.states().get(node.session_id) == "SERVING", 30, "serving")
        key = new_key(node, name="workers")
        with httpx.Client(trust_env=False, timeout=10) as http:  # new connections: both
            for _ in range(16):                                 # workers take some
                answer = http.post(f"{node.http_url}/v1/chat/completions",
                                   headers={"authorization": f"Bearer {key['key']}",
                                            "connection": "close"},
                                   json={"model": MODEL, "messages": [
                                       {"role": "user", "content": "x"}]})
                assert answer.status_code == 200, answer.text
        wait_for(lambda: len(usage_rows(str(db), key["id"])) == 16, 5, "16 usage rows")
        with sqlite3.connect(db) as conn:
            writers = {row[0] for row in conn.execute(
                "SELECT ingress FROM usage WHERE key_id = ?", (key["id"],))}
        assert writers and all(re.search(r"/w\d+$", w) for w in writers)
        assert admin(node, "POST", f"/keys/{key['id']}/revoke").status_code == 200
        for _ in range(16):
            refused = httpx.post(f"{node.http_url}/v1/chat/completions", trust_env=False,
                                 headers={"authorization": f"Bearer {key['key']}",
                                          "connection": "close"},
                                 json={"model": MODEL, "messages": []})
            assert refused.status_code == 401, refused.text


def _headers_only(node: LocalNode, authorization: str | None, length: int) -> tuple[bytes, float]:
    """Send a POST's headers announcing ``length`` body bytes and no body: the answer and
    how long it took (the server must answer without waiting for the body)."""
    import socket
    import time

    host, port = node.http_url.removeprefix("http://").split(":")
    auth = f"authorization: {authorization}\r\n" if authorization else ""
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
            f"\r\n{auth}content-length: {length}\r\n\r\n").encode()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        started = time.monotonic()
        sock.sendall(head)
        answer = b""
        while chunk := sock.recv(65536):  # the server closes after refusing
            answer += chunk
        return answer, time.monotonic() - started


def _rss_kib(node: LocalNode) -> int:
    status = open(f"/proc/{node.process.pid}/status").read()  # noqa: SIM115
    return int(next(line.split()[1] for line in status.splitlines()
                    if line.startswith("VmRSS:")))


def test_the_key_is_checked_before_the_body_is_read(fed):
    """A keyless 30 MB upload is refused from its headers: the answer comes at once, no body
    byte is read (16 of them used to take the ingress from 514 to 1,066 MiB), and a body that
    never comes holds nothing; a key over its rate is refused the same way."""
    ingress, _ = fed
    before = _rss_kib(ingress)
    for authorization in (None, "Bearer otela-wrong", "Basic eA=="):
        answer, took = _headers_only(ingress, authorization, 30 * 1024 * 1024)
        assert answer.startswith(b"HTTP/1.1 401 ") and b"invalid_api_key" in answer
        assert b"connection: close" in answer and took < 5
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda _: _headers_only(ingress, None, 30 * 1024 * 1024)[0],
                                range(16)))
    assert all(a.startswith(b"HTTP/1.1 401 ") for a in answers)
    assert _rss_kib(ingress) - before < 64 * 1024  # no 30 MB body was buffered
    key = new_key(ingress, rpm=6)["key"]  # holds 10 s of it: 1
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
    first = httpx.post(f"{ingress.http_url}/v1/chat/completions", json=body, timeout=10,
                       headers={"authorization": f"Bearer {key}"}, trust_env=False)
    assert first.status_code == 200
    answer, took = _headers_only(ingress, f"Bearer {key}", 1024 * 1024)
    assert answer.startswith(b"HTTP/1.1 429 ") and b"retry-after: " in answer.lower()
    # A key in good standing still sends its body after its headers, at its own pace.
    good = new_key(ingress)["key"]
    chunks = (part for part in (b'{"model": "' + MODEL.encode() + b'", ',
                                b'"messages": [{"role": "user", "content": "slow"}]}'))
    slow = httpx.post(f"{ingress.http_url}/v1/chat/completions", content=chunks, timeout=10,
                      headers={"authorization": f"Bearer {good}",
                               "content-type": "application/json"}, trust_env=False)
    assert slow.status_code == 200


def test_prices_spend_and_the_request_log(fed, tmp_path):
    """Prices set through the admin API price every request from then on, per provider or
    for all; usage groups by team with its spend; the request log pages and exports
    (through the API and the command line), and a key holder sees only their own."""
    ingress, db = fed
    bad = admin(ingress, "PUT", "/prices", json={"model": MODEL, "input_per_mtok": -1,
                                                 "output_per_mtok": 1})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input_per_mtok"
    assert admin(ingress, "DELETE", f"/prices?model={MODEL}").status_code == 404
    assert admin(ingress, "PUT", "/prices", json={
        "model": MODEL, "input_per_mtok": 1.5, "output_per_mtok": 6}).status_code == 200
    assert admin(ingress, "PUT", "/prices", json={
        "model": OTHER, "provider": "prov-b", "input_per_mtok": 10,
        "output_per_mtok": 20}).status_code == 200
    listed = admin(ingress, "GET", "/prices").json()["data"]
    assert {(p["model"], p["provider"]) for p in listed} == {(MODEL, None), (OTHER, "prov-b")}

    astro = new_key(ingress, owner="vera", team="astro-spend")
    solo = new_key(ingress, owner="otto")
    for model in (MODEL, MODEL, OTHER):
        client(ingress, astro["key"]).chat.completions.create(
            model=model, messages=[{"role": "user", "content": "price me"}])
    client(ingress, solo["key"]).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "mine"}])

    def rows_of(key_id: str) -> list[tuple]:
        with sqlite3.connect(db) as conn:
            return conn.execute("SELECT model, prompt_tokens, completion_tokens, spend, team "
                                "FROM usage WHERE key_id = ?", (key_id,)).fetchall()
    wait_for(lambda: len(rows_of(astro["id"])) == 3, 5, "three usage rows")
    rates = {MODEL: (1.5, 6.0), OTHER: (10.0, 20.0)}
    expected = 0.0
    for model, prompt, completion, spend, team in rows_of(astro["id"]):
        assert team == "astro-spend" and prompt > 0 and completion > 0
        assert spend == pytest.approx((prompt * rates[model][0]
                                       + completion * rates[model][1]) / 1e6)
        expected += spend
    by_team = {r["group"]: r for r in admin(
        ingress, "GET", "/usage?by=team&team=astro-spend").json()["data"]}
    assert list(by_team) == ["astro-spend"] and by_team["astro-spend"]["requests"] == 3
    assert by_team["astro-spend"]["spend"] == pytest.approx(expected)
    assert by_team["astro-spend"]["unpriced_requests"] == 0
    owners = {r["group"] for r in admin(ingress, "GET", "/usage?by=owner").json()["data"]}
    assert {"vera", "otto"} <= owners

    first = admin(ingress, "GET", "/requests?team=astro-spend&limit=2").json()
    assert len(first["data"]) == 2 and first["has_more"]
    rest = admin(ingress, "GET", f"/requests?team=astro-spend&after={first['last_id']}").json()
    assert len(rest["data"]) == 1 and not rest["has_more"]
    assert {e["model"] for e in first["data"] + rest["data"]} == {MODEL, OTHER}
    exported = admin(ingress, "GET", "/requests?team=astro-spend&format=csv")
    assert exported.headers["content-type"].startswith("text/csv")
    lines = exported.text.splitlines()
    assert len(lines) == 4 and lines[0].startswith("id,request_id,finished_at")
    bad_page = admin(ingress, "GET", "/requests?after=nope")
    assert bad_page.status_code == 400 and bad_page.json()["error"]["param"] == "after"
    mine = httpx.get(f"{ingress.http_url}/v1/me/requests", trust_env=False,
                     headers={"authorization": f"Bearer {solo['key']}"}).json()["data"]
    assert [e["key_id"] for e in mine] == [solo["id"]]

    out = tmp_path / "astro.jsonl"
    done = subprocess.run([sys.executable, "-m", "otela", "requests", "--db", db, "--team",
                           "astro-spend", "--format", "jsonl", "--output", str(out)],
                          capture_output=True, text=True, timeout=60, env=_cli_env(tmp_path))
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["key_id"] for line in out.read_text().splitlines()] == \
        [astro["id"]] * 3
    shown = subprocess.run([sys.executable, "-m", "otela", "usage", "--db", db, "--by", "team",
                            "--team", "astro-spend", "--format", "json"],
                           capture_output=True, text=True, timeout=60, env=_cli_env(tmp_path))
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["data"][0]["spend"] == pytest.approx(expected)


def _cli_env(tmp_path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTELA_")}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
    return env

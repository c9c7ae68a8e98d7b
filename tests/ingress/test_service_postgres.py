"""The ingress service on a real PostgreSQL server: the schema and queries in that dialect,
and two ingress nodes sharing one database (keys made on one work on the other, a
revocation reaches both within 5 s, a key's rate limit holds across both)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio

from ingress import keystore, prices, retention, usage
from ingress.access import Access
from ingress.database import Database, DatabaseUrl
from ingress.keystore import KeySpec
from ingress.migrations import LATEST, SchemaTooNew, migrate
from ingress.prices import Price
from ingress.service import IngressService
from otela.dataplane.exchange import Exchange, UsageTap
from otela.testing.localfed import (
    LocalFederation,
    LocalNode,
    echo_engine_command,
    free_port,
    wait_for,
)

pytestmark = pytest.mark.slow  # a PostgreSQL server and otela processes

MODEL = "echo-pg"
ADMIN = "postgres-admin-token-00000000000"


def test_schema_keys_and_usage_in_postgresql(postgres_db):
    db = Database.connect(DatabaseUrl.parse(postgres_db))
    assert migrate(db) == 0 and migrate(db) == LATEST
    made, secret = keystore.create(db, KeySpec(owner="a", models=frozenset({"m"}), tpm=10**12,
                                                rpm=2**61, budget_tokens=2**61))
    assert keystore.get(db, made.id) == made
    changed = keystore.update(db, made.id, {"rpm": 5, "models": None}, actor="t")
    assert keystore.get(db, made.id) == changed and changed.models is None
    assert [(c.action, c.changes) for c in keystore.history(db, made.id)][1] == (
        "update", {"rpm": [2**61, 5], "models": [["m"], None]})
    writer = usage.UsageWriter(db, "ingress-1")
    done = Exchange(route="/v1/chat/completions", request_id="r", model="m", status=200,
                    api_key=made.id)
    done.tap = UsageTap(False)
    done.tap.prompt_tokens, done.tap.completion_tokens = 4, 6
    writer.finished(done)
    trio.run(writer.flush)
    assert usage.used_tokens(db) == {made.id: 10}
    assert usage.aggregate(db, "model")[0].to_dict()["completion_tokens"] == 6
    hour = usage.buckets(db, time.time() - 3600, time.time() + 1, 600)
    assert sum(b["requests"] for b in hour) == 1
    # Prices, spend, grouping by team and owner and the request log in this dialect.
    prices.set_price(db, Price("m", "", 1.0, 2.0))
    prices.set_price(db, Price("m", "", 1.0, 3.0))  # an upsert, not a second row
    assert prices.price_list(db).spend("m", "any", 10**6, 10**6) == pytest.approx(4.0)
    teamed, _ = keystore.create(db, KeySpec(owner="ada", team="physics"))
    access = service_access(db)
    priced = usage.UsageWriter(db, "ingress-1", context=access)
    for _ in range(3):
        again = Exchange(route="/v1/chat/completions", request_id="r", model="m",
                         status=200, api_key=teamed.id)
        again.tap = UsageTap(False)
        again.tap.prompt_tokens, again.tap.completion_tokens = 100, 10
        priced.finished(again)
    trio.run(priced.flush)
    by_team = {t.group: t for t in usage.aggregate(db, "team")}
    assert by_team["physics"].spend == pytest.approx(3 * 130 / 1e6)
    assert by_team[None].unpriced == 1  # the row made before any price
    assert {t.group: t.requests for t in usage.aggregate(db, "owner")} == {"a": 1, "ada": 3}
    page, more = usage.request_log(db, filters={"team": "physics"}, limit=2)
    rest, done_paging = usage.request_log(db, filters={"team": "physics"}, limit=2,
                                          after=page[-1]["id"])
    assert more and not done_paging and len({e["id"] for e in page + rest}) == 3
    # Rolled up past a retention, by two connections at once: counted once, still counted.
    totals = [t.to_dict() for t in usage.aggregate(db, "team")]
    other = Database.connect(DatabaseUrl.parse(postgres_db))
    gone: list[int] = []
    racers = [threading.Thread(target=lambda d=d: gone.append(retention.roll_up(
        d, time.time() + 60))) for d in (db, other)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join()
    other.close()
    assert sorted(gone) == [0, 4] and usage.request_log(db)[0] == []
    assert [t.to_dict() for t in usage.aggregate(db, "team")] == totals
    assert usage.used_tokens(db) == {made.id: 10, teamed.id: 330}
    service = IngressService(db, "ingress-1")
    service.access.load()
    assert service.authenticate(f"Bearer {secret}".encode()).id == made.id
    keystore.revoke(db, made.id)
    with pytest.raises(keystore.KeyRevoked):
        keystore.rotate(db, made.id)
    db.run_sync("INSERT INTO otela_schema (version) VALUES (?)", (LATEST + 1,))
    with pytest.raises(SchemaTooNew):
        migrate(db)
    db.close()


def service_access(db: Database) -> Access:
    access = Access(db, "ingress-1")
    access.load()
    return access


@pytest.fixture
def pair(tmp_path, postgres_db) -> Iterator[tuple[LocalNode, LocalNode, str]]:
    args = ["--ingress-db", postgres_db]
    env = {"OTELA_ADMIN_TOKEN": ADMIN}
    with LocalFederation(tmp_path) as fed:
        first = fed.start_node("ingress-a", ingress=True, extra_args=args, extra_env=env)
        with fed.together():
            second = fed.start_node("ingress-b", ingress=True, extra_args=args,
                                    extra_env=env, bootstrap=[first])
            server = fed.start_node("server", bootstrap=[first], provider_id="prov-a",
                                    process=echo_engine_command(free_port(), [MODEL]))
        for ingress in (first, second):
            wait_for(lambda i=ingress: i.states().get(server.session_id) == "SERVING", 20,
                     f"{ingress.name} to see the server")
            # and the server them: its engine hop serves members only
            wait_for(lambda i=ingress: i.session_id in server.states(), 20,
                     f"the server to know {ingress.name}")
        yield first, second, postgres_db


def status(node: LocalNode, key: str) -> int:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
    return httpx.post(f"{node.http_url}/v1/chat/completions", json=body, timeout=10,
                      trust_env=False, headers={"authorization": f"Bearer {key}"}).status_code


def _requests_of(db: str, key_id: str) -> int:
    import psycopg
    with psycopg.connect(db) as conn:
        row = conn.execute("SELECT COUNT(*) FROM usage WHERE key_id = %s", (key_id,)).fetchone()
    return int(row[0]) if row else 0


def otela(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "otela", *args], capture_output=True,
                          text=True, timeout=60)


def test_two_ingress_nodes_share_keys_revocations_and_usage(pair):
    first, second, db = pair
    made = httpx.post(f"{first.http_url}/v1/admin/keys", json={"owner": "shared"},
                      headers={"authorization": f"Bearer {ADMIN}"}, trust_env=False).json()
    counted = 0  # requests the key was accepted for: each must leave one usage row

    def accepted(node: LocalNode) -> int:
        nonlocal counted
        code = status(node, made["key"])
        counted += code != 401  # (an ingress that does not know the key yet counts nothing)
        return code

    assert accepted(first) == 200
    wait_for(lambda: accepted(second) == 200, 5, "the other ingress to know it")
    # Text PostgreSQL refuses (NUL) in a usage row must not hold the other rows back.
    hostile = httpx.post(f"{first.http_url}/v1/chat/completions", trust_env=False,
                         json={"model": "evil\u0000model", "messages": []},
                         headers={"authorization": f"Bearer {made['key']}"})
    assert hostile.status_code == 404
    counted += 1
    assert accepted(first) == 200
    wait_for(lambda: _requests_of(db, made["id"]) == counted, 5, "every request's usage row")
    revoked = otela("keys", "revoke", made["id"], "--db", db, "--json")
    assert revoked.returncode == 0, revoked.stderr
    assert json.loads(revoked.stdout)["status"] == "revoked"
    started = time.monotonic()
    for ingress in (first, second):
        wait_for(lambda i=ingress: status(i, made["key"]) == 401, 5,
                 f"{ingress.name} to refuse the revoked key")
    assert time.monotonic() - started < 5
    report = otela("usage", "--db", db, "--by", "ingress", "--format", "json")
    assert report.returncode == 0, report.stderr
    groups = {row["group"]: row["requests"] for row in json.loads(report.stdout)["data"]}
    assert len(groups) == 2 and all(n >= 1 for n in groups.values())


def test_a_keys_rate_limit_holds_across_two_ingress_nodes(pair):
    """Clients hammer both nodes with one key for 10 s: together they are admitted what
    one bucket would admit (its 10 s burst plus the rate), within 10 %."""
    first, second, _ = pair
    rpm = 600
    made = httpx.post(f"{first.http_url}/v1/admin/keys", json={"owner": "fast", "rpm": rpm},
                      headers={"authorization": f"Bearer {ADMIN}"}, trust_env=False).json()
    wait_for(lambda: status(second, made["key"]) == 200, 5, "the other ingress to know it")
    admitted = [1, 0]  # the probe above was one
    refused = [0, 0]
    duration = 10.0
    started = time.monotonic()

    def hammer(index: int, node: LocalNode) -> None:
        with httpx.Client(trust_env=False, timeout=10) as client:
            body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
            while time.monotonic() - started < duration:
                code = client.post(f"{node.http_url}/v1/chat/completions", json=body,
                                   headers={"authorization": f"Bearer {made['key']}"}
                                   ).status_code
                if code == 200:
                    admitted[index] += 1
                else:
                    assert code == 429
                    refused[index] += 1

    threads = [threading.Thread(target=hammer, args=(i, n))
               for i, n in enumerate((first, second))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    ideal = rpm * 10 / 60 + rpm / 60 * elapsed
    total = sum(admitted)
    assert all(n > 0 for n in admitted) and sum(refused) > total  # both served, both limited
    assert 0.9 * ideal <= total <= 1.1 * ideal, (total, ideal, admitted)


def test_a_dropped_connection_is_opened_again_and_no_usage_is_lost(postgres_db):
    import psycopg

    db = Database.connect(DatabaseUrl.parse(postgres_db))
    migrate(db)
    writer = usage.UsageWriter(db, "ingress-1", flush_interval=0.01)

    def done(request_id: str) -> Exchange:
        finished = Exchange(route="/v1/chat/completions", request_id=request_id, model="m",
                            status=200)
        finished.tap = UsageTap(False)
        return finished

    writer.finished(done("before"))
    trio.run(writer.flush)
    with psycopg.connect(postgres_db, autocommit=True) as admin:  # the server drops us
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                      "WHERE datname = current_database() AND pid <> pg_backend_pid()")
    writer.finished(done("after"))
    trio.run(writer.flush)  # fails on the dead connection; the rows are kept
    trio.run(writer.flush)  # a new connection: written
    rows = db.query_sync("SELECT request_id FROM usage ORDER BY request_id")
    assert [r[0] for r in rows] == ["after", "before"] and writer.pending() == 0
    db.close()


def test_health_names_the_backend_not_the_server(tmp_path: Path, postgres_db: str) -> None:
    """``/v1/health`` said ``postgresql://user:***@host:port/db``: now the kind only, to
    the admin too, and whether the database answers."""
    from urllib.parse import urlsplit

    where = urlsplit(postgres_db)
    with LocalFederation(tmp_path) as fed:
        node = fed.start_node("ingress", ingress=True, extra_args=["--ingress-db", postgres_db],
                              extra_env={"OTELA_ADMIN_TOKEN": ADMIN})
        answer = httpx.get(f"{node.http_url}/v1/health", trust_env=False, timeout=10,
                           headers={"authorization": f"Bearer {ADMIN}"})
    service = answer.json()["ingress_service"]
    assert service["database"] == "postgresql" and service["database_status"] == "ok"
    text = answer.text
    assert "postgresql://" not in text and where.path.strip("/") not in text
    if where.hostname and where.port:
        assert f"{where.hostname}:{where.port}" not in text
    if where.username:
        assert f"{where.username}@" not in text and f"{where.username}:" not in text


def test_a_teams_budget_holds_across_two_ingress_nodes(pair):
    """A team's daily token budget, its two keys hammering one ingress each (two clients
    per ingress): the ingress nodes admit only from their leases of the budget, taken
    through the database, so together they overshoot it by less than one request's
    reservation (its ``max_tokens`` plus its body's length), and then both refuse with
    403 budget_exceeded. (Before leases: 468 of 400.)"""
    import psycopg

    first, second, db = pair
    budget = 400
    admin = {"authorization": f"Bearer {ADMIN}"}
    team = httpx.put(f"{first.http_url}/v1/admin/teams/pg-team", headers=admin,
                     trust_env=False, json={"budget_tokens": budget, "budget_period": "day"})
    assert team.status_code == 200, team.text
    keys = [httpx.post(f"{first.http_url}/v1/admin/keys", headers=admin, trust_env=False,
                       json={"owner": f"member-{i}", "team": "pg-team"}).json()
            for i in range(2)]
    for key, node in zip(keys, (first, second), strict=True):
        wait_for(lambda k=key, n=node: httpx.get(
            f"{n.http_url}/v1/me", trust_env=False,
            headers={"authorization": f"Bearer {k['key']}"}).status_code == 200, 5,
            f"{node.name} to know the key")
    codes: list[int] = []
    last_429: dict[str, str] = {}
    body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}
    reservation = 4 + len(httpx.Request("POST", first.http_url, json=body).content)
    # An account's first budgeted request on an ingress has no lease there yet: it waits
    # for the take (milliseconds), it is not refused.
    for key, node in zip(keys, (first, second), strict=True):
        answer = httpx.post(f"{node.http_url}/v1/chat/completions", json=body,
                            trust_env=False, timeout=10,
                            headers={"authorization": f"Bearer {key['key']}"})
        assert answer.status_code == 200, answer.text

    def hammer(key: dict, node: LocalNode) -> None:
        with httpx.Client(trust_env=False, timeout=10) as client:
            deadline = time.monotonic() + 30
            refusals = 0
            while time.monotonic() < deadline and refusals < 5:
                answer = client.post(f"{node.http_url}/v1/chat/completions", json=body,
                                     headers={"authorization": f"Bearer {key['key']}"})
                code = answer.status_code
                codes.append(code)
                if code == 429:
                    last_429[node.name] = answer.text
                refusals += code == 403
                if code == 429:  # a lease being taken: a client that retries, gently
                    time.sleep(0.02)

    threads = [threading.Thread(target=hammer, args=(k, n))
               for k, n in zip(keys, (first, second), strict=True) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with psycopg.connect(db) as conn:
        shares = conn.execute("SELECT * FROM budget_windows").fetchall(), conn.execute(
            "SELECT * FROM budget_leases").fetchall(), conn.execute(
            "SELECT SUM(prompt_tokens + completion_tokens), COUNT(*) FROM usage WHERE "
            "team = 'pg-team'").fetchall()
    assert set(codes) <= {200, 403, 429} and 403 in codes, (sorted(set(codes)), shares, last_429)
    with psycopg.connect(db) as conn:
        rows = conn.execute(
            "SELECT finished_at, prompt_tokens + completion_tokens, ingress FROM usage "
            "WHERE team = 'pg-team' AND status = 200 ORDER BY finished_at").fetchall()
    used = 0
    ran_out = None
    for finished_at, tokens, _ in rows:
        used += tokens
        if ran_out is None and used >= budget:
            ran_out = finished_at
    assert ran_out is not None and len({ingress for _, _, ingress in rows}) == 2
    print(f"team budget {budget}: {used} used, one request's reservation {reservation}")
    assert budget <= used < budget + reservation, (used, reservation)
    late = [finished_at - ran_out for finished_at, _, _ in rows if finished_at > ran_out]
    assert max(late, default=0.0) < 2.0, late  # a refresh (1 s) and the requests in flight
    for key, node in zip(keys, (first, second), strict=True):
        answer = httpx.post(f"{node.http_url}/v1/chat/completions", trust_env=False,
                            headers={"authorization": f"Bearer {key['key']}"},
                            json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
        assert answer.status_code == 403
        assert "Team pg-team's daily token budget" in answer.json()["error"]["message"]


def test_budget_leases_on_postgresql_hand_out_no_more_than_the_rest(postgres_db):
    """Takes from four connections at once hand out the budget and at most one need more
    (the window's row is locked); a share its ingress stopped renewing is taken back once
    it expires; a share given back is free again."""
    from ingress import leases
    from ingress.budgets import Budget, Spent

    url = DatabaseUrl.parse(postgres_db)
    db = Database.connect(url)
    migrate(db)
    budget, account = Budget(tokens=10_000), ("team", "t")
    granted: list[int] = []

    def taker(name: str) -> None:
        mine = Database.connect(url)
        while (got := leases.take(mine, name, account, budget, 0.0, Spent(50),
                                  time.time())) is not None:
            granted.append(got.tokens)
        mine.close()

    racers = [threading.Thread(target=taker, args=(f"ingress-{i}",)) for i in range(4)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join()
    assert 10_000 <= sum(granted) < 10_000 + 50 and len(granted) > 4
    # A share that is not renewed is taken back, less its ingress's use (none here).
    lapsed = ("key", "k")
    assert leases.take(db, "dead", lapsed, budget, 0.0, Spent(10), time.time(),
                       ttl=0.3) == Spent(2500, 0.0)
    assert leases.take(db, "alive", lapsed, budget, 0.0, Spent(0), time.time()) == \
        Spent(1875, 0.0)
    expires = db.query_sync("SELECT expires_at FROM budget_leases WHERE ingress = 'dead'")
    wait_for(lambda: db.now() > expires[0][0], 5, "the dead ingress's share to expire")
    assert leases.take(db, "alive", lapsed, budget, 0.0, Spent(0), time.time()) == \
        Spent(2032, 0.0)  # a quarter of 10,000 - 1,875
    assert db.query_sync("SELECT ingress, tokens FROM budget_leases WHERE name = 'k'") == [
        ("alive", 3907)]
    leases.give_back(db, "alive", lapsed, "lifetime", 0.0, Spent(3907))
    assert db.query_sync("SELECT tokens FROM budget_windows WHERE name = 'k'") == [(0,)]
    db.close()

"""Prices, spend and the request log on real SQLite files: a price per provider or for
all, each row priced when it is made, usage grouped and filtered by team and owner, the
log paged by keyset and exported without formulas, and a database from before prices
migrated with every row kept."""

from __future__ import annotations

import csv
import io
import sqlite3
from pathlib import Path

import orjson
import pytest
import trio

from ingress import export, keystore, prices, usage
from ingress.access import Access
from ingress.admin_input import price, usage_filters
from ingress.database import Database, DatabaseUrl
from ingress.keystore import KeySpec
from ingress.migrations import LATEST, MIGRATIONS, migrate
from ingress.prices import Price, PriceList
from otela.dataplane.errors import RequestError
from otela.dataplane.exchange import Exchange, UsageTap


def sqlite(path: Path) -> Database:
    db = Database.connect(DatabaseUrl.parse(str(path)))
    migrate(db)
    return db


def done(key_id: str | None, model: str, provider: str, tokens: tuple[int, int],
         status: int = 200, arrival: float = 1000.0) -> Exchange:
    exchange = Exchange(route="/v1/chat/completions", request_id="r", model=model,
                        status=status, node_peer="peer-1", node_provider=provider,
                        api_key=key_id)
    exchange.arrival = arrival
    exchange.tap = UsageTap(False)
    exchange.tap.prompt_tokens, exchange.tap.completion_tokens = tokens
    return exchange


def test_a_providers_own_price_wins_over_the_models_price_for_all():
    listed = PriceList([Price("m", "", 1.0, 2.0), Price("m", "cloud", 3.0, 6.0)])
    assert listed.spend("m", "uni", 1_000_000, 500_000) == pytest.approx(2.0)
    assert listed.spend("m", "cloud", 1_000_000, 500_000) == pytest.approx(6.0)
    assert listed.spend("other", "uni", 10, 10) is None  # no price: not a free model
    assert PriceList().spend("m", "uni", 1, 1) is None


@pytest.mark.parametrize("body", [
    {"model": "", "input_per_mtok": 1, "output_per_mtok": 1},
    {"model": "m", "input_per_mtok": -1, "output_per_mtok": 1},
    {"model": "m", "input_per_mtok": float("nan"), "output_per_mtok": 1},
    {"model": "m", "input_per_mtok": True, "output_per_mtok": 1},
    {"model": "m", "input_per_mtok": "1", "output_per_mtok": 1},
    {"model": "m", "input_per_mtok": 1},
    {"model": "m", "provider": 3, "input_per_mtok": 1, "output_per_mtok": 1},
    {"model": "m", "input_per_mtok": 1, "output_per_mtok": 1, "currency": "EUR"},
])
def test_bad_prices_are_400s_naming_the_field(body):
    with pytest.raises(RequestError) as caught:
        price(body)
    assert caught.value.status == 400 and caught.value.param


def test_rows_are_priced_when_made_and_a_later_price_does_not_rewrite_them(tmp_path):
    db = sqlite(tmp_path / "p.db")
    made, _ = keystore.create(db, KeySpec(owner="ada", team="physics"))
    other, _ = keystore.create(db, KeySpec(owner="bob"))
    prices.set_price(db, Price("m", "", 1.0, 2.0))
    access = Access(db, "ingress-1")
    access.load()
    writer = usage.UsageWriter(db, "ingress-1", context=access)
    writer.finished(done(made.id, "m", "uni", (1000, 500)))
    writer.finished(done(other.id, "m", "uni", (2000, 0)))
    writer.finished(done(made.id, "unpriced-model", "uni", (10, 10)))
    writer.finished(done(made.id, "unpriced-model", "uni", (0, 0), status=429))
    trio.run(writer.flush)
    prices.set_price(db, Price("m", "", 100.0, 100.0))  # from now on only

    by_team = {t.group: t for t in usage.aggregate(db, "team")}
    assert by_team["physics"].spend == pytest.approx(0.002)  # 1000 x 1 + 500 x 2, per M
    assert by_team["physics"].unpriced == 1  # the refusal used no tokens: not unpriced
    assert by_team[None].spend == pytest.approx(0.002) and by_team[None].requests == 1
    by_owner = {t.group: t.requests for t in usage.aggregate(db, "owner")}
    assert by_owner == {"ada": 3, "bob": 1}
    only_m = usage.aggregate(db, "key", filters={"model": "m", "team": "physics"})
    assert [(t.group, t.requests) for t in only_m] == [(made.id, 1)]
    assert usage.aggregate(db, "key", filters={"status": 429})[0].requests == 1


def test_the_request_log_pages_by_keyset_newest_first(tmp_path):
    db = sqlite(tmp_path / "log.db")
    writer = usage.UsageWriter(db, "ingress-1")
    for i in range(7):
        writer.finished(done("key_a" if i % 2 else "key_b", "m", "uni", (i, i),
                             arrival=1000.0 + (i // 2)))  # ties in time: ids order them
    trio.run(writer.flush)
    seen: list[str] = []
    after = None
    while True:
        entries, more = usage.request_log(db, limit=3, after=after)
        seen += [e["id"] for e in entries]
        if not more:
            break
        after = entries[-1]["id"]
    everything, more = usage.request_log(db, limit=100)
    assert not more and seen == [e["id"] for e in everything] and len(seen) == 7
    times = [(e["finished_at"], e["id"]) for e in everything]
    assert times == sorted(times, reverse=True)
    mine, _ = usage.request_log(db, key_id="key_a")
    assert {e["key_id"] for e in mine} == {"key_a"} and len(mine) == 3
    assert everything[0]["prompt"] is None and everything[0]["object"] == "request"
    with pytest.raises(ValueError, match="after"):
        usage.request_log(db, after="no-such-row")


def test_exports_are_whole_rows_and_never_formulas(tmp_path):
    db = sqlite(tmp_path / "x.db")
    writer = usage.UsageWriter(db, "ingress-1")
    writer.finished(done("key_a", "=HYPERLINK(\"http://x\")", "uni", (1, 2)))
    writer.finished(done("key_a", "m", "uni", (3, 4)))
    trio.run(writer.flush)
    entries, _ = usage.request_log(db)
    rows = list(csv.DictReader(io.StringIO(export.render(entries, "csv", True).decode())))
    by_model = {r["model"]: r for r in rows}  # two rows of one flush: either may be newer
    assert set(by_model) == {"m", "'=HYPERLINK(\"http://x\")"}
    assert by_model["m"]["prompt_tokens"] == "3" and set(rows[0]) == set(usage.LOG_COLUMNS)
    lines = export.render(entries, "jsonl", False).splitlines()
    assert {orjson.loads(line)["model"] for line in lines} == {"m", "=HYPERLINK(\"http://x\")"}


def test_filters_are_checked():
    assert usage_filters({"team": "t", "status": "200", "model": ""}) == {
        "team": "t", "status": 200}
    for bad in ({"status": "abc"}, {"status": "99"}, {"model": "x" * 600}):
        with pytest.raises(RequestError):
            usage_filters(bad)


def test_a_database_from_before_prices_keeps_every_key_and_row(tmp_path):
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE otela_schema (version INTEGER NOT NULL)")
    for version, statements in enumerate(MIGRATIONS[:5], start=1):
        for statement in statements:
            conn.execute(statement)
        conn.execute("INSERT INTO otela_schema (version) VALUES (?)", (version,))
    conn.execute("INSERT INTO api_keys (id, secret_hash, owner, created_at, updated_at, team) "
                 "VALUES ('key_000000000001', 'h', 'ada', 1, 1, 'physics')")
    conn.execute("INSERT INTO usage (id, request_id, key_id, model, route, provider, "
                 "node_peer, node_session, prompt_tokens, completion_tokens, status, stream, "
                 "latency_ms, started_at, finished_at, ingress, recorded_at) VALUES "
                 "('u1', 'r', 'key_000000000001', 'm', '/v1/chat/completions', 'p', 'n', "
                 "'s', 5, 6, 200, 0, 1.0, 10, 11, 'i', 11)")
    conn.commit()
    conn.close()
    db = Database.connect(DatabaseUrl.parse(str(path)))
    assert migrate(db) == 5 and LATEST >= 6
    totals = usage.aggregate(db, "owner")
    assert [(t.group, t.requests, t.prompt_tokens, t.unpriced) for t in totals] == [
        ("ada", 1, 5, 1)]  # an old row has no spend: unpriced, not free
    assert keystore.get(db, "key_000000000001").team == "physics"


def test_prompts_are_kept_only_where_the_operator_opted_in(tmp_path):
    db = sqlite(tmp_path / "prompts.db")
    for opted_in in (False, True):
        writer = usage.UsageWriter(db, f"ingress-{opted_in}", log_prompts=opted_in)
        exchange = done("key_a", "m", "uni", (1, 1))
        exchange.prompt = "secret plans\x00" + "x" * (usage.MAX_PROMPT + 10)
        writer.finished(exchange)
        trio.run(writer.flush)
    entries, _ = usage.request_log(db)
    kept = {e["ingress"]: e["prompt"] for e in entries}
    assert kept["ingress-False"] is None
    assert kept["ingress-True"].startswith("secret plans\ufffd")
    assert len(kept["ingress-True"]) == usage.MAX_PROMPT


def test_rows_past_the_retention_become_daily_totals_that_still_count(tmp_path):
    """Rolled up, the old rows leave the request log, but usage reports, budgets and
    lifetime totals count them as before; a second roll-up adds nothing."""
    from ingress import retention

    db = sqlite(tmp_path / "keep.db")
    made, _ = keystore.create(db, KeySpec(owner="ada", team="physics", budget_tokens=10**6))
    prices.set_price(db, Price("m", "", 1.0, 1.0))
    access = Access(db, "ingress-1")
    access.load()
    writer = usage.UsageWriter(db, "ingress-1", context=access)
    day = 86400.0
    for days_ago, tokens, status in ((40, (100, 50), 200), (40, (10, 0), 429),
                                     (35, (7, 3), 200), (1, (1, 1), 200)):
        writer.finished(done(made.id, "m", "uni", tokens, status=status,
                             arrival=1_800_000_000.0 - days_ago * day))
    trio.run(writer.flush)
    before = {by: [t.to_dict() for t in usage.aggregate(db, by)]
              for by in ("key", "team", "owner", "model", "status")}
    lifetime = usage.used_tokens(db, [made.id])[made.id]
    assert retention.roll_up(db, 1_800_000_000.0 - 30 * day) == 3
    assert retention.roll_up(db, 1_800_000_000.0 - 30 * day) == 0
    entries, _ = usage.request_log(db)
    assert len(entries) == 1  # the request log keeps what is within the retention
    after = {by: [t.to_dict() for t in usage.aggregate(db, by)] for by in before}
    assert after == before  # means too: latency and TTFT sums are rolled up with counts
    assert usage.used_tokens(db, [made.id])[made.id] == lifetime == 172
    reloaded = Access(db, "ingress-2")
    reloaded.load()
    assert reloaded.used(made.id) == lifetime
    by_node = {t.group for t in usage.aggregate(db, "node")}
    assert by_node == {None, "peer-1"}  # a day's totals keep no node


def test_a_retention_is_at_least_a_day():
    from otela.config.values import as_opt_retention

    assert as_opt_retention("90d") == 90 * 86400 and as_opt_retention(None) is None
    assert as_opt_retention("off") is None
    with pytest.raises(ValueError, match="at least a day"):
        as_opt_retention("6h")

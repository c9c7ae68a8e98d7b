"""The ingress service's pure parts: key checks, limits, the usage-chunk filter, operator
input; and its database parts on real SQLite files (migrations, keys, usage rows)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import orjson
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from ingress import keystore, usage
from ingress.access import _LOOKBACK_S, Access
from ingress.admin_input import bucket_seconds, key_spec, time_param
from ingress.database import Database, DatabaseError, DatabaseUrl
from ingress.keys import ApiKey, bearer, check, hash_secret
from ingress.keystore import KeySpec
from ingress.limits import KeyLimits, TokenBucket, limits_for
from ingress.migrations import LATEST, SchemaTooNew, migrate
from otela.dataplane.errors import RequestError
from otela.dataplane.exchange import Exchange, UsageTap
from otela.dataplane.sse_usage import UsageChunkFilter, ask_for_usage

NOW = 1_800_000_000.0


def key(**fields: object) -> ApiKey:
    return ApiKey(**{"id": "key_000000000001", "secret_hash": "h", "owner": "o",  # type: ignore[arg-type]
                     **fields})


# -- keys ----------------------------------------------------------------------------------

def test_wrong_revoked_and_expired_keys_get_the_same_401():
    errors = []
    for candidate in (None, key(revoked_at=NOW - 1), key(expires_at=NOW)):
        with pytest.raises(RequestError) as caught:
            check(candidate, "m", NOW, 0)
        errors.append((caught.value.status, caught.value.code, caught.value.message))
    assert len(set(errors)) == 1 and errors[0][:2] == (401, "invalid_api_key")


def test_model_allowlist_and_budget_are_403():
    with pytest.raises(RequestError) as caught:
        check(key(models=frozenset({"a"})), "b", NOW, 0)
    assert (caught.value.status, caught.value.code) == (403, "model_not_allowed")
    check(key(models=frozenset({"a"})), "a", NOW, 0)
    with pytest.raises(RequestError) as caught:
        check(key(budget_tokens=10), "a", NOW, 10)
    assert (caught.value.status, caught.value.code) == (403, "budget_exceeded")
    check(key(budget_tokens=10), "a", NOW, 9)


def test_bearer_reads_only_bearer_tokens():
    assert bearer(b"Bearer abc") == b"abc"
    assert bearer(b"bearer   abc ") == b"abc"
    for value in (None, b"", b"Bearer", b"Bearer  ", b"Basic abc", b"abc"):
        assert bearer(value) is None


# -- limits --------------------------------------------------------------------------------

def test_request_bucket_allows_a_ten_second_burst_then_refills():
    limits = limits_for(rpm=60, tpm=None, max_concurrent=None)
    for _ in range(10):
        limits.admit(0.0)
        limits.finished(0, 0.0)
    with pytest.raises(RequestError) as caught:
        limits.admit(0.0)
    assert caught.value.status == 429 and caught.value.headers["Retry-After"] == "1"
    limits.admit(1.0)  # one request per second comes back


def test_tokens_are_charged_after_the_answer_and_may_overdraw():
    limits = limits_for(rpm=None, tpm=600, max_concurrent=None)  # holds 100
    limits.admit(0.0)
    limits.finished(400, 0.0)  # one long answer: 300 over
    with pytest.raises(RequestError) as caught:
        limits.admit(15.0)  # refilled 150 of the 300 owed
    assert caught.value.code == "token_rate_limit_exceeded"
    assert int(caught.value.headers["Retry-After"]) == 16  # past 15 s more: above zero
    limits.admit(30.001)


def test_concurrency_limit_and_charges_from_elsewhere():
    limits = limits_for(rpm=60, tpm=None, max_concurrent=2)  # holds 10
    limits.admit(0.0)
    limits.admit(0.0)
    with pytest.raises(RequestError) as caught:
        limits.admit(0.0)
    assert caught.value.code == "concurrency_limit_exceeded"
    limits.finished(0, 0.0)
    limits.charge(7, 0, 0.0)  # another ingress served seven for this key
    limits.admit(0.0)
    with pytest.raises(RequestError):
        limits.admit(0.0)


@given(st.lists(st.tuples(st.floats(0, 5), st.integers(0, 3)), max_size=200))
def test_a_bucket_never_admits_more_than_burst_plus_refill(steps):
    bucket = TokenBucket(30.0)
    limits = KeyLimits(bucket, None, None)
    now, admitted = 0.0, 0
    for gap, tries in steps:
        now += gap
        for _ in range(tries):
            try:
                limits.admit(now)
                admitted += 1
            except RequestError:
                pass
    assert admitted <= bucket.capacity + now * 30 / 60 + 1e-6


# -- streams' usage ------------------------------------------------------------------------

def sse(*payloads: dict | str) -> bytes:
    return b"".join(b"data: " + (p.encode() if isinstance(p, str) else orjson.dumps(p))
                    + b"\n\n" for p in payloads)


CONTENT = {"choices": [{"index": 0, "delta": {"content": "hi"}}]}
USAGE = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}


def test_ask_for_usage_only_when_the_client_did_not():
    chat = "/v1/chat/completions"
    body = {"stream": True}
    assert ask_for_usage(body, chat) and body["stream_options"] == {"include_usage": True}
    assert not ask_for_usage({"stream": True, "stream_options": {"include_usage": True}}, chat)
    assert not ask_for_usage({"stream": False}, chat)
    assert not ask_for_usage({"stream": True, "stream_options": "bad"}, chat)
    kept = {"stream": True, "stream_options": {"continuous_usage_stats": False}}
    assert ask_for_usage(kept, "/v1/completions")
    assert kept["stream_options"] == {"continuous_usage_stats": False, "include_usage": True}


def test_streams_that_always_report_usage_are_not_asked():
    """The Responses and Messages APIs say their usage in their own events: their bodies go
    on as sent (vLLM's Messages API has no ``stream_options``)."""
    for route in ("/v1/responses", "/v1/messages", "/v1/embeddings"):
        body = {"stream": True, "model": "m"}
        assert not ask_for_usage(body, route)
        assert body == {"stream": True, "model": "m"}


@given(st.lists(st.integers(1, 40), max_size=30))
def test_the_usage_chunk_is_removed_however_the_stream_is_cut(cuts):
    stream = sse(CONTENT, CONTENT, USAGE, "[DONE]")
    want = sse(CONTENT, CONTENT, "[DONE]")
    pieces, at = [], 0
    for cut in cuts:
        pieces.append(stream[at:at + cut])
        at += cut
    pieces.append(stream[at:])
    hide = UsageChunkFilter()
    out = b"".join(hide.feed(p) for p in pieces) + hide.end()
    assert out == want and hide.removed == 1


def test_the_filter_keeps_usage_inside_content_chunks_and_crlf_events():
    with_both = {**CONTENT, "usage": {"prompt_tokens": 1}}
    stream = sse(with_both).replace(b"\n\n", b"\r\n\r\n") + sse(USAGE)
    hide = UsageChunkFilter()
    assert hide.feed(stream) + hide.end() == sse(with_both).replace(b"\n\n", b"\r\n\r\n")


# -- operator input ------------------------------------------------------------------------

def test_key_spec_reads_and_checks_fields():
    spec = key_spec({"owner": "alice", "models": "a, b", "rpm": 5, "expires_in": 60}, NOW)
    assert spec == KeySpec(owner="alice", models=frozenset({"a", "b"}), rpm=5,
                           expires_at=NOW + 60)
    for bad in ({}, {"owner": "a\x00"}, {"owner": "a", "tpm": 0}, {"owner": "a", "x": 1},
                {"owner": "a", "providers": [""]}, {"owner": "a", "budget_tokens": 1.5},
                {"owner": "a", "expires_in": 5, "expires_at": NOW + 9},
                # beyond the year 9999: `otela keys list` could not format it (fuzzing)
                {"owner": "a", "expires_at": 1e308}, {"owner": "a", "expires_in": 2**61}):
        with pytest.raises(RequestError) as caught:
            key_spec(bad, NOW)
        assert caught.value.status == 400


def test_times_and_buckets():
    assert time_param("1700000000", "since") == 1_700_000_000
    assert time_param("2026-01-01T00:00:00", "since") == 1767225600
    with pytest.raises(RequestError):
        time_param("soon", "since")
    assert bucket_seconds(None, 0, 6000) == 100
    with pytest.raises(RequestError):
        bucket_seconds("0.5", 0, 10)


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "Infinity", "1e308", "-1e308",
                                   "1e309", "9999-12-31T23:59:59-14:00",
                                   "0001-01-01T00:00:00+14:00"])
def test_times_that_float_or_datetime_read_but_no_window_can_use_are_a_400(value):
    # ?until=nan made /v1/me/usage count int(nan) buckets: a 500 (found by fuzzing).
    with pytest.raises(RequestError) as caught:
        time_param(value, "until")
    assert caught.value.status == 400 and caught.value.param == "until"
    assert time_param("0001-01-01", "since") == -62135596800
    assert time_param("9999-12-31", "until") == 253402214400


@pytest.mark.parametrize("value", ["inf", "nan", "1e300"])
def test_an_endless_bucket_is_a_400(value):
    with pytest.raises(RequestError):
        bucket_seconds(value, 0, 10)


# -- the database --------------------------------------------------------------------------

def sqlite(path: Path) -> Database:
    db = Database.connect(DatabaseUrl.parse(str(path)))
    migrate(db)
    return db


def test_urls():
    assert DatabaseUrl.parse("", Path("/h")) == DatabaseUrl("sqlite", "/h/ingress.db")
    assert DatabaseUrl.parse("sqlite:///x/y.db").target == "/x/y.db"
    pg = DatabaseUrl.parse("postgresql://u:secret@h/db")
    assert pg.dialect == "postgresql" and "secret" not in pg.display()
    with pytest.raises(DatabaseError):
        DatabaseUrl.parse("mysql://h/db")


def test_migrations_apply_once_and_a_newer_schema_is_refused(tmp_path):
    db = sqlite(tmp_path / "a.db")
    assert migrate(db) == LATEST  # already there: nothing to do
    db.run_sync("INSERT INTO otela_schema (version) VALUES (?)", (LATEST + 1,))
    with pytest.raises(SchemaTooNew, match="newer"):
        migrate(db)


def test_keys_round_trip_rotate_and_revoke(tmp_path):
    db = sqlite(tmp_path / "k.db")
    made, secret = keystore.create(db, KeySpec(owner="a", models=frozenset({"m"}), rpm=3))
    assert keystore.get(db, made.id) == made and made.secret_hash == hash_secret(secret)
    assert secret not in (tmp_path / "k.db").read_bytes().decode("latin-1")
    rotated, new = keystore.rotate(db, made.id)
    assert new != secret and rotated.secret_hash == hash_secret(new)
    revoked = keystore.revoke(db, made.id)
    assert revoked.revoked_at is not None and keystore.revoke(db, made.id) == revoked
    with pytest.raises(keystore.KeyRevoked):  # it exists: "revoked", not "no such key"
        keystore.rotate(db, made.id)
    with pytest.raises(keystore.KeyNotFound):
        keystore.rotate(db, "key_000000000000")


def test_access_sees_revocations_made_by_another_connection(tmp_path):
    path = tmp_path / "shared.db"
    here, elsewhere = sqlite(path), sqlite(path)
    made, secret = keystore.create(elsewhere, KeySpec(owner="a"))
    access = Access(here, "ingress-1")
    access.load()
    header = b"Bearer " + secret.encode()
    assert access.authenticate(header).id == made.id
    keystore.revoke(elsewhere, made.id)
    access.load()
    with pytest.raises(RequestError):
        access.authenticate(header)


def exchange(request_id: str, key_id: str | None, tokens: tuple[int, int]) -> Exchange:
    done = Exchange(route="/v1/chat/completions", request_id=request_id, model="m",
                    status=200, node_peer="peer", node_provider="prov", api_key=key_id)
    done.tap = UsageTap(False)
    done.tap.prompt_tokens, done.tap.completion_tokens = tokens
    return done


def test_usage_rows_are_written_in_batches_and_aggregated(tmp_path):
    db = sqlite(tmp_path / "u.db")
    writer = usage.UsageWriter(db, "ingress-1")
    for i in range(5):
        writer.finished(exchange("same-id", "key_a" if i < 3 else "key_b", (2, 3)))
    writer.finished(Exchange(route="/v1/x", request_id="r"))  # no model: not usage
    trio.run(writer.flush)
    assert writer.written == 5 and writer.pending() == 0
    by_key = {t.group: t for t in usage.aggregate(db, "key")}
    assert by_key["key_a"].requests == 3 and by_key["key_a"].prompt_tokens == 6
    assert usage.used_tokens(db) == {"key_a": 15, "key_b": 10}
    rows = sqlite3.connect(tmp_path / "u.db").execute("SELECT COUNT(DISTINCT id) FROM usage")
    assert rows.fetchone()[0] == 5  # the client's request id never merges rows


def test_other_ingress_nodes_use_is_charged_once(tmp_path, monkeypatch):
    import time as real_time
    from types import SimpleNamespace

    # The buckets refill with time: hold the monotonic clock still, or a slow machine's
    # pause between the admission and the refresh shows up as refill.
    monkeypatch.setattr("ingress.access.time",
                        SimpleNamespace(time=real_time.time, monotonic=lambda: 1000.0))
    path = tmp_path / "two.db"
    one, two = sqlite(path), sqlite(path)
    made, _ = keystore.create(one, KeySpec(owner="a", rpm=60))
    access = Access(one, "ingress-1")
    access.load()
    access.admit(made, "m")  # creates the key's buckets here (10 s of 60/min): 9 left
    writer = usage.UsageWriter(two, "ingress-2")
    for i in range(4):
        writer.finished(exchange(f"r{i}", made.id, (1, 1)))
    trio.run(writer.flush)
    access.refresh()
    access.refresh()  # a second refresh must not charge the same rows again
    assert access.used(made.id) == 8  # and budgets see the tokens, once
    limits = access.limits[made.id]
    assert limits.requests is not None
    assert 4.9 < limits.requests.available(limits.requests.at) < 5.1


def test_a_remembered_authorization_header_still_sees_revocation_and_expiry(tmp_path,
                                                                          monkeypatch):
    import time as clock
    from dataclasses import replace

    db = sqlite(tmp_path / "memo.db")
    made, secret = keystore.create(db, KeySpec(owner="a", expires_at=clock.time() + 3600))
    access = Access(db, "ingress-1")
    access.load()
    header = b"Bearer " + secret.encode()
    assert access.authenticate(header).id == made.id
    assert access.authenticate(header).id == made.id  # the remembered path
    later = clock.time() + 7200
    monkeypatch.setattr("ingress.access.time.time", lambda: later)
    with pytest.raises(RequestError) as expired:
        access.authenticate(header)
    assert expired.value.status == 401
    monkeypatch.undo()
    access.remember([replace(made, revoked_at=clock.time())])  # as a refresh does
    with pytest.raises(RequestError):
        access.authenticate(header)
    for wrong in (None, b"Bearer otela-wrong", b"Basic abc"):  # never remembered
        with pytest.raises(RequestError):
            access.authenticate(wrong)
    assert set(access._key_of) <= {header}


def test_the_refresh_scan_moves_on_when_nobody_else_writes(tmp_path):
    """A lone ingress's refresh reads only the last seconds' rows: its horizon follows the
    database's clock, not the newest row of another ingress (there is none), and the scan
    skips its own rows in the index."""
    db = sqlite(tmp_path / "alone.db")
    made, _ = keystore.create(db, KeySpec(owner="a"))
    access = Access(db, "ingress-1")
    access.load()
    writer = usage.UsageWriter(db, "ingress-1")
    writer.finished(exchange("r", made.id, (1, 1)))
    trio.run(writer.flush)
    loaded = access._others_after
    while db.now() < loaded + _LOOKBACK_S + 0.005:  # the clock has ms steps: let one pass
        pass
    access.refresh()
    assert loaded < access._others_after <= db.now() - _LOOKBACK_S
    plan = " ".join(str(row) for row in db.query_sync(
        "EXPLAIN QUERY PLAN SELECT id, key_id, prompt_tokens + completion_tokens, status, "
        "recorded_at FROM usage WHERE recorded_at > ? AND ingress <> ? AND key_id IS NOT "
        "NULL", (0.0, "ingress-1")))
    assert "usage_recorded_by" in plan


def test_usage_rows_carry_the_database_clock(tmp_path):
    db = sqlite(tmp_path / "clock.db")
    writer = usage.UsageWriter(db, "ingress-1")
    writer.finished(exchange("r", None, (1, 1)))
    before = db.now()
    trio.run(writer.flush)
    (recorded,), = db.query_sync("SELECT recorded_at FROM usage")
    assert before - 0.01 <= recorded <= db.now() + 0.01


def test_config_show_hides_the_admin_token_and_database_passwords(tmp_path):
    from otela.config import show_rows
    from otela.config.layers import resolve

    env = {"OTELA_ADMIN_TOKEN": "s3cret-token", "OTELA_INGRESS_DB": "postgresql://u:pw@h/db",
           "XDG_CONFIG_HOME": str(tmp_path)}
    rows = {row["setting"]: row["value"] for row in show_rows(resolve({}, env))}
    assert rows["ingress.admin_token"] == "(set, hidden)"
    assert "pw" not in rows["ingress.db"] and "u:***@h/db" in rows["ingress.db"]
    assert not any("s3cret" in str(value) for value in rows.values())


def test_a_fresh_ingress_counts_recent_rows_once(tmp_path):
    path = tmp_path / "fresh.db"
    db = sqlite(path)
    made, _ = keystore.create(db, KeySpec(owner="a", budget_tokens=100))
    writer = usage.UsageWriter(db, "ingress-old")
    for i in range(3):
        writer.finished(exchange(f"r{i}", made.id, (5, 5)))
    trio.run(writer.flush)
    access = Access(sqlite(path), "ingress-new")
    access.load()  # the rows are seconds old: inside the look-back of the first refresh
    access.refresh()
    assert access.used(made.id) == 30


def test_open_access_lets_keyless_requests_through_but_still_checks_keys(tmp_path):
    from ingress.service import IngressService

    db = sqlite(tmp_path / "open.db")
    made, secret = keystore.create(db, KeySpec(owner="a"))
    for open_access in (True, False):
        service = IngressService(db, "i", open_access=open_access)
        service.access.load()
        assert service.authenticate(f"Bearer {secret}".encode()).id == made.id
        with pytest.raises(RequestError):
            service.authenticate(b"Bearer otela-wrong")
        if open_access:
            assert service.authenticate(None) is None
        else:
            with pytest.raises(RequestError):
                service.authenticate(None)

"""Trace schema: validation, JSONL <-> CSV (and gzip) round trips, clear errors."""

import json
from pathlib import Path

import pytest

from otela.tracing.schema import SCHEMA_VERSION, TraceError, TraceRecord, hash_id, make_header
from traces.io import Trace, read_trace, write_trace


def _sample() -> Trace:
    recs = [
        TraceRecord(
            0.0,
            "llama",
            512,
            128,
            "r0",
            ttft=0.05,
            e2e=1.2,
            itl_mean=0.009,
            itl_p50=0.008,
            itl_p99=0.02,
            itl_max=0.03,
            status=200,
            provider="p1",
            node="n1",
            key=hash_id("sk-1"),
            stream=True,
            max_tokens=128,
        ),
        TraceRecord(
            0.25,
            "qwen, 7b",
            30,
            0,
            "r1",
            status=503,
            error="http_503",
            extra={"tenant": "lab", "tags": ["a", "b"]},
        ),
        TraceRecord(
            0.5,
            "llama",
            900,
            64,
            "r2",
            prefix_hash="p3",
            prefix_len=256,
            prompt='say "hi",\nplease',
            send_lag=0.0001,
        ),
    ]
    return Trace(make_header("test", start_time=1700000000.0, note="x"), recs)


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".csv"])
def test_round_trip_is_lossless(tmp_path: Path, suffix: str) -> None:
    t = _sample()
    back = read_trace(write_trace(tmp_path / f"t{suffix}", t))
    assert back.header == t.header
    assert [r.to_json() for r in back.records] == [r.to_json() for r in t.records]


def test_jsonl_to_csv_to_jsonl(tmp_path: Path) -> None:
    t = _sample()
    a = write_trace(tmp_path / "a.jsonl", t)
    b = write_trace(tmp_path / "b.csv", read_trace(a))
    c = write_trace(tmp_path / "c.jsonl", read_trace(b))
    assert a.read_text() == c.read_text()


def test_records_are_sorted_and_derived_fields(tmp_path: Path) -> None:
    t = _sample()
    t.records.reverse()
    back = read_trace(write_trace(tmp_path / "t.jsonl", t))
    assert [r.request_id for r in back.records] == ["r0", "r1", "r2"]
    r0 = back.records[0]
    assert r0.ok and r0.tpot == pytest.approx((1.2 - 0.05) / 127)
    assert not back.records[1].ok


def test_header_version_and_errors(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps({"otela_trace": SCHEMA_VERSION + 1}) + "\n")
    with pytest.raises(TraceError, match="schema version"):
        read_trace(p)
    p.write_text('{"arrival": 0, "model": "m", "input_tokens": 1, "output_tokens": 1}\n')
    with pytest.raises(TraceError, match="not an otela trace"):
        read_trace(p)
    p.write_text(json.dumps(make_header("x")) + '\n{"arrival": 1, "model": "m"}\n')
    with pytest.raises(TraceError, match=r"t.jsonl:2: missing input_tokens, output_tokens"):
        read_trace(p)
    p.write_text(
        json.dumps(make_header("x")) + '\n{"arrival": "soon", "model": "m", '
        '"input_tokens": 1, "output_tokens": 1}\n'
    )
    with pytest.raises(TraceError, match="'arrival' has bad value"):
        read_trace(p)
    p.write_text(json.dumps(make_header("x")) + "\n{not json\n")
    with pytest.raises(TraceError, match=":2: not JSON"):
        read_trace(p)
    with pytest.raises(TraceError, match="no such file"):
        read_trace(tmp_path / "missing.jsonl")


def test_hash_is_stable_short_and_salted() -> None:
    assert hash_id("sk-abc") == hash_id("sk-abc") != hash_id("sk-abd")
    assert len(hash_id("x")) == 16 and hash_id("x", "salt") != hash_id("x")

"""The ingress trace recorder: non-blocking, bounded, rotating, hashing, never raising."""

import json
from pathlib import Path

import pytest
import trio

from otela.tracing.recorder import TraceRecorder
from otela.tracing.schema import hash_id
from traces.io import read_trace


def _record(rec: TraceRecorder, i: int, **kw: object) -> bool:
    args: dict = {  # type: ignore[type-arg]
        "arrival": rec.start_time + i * 0.01,
        "model": "m",
        "input_tokens": 100 + i,
        "output_tokens": 10,
        "status": 200,
        "ttft_s": 0.05,
        "e2e_s": 0.5,
        "itl_s": [0.01, 0.03, 0.02],
        "api_key": "sk-secret",
        "provider": "lab-a",
        "node": "12D3KooWnode",
        "request_id": f"q{i}",
    }
    args.update(kw)
    return rec.record(**args)


async def _run_briefly(rec: TraceRecorder, producer) -> None:  # type: ignore[no-untyped-def]
    async with trio.open_nursery() as n:
        await n.start(rec.run)
        await producer()
        await trio.sleep(rec.flush_interval * 3)
        n.cancel_scope.cancel()


def test_records_are_written_with_hashed_key_and_itl_summary(tmp_path: Path) -> None:
    rec = TraceRecorder(tmp_path / "t.jsonl", flush_interval=0.02)

    async def produce() -> None:
        for i in range(50):
            assert _record(rec, i, prompt="secret prompt")

    trio.run(_run_briefly, rec, produce)
    t = read_trace(tmp_path / "t.jsonl")
    assert len(t) == 50 and rec.stats.recorded == 50 and rec.stats.dropped == 0
    r = t.records[3]
    assert r.key == hash_id("sk-secret") and "sk-secret" not in (tmp_path / "t.jsonl").read_text()
    assert r.prompt is None  # prompts only on request
    assert r.provider == "lab-a" and r.node == "12D3KooWnode"
    assert r.itl_mean == pytest.approx(0.02) and r.itl_max == pytest.approx(0.03)
    assert r.itl_p50 == pytest.approx(0.02)
    assert r.arrival == pytest.approx(0.03, abs=1e-6) and r.ttft == 0.05
    assert t.header["start_time"] == pytest.approx(rec.start_time)


def test_hash_ids_and_prompts_opt_in(tmp_path: Path) -> None:
    rec = TraceRecorder(
        tmp_path / "t.jsonl", flush_interval=0.02, hash_ids=True, record_prompts=True, salt="s"
    )

    async def produce() -> None:
        _record(rec, 0, prompt="hello")

    trio.run(_run_briefly, rec, produce)
    r = read_trace(tmp_path / "t.jsonl").records[0]
    assert r.provider == hash_id("lab-a", "s") and r.node == hash_id("12D3KooWnode", "s")
    assert r.prompt == "hello"


def test_full_queue_drops_and_counts_without_blocking(tmp_path: Path) -> None:
    # No writer runs here: a recorder that waited for room, or wrote in the caller's
    # task, would hang or leave a file behind. Behaviour, not wall-clock time, which
    # a loaded CI host stretches past any per-call bound.
    rec = TraceRecorder(tmp_path / "t.jsonl", queue_size=100)
    results = [_record(rec, i) for i in range(10_000)]
    assert results.count(True) == 100 and rec.stats.dropped == 9_900
    assert not (tmp_path / "t.jsonl").exists()  # the request path did no file I/O


def test_bad_values_never_raise_into_the_caller(tmp_path: Path) -> None:
    rec = TraceRecorder(tmp_path / "t.jsonl", flush_interval=0.02)

    async def produce() -> None:
        assert _record(rec, 0, input_tokens="lots")  # queued; rejected by the writer
        assert _record(rec, 1, arrival=float("nan"))
        assert _record(rec, 2)

    trio.run(_run_briefly, rec, produce)
    assert rec.stats.invalid == 2 and rec.stats.recorded == 1
    assert len(read_trace(tmp_path / "t.jsonl")) == 1


def test_rotation_keeps_backups_each_a_valid_trace(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("old run\n")  # a previous run's file is moved aside, never appended to
    rec = TraceRecorder(path, max_bytes=20_000, backups=3, flush_interval=0.01)

    async def produce() -> None:
        for i in range(1000):
            _record(rec, i)
            if i % 50 == 49:  # several flushes, so several rotations (waited for, not timed)
                while rec.pending:
                    await trio.sleep(rec.flush_interval)

    trio.run(_run_briefly, rec, produce)
    files = sorted(tmp_path.glob("t.jsonl*"))
    assert [f.name for f in files] == ["t.jsonl", "t.jsonl.1", "t.jsonl.2", "t.jsonl.3"]
    assert rec.stats.rotations >= 3
    kept = [r for f in files for r in read_trace(f).records]  # every file has a header
    assert all(f.stat().st_size <= 20_000 + 2_000 for f in files)
    ids = sorted(int(r.request_id[1:]) for r in kept)
    assert ids == list(range(1000 - len(ids), 1000))  # the newest records, none lost in between
    first = json.loads(path.read_text().splitlines()[0])
    assert first["otela_trace"] == 1


def test_cancel_flushes_what_is_queued(tmp_path: Path) -> None:
    rec = TraceRecorder(tmp_path / "t.jsonl", flush_interval=60)

    async def main() -> None:
        async with trio.open_nursery() as n:
            await n.start(rec.run)
            for i in range(20):
                _record(rec, i)
            n.cancel_scope.cancel()

    trio.run(main)
    assert len(read_trace(tmp_path / "t.jsonl")) == 20

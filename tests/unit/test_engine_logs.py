"""Engine log handling: rotation, fatal patterns as lines stream in, the sink, health checks."""

from __future__ import annotations

import httpx
import trio
import trio.testing

from otela.config import DEFAULT_FATAL_PATTERNS
from otela.engine.command import parse_engine_command
from otela.engine.health import watch_health
from otela.engine.logs import FatalPatterns, RotatingLog, copy_to_sink, pump_output


def test_rotation_keeps_the_newest_backups(tmp_path):
    log = RotatingLog(tmp_path / "engine.log", max_bytes=10, backups=2)
    for i in range(5):
        log.write(f"line-{i}-x\n".encode())  # 9 bytes each: one per file
    log.close()
    assert [p.name for p in log.files()] == ["engine.log", "engine.log.1", "engine.log.2"]
    assert (tmp_path / "engine.log").read_text() == "line-4-x\n"
    assert (tmp_path / "engine.log.2").read_text() == "line-2-x\n"
    assert not (tmp_path / "engine.log.3").exists()


def test_default_patterns_catch_nccl_timeouts_and_cuda_oom():
    patterns = FatalPatterns(DEFAULT_FATAL_PATTERNS)
    assert patterns.match("[Rank 0] Watchdog caught collective operation timeout: "
                          "WorkNCCL(SeqNum=1) ran for 600000 ms before timing out")
    assert patterns.match("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB")
    assert patterns.match("INFO 11-21 engine started, NCCL version 2.21") is None


def test_pump_splits_chunks_into_lines_and_reports_matches(tmp_path):
    send, receive = trio.testing.memory_stream_one_way_pair()
    log = RotatingLog(tmp_path / "e.log", 1 << 20, 1)
    hits: list[tuple[str, str]] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump_output, receive, log,
                               FatalPatterns(["cuda out of memory"]),
                               lambda p, line: hits.append((p, line)))
            for chunk in (b"ok\nRuntimeError: CUDA out", b" of memory\nfine\n"):
                await send.send_all(chunk)
                await trio.testing.wait_all_tasks_blocked()
            await send.aclose()

    trio.run(main)
    assert hits == [("cuda out of memory", "RuntimeError: CUDA out of memory")]
    assert (tmp_path / "e.log").read_text() == "ok\nRuntimeError: CUDA out of memory\nfine\n"


def test_copy_to_sink(tmp_path):
    (tmp_path / "engine.log").write_text("boom\n")
    target = copy_to_sink(tmp_path / "sink", "prov-abc", [tmp_path / "engine.log",
                                                          tmp_path / "absent.log"], "why")
    assert (target / "engine.log").read_text() == "boom\n"
    assert (target / "reason.txt").read_text() == "why\n"


def test_health_fails_only_after_consecutive_failures():
    statuses = iter([200, 500, 200, 500, 500, 500])
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return httpx.Response(next(statuses))

    async def main() -> str:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            command = parse_engine_command("vllm serve m --port 1")
            return await watch_health(client, command, interval=1, failures=3)

    reason = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert len(seen) == 6 and seen[0] == "/health"
    assert "3 health checks in a row failed" in reason and "HTTP 500" in reason

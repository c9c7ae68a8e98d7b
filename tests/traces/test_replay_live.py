"""Replay against real processes on 127.0.0.1: a local otela federation (ingress node wrapping
the echo engine) and the microsecond mock engine that fails on request."""

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from otela.testing.localfed import LocalFederation, echo_engine_command, free_port, wait_for
from traces.generate import GenSpec, generate, parse_models
from traces.io import read_trace, write_trace
from traces.replay.runner import ReplayOptions, replay
from traces.stats import summarize

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An ingress node wrapping the echo engine. With two or more cores the federation runs on
    the last core and this process (the replayer, and the timing control it starts) on the
    others, as a load generator on its own client machine would."""
    root = tmp_path_factory.mktemp("fed")
    cores = sorted(os.sched_getaffinity(0))
    try:
        if len(cores) > 1:
            os.sched_setaffinity(0, cores[-1:])  # the node and its engine inherit this at spawn
        with LocalFederation(root) as fed:
            node = fed.start_node(
                "ingress",
                ingress=True,
                provider_id="lab-replay",
                process=echo_engine_command(free_port(), ["m1"]),
            )
            os.sched_setaffinity(0, cores[:-1] or cores)

            def serving() -> bool:
                r = httpx.get(f"{node.http_url}/v1/models", timeout=5, trust_env=False)
                return any(m["id"] == "m1" for m in r.json().get("data", []))

            wait_for(serving, 60, "the ingress to serve m1", interval=0.3)
            yield node.http_url
    finally:
        os.sched_setaffinity(0, cores)


CONTROL = """
import sys, time
import numpy as np, trio
from traces.replay.timer import PreciseTimer
schedule = np.load(sys.argv[1])
async def run():
    timer, late = PreciseTimer(), []
    t0 = time.perf_counter() + 0.2
    for a in schedule - schedule[0]:
        await timer.sleep_until(t0 + a)
        late.append(time.perf_counter() - t0 - a)
    print(float(np.percentile(late, 99)))
trio.run(run)
"""


ACCURACY_S = 1e-3  # the replayer's own arrival error allowed, p99
MEDIAN_S = 0.5e-3  # the median error allowed in any attempt (0.01-0.3 ms measured, loaded or not)
LOADED_FACTOR = 2.0  # on a loaded host, how many times the control's p99 the replay may reach
CONTROL_FAIR_S = 10e-3  # an attempt whose control was later than this had the host stalled


def _attempt_passes(control_p99: float, p50: float, p99: float) -> bool:
    """Whether one attempt shows the replayer on time, judged as precisely as the host allows.

    On a quiet host (the control within 1 ms at p99) the claim itself is checked: p99 within
    1 ms beyond the control's. On a loaded host every process on the core waits out other
    processes' slices (3.5-7 ms here), and which wake-ups meet one is chance: two identical
    bare sleepers side by side measured p99s up to 1.8x apart, and the replay (it also reads
    the responses) up to 1.5x the control's beyond the 1 ms. So the allowance grows with the
    host's lateness, to twice the control's p99 (the two rules meet at 1 ms); that still fails
    a replayer late by 4 ms on one request in 20 on a host late by 1.8 ms (measured). The
    median, which the host's stalls hardly move, must stay within 0.5 ms either way."""
    if p50 > MEDIAN_S or control_p99 > CONTROL_FAIR_S:
        return False
    return p99 <= max(ACCURACY_S + control_p99, LOADED_FACTOR * control_p99)


def _start_control(schedule: np.ndarray, tmp_path: Path) -> subprocess.Popen[str]:
    """A process timing the same arrival schedule, at the same time, with nothing else to do:
    how late the host (shared, 2 cores) makes a bare sleeper, which the replay is judged
    beyond."""
    path = tmp_path / "schedule.npy"
    np.save(path, schedule)
    return subprocess.Popen(
        [sys.executable, "-c", CONTROL, str(path)], stdout=subprocess.PIPE, text=True
    )


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _mock_engine(*args: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "traces.replay.mock_engine", "--port", str(port), *args]
    )
    end = time.monotonic() + 15
    while time.monotonic() < end:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, port
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("mock engine did not start")


def test_replay_reproduces_recorded_arrivals_through_a_federation(
    federation: str, tmp_path: Path
) -> None:
    src = generate(
        GenSpec(
            rate=40,
            requests=240,
            cv=2.0,
            input="uniform:5,40",
            output="uniform:2,8",
            models=parse_models(["m1"]),
            seed=11,
        )
    )
    path = write_trace(tmp_path / "recorded.jsonl", src)
    want = np.array([r.arrival for r in src.records])
    # This 2-core machine is shared (and with OTELA_TEST_WORKERS, by the suite): another process's
    # burst can delay any wake-up by milliseconds. A control process times the same schedule,
    # with nothing else to do, during each attempt, and each attempt is judged as precisely as
    # the host allowed (`_attempt_passes`); up to four attempts, one must pass.
    results = []
    for _ in range(4):
        control = _start_control(want, tmp_path)
        res = replay(read_trace(path), ReplayOptions(url=federation))
        control_p99 = float(control.communicate(timeout=60)[0])
        s = summarize(res.records)
        assert s["succeeded"] == 240, s["errors"]
        sent = np.array([r.arrival for r in res.records])
        # each request's offset from its recorded arrival, around the run's median offset
        # (the time origin is arbitrary; anchoring on the first request would charge its own
        # lateness to every other request)
        offset = (sent - sent[0]) - (want - want[0])
        err = np.abs(offset - np.median(offset))
        p50, p99 = (float(np.percentile(err, q)) for q in (50, 99))
        results.append((control_p99, p50, p99))
        print(
            f"control p99 {control_p99 * 1e3:.3f} ms; arrival error p50 {p50 * 1e3:.3f} ms, "
            f"p99 {p99 * 1e3:.3f} ms"
        )
        if _attempt_passes(control_p99, p50, p99):
            break
    if all(c > CONTROL_FAIR_S for c, _, _ in results):
        pytest.skip(f"host stalled every attempt: control p99s {[c for c, _, _ in results]}")
    assert any(_attempt_passes(*r) for r in results), results
    r = res.records[0]
    assert r.provider == "lab-replay" and r.node and r.ttft is not None and r.status == 200
    assert all(0 < x.ttft <= x.e2e for x in res.records if x.ttft is not None)
    assert all(x.output_tokens >= 1 for x in res.records)


def test_closed_loop_keeps_concurrency_and_ignores_arrivals(federation: str) -> None:
    src = generate(
        GenSpec(
            rate=0.5,
            requests=30,
            input="fixed:10",
            output="fixed:4",
            models=parse_models(["m1"]),
            seed=12,
        )
    )  # ~60 s of arrivals
    t0 = time.monotonic()
    res = replay(src, ReplayOptions(url=federation, closed_loop=True, concurrency=4))
    assert time.monotonic() - t0 < 20 and summarize(res.records)["succeeded"] == 30
    assert all(r.send_lag is None for r in res.records)


def test_errors_are_counted_by_kind() -> None:
    proc, port = _mock_engine("--fail-every", "4")
    try:
        src = generate(
            GenSpec(
                rate=200,
                requests=400,
                input="fixed:16",
                output="fixed:3",
                models=parse_models(["mock"]),
                seed=13,
            )
        )
        for stream in (True, False):
            res = replay(src, ReplayOptions(url=f"http://127.0.0.1:{port}", stream=stream))
            s = summarize(res.records)
            assert s["errors"] == {"http_503": 100} and s["succeeded"] == 300, s
            ok = [r for r in res.records if r.ok]
            assert all(r.output_tokens == 3 and r.input_tokens == 16 for r in ok)
    finally:
        proc.terminate()
        proc.wait(10)
    res = replay(src, ReplayOptions(url=f"http://127.0.0.1:{free_port()}"))  # nothing listens
    assert summarize(res.records)["errors"] == {"connect": 400}


def test_slow_engine_times_out_and_sockets_are_released() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "otela.engine.demo.echo",
            "--port",
            str(port),
            "--model",
            "m1",
            "--token-delay",
            "0.5",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: _listening(port), 20, "the echo engine to listen")
        src = generate(
            GenSpec(
                rate=20,
                requests=6,
                input="fixed:5",
                output="fixed:4",
                models=parse_models(["m1"]),
                seed=14,
            )
        )
        res = replay(src, ReplayOptions(url=f"http://127.0.0.1:{port}", timeout_s=0.3))
        s = summarize(res.records)
        assert s["errors"] == {"timeout": 6}
        assert all(r.e2e is None and r.status == 0 for r in res.records)
    finally:
        proc.terminate()
        proc.wait(10)

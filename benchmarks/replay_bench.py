"""Replay overhead: requests/s the replayer sustains on ONE core, and its arrival-time error.

Starts a microsecond mock engine as its own process on the other core — by default the
data-path benchmark's (`benchmarks/mock_engine.py`, on otela's own HTTP server), or with
`--engine traces` the replay package's (`traces.replay.mock_engine`) — pins this process
(the replayer) to one core, and replays Poisson traces at increasing rates, streaming (the
default) and not. Prints, per rate: achieved throughput, send lag (actual send - scheduled
arrival) p50/p99/max, errors, and the replayer's CPU use (user+sys seconds / wall seconds:
1.0 = one core saturated).

    .venv/bin/python benchmarks/replay_bench.py [--rates 1000,2000,3000] [--seconds 5]
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from traces.generate import GenSpec, generate
from traces.replay.runner import ReplayOptions, replay
from traces.stats import summarize


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise SystemExit(f"mock engine did not listen on {port}")


def _proc_cpu(pid: int) -> float:
    """User + system CPU seconds of another process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="1000,2000,3000")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--output-tokens", type=int, default=8)
    ap.add_argument("--input-tokens", type=int, default=128)
    ap.add_argument("--engine", choices=("data-path", "traces"), default="data-path")
    args = ap.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    port = _free_port()
    engine_cpu = [cores[-1]] if len(cores) > 1 else cores
    if args.engine == "data-path":
        script = str(Path(__file__).with_name("mock_engine.py"))
        cmd = [sys.executable, script, "--port", str(port), "--model", "mock",
               "--chunks", str(args.output_tokens)]
    else:
        cmd = [sys.executable, "-m", "traces.replay.mock_engine", "--port", str(port)]
    proc = subprocess.Popen(cmd, preexec_fn=lambda: os.sched_setaffinity(0, engine_cpu))
    try:
        _wait_port(port)
        os.sched_setaffinity(0, [cores[0]])
        print(f"replayer on core {cores[0]}, {args.engine} mock engine on core {engine_cpu[0]}")
        print(
            f"{'mode':<10}{'rate':>7}{'reqs':>7}{'achieved/s':>12}{'lag p50':>10}"
            f"{'lag p99':>10}{'lag max':>10}{'errors':>8}{'cpu':>7}{'engine':>8}"
        )
        for stream in (True, False):
            for rate in (float(r) for r in args.rates.split(",")):
                n = int(rate * args.seconds)
                trace = generate(
                    GenSpec(
                        rate=rate,
                        requests=n,
                        input=f"fixed:{args.input_tokens}",
                        output=f"fixed:{args.output_tokens}",
                        models=[("mock", 1.0)],
                        seed=1,
                    )
                )
                c0, e0, w0 = _cpu(), _proc_cpu(proc.pid), time.perf_counter()
                res = replay(trace, ReplayOptions(url=f"http://127.0.0.1:{port}", stream=stream))
                wall = time.perf_counter() - w0
                cpu = (_cpu() - c0) / wall
                engine_cpu = (_proc_cpu(proc.pid) - e0) / wall
                s = summarize(res.records)
                lag = np.array([abs(r.send_lag or 0.0) for r in res.records]) * 1e3
                print(
                    f"{'stream' if stream else 'json':<10}{rate:>7.0f}{n:>7d}"
                    f"{s['throughput_rps']:>12.0f}{np.percentile(lag, 50):>8.3f}ms"
                    f"{np.percentile(lag, 99):>8.3f}ms{lag.max():>8.2f}ms"
                    f"{s['failed']:>8d}{cpu:>7.2f}{engine_cpu:>8.2f}",
                    flush=True,
                )
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()

"""Convergence and control-plane bandwidth of a federation of real otela processes.

For each size N: N-1 nodes join through one bootstrap node and converge; then, three times,
an extra node joins whose echo engine takes 3 s to load, so its SERVING announcement is one
fresh registry change. Every replica records when it received that version
(``received_at`` in /v1/registry/nodes); minus the signer's ``updated_at`` (same machine,
same clock) that is the node's apply latency. Bandwidth: TCP payload bytes per node
process (kernel socket counters via ``ss -tinp``) over an idle window.

Run:  .venv/bin/python benchmarks/convergence.py --nodes 8 16 32 64 128
One OS process per node on this 2-core machine; figures are documented in docs/mesh.md.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from otela.localfed import LocalFederation, echo_engine_command, free_port, wait_for

_SOCKET = re.compile(r"pid=(\d+),.*?bytes_sent:(\d+)(?:.*?bytes_received:(\d+))?", re.S)
Socket = tuple[int, str, str]  # (pid, local address, peer address)


def socket_bytes() -> dict[Socket, int]:
    """Per TCP socket: payload bytes sent + received so far (kernel counters)."""
    out = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True, check=True).stdout
    totals: dict[Socket, int] = {}
    for block in re.split(r"\n(?=\S)", out):
        match = _SOCKET.search(block)
        fields = block.split()
        if match and len(fields) >= 5:
            pid, sent = int(match.group(1)), int(match.group(2))
            totals[(pid, fields[3], fields[4])] = sent + int(match.group(3) or 0)
    return totals


def bytes_per_pid(before: dict[Socket, int], after: dict[Socket, int]) -> dict[int, int]:
    """Bytes each process moved between two samples: per-socket differences, with sockets
    opened in between counted from zero (sockets closed in between are missed: a lower
    bound, tight when connections are stable, as in an idle federation)."""
    moved: dict[int, int] = {}
    for key, total in after.items():
        moved[key[0]] = moved.get(key[0], 0) + total - before.get(key, 0)
    return moved


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run_size(n: int, root: Path, idle_window: float) -> dict[str, float]:
    with LocalFederation(root / f"n{n}") as fed:
        boot = fed.start_node("boot", extra_args=["--log-level", "WARNING"])
        nodes = [boot] + [
            fed.start_node(f"m{i:03d}", bootstrap=[boot], wait=False,
                           extra_args=["--log-level", "WARNING"])
            for i in range(n - 2)
        ]
        for node in nodes[1:]:
            fed.wait_started(node, node.home / "status.json", 600.0)
        everyone = {x.session_id for x in nodes}
        for node in nodes:
            wait_for(lambda node=node: set(node.states()) >= everyone, 600.0,
                     f"{node.name} to converge", interval=0.5)

        pids = {x.process.pid for x in nodes}
        time.sleep(10)  # let join-time churn settle before measuring "idle"
        before = socket_bytes()
        time.sleep(idle_window)
        moved = bytes_per_pid(before, socket_bytes())
        idle = [moved.get(p, 0) / idle_window for p in pids]

        latencies: list[float] = []
        for k in range(3):
            engine = echo_engine_command(free_port(), [f"model-{k}"], "--startup-delay", "3")
            announcer = fed.start_node(f"announcer{k}", bootstrap=[boot], process=engine,
                                       extra_args=["--log-level", "WARNING"], timeout=120)
            observers = [x for x in nodes if x is not announcer]
            session = announcer.session_id
            for node in observers:
                wait_for(lambda node=node, session=session: node.states().get(session)
                         == "SERVING",
                         120.0, f"{node.name} to apply the change", interval=0.25)
            for node in observers:
                entry = next(e for e in node.get("/v1/registry/nodes", timeout=30)["nodes"]
                             if e["session_id"] == announcer.session_id)
                latencies.append(entry["received_at"] - entry["updated_at"])
            nodes.append(announcer)
        return {
            "nodes": n,
            "p50_ms": 1000 * statistics.median(latencies),
            "p95_ms": 1000 * percentile(latencies, 0.95),
            "max_ms": 1000 * max(latencies),
            "idle_bytes_per_s_median": statistics.median(idle),
            "idle_bytes_per_s_max": max(idle),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--idle-window", type=float, default=20.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="otela-bench-") as tmp:
        print(f"{'nodes':>5} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} "
              f"{'idle B/s/node (median, max)':>28}")
        for n in args.nodes:
            try:
                r = run_size(n, Path(tmp), args.idle_window)
            except (httpx.HTTPError, RuntimeError) as exc:
                print(f"{n:>5} failed: {exc}")
                continue
            print(f"{n:>5} {r['p50_ms']:>8.0f} {r['p95_ms']:>8.0f} {r['max_ms']:>8.0f} "
                  f"{r['idle_bytes_per_s_median']:>14.0f} {r['idle_bytes_per_s_max']:>13.0f}",
                  flush=True)


if __name__ == "__main__":
    main()

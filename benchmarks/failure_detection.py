"""Time from SIGKILL of a node to its exclusion from routing (suspected) and to LEFT.

For each size N: N real otela processes join and converge; one member (never the
bootstrap node) is SIGKILLed, and we wait until every other node's registry says its
session is LEFT. Then each survivor's own records give the timings, free of polling delay:
- suspected: the first "suspected" (or "confirmed") liveness event for the victim in
  /v1/network (its routing drops the victim from that moment);
- LEFT: ``received_at`` of the victim's LEFT entry in /v1/registry/nodes.
Both minus the kill time (same machine, same wall clock).

Run:  .venv/bin/python benchmarks/failure_detection.py --nodes 16 64
Defaults: probe every 1 s, stale window 3 s, suspicion timeout 6 s (docs/failure-detection.md).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from fedbench import percentile, start_federation

from otela.testing.localfed import FederationError, LocalFederation, LocalNode, wait_for


def detection_times(node: LocalNode, victim: LocalNode, killed_at: float) -> tuple[float, float]:
    """(seconds to exclusion from routing, seconds to LEFT) as ``node`` recorded them."""
    entry = next(e for e in node.nodes(timeout=30)
                 if e["session_id"] == victim.session_id)
    left = entry["received_at"] - killed_at
    peer_id = victim.status["peer_id"]
    events = node.get(f"/v1/network?peer={peer_id}", timeout=30)["peer"]["liveness_events"]
    suspected = [e["at"] for e in events if e["event"] in ("suspected", "confirmed")]
    excluded = min([*suspected, entry["received_at"]]) - killed_at
    return excluded, left


def run_size(n: int, root: Path, rng: random.Random) -> dict[str, float]:
    with LocalFederation(root / f"n{n}") as fed:
        nodes = start_federation(fed, n)
        time.sleep(10)  # let join-time churn settle
        victim = rng.choice(nodes[1:])
        survivors = [x for x in nodes if x is not victim]
        killed_at = time.time()
        os.kill(victim.process.pid, signal.SIGKILL)
        for node in survivors:
            wait_for(lambda node=node: node.states().get(victim.session_id) == "LEFT",
                     180.0, f"{node.name} to mark the killed node LEFT", interval=1.0)
        times = [detection_times(node, victim, killed_at) for node in survivors]
        excluded = [t[0] for t in times]
        left = [t[1] for t in times]
        return {
            "excluded_p50": statistics.median(excluded),
            "excluded_p95": percentile(excluded, 0.95),
            "excluded_max": max(excluded),
            "left_p50": statistics.median(left),
            "left_p95": percentile(left, 0.95),
            "left_max": max(left),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="otela-bench-") as tmp:
        print(f"{'nodes':>5}  {'suspected s (p50/p95/max)':>26}  {'LEFT s (p50/p95/max)':>22}")
        for n in args.nodes:
            try:
                r = run_size(n, Path(tmp), rng)
            except (httpx.HTTPError, FederationError) as exc:
                print(f"{n:>5} failed: {exc}")
                continue
            print(f"{n:>5}  {r['excluded_p50']:>10.1f}/{r['excluded_p95']:.1f}/"
                  f"{r['excluded_max']:<8.1f}  {r['left_p50']:>10.1f}/{r['left_p95']:.1f}/"
                  f"{r['left_max']:.1f}", flush=True)


if __name__ == "__main__":
    main()

"""Convergence and control-plane bandwidth of a federation of real otela processes.

For each size N: N nodes join through one bootstrap node and converge, ten of them able to
re-register on demand (benchmarks/churn_node.py). Then:
- idle: TCP payload bytes per node process (kernel socket counters via ``ss -tinp``) and
  CPU per process over a window with nothing happening;
- convergence: three times, an extra node joins whose echo engine takes 3 s to load, so
  its SERVING announcement is one fresh registry change. Every replica records when it
  received that version (``received_at`` in /v1/registry/nodes); minus the signer's
  ``updated_at`` (same machine, same clock) that is the node's apply latency;
- load reports (``--load-reports``; the bootstrap node is then an ingress): bytes per
  node while every node reports a load that changes all the time
  (benchmarks/churn_node.py), the worst case for load reports; the figures are the
  median added over each node's idle bytes, the most, and the ingress's (which hears
  every report);
- churn, last: bytes per node and total CPU while the ten nodes re-register (sign and
  gossip a new record version) every 3 s, the load the paper measured;
- evictions: how many the failure detectors signed before churn and during it. No node
  dies in this benchmark, so every one is a false suspicion that ran its course.

Run:  .venv/bin/python benchmarks/convergence.py --nodes 8 16 32 64 128
One OS process per node on this 2-core machine; figures are documented in docs/mesh.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from fedbench import (
    QUIET,
    bytes_per_second,
    cpu_seconds,
    percentile,
    set_churn,
    set_load,
    start_federation,
)

from otela.testing.localfed import (
    FederationError,
    LocalFederation,
    LocalNode,
    echo_engine_command,
    free_port,
    wait_for,
)

CHURNERS = 10
CHURN_EVERY_S = 3.0


def run_size(n: int, root: Path, window: float, load_reports: bool = False
             ) -> dict[str, float]:
    with LocalFederation(root / f"n{n}") as fed:
        started = time.monotonic()
        nodes = start_federation(fed, n, churners=min(CHURNERS, n - 1),
                                 churn_every=CHURN_EVERY_S, switchable=load_reports,
                                 ingress_boot=load_reports)
        converged_s = time.monotonic() - started
        progress(f"{n} nodes joined and converged in {converged_s:.0f} s")
        pids = [x.process.pid for x in nodes]  # the bootstrap node first
        time.sleep(10)  # let join-time churn settle before measuring "idle"
        cpu_before = {p: cpu_seconds(p) for p in pids}
        idle = bytes_per_second(pids, window)
        idle_cpu = [100 * (cpu_seconds(p) - cpu_before[p]) / window for p in pids]
        progress(f"idle: {statistics.median(idle):.0f} B/s and "
                 f"{statistics.median(idle_cpu):.2f} % CPU per node (median)")
        latencies: list[float] = []
        for k in range(3):
            engine = echo_engine_command(free_port(), [f"model-{k}"], "--startup-delay", "3")
            announcer = fed.start_node(f"announcer{k}", bootstrap=[nodes[0]], process=engine,
                                       extra_args=QUIET, timeout=120)
            observers = [x for x in nodes if x is not announcer]
            session = announcer.session_id
            for node in observers:  # one entry per poll: the whole listing costs the node
                # far more to encode, and 127 nodes were polled for it
                wait_for(lambda node=node, session=session: (node.entry(session, timeout=30)
                         or {}).get("state") == "SERVING", 120.0,
                         f"{node.name} to apply the change", interval=0.25)
                entry = node.entry(session, timeout=30)
                assert entry is not None
                latencies.append(entry["received_at"] - entry["updated_at"])
            nodes.append(announcer)
            progress(f"change {k + 1}/3 applied everywhere; so far p50/p95/max "
                     f"{1000 * statistics.median(latencies):.0f}/"
                     f"{1000 * percentile(latencies, 0.95):.0f}/{1000 * max(latencies):.0f} ms, "
                     f"evictions {evictions(nodes)}")

        false_evictions = evictions(nodes)  # nobody died: every eviction so far was false
        load_bps = [0.0]
        if load_reports:
            # One report per node per max(2 s, members x 0.5 s): measure over two of them,
            # after the first burst (every node's first report goes out at once).
            interval = max(2.0, len(nodes) * 0.5)
            set_load(nodes, True)
            time.sleep(interval + 2)
            loaded = bytes_per_second(pids, max(window, 2 * interval))
            set_load(nodes, False)
            load_bps = [b - before for b, before in zip(loaded, idle, strict=True)]
            progress(f"load reports: +{statistics.median(load_bps):.0f} B/s per node "
                     f"(median; max +{max(load_bps):.0f}; the ingress +{load_bps[0]:.0f})")

        # Churn last: on 2 cores it can saturate the machine at 64+ nodes, and what follows
        # a saturated period (false suspicions, rejoins) must not leak into the figures
        # above.
        set_churn(nodes[1 : 1 + CHURNERS], True)
        time.sleep(2 * CHURN_EVERY_S)
        cpu_before = {p: cpu_seconds(p) for p in pids}
        churn = bytes_per_second(pids, window)
        churn_cpu = sum(100 * (cpu_seconds(p) - cpu_before[p]) / window for p in pids)
        churn_evictions = evictions(nodes) - false_evictions
        return {
            "nodes": n,
            "join_s": converged_s,
            "p50_ms": 1000 * statistics.median(latencies),
            "p95_ms": 1000 * percentile(latencies, 0.95),
            "max_ms": 1000 * max(latencies),
            "idle_bps_median": statistics.median(idle),
            "idle_bps_max": max(idle),
            "idle_cpu_median": statistics.median(idle_cpu),
            "load_bps_median": statistics.median(load_bps),
            "load_bps_max": max(load_bps),
            "load_bps_ingress": load_bps[0],
            "churn_bps_median": statistics.median(churn),
            "churn_bps_max": max(churn),
            "churn_cpu_total": churn_cpu,
            "false_evictions": false_evictions,
            "churn_evictions": churn_evictions,
        }


def progress(line: str) -> None:
    """Phase results as they come (stderr): a run that fails later still reports them."""
    print(f"  .. {line}", file=sys.stderr, flush=True)


def evictions(nodes: list[LocalNode]) -> int:
    """Evictions the nodes' failure detectors signed so far (sum over nodes)."""
    return sum(int(x.get("/v1/health", timeout=30)["liveness"]["evicted"]) for x in nodes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--window", type=float, default=20.0,
                        help="seconds over which bytes and CPU are measured")
    parser.add_argument("--load-reports", action="store_true",
                        help="also measure the load gossip's bytes (every node reporting)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="otela-bench-") as tmp:
        print(f"{'nodes':>5} {'join s':>7} {'p50 ms':>7} {'p95 ms':>7} {'max ms':>7} "
              f"{'idle B/s (med/max)':>19} {'idle CPU %':>10} {'churn B/s (med/max)':>20} "
              f"{'churn CPU % (all)':>17} {'evictions (idle/churn)':>22}")
        for n in args.nodes:
            try:
                r = run_size(n, Path(tmp), args.window, args.load_reports)
            except (httpx.HTTPError, FederationError) as exc:
                print(f"{n:>5} failed: {exc}")
                continue
            print(f"{n:>5} {r['join_s']:>7.0f} {r['p50_ms']:>7.0f} {r['p95_ms']:>7.0f} "
                  f"{r['max_ms']:>7.0f} {r['idle_bps_median']:>9.0f}/{r['idle_bps_max']:<9.0f} "
                  f"{r['idle_cpu_median']:>10.2f} "
                  f"{r['churn_bps_median']:>9.0f}/{r['churn_bps_max']:<9.0f} "
                  f"{r['churn_cpu_total']:>17.0f} "
                  f"{r['false_evictions']:>11}/{r['churn_evictions']:<10}", flush=True)
            if args.load_reports:
                print(f"{'':>5} load reports: +{r['load_bps_median']:.0f} B/s per node "
                      f"(median), +{r['load_bps_max']:.0f} max, the ingress "
                      f"+{r['load_bps_ingress']:.0f}", flush=True)


if __name__ == "__main__":
    main()

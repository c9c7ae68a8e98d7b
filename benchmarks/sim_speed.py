"""Simulator speed: one simulated hour of a 10 req/s Poisson workload on 8 replicas.

Run: .venv/bin/python benchmarks/sim_speed.py [--model M --gpu G --rate R --hours H --replicas N]
Prints wall time for workload generation, operator tables and the event simulation.
"""

from __future__ import annotations

import argparse
import time

from simulator.api import Deployment, run
from simulator.workload import synthetic


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--rate", type=float, default=10.0)
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--input-dist", default="normal:764,561")
    ap.add_argument("--output-dist", default="normal:674,412")
    ap.add_argument("--router", default="least_outstanding")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()

    t0 = time.perf_counter()
    wl = synthetic(
        a.rate, duration=3600 * a.hours, input_dist=a.input_dist, output_dist=a.output_dist
    )
    t1 = time.perf_counter()
    dep = Deployment(a.model, a.gpu, tp=a.tp)
    dep.cost()  # operator tables (cached afterwards)
    t2 = time.perf_counter()
    walls = []
    res: dict = {}
    for _ in range(a.repeat):
        s = time.perf_counter()
        res = run(dep, wl, replicas=a.replicas, router=a.router)
        walls.append(time.perf_counter() - s)
    steps = sum(r["steps"] for r in res["replicas"])
    print(
        f"workload: {len(wl)} requests over {wl.duration:.0f} s at {a.rate} req/s "
        f"({a.model} on {a.replicas} x {a.gpu}, TP={a.tp}, router {a.router})"
    )
    print(f"generate workload     {t1 - t0:8.3f} s")
    print(f"build operator tables {t2 - t1:8.3f} s")
    every = ", ".join(f"{w:.2f}" for w in walls)
    print(f"simulate (best of {a.repeat})   {min(walls):8.3f} s   (all: {every})")
    print(f"engine iterations simulated: {steps} ({steps / min(walls) / 1e3:.0f} k/s wall)")
    print(f"simulated-time / wall-time: {res['duration_s'] / min(walls):.0f}x")
    ttft, tpot = res["ttft_s"]["p50"] * 1e3, res["tpot_s"]["p50"] * 1e3
    print(f"result: {res['completed']} completed, {res['throughput_rps']:.2f} req/s, ")
    print(f"        TTFT p50 {ttft:.1f} ms, TPOT p50 {tpot:.2f} ms")


if __name__ == "__main__":
    main()

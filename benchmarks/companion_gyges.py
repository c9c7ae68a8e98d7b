"""Gyges headline (§6.2.4, Figure 12): transformation-aware scheduling against round-robin and
least-load, all with the same TP1 -> TP4 transformations, on the paper's workload (1K-token
prompts at 60/min, 50K-token prompts at 1/min, 8 x H20, Qwen2.5-32B). Two comparisons, both
on three workload seeds:

1. **equal offered load**: every policy at the same multiples of the paper's rates; throughput,
   SLO attainment and the load's utilisation (offered tokens/s over the highest tokens/s any
   policy sustains within the SLO);
2. **SLO-bounded maximum load** (the paper's "throughput"): the tokens/s each policy delivers
   at the highest load where >= 90 % of requests meet TTFT <= 10 s and TPOT <= 100 ms, for
   several run lengths, so that the gain's dependence on the run length shows.

Run: nice -n 10 .venv/bin/python benchmarks/companion_gyges.py [--equal-loads 1,2,2.5,3]
     [--loads 1.5,...,4] [--durations 600,1200,2400] [--seeds 0,1,2] [--calibrated]
     [--json FILE] [--quick]   (--quick: one seed, 1200 s, the old single table)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from simulator.policies.gyges.experiment import (
    MODES,
    PAPER_CALIBRATION,
    equal_load,
    figure12,
    stability,
)


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",")]


def _rng(v: list[float], pct: bool = True) -> str:
    f = (lambda x: f"{100 * x:+.1f} %") if pct else (lambda x: f"{x:.3f}")
    return f"{f(statistics.mean(v))} ({f(min(v))} .. {f(max(v))})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--equal-loads", default="1,2,2.5,3")
    ap.add_argument("--loads", default="1.5,1.75,2,2.25,2.5,2.75,3,3.25,3.5,3.75,4")
    ap.add_argument("--durations", default="600,1200,2400")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--calibrated", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    cal = PAPER_CALIBRATION if a.calibrated else None
    seeds = [int(x) for x in a.seeds.split(",")]
    t0 = time.perf_counter()
    out: dict[str, Any] = {}
    if a.quick:
        res = figure12(_floats(a.loads), 1200.0, seeds[0], cal)
        for mode, r in res["sustainable"].items():
            print(f"  {mode:14s} {r['tokens_per_s']:7.0f} tok/s at load x{r['load']:g}")
        for mode, g in res["gain_over"].items():
            print(f"Gyges vs {mode}: {100 * g:+.1f} % (paper: +26.1 % to +39.2 %)")
        return

    # 2 first: its sustainable throughputs define the utilisation of the equal loads
    durations = _floats(a.durations)
    stab = stability(durations, seeds, _floats(a.loads), cal)
    out["stability"] = stab
    print("SLO-bounded maximum load (>= 90 % within TTFT 10 s, TPOT 100 ms):")
    print(f"{'run length':>11s}{'seed':>6s}" + "".join(f"{m + ' load':>20s}" for m in MODES)
          + f"{'vs round-robin':>16s}{'vs least-load':>15s}")
    for r in stab:
        sus = r["sustainable"]
        loads = "".join(f"{sus[m]['load']:>13g} {sus[m]['tokens_per_s']:6.0f}" for m in MODES)
        print(f"{r['duration_s']:>10.0f}s{r['seed']:>6d}{loads}"
              f"{100 * r['gain_over']['round_robin']:>+15.1f}%"
              f"{100 * r['gain_over']['least_loaded']:>+14.1f}%")
    for d in durations:
        rs = [r for r in stab if r["duration_s"] == d]
        print(f"  {d:.0f} s runs: vs round-robin "
              f"{_rng([r['gain_over']['round_robin'] for r in rs])}, vs least-load "
              f"{_rng([r['gain_over']['least_loaded'] for r in rs])}")
    longest = [r for r in stab if r["duration_s"] == max(durations)]
    capacity = statistics.mean(r["sustainable"]["gyges"]["tokens_per_s"] for r in longest)

    eq = equal_load(_floats(a.equal_loads), max(durations), seeds, cal)
    out["equal_load"] = eq
    out["capacity_tokens_per_s"] = capacity
    print(f"\nEqual offered load ({max(durations):.0f} s runs, seeds {seeds}); utilisation = "
          f"offered tokens/s over {capacity:.0f} tok/s (Gyges's sustainable throughput):")
    print(f"{'load':>6s}{'util.':>7s}" + "".join(f"{m + ' tok/s':>20s}{'SLO att':>9s}"
                                                for m in MODES))
    for x in _floats(a.equal_loads):
        rows = {m: [r for r in eq["rows"] if r["mode"] == m and r["load"] == x] for m in MODES}
        offered = statistics.mean(r["tokens_per_s"] for r in rows["gyges"])
        line = f"{x:>6g}{100 * offered / capacity:>6.0f}%"
        for m in MODES:
            line += (f"{statistics.mean(r['tokens_per_s'] for r in rows[m]):>20.0f}"
                     f"{statistics.mean(r['slo_attainment'] for r in rows[m]):>9.3f}")
        print(line)
    for m, per in eq["relative"].items():
        for x, v in per.items():
            print(f"  Gyges vs {m} at x{x:g}: throughput {_rng(v['throughput'])}, "
                  f"SLO attainment {_rng(v['attainment'], pct=False)} (difference)")
    print(f"total wall {time.perf_counter() - t0:.0f} s")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=2)


if __name__ == "__main__":
    main()

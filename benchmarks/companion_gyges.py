"""Gyges headline (§6.2.4, Figure 12): throughput of transformation-aware scheduling against
round-robin and least-load, all with the same TP1 -> TP4 transformations, on the paper's
workload (1K-token prompts at 60/min, 50K-token prompts at 1/min, 8 x H20, Qwen2.5-32B).

Run: .venv/bin/python benchmarks/companion_gyges.py [--loads 1,1.5,...] [--duration S]
     [--calibrated]   (TP overhead fitted to the paper's Table 1)  [--json FILE]
Prints each policy's throughput and SLO attainment per load multiple, its sustainable
throughput (highest load meeting TTFT <= 10 s and TPOT <= 100 ms for 90 % of requests) and
Gyges's gain over each baseline (paper: +26 % to +39 %).
"""

from __future__ import annotations

import argparse
import json
import time

from simulator.policies.gyges.experiment import PAPER_CALIBRATION, figure12


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--loads", default="1,1.5,2,2.25,2.5,2.75,3,3.25,3.5,3.75,4")
    ap.add_argument("--duration", type=float, default=1200.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--calibrated", action="store_true")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    t0 = time.perf_counter()
    res = figure12([float(x) for x in a.loads.split(",")], a.duration, a.seed,
                   PAPER_CALIBRATION if a.calibrated else None)
    print(f"{'policy':14s}{'load':>6s}{'tok/s':>9s}{'req/s':>8s}{'SLO att':>9s}"
          f"{'TTFT p99':>10s}{'merges':>8s}{'splits':>8s}{'wall s':>8s}")
    for mode, rows in res["rows"].items():
        for r in rows:
            print(f"{mode:14s}{r['load']:6.1f}{r['tokens_per_s']:9.0f}{r['requests_per_s']:8.2f}"
                  f"{r['slo_attainment']:9.3f}{r['ttft_p99']:10.1f}{r['merges']:8d}"
                  f"{r['splits']:8d}{r['wall_s']:8.1f}")
    print("\nsustainable throughput (SLO met by >= 90 %):")
    for mode, r in res["sustainable"].items():
        print(f"  {mode:14s} {r['tokens_per_s']:7.0f} tok/s at load x{r['load']:g}")
    for mode, g in res["gain_over"].items():
        print(f"Gyges vs {mode}: {100 * g:+.1f} % (paper: +26.1 % to +39.2 %)")
    print(f"total wall {time.perf_counter() - t0:.0f} s")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(res, fh, indent=2)


if __name__ == "__main__":
    main()

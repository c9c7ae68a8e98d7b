"""Prism headline (Table 1, §7.3, §7.5): eight models on two shared H100s against one
dedicated H100 per model, and the GPUs each system needs for 99 % of the dedicated
deployment's SLO attainment (the cost saving; paper: 2 GPUs for 8 models, > 2x saving).

Run: .venv/bin/python benchmarks/companion_prism.py [--rates 4,8,12] [--duration S]
     [--slo-scale K] [--need-rate R] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import time

from simulator.policies.prism.experiment import gpus_needed, headline


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rates", default="4,8,12,16")
    ap.add_argument("--duration", type=float, default=1800.0)
    ap.add_argument("--slo-scale", type=float, default=5.0)
    ap.add_argument("--need-rate", type=float, default=8.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    t0 = time.perf_counter()
    rows = headline([float(x) for x in a.rates.split(",")], a.duration, a.slo_scale,
                    seed=a.seed)
    print(f"SLO = {a.slo_scale:g} x each model's P95 TTFT/TPOT on its dedicated GPU")
    print(f"{'req/s':>6s}  {'dedicated (8)':>14s}{'prism (2)':>11s}{'muxserve (2)':>14s}"
          f"{'static (2)':>12s}")
    for r in rows:
        print(f"{r['rate']:6.1f}  {r['dedicated']['slo_attainment']:14.3f}"
              f"{r['prism']['slo_attainment']:11.3f}{r['muxserve']['slo_attainment']:14.3f}"
              f"{r['static']['slo_attainment']:12.3f}")
    need = gpus_needed(a.need_rate, a.duration, a.slo_scale, a.seed)
    print(f"\nGPUs for 99 % of the dedicated attainment ({need['dedicated_attainment']:.3f}) at "
          f"{a.need_rate:g} req/s: {need['gpus']}")
    print("cost saving vs dedicated: " + ", ".join(
        f"{m} {x:.1f}x" for m, x in need["cost_saving"].items() if m != "dedicated"))
    print(f"total wall {time.perf_counter() - t0:.0f} s")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"headline": rows, "gpus_needed": need}, fh, indent=2)


if __name__ == "__main__":
    main()

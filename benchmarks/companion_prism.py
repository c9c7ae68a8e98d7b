"""Prism headline (Table 1, §7.3, §7.5): eight models on two shared H100s against one
dedicated H100 per model, and the GPUs each system needs for 99 % of the dedicated
deployment's SLO attainment (the cost saving; paper: 2 GPUs for 8 models, > 2x saving).

Run: .venv/bin/python benchmarks/companion_prism.py [--rates 4,8,12,16,24,32]
     [--duration S] [--slo-scale K] [--need-rate R] [--seeds 0,1,2] [--json FILE]
Every rate on every seed; "util." is the operating point's utilisation on the two shared GPUs:
the GPU-time the offered requests need at each model's dedicated saturated speed, per GPU
(`experiment.work_share`, mean over seeds).
"""

from __future__ import annotations

import argparse
import json
import time

from simulator.policies.prism.experiment import gpus_needed, headline


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rates", default="4,8,12,16,24,32")
    ap.add_argument("--duration", type=float, default=1800.0)
    ap.add_argument("--slo-scale", type=float, default=5.0)
    ap.add_argument("--need-rate", type=float, default=8.0)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    t0 = time.perf_counter()
    seeds = [int(x) for x in a.seeds.split(",")]
    rates = [float(x) for x in a.rates.split(",")]
    by_seed = {s: headline(rates, a.duration, a.slo_scale, seed=s) for s in seeds}
    print(f"SLO = {a.slo_scale:g} x each model's P95 TTFT/TPOT on its dedicated GPU; "
          f"attainment per seed {seeds}")
    print(f"{'req/s':>6s} {'util.':>5s}  {'dedicated (8)':>20s}{'prism (2)':>20s}"
          f"{'muxserve++ (2)':>20s}{'static (2)':>20s}")
    for i, rate in enumerate(rates):
        per = [by_seed[s][i] for s in seeds]
        busy = sum(r["work_share"] for r in per) / len(per)
        cells = ""
        for m in ("dedicated", "prism", "muxserve", "static"):
            att = "/".join(f"{r[m]['slo_attainment']:.3f}" for r in per)
            cells += f"{att:>20s}"
        print(f"{rate:6.1f} {100 * busy:4.0f}%  {cells}")
    need = gpus_needed(a.need_rate, a.duration, a.slo_scale, seeds[0])
    print(f"\nGPUs for 99 % of the dedicated attainment ({need['dedicated_attainment']:.3f}) at "
          f"{a.need_rate:g} req/s: {need['gpus']}")
    print("cost saving vs dedicated: " + ", ".join(
        f"{m} {x:.1f}x" for m, x in need["cost_saving"].items() if m != "dedicated"))
    print(f"total wall {time.perf_counter() - t0:.0f} s")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"headline": by_seed, "gpus_needed": need}, fh, indent=2)


if __name__ == "__main__":
    main()

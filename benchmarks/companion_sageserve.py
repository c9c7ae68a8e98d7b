"""SageServe headline (Figure 11): instance-hours over a day of forecast-aware scaling (LT-I,
LT-U, LT-UA) against reactive scaling, at similar tail TTFT; Llama-2-70B, three regions.

Run: .venv/bin/python benchmarks/companion_sageserve.py [--rate R] [--hours H] [--start-h H]
     [--max-instances N] [--json FILE]
Paper (Llama-2, peak day): reactive 362.25, LT-I 274.5, LT-U 291, LT-UA 277.5 instance-hours:
24.2 %, 19.7 %, 23.4 % fewer.
"""

from __future__ import annotations

import argparse
import json
import time

from simulator.policies.sageserve.experiment import run_day


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rate", type=float, default=10.0, help="daily mean req/s (all regions)")
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--start-h", type=float, default=0.0)
    ap.add_argument("--max-instances", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    t0 = time.perf_counter()
    res = run_day(a.rate, a.hours, a.start_h, a.seed, max_instances=a.max_instances)
    print(f"{res['requests']} requests over {a.hours:g} h from {a.start_h:g}:00")
    print(f"{'mode':10s}{'inst-h':>9s}{'saving':>9s}{'launched':>10s}{'IW TTFT p95':>13s}"
          f"{'(worst)':>9s}{'NIW e2e p95':>13s}{'wall s':>8s}")
    for mode, r in res["modes"].items():
        print(f"{mode:10s}{r['instance_hours']:9.1f}{100 * r.get('saving_vs_reactive', 0):8.1f}%"
              f"{r['launched']:10d}{r['iw_ttft_p95_mean']:13.2f}{r['iw_ttft_p95_max']:9.2f}"
              f"{r['niw_e2e_p95']:13.0f}{r['wall_s']:8.1f}")
    print("paper: 24.2 % (LT-I), 19.7 % (LT-U), 23.4 % (LT-UA) fewer instance-hours")
    print(f"total wall {time.perf_counter() - t0:.0f} s")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(res, fh, indent=2)


if __name__ == "__main__":
    main()

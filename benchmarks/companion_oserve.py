"""OSERVE headline (Table 1): heterogeneous deployment against the best homogeneous one as
the workload mix grows more skewed (CV of the four type proportions), on the paper's setup
(Llama2-70B, 16 H100s) and on OPT-30B (another OSERVE model, full multi-head attention,
lengths halved for its 2K context). Optionally Table 2 (temporal), with adaptive switching.

Run: .venv/bin/python benchmarks/companion_oserve.py [--models 70b,opt] [--levels S1,...]
     [--duration S] [--table2 T1,T4] [--routing backlog|lp|lp-wrr] [--json FILE]
     [--search-check S1,S3,S5 --seeds 3]  (search vs exhaustive instead of Table 1)
     [--served-layouts S1,S3,S5 [--served-keep 0.85]]  (near-best layouts on the serving
     check's sample)
     [--operating-points 0.7,0.9 --seeds 3]  (the paper's metric, P99 end-to-end latency, at
     loads the layouts carry: each level's mix offered at that share of the LP's best
     homogeneous capacity; OSERVE with type-matched LP routing, with and without its serving
     check, against the best homogeneous layout; one line per seed)
Planned speedup = LP throughput of the layout OSERVE launches (after its serving check; the
search's own result and the check's figures are printed below the table) / the LP's best
homogeneous layout on the mix; simulated = requests completed when offered 1.05x that
homogeneous capacity, against the best-serving homogeneous layout (paper speedups: 1.14x at
CV 0.112 to 2.66x at CV 0.688). The "static" columns compare with one fixed
homogeneous layout, the best on --static-from's mix (default S1), at every level.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from simulator.policies.oserve.experiment import (
    OPT,
    operating_point,
    search_check,
    served_layouts,
    table1,
    table2,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", default="70b,opt")
    ap.add_argument("--levels", default="S1,S2,S3,S4,S5")
    ap.add_argument("--duration", type=float, default=600.0)
    ap.add_argument("--static-from", default="S1",
                    help="level whose best homogeneous layout is the fixed baseline ('' for none)")
    ap.add_argument("--table2", default="")
    ap.add_argument("--routing", default="backlog", help="OSERVE's routing (policy.ROUTING)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--search-check", default="",
                    help="levels on which to compare the search (per seed) with exhaustive")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--served-layouts", default="",
                    help="levels on which every layout within --served-keep of the LP's best "
                         "serves the serving check's sample (is there a heterogeneous gain?)")
    ap.add_argument("--served-keep", type=float, default=0.85)
    ap.add_argument("--operating-points", default="",
                    help="utilisations (share of the LP's best homogeneous capacity) at which "
                         "to measure P99 latency, e.g. 0.7,0.9")
    a = ap.parse_args()
    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    if a.operating_points:
        print("P99 end-to-end latency speedup over the best homogeneous layout (vLLM static), "
              "per seed; paper: 1.14x (S1) to 2.66x (S5)")
        for key in a.models.split(","):
            kw_o: dict[str, Any] = {"model": OPT["model"], "scale": OPT["scale"]} \
                if key == "opt" else {}
            for u in (float(x) for x in a.operating_points.split(",")):
                for name in a.levels.split(","):
                    r = operating_point(name, u, range(a.seeds), a.duration, **kw_o)
                    out[f"op_{key}_{name}_{u:g}"] = r
                    hom = r["runs"]["homogeneous"]
                    for sys_ in ("oserve", "oserve-het"):
                        sp = ", ".join(f"{x:.3f}" for x in r["p99_speedup"][sys_])
                        lay = r["runs"][sys_][0]["layout"]
                        print(f"{key} {name} (CV {r['cv']:.3f}, paper {r['paper_speedup']:.2f}x) "
                              f"util {100 * u:.0f} % ({r['offered_rps']:.2f} req/s): {sys_:10s} "
                              f"{sp} [{'stable' if r['stable'][sys_] else 'mixed'}] {lay}; "
                              f"homogeneous {hom[0]['layout']} P99 "
                              + ", ".join(f"{h['e2e_p99']:.1f}" for h in hom) + " s",
                              flush=True)
        print(f"total wall {time.perf_counter() - t0:.0f} s")
        if a.json:
            with open(a.json, "w") as fh:
                json.dump(out, fh, indent=2, default=str)
        return
    if a.served_layouts:
        for key in a.models.split(","):
            kw_v: dict[str, Any] = {"model": OPT["model"], "scale": OPT["scale"]} \
                if key == "opt" else {}
            for name in a.served_layouts.split(","):
                r = served_layouts(name, keep=a.served_keep, **kw_v)
                out[f"served_{key}_{name}"] = r
                print(f"{key} {name}: served / planned over {r['homogeneous']} "
                      f"({r['homogeneous_served_rps']:.2f} req/s served), "
                      f"{len(r['layouts'])} layouts, best 8:")
                for x in r["layouts"][:8]:
                    print(f"  {x['served']:.3f} / {x['planned']:.3f}  {x['layout']}")
                print(flush=True)
        print(f"total wall {time.perf_counter() - t0:.0f} s")
        if a.json:
            with open(a.json, "w") as fh:
                json.dump(out, fh, indent=2, default=str)
        return
    if a.search_check:
        for key in a.models.split(","):
            kw_s: dict[str, Any] = {"model": OPT["model"], "scale": OPT["scale"]} \
                if key == "opt" else {}
            for name in a.search_check.split(","):
                r = search_check(name, range(a.seeds), **kw_s)
                out[f"search_{key}_{name}"] = r
                print(f"{key} {name}: exhaustive {r['exhaustive']} ({r['exhaustive_rps']:.2f} "
                      "req/s); search " + "; ".join(
                          f"seed {s}: {v['ratio']:.4f} {v['layout']}"
                          for s, v in r["search"].items()), flush=True)
        print(f"\ntotal wall {time.perf_counter() - t0:.0f} s")
        if a.json:
            with open(a.json, "w") as fh:
                json.dump(out, fh, indent=2, default=str)
        return
    for key in a.models.split(","):
        kw: dict[str, Any] = {"duration_s": a.duration, "static_from": a.static_from or None,
                              "routing": a.routing}
        if key == "opt":
            kw.update(model=OPT["model"], scale=OPT["scale"])
        rows = table1(levels=a.levels.split(","), **kw)
        out[key] = rows
        print(f"\n{rows[0]['level'] and ('Llama2-70B' if key == '70b' else 'OPT-30B')} "
              f"on 16 x H100")
        print(f"{'level':6s}{'CV':>7s}{'paper':>7s}{'planned':>9s}{'simul.':>8s}"
              f"{'static planned':>16s}{'simul.':>8s}  "
              f"{'OSERVE layout':40s}{'homogeneous':16s}{'static':16s}")
        nan = float("nan")
        for r in rows:
            print(f"{r['level']:6s}{r['cv']:7.3f}{r['paper_speedup']:7.2f}"
                  f"{r['planned_speedup']:9.3f}{r.get('simulated_speedup', nan):8.3f}"
                  f"{r.get('static_planned_speedup', nan):16.3f}"
                  f"{r.get('static_simulated_speedup', nan):8.3f}  "
                  f"{r['oserve_layout']:40s}{r['homogeneous_layout']:16s}"
                  f"{r.get('static_layout', '-'):16s}")
        for r in rows:
            c = r["check"]
            if c:
                served = ", ".join(f"{k} {v:.2f}" for k, v in c["served_rps"].items())
                print(f"  {r['level']} search: {r['searched_layout']} planned "
                      f"{r['searched_planned_speedup']:.3f}; serving check ({c['sample_s']:.0f} s "
                      f"at {c['sample_rps']:.1f} req/s, served req/s): {served}: "
                      f"launch {c['chosen']}")
        for r in rows:
            if "oserve_run_layout" in r:
                print(f"  {r['level']} simulated runs' layouts: OSERVE {r['oserve_run_layout']}; "
                      f"homogeneous {r['homogeneous_run_layout']}; "
                      f"static {r.get('static_run_layout', r['homogeneous_run_layout'])}")
    for name in filter(None, a.table2.split(",")):
        r = table2(name, model=str(OPT["model"]), scale=float(str(OPT["scale"])), load=1.0,
                   routing=a.routing)
        out[f"table2_{name}"] = r
        print(f"\nTable 2 {name} (OPT-30B, {'/'.join(r['levels'])}): OSERVE {r['oserve_rps']:.1f} "
              f"req/s, P99 {r['oserve_e2e_p99']:.1f} s; static {r['static_rps']:.1f} req/s, "
              f"P99 {r['static_e2e_p99']:.1f} s; P99 speedup {r['p99_speedup']:.2f} "
              f"(paper {r['paper_speedup']})")
    print(f"\ntotal wall {time.perf_counter() - t0:.0f} s")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=2, default=str)


if __name__ == "__main__":
    main()

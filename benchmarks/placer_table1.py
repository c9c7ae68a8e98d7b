"""The paper's Table 1 scenario: otela's plan vs the paper's plan vs memP, all simulated.

24 A100-80GB + 32 GH200 (hosts of 4); Llama-2-13B 110 req/s, CodeLlama-34B 185.5 req/s,
Llama-3.3-70B 221 req/s with upstream's Normal length distributions (scenarios.py). Each
allocation is evaluated by the event simulator on the same Poisson workload (`--duration`,
default 300 s as upstream's experiment), routed by its own weights (the paper's and memP's
as published in upstream's experiment files; otela's from its solution), and again with the
routing weights otela's model finds best for that allocation. Goodput counts requests within
TTFT <= 10 s and TPOT <= 0.1 s (the simulator's default SLO).

    nice -n 10 .venv/bin/python benchmarks/placer_table1.py [--duration 300] [--out DIR]
        [--seeds 0,1,2] [--rate-scale 0.25 | --target-utilisation 0.9]

Without --rate-scale it runs two operating points: the paper's rates (where every plan is
overloaded) and the rates at which the busiest model of otela's or the paper's plan is
offered 90 % of its capacity (memP's utilisation there is reported, whatever it is); each
plan on three workload seeds, with its utilisation and unserved models.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from simulator.placer.cpsat import Option, Problem, solve
from simulator.placer.demand import SLO, Demand, Objective
from simulator.placer.evaluate import Group, evaluate, groups_of_plan
from simulator.placer.memp import memp
from simulator.placer.plan import make_plan
from simulator.placer.pool import Variant
from simulator.placer.profile import Profiler, default_cache_dir
from simulator.placer.scenarios import PAPER_MEMP, PAPER_PLAN, table1_demand, table1_pool

GOODPUT_SLO = SLO(ttft_s=10.0, tpot_s=0.1)


def best_weights(problem: Problem, counts: dict[tuple[str, str, int], int]) -> list[Group]:
    """Routing weights otela's model finds best for a fixed allocation (flows only)."""
    fixed = tuple(Option(o.service, o.variant, o.tp, o.pieces, o.cap, o.cost_per_hour,
                         counts.get((o.service, o.variant, o.tp), 0)) for o in problem.options)
    sol = solve(Problem(problem.rates, fixed, (), Objective.LATENCY), time_limit_s=30)
    return [Group(o.service, Variant(o.variant), o.tp, o.existing, f)
            for o, f in zip(fixed, sol.flows, strict=True) if o.existing > 0]


def model_latency(problem: Problem, groups: Sequence[Group]) -> float:
    """Mean latency the planner's model predicts for fixed groups and weights."""
    total = 0.0
    idx = {(o.service, o.variant, o.tp): o for o in problem.options}
    for svc, rate in problem.rates.items():
        mine = [g for g in groups if g.service == svc]
        wsum = sum(g.weight for g in mine)
        for g in mine:
            o = idx[(g.service, g.variant.name, g.tp)]
            flow = rate * g.weight / wsum
            total += max(a * g.replicas + b * flow for a, b in o.pieces)
    return total / sum(problem.rates.values())


def operating_point(scale: float, duration: float, seeds: Sequence[int],
                    cache: Path) -> dict[str, Any]:
    """Plan (otela, memP) for the Table 1 demand times `scale`, and evaluate every plan on
    the same Poisson workload for each seed."""
    pool = table1_pool()
    demand = table1_demand(Objective.LATENCY, horizon_s=duration)
    if scale != 1.0:
        demand = Demand(tuple(replace(s, rate=s.rate * scale) for s in demand.services),
                        demand.objective, demand.horizon_s)
    profiler = Profiler(cache, requests=600)
    t0 = time.monotonic()
    cands, rejected = profiler.candidates(demand.services, pool.variants(), lambda v: 4)
    profile_s = time.monotonic() - t0
    plan = make_plan(demand, pool, cands, rejected, time_limit_s=60.0)
    problem = plan.problem
    phase = plan.solution.phases[0]
    print(f"\n== rates x{scale:.3g}: profiled {len(cands)} configurations in {profile_s:.0f}s "
          f"({profiler.simulated} simulated); CP-SAT {phase.status} in {phase.wall_s:.2f}s, "
          f"gap {phase.gap:.2%}", flush=True)

    def published(groups: Sequence[Any]) -> list[Group]:
        return [Group(g.service, Variant(g.gpu), g.tp, g.replicas, g.weight) for g in groups]

    memp_groups = [Group(g.service, Variant(g.variant), g.tp, g.replicas, g.replicas)
                   for g in memp(demand.services, pool)]
    plans: dict[str, list[Group]] = {
        "otela (CP-SAT)": groups_of_plan(plan),
        "paper, published weights": published(PAPER_PLAN),
        "paper, otela's weights": best_weights(problem, _counts(published(PAPER_PLAN))),
        "memP, published weights": published(PAPER_MEMP),
        "memP (ours), otela's weights": best_weights(problem, _counts(memp_groups)),
    }
    slos = {s.name: GOODPUT_SLO for s in demand.services}
    results: list[dict[str, Any]] = []
    for name, groups in plans.items():
        runs = []
        for seed in seeds:
            t = time.monotonic()
            ev = evaluate(demand, groups, duration, seed=seed, slo=slos)
            runs.append(ev.to_dict() | {"seed": seed, "eval_s": time.monotonic() - t})
            unserved = f"  UNSERVED {','.join(ev.unserved)}" if ev.unserved else ""
            print(f"{name:30s} seed {seed}: mean {ev.mean_e2e:7.1f}s  p99 {ev.p99_e2e:7.1f}s  "
                  f"goodput {ev.goodput_rps:6.1f}/s  max util {ev.max_utilization:5.2f}"
                  f"{unserved}  ({time.monotonic() - t:.0f}s)", flush=True)
        results.append({"plan": name, "allocation": _alloc(groups),
                        "model_mean_latency_s": model_latency(problem, groups), "runs": runs})
    return {"rate_scale": scale, "profile_s": profile_s,
            "solver": [vars(p) for p in plan.solution.phases], "results": results}


def _spread(runs: Sequence[dict[str, Any]], key: str) -> str:
    v = [r[key] for r in runs]
    mean = sum(v) / len(v)
    return f"{mean:,.1f} ({min(v):,.1f}-{max(v):,.1f})" if len(v) > 1 else f"{mean:,.1f}"


def verdict(point: dict[str, Any], ours: str = "otela (CP-SAT)",
            theirs: str = "paper, published weights") -> dict[str, Any]:
    """otela's mean and p99 latency relative to the paper's plan, seed by seed; stable when
    every seed gives the same sign."""
    by = {r["plan"]: r["runs"] for r in point["results"]}
    out: dict[str, Any] = {}
    for key in ("mean_e2e_s", "p99_e2e_s", "goodput_rps"):
        rel = [a[key] / b[key] - 1 for a, b in zip(by[ours], by[theirs], strict=True)]
        out[key] = {"per_seed": rel, "stable": all(x < 0 for x in rel) or all(x > 0 for x in rel)}
    return out


def print_point(point: dict[str, Any]) -> None:
    print(f"\n### rates x{point['rate_scale']:.3g} of Table 1 (mean over seeds, min-max)\n")
    print("| plan | 13B | 34B | 70B | max utilisation | unserved | model mean | sim mean e2e "
          "| sim p99 e2e | goodput |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in point["results"]:
        a, runs = r["allocation"], r["runs"]
        util = max(x["max_utilization"] or 0.0 for x in runs)
        unserved = ", ".join(sorted({m for x in runs for m in x["unserved"]})) or "-"
        print(f"| {r['plan']} | {a.get('13b', '-')} | {a.get('34b', '-')} | {a.get('70b', '-')} "
              f"| {100 * util:.0f} % | {unserved} | {r['model_mean_latency_s']:.1f} s "
              f"| {_spread(runs, 'mean_e2e_s')} s | {_spread(runs, 'p99_e2e_s')} s "
              f"| {_spread(runs, 'goodput_rps')}/s |")
    v = verdict(point)
    for key, label in (("mean_e2e_s", "mean"), ("p99_e2e_s", "p99"), ("goodput_rps", "goodput")):
        per = ", ".join(f"{100 * x:+.1f} %" for x in v[key]["per_seed"])
        print(f"otela vs paper (published weights), {label}: {per} per seed; "
              f"{'stable' if v[key]['stable'] else 'NOT stable'} across seeds")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=300.0)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--cache", type=Path, default=default_cache_dir())
    ap.add_argument("--seeds", default="0,1,2", help="workload seeds, comma-separated")
    ap.add_argument("--rate-scale", type=float, default=None,
                    help="one operating point: every model's rate times this (same pool; "
                    "otela and memP re-planned, the paper's plan as published)")
    ap.add_argument("--target-utilisation", type=float, default=0.9,
                    help="without --rate-scale: the paper's rates, then the rates at which "
                    "the busiest model of otela's or the paper's plan is offered this share "
                    "of its capacity")
    args = ap.parse_args()
    seeds = [int(x) for x in args.seeds.split(",")]
    points = []
    if args.rate_scale is not None:
        points.append(operating_point(args.rate_scale, args.duration, seeds, args.cache))
    else:
        first = operating_point(1.0, args.duration, seeds, args.cache)
        points.append(first)
        # utilisation is linear in the rate for a fixed plan: scale so that the busiest
        # model of the two plans the headline compares (otela's, the paper's) is at the
        # target at the paper's rates; otela re-plans there, memP's utilisation is reported
        compared = ("otela (CP-SAT)", "paper, published weights")
        worst = max(x["max_utilization"] or 0.0 for r in first["results"]
                    if r["plan"] in compared for x in r["runs"])
        scale = args.target_utilisation / worst
        points.append(operating_point(scale, args.duration, seeds, args.cache))
    args.out.mkdir(parents=True, exist_ok=True)
    name = "placer_table1.json" if args.rate_scale is None else \
        f"placer_table1_x{args.rate_scale:g}.json"
    (args.out / name).write_text(json.dumps(
        {"duration_s": args.duration, "seeds": seeds,
         "points": [p | {"verdict": verdict(p)} for p in points]}, indent=2))
    for p in points:
        print_point(p)
        print(f"\nper model (sim mean / p99 e2e s, utilisation; seed {seeds[0]}):")
        for r in p["results"]:
            per = ", ".join(
                f"{m['service'].split('/')[1]} " + (
                    "UNSERVED" if not m["served"] else
                    f"{m['mean_e2e']:.1f}/{m['p99_e2e']:.1f} ({100 * m['utilization']:.0f} %)")
                for m in r["runs"][0]["models"])
            print(f"  {r['plan']}: {per}")


def _counts(groups: Sequence[Group]) -> dict[tuple[str, str, int], int]:
    out: dict[tuple[str, str, int], int] = {}
    for g in groups:
        k = (g.service, g.variant.name, g.tp)
        out[k] = out.get(k, 0) + g.replicas
    return out


def _alloc(groups: Sequence[Group]) -> dict[str, str]:
    short = {"Llama-2-13b-hf": "13b", "CodeLlama-34b-hf": "34b", "Llama-3.3-70B-Instruct": "70b"}
    out: dict[str, list[str]] = {}
    for g in groups:
        name = "A100" if g.variant.gpu.startswith("a100") else "GH200"
        total = sum(x.weight for x in groups if x.service == g.service)
        share = g.weight / max(total, 1e-9)
        out.setdefault(short[g.service.split("/")[1]], []).append(
            f"{g.replicas * g.tp}x{name} (TP{g.tp}, w {share:.2f})")
    return {k: " + ".join(v) for k, v in out.items()}


if __name__ == "__main__":
    main()

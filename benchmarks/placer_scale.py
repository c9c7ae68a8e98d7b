"""Placer scale benchmark: CP-SAT solve time and optimality gap on growing pools.

Pools of 8, 64, 256 and 1,024 GPUs over 4-6 GPU types (hosts of 2, 4 or 8 GPUs), 3-20
models (catalog models x two length profiles). Curves come from the simulator (cached on
disk: the first run simulates every configuration; later runs only solve). Demand is set
so the pool is loaded but not overloaded: each model gets an equal share of the pool's GPUs
at half of its per-GPU capacity averaged over the pool's GPU types.

    nice -n 10 .venv/bin/python benchmarks/placer_scale.py [--out DIR] [--workers 8]

Each pool and objective is solved `--repeats` times with different CP-SAT seeds (its
multi-worker search is not deterministic in time): the table gives the median and the worst.
Prints a markdown table and writes DIR/placer_scale.json and DIR/placer_scale.png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from simulator.placer.cpsat import DEFAULT_WORKERS, solve
from simulator.placer.demand import Demand, Lengths, Objective, Service
from simulator.placer.plan import build_problem
from simulator.placer.pool import Host, Pool, Variant
from simulator.placer.profile import Profiler, default_cache_dir

MODELS = ["llama-3.1-8b", "qwen3-8b", "mistral-7b", "qwen2.5-7b", "llama-2-13b",
          "qwen3-32b", "qwen2.5-32b", "codellama-34b", "llama-3.3-70b", "qwen3-30b-a3b"]
LOAD = 0.5
PROFILES = [("normal:600,400", "normal:250,150"), ("normal:2000,800", "normal:400,200")]

# (name, GPUs, [(gpu, gpus per host, hosts)], models)
SCENARIOS = [
    ("8 GPUs / 4 types / 3 models", [("a100-80g-sxm", 2, 1), ("h100-sxm", 2, 1),
                                     ("l40s", 2, 1), ("gh200", 2, 1)], 3),
    ("64 GPUs / 5 types / 6 models", [("a100-80g-sxm", 8, 2), ("h100-sxm", 8, 1),
                                      ("l40s", 4, 4), ("gh200", 4, 2), ("a10g", 4, 2)], 6),
    ("256 GPUs / 6 types / 10 models", [("a100-80g-sxm", 8, 8), ("h100-sxm", 8, 6),
                                        ("l40s", 4, 8), ("gh200", 4, 8), ("a10g", 4, 4),
                                        ("h200", 8, 2)], 10),
    ("1,024 GPUs / 6 types / 20 models", [("a100-80g-sxm", 8, 32), ("h100-sxm", 8, 24),
                                          ("l40s", 4, 32), ("gh200", 4, 32),
                                          ("a10g", 4, 16), ("h200", 8, 8)], 20),
]


def pool_of(spec: list[tuple[str, int, int]]) -> Pool:
    hosts = [Host(f"{g}-{i}", Variant(g), per) for g, per, n in spec for i in range(n)]
    return Pool(tuple(hosts))


def services(n: int) -> list[Service]:
    out = []
    for i in range(n):
        model = MODELS[i % len(MODELS)]
        inp, outp = PROFILES[(i // len(MODELS)) % len(PROFILES)]
        out.append(Service(f"{model}#{i}", model, 1.0, Lengths.parse(inp), Lengths.parse(outp),
                           tp=(1, 2, 4, 8)))
    return out


def _largest(sizes: dict[str, int]) -> Callable[[Variant], int]:
    """The largest TP group a variant's hosts take."""
    return lambda v: sizes[v.name]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--workers", type=int, default=DEFAULT_WORKERS)
    ap.add_argument("--requests", type=int, default=300, help="simulated requests per point")
    ap.add_argument("--cache", type=Path, default=default_cache_dir())
    ap.add_argument("--only", type=int, default=None, help="run one scenario (index)")
    ap.add_argument("--repeats", type=int, default=3, help="solves per pool and objective")
    ap.add_argument("--time-limit", type=float, default=60.0, help="CP-SAT limit per solve")
    args = ap.parse_args()
    profiler = Profiler(args.cache, requests=args.requests)
    rows = []
    for k, (name, spec, n_models) in enumerate(SCENARIOS):
        if args.only is not None and k != args.only:
            continue
        pool = pool_of(spec)
        sizes = {h.variant.name: max(h.gpus, 0) for h in pool.hosts}
        svcs = services(n_models)
        t0 = time.monotonic()
        cands, rejected = profiler.candidates(svcs, pool.variants(), _largest(sizes))
        profile_s = time.monotonic() - t0
        # demand: an equal share of the GPUs per model at half of its per-GPU capacity
        # averaged over the pool's GPU types (the best configuration on each type)
        share = pool.total_gpus / n_models
        loaded = []
        for s in svcs:
            per_type: dict[str, float] = {}
            for c in cands:
                if c.service == s.name:
                    v = c.variant.name
                    per_type[v] = max(per_type.get(v, 0.0), c.curve.mu / c.tp)
            per_gpu = sum(per_type.get(v.name, 0.0) * pool.gpus_of(v)
                          for v in pool.variants()) / pool.total_gpus
            loaded.append(Service(s.name, s.model, round(LOAD * share * per_gpu, 2), s.input,
                                  s.output, s.slo, s.tp))
        for objective in (Objective.LATENCY, Objective.GPUS):
            demand = Demand(tuple(loaded), objective, 300.0)
            problem = build_problem(demand, pool, cands)
            runs: list[dict[str, Any]] = []
            for seed in range(args.repeats):
                t1 = time.monotonic()
                sol = solve(problem, time_limit_s=args.time_limit, workers=args.workers,
                            seed=seed)
                wall = time.monotonic() - t1
                first = sol.phases[0]
                runs.append({"seed": seed, "status": first.status, "phase1_s": first.wall_s,
                             "gap": first.gap, "objective": first.objective,
                             "bound": first.bound, "unit": first.unit, "total_s": wall,
                             "phases": [vars(p) for p in sol.phases]})
                print(f"{name:34s} {objective.value:8s} options={len(problem.options):4d} "
                      f"seed {seed} {first.status:8s} phase1 {first.wall_s:6.2f}s gap "
                      f"{first.gap:.3%} total {wall:6.2f}s (profiling {profile_s:.0f}s)",
                      flush=True)
            rows.append({
                "scenario": name, "gpus": pool.total_gpus, "types": len(spec),
                "models": n_models, "objective": objective.value,
                "options": len(problem.options), "rejected": len(rejected),
                "profile_s": profile_s, "simulated": profiler.simulated,
                "time_limit_s": args.time_limit, "workers": args.workers, "runs": runs,
                "phase1_s": statistics.median(float(r["phase1_s"]) for r in runs),
            })
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "placer_scale.json").write_text(json.dumps(rows, indent=2))
    print(f"\n{args.repeats} solves each (seeds 0-{args.repeats - 1}), {args.workers} workers, "
          f"{args.time_limit:g} s limit; median (worst)\n")
    print("| pool | objective | options | optimal | phase-1 time | gap to bound | both phases |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        runs = r["runs"]
        optimal = sum(x["status"] == "OPTIMAL" for x in runs)

        def med(key: str, runs: list[dict[str, Any]] = runs) -> tuple[float, float]:
            vals = [float(x[key]) for x in runs]
            return statistics.median(vals), max(vals)

        (t, tw), (g, gw), (b, bw) = med("phase1_s"), med("gap"), med("total_s")
        print(f"| {r['scenario']} | {r['objective']} | {r['options']} "
              f"| {optimal}/{len(runs)} | {t:.2f} s ({tw:.2f}) | {g:.2%} ({gw:.2%}) "
              f"| {b:.1f} s ({bw:.1f}) |")
    _figure(rows, args.out / "placer_scale.png")


def _figure(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for objective, marker in (("latency", "o"), ("gpus", "s")):
        pts = [r for r in rows if r["objective"] == objective]
        ax.plot([r["gpus"] for r in pts], [r["phase1_s"] for r in pts], marker=marker,
                label=f"{objective} objective")
    ax.axhline(10, color="grey", ls=":", lw=1)
    ax.axhline(60, color="grey", ls="--", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("GPUs in the pool")
    ax.set_ylabel("CP-SAT time to phase-1 result (s)")
    ax.set_title("otela plan: CP-SAT solve time (2-core VM)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()

"""OSERVE Table 1 (and Table 2) in the simulator: heterogeneous versus the best homogeneous
deployment as the request mix grows more skewed.

For each level S1-S5, the policy's planner (types, profiling, LP, search, serving check) runs
on the level's workload; the *searched* speedup is the LP throughput of the layout the search
finds over the LP's best homogeneous layout's on that mix (what the profiles promise), the
*planned* one that of the layout launched after the serving check. The *simulated* speedup
measures it in the event simulator: both serve the level's workload offered at `load`
(default 1.05) x the LP's best homogeneous capacity for `duration_s`, OSERVE with its layout
and per-type routing, vLLM static with the best-serving homogeneous layout (the baseline's
own serving check) and least-loaded routing, and the speedup is the ratio of requests each
completes. Just above the homogeneous capacity
this ratio measures capacity: on levels where both plans are the same layout it stays within
1 % of 1.0 (routing alone does not bias it), whereas further into overload, or in P99 latency
there, the order in which each router lets requests through dominates.

The paper's baseline, vLLM (static), is "a static parallel configuration" that it "optimizes
for each baseline" without saying for which mix. The best homogeneous layout for each level
is the strongest reading; `static_from` adds a second, clearly weaker one: the homogeneous
layout that is best on one level's mix (S1, the near-uniform one), kept at every level.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from simulator.policies.cluster import Cluster, Pool, run_cluster
from simulator.policies.interfaces import Shape
from simulator.policies.metrics import summarize
from simulator.policies.oserve import scenario
from simulator.policies.oserve.policy import OservePolicy
from simulator.policies.oserve.scenario import TABLE1, TABLE2

# OPT-30B (an OSERVE model, full multi-head attention) has a 2,048-token context: its types
# are the same four, scaled down to fit.
OPT = {"model": "opt-30b", "scale": 0.5}


def _plan(
    model: str, mix: Sequence[float], pool: Pool, layout: str, scale: float,
    shapes: Sequence[Shape] | None = None, policy: bool = False,
) -> Any:
    """The layout the policy plans for this mix (types and rates from a 10-minute sample),
    or with `policy` the planned policy itself."""
    wl = scenario.workload(mix, 10.0, 600.0, seed=11, model=model, scale=scale)
    pol = OservePolicy(model, layout=layout, shapes=shapes)
    pol.start(Cluster(wl, pool), 0.0)
    return pol if policy else pol.plan


def level(
    name: str, model: str = scenario.MODEL, gpu: str = scenario.GPU, gpus: int = scenario.GPUS,
    duration_s: float = 0.0, load: float = 1.05, scale: float = 1.0, seed: int = 0,
    static_from: str | None = None, routing: str = "backlog",
) -> dict[str, Any]:
    """One Table 1 level: planned layouts and speedup, and (duration_s > 0) simulated one.

    `static_from` (a level name) adds the speedup over a static homogeneous layout: the one
    that is best on that level's mix, replanned (assignment only) on this level's mix."""
    cv, mix, paper = TABLE1[name]
    pool = Pool.uniform(gpu, gpus)
    het_pol = _plan(model, mix, pool, "search", scale, policy=True)
    het, check = het_pol.plan, het_pol.check
    hom = _plan(model, mix, pool, "homogeneous", scale)
    # the LP's best homogeneous layout (the serving check may launch another, for both)
    lp_hom = check["planned_rps"][check["homogeneous"]] if check else hom.throughput
    out: dict[str, Any] = {
        "level": name, "cv": cv, "cv_check": scenario.mix_cv(mix), "paper_speedup": paper,
        # what the search found on the profiles, before the serving check, over the LP's
        # best homogeneous layout: what the profiles promise
        "searched_layout": check.get("searched", het.describe()),
        "searched_planned_speedup": check.get("searched_planned_rps", het.throughput) / lp_hom,
        "check": check,
        "oserve_layout": het.describe(), "homogeneous_layout": hom.describe(),
        "planned_speedup": het.throughput / lp_hom,
        "oserve_lp_rps": het.throughput, "homogeneous_lp_rps": hom.throughput,
        "lp_homogeneous_rps": lp_hom,
    }
    static_shape: Shape | None = None
    if static_from is not None:
        tuned = _plan(model, TABLE1[static_from][1], pool, "homogeneous", scale)
        static_shape = tuned.layout[0]
        fixed = _plan(model, mix, pool, "homogeneous", scale, shapes=[static_shape])
        out.update(static_from=static_from, static_layout=fixed.describe(),
                   static_planned_speedup=het.throughput / fixed.throughput,
                   static_lp_rps=fixed.throughput)
    if duration_s > 0:
        rate = load * lp_hom
        wl = scenario.workload(mix, rate, duration_s, seed=seed, model=model, scale=scale)
        runs: list[tuple[str, OservePolicy]] = [
            ("oserve", OservePolicy(model, layout="search", routing=routing)),
            ("homogeneous", OservePolicy(model, layout="homogeneous", routing="least_loaded"))]
        if static_shape is not None:
            runs.append(("static", OservePolicy(model, layout="homogeneous",
                                                routing="least_loaded", shapes=[static_shape])))
        for key, pol in runs:
            if key == "static" and out["homogeneous_run_layout"] == out["static_layout"]:
                break  # the same layout and routing on the same trace: the same run
            run = run_cluster(wl, pol, pool, horizon=duration_s)
            s = summarize(run)
            out[f"{key}_rps"] = s["throughput_rps"]
            out[f"{key}_e2e_p99"] = s["e2e_s"]["p99"]
            out[f"{key}_wall_s"] = run.wall_s
            # the run plans on its own trace (types re-fitted): near ties between shapes can
            # give a layout other than the planned one above
            out[f"{key}_run_layout"] = pol.plan.describe() if pol.plan else ""
        if static_shape is not None and "static_rps" not in out:
            for field in ("rps", "e2e_p99", "run_layout"):
                out[f"static_{field}"] = out[f"homogeneous_{field}"]
        out["offered_rps"] = rate
        out["simulated_speedup"] = out["oserve_rps"] / out["homogeneous_rps"]
        if static_shape is not None:
            out["static_simulated_speedup"] = out["oserve_rps"] / out["static_rps"]
    return out


def search_check(
    name: str, seeds: Sequence[int] = (0, 1, 2), model: str = scenario.MODEL,
    gpu: str = scenario.GPU, gpus: int = scenario.GPUS, scale: float = 1.0,
) -> dict[str, Any]:
    """The paper's Figure 16 check: Algorithm 1 (one run per seed) against the exhaustive
    optimum on one level's planning sample, both on the policy's own capacity table."""
    import numpy as np

    from simulator.policies.oserve.search import flow_guided_search

    pool = Pool.uniform(gpu, gpus)
    wl = scenario.workload(TABLE1[name][1], 10.0, 600.0, seed=11, model=model, scale=scale)
    pol = OservePolicy(model, layout="exhaustive")
    pol.start(Cluster(wl, pool), 0.0)
    assert pol.plan is not None and pol.types is not None
    demand = np.maximum(np.bincount(pol.type_of, minlength=pol.types.k) / max(wl.duration, 1.0),
                        1e-6)
    hosts = [h.gpus for h in pool.hosts]
    out: dict[str, Any] = {"level": name, "exhaustive": pol.plan.describe(),
                           "exhaustive_rps": pol.plan.throughput, "search": {}}
    for s in seeds:
        found, trace = flow_guided_search(list(pol._caps), pol._caps, demand, hosts, seed=s)
        out["search"][s] = {"layout": found.describe(),
                            "ratio": found.throughput / pol.plan.throughput,
                            "evaluations": trace.evaluations}
    return out


def served_layouts(
    name: str, keep: float = 0.85, model: str = scenario.MODEL, gpu: str = scenario.GPU,
    gpus: int = scenario.GPUS, scale: float = 1.0,
) -> dict[str, Any]:
    """Is there a heterogeneous gain to find? Every layout of the policy's shapes that the LP
    rates within `keep` of the best serves the serving check's sample (the planning sample of
    `level`, offered at 1.05x the LP's best homogeneous capacity); rates are relative to the
    LP's best homogeneous layout, best first."""
    import numpy as np

    from simulator.policies.oserve.search import best_homogeneous, layouts, score

    pool = Pool.uniform(gpu, gpus)
    wl = scenario.workload(TABLE1[name][1], 10.0, 600.0, seed=11, model=model, scale=scale)
    pol = OservePolicy(model, check_s=0.0)
    cluster = Cluster(wl, pool)
    pol.start(cluster, 0.0)
    assert pol.types is not None
    caps = pol._caps
    demand = np.maximum(np.bincount(pol.type_of, minlength=pol.types.k) / max(wl.duration, 1.0),
                        1e-6)
    hosts = [h.gpus for h in pool.hosts]
    hom = best_homogeneous(list(caps), caps, demand, hosts)
    cands = [sc for lay in layouts(list(caps), sum(hosts))
             if (sc := score(lay, caps, demand, hosts)) is not None]
    top = max(sc.throughput for sc in cands)
    cands = [sc for sc in cands if sc.throughput >= keep * top]
    pol.check_s = 120.0
    pol._sample = pol._check_sample(cluster, pol.check_load * hom.throughput)
    base = pol._served(cluster, hom, caps, demand)
    rows = sorted(((pol._served(cluster, sc, caps, demand) / base, sc.throughput / hom.throughput,
                    sc.describe()) for sc in cands), reverse=True)
    return {"level": name, "homogeneous": hom.describe(), "homogeneous_served_rps": base,
            "layouts": [{"layout": d, "served": v, "planned": p} for v, p, d in rows]}


def table1(levels: Sequence[str] = tuple(TABLE1), **kw: Any) -> list[dict[str, Any]]:
    return [level(name, **kw) for name in levels]


def table2(
    name: str, span_s: float = 300.0, model: str = scenario.MODEL, gpu: str = scenario.GPU,
    gpus: int = scenario.GPUS, load: float = 0.9, scale: float = 1.0, seed: int = 0,
    adapt_s: float = 60.0, routing: str = "backlog",
) -> dict[str, Any]:
    """One Table 2 trace: `span_s` per level; OSERVE re-plans every `adapt_s` (the paper's
    one-minute spans: a forecast of the per-type rates, a switch by parameter copying when
    the new layout is better) against the static homogeneous layout planned for the whole
    trace. Offered load: `load` x the homogeneous capacity on the first level's mix."""
    levels, cv, paper = TABLE2[name]
    pool = Pool.uniform(gpu, gpus)
    first = _plan(model, TABLE1[levels[0]][1], pool, "homogeneous", scale)
    rate = load * first.throughput
    wl = scenario.temporal(levels, rate, span_s, seed=seed, model=model, scale=scale)
    res: dict[str, Any] = {"trace": name, "levels": levels, "cv": cv, "paper_speedup": paper,
                           "offered_rps": rate}
    for key, pol in (("oserve", OservePolicy(model, layout="search", adapt_s=adapt_s,
                                             routing=routing)),
                     ("static", OservePolicy(model, layout="homogeneous",
                                             routing="least_loaded"))):
        run = run_cluster(wl, pol, pool, horizon=span_s * len(levels))
        s = summarize(run)
        res[f"{key}_rps"] = s["throughput_rps"]
        res[f"{key}_e2e_p99"] = s["e2e_s"]["p99"]
        res[f"{key}_notes"] = s["notes"]
    res["p99_speedup"] = res["static_e2e_p99"] / res["oserve_e2e_p99"]
    return res


def operating_point(
    name: str, utilisation: float = 0.9, seeds: Sequence[int] = (0, 1, 2),
    duration_s: float = 600.0, model: str = scenario.MODEL, gpu: str = scenario.GPU,
    gpus: int = scenario.GPUS, scale: float = 1.0,
) -> dict[str, Any]:
    """Table 1's measure at a load the deployments carry: the level's mix offered at
    `utilisation` x the LP's best homogeneous capacity, and the paper's metric, P99
    end-to-end latency (speedup = vLLM static's P99 over OSERVE's), seed by seed.

    Three systems on the same trace: `oserve` (the policy as it runs: search, serving check,
    per-type routing confined to the replicas the LP gives each type, `lp`), `oserve-het`
    (the searched heterogeneous layout launched without the serving check, same routing: the
    paper's mechanism, layout and type-matched routing, on its own) and `homogeneous` (the
    best homogeneous layout, least-loaded routing: vLLM static)."""
    cv, mix, paper = TABLE1[name]
    pool = Pool.uniform(gpu, gpus)
    het_pol = _plan(model, mix, pool, "search", scale, policy=True)
    check = het_pol.check
    lp_hom = check["planned_rps"][check["homogeneous"]] if check else het_pol.plan.throughput
    rate = utilisation * lp_hom
    runs: dict[str, list[dict[str, Any]]] = {}
    for seed in seeds:
        wl = scenario.workload(mix, rate, duration_s, seed=seed, model=model, scale=scale)
        for key, pol in (
            ("oserve", OservePolicy(model, layout="search", routing="lp")),
            ("oserve-het", OservePolicy(model, layout="search", routing="lp", check_s=0.0)),
            ("homogeneous", OservePolicy(model, layout="homogeneous", routing="least_loaded")),
        ):
            run = run_cluster(wl, pol, pool, horizon=duration_s)
            s = summarize(run)
            runs.setdefault(key, []).append({
                "seed": seed, "layout": pol.plan.describe() if pol.plan else "",
                "e2e_p99": s["e2e_s"]["p99"], "e2e_mean": s["e2e_s"]["mean"],
                "ttft_p99": s["ttft_s"]["p99"], "throughput_rps": s["throughput_rps"],
                "completed_share": s["completed"] / max(1, s["requests"]),
                "wall_s": run.wall_s})
    speedups = {
        key: [h["e2e_p99"] / o["e2e_p99"] for o, h in zip(runs[key], runs["homogeneous"],
                                                           strict=True)]
        for key in ("oserve", "oserve-het")}
    return {"level": name, "cv": cv, "paper_speedup": paper, "utilisation": utilisation,
            "offered_rps": rate, "lp_homogeneous_rps": lp_hom, "runs": runs,
            "p99_speedup": speedups,
            # the verdict holds on every seed: all faster, all slower, or all within 0.5 %
            "stable": {k: all(x > 1.005 for x in v) or all(x < 0.995 for x in v)
                       or all(abs(x - 1) <= 0.005 for x in v) for k, v in speedups.items()}}

"""`otela plan --policy oserve|prism|sageserve`: the companion systems' planners on a pool.

The CP-SAT placer answers "which replicas on which GPUs" for a demand. Three companion
systems answer narrower versions of it, and the operator may want their answer instead:

* oserve: for one model, the heterogeneous layout (replica shapes on the hosts) and the share
  of each request type each replica gets, against the best homogeneous layout;
* prism: which GPU each model's engine shares (KV-pressure-ratio placement);
* sageserve: how many instances each model needs in each region next hour (forecast + ILP).

Gyges decides at run time only (`otela sim run/compare --policy gyges`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
from rich.console import Console
from rich.table import Table

from otela.console import make_console
from simulator.policies.cluster import Cluster, HostSpec, PolicyError, Pool
from simulator.policies.workload import ClusterWorkload, load_cluster_workload

PLANNERS = ("oserve", "prism", "sageserve")


def plan_oserve(wl: ClusterWorkload, pool: Pool) -> dict[str, Any]:
    from simulator.policies.oserve.policy import OservePolicy
    from simulator.policies.oserve.search import best_homogeneous

    if len(wl.models) != 1:
        raise PolicyError("oserve plans one model: the trace has " + ", ".join(wl.models))
    policy = OservePolicy(wl.models[0])
    cluster = Cluster(wl, pool)
    policy.types = None
    policy.start(cluster, 0.0)  # plans and launches into a scratch cluster
    assert policy.plan is not None and policy.types is not None
    demand = np.bincount(policy.type_of, minlength=policy.types.k) / max(wl.duration, 1.0)
    shapes = sorted(policy._caps, key=lambda s: (s.gpus, s.tp))
    homog = best_homogeneous(shapes, policy._caps, np.maximum(demand, 1e-6),
                             [h.gpus for h in pool.hosts])
    notes = policy.notes()
    return {
        "policy": "oserve",
        "model": wl.models[0],
        "types": notes["types"],
        "demand_rps": dict(zip(policy.types.names, (float(x) for x in demand), strict=True)),
        "layout": notes["layout"],
        "replicas": [{"shape": s.label, "host": h, "gpus": s.gpus}
                     for s, h in zip(policy.plan.layout, policy.plan.hosts, strict=True)],
        "assignment": notes["assignment"],
        "throughput_rps": policy.plan.throughput,
        "homogeneous": {"layout": homog.describe(), "throughput_rps": homog.throughput},
        # the serving check's sample and served rates, when one was simulated (the
        # launched layout can differ from what the LP alone would pick)
        "check": notes.get("check"),
    }


def plan_prism(wl: ClusterWorkload, pool: Pool) -> dict[str, Any]:
    from simulator.policies.cli import known_models
    from simulator.policies.prism.core import ModelLoad, kvpr, place
    from simulator.policies.prism.policy import PrismPolicy

    policy = PrismPolicy("muxserve")  # start() places by KVPR on the trace's mean rates
    cluster = Cluster(wl, pool, models=known_models(wl))
    policy.start(cluster, 0.0)
    loads = [ModelLoad(m.name, policy._weighted(m, m.expected_rate), m.weights)
             for m in policy.models.values()]
    where = place(loads, [g.usable for g in policy.gpus])
    gpus = []
    for g, gpu in enumerate(policy.gpus):
        names = sorted(n for n, x in where.items() if x == g)
        w = sum(policy._weighted(policy.models[n], policy.models[n].expected_rate)
                for n in names)
        kv = gpu.usable - sum(policy.models[n].weights for n in names)
        gpus.append({"gpu": g, "models": names, "kv_free_gib": kv / 2**30, "kvpr": kvpr(w, kv)})
    return {
        "policy": "prism",
        "rates_rps": {n: m.expected_rate for n, m in policy.models.items()},
        "placement": where,
        "gpus": gpus,
        "unplaced": sorted(set(policy.models) - set(where)),
    }


def plan_sageserve(wl: ClusterWorkload, pool: Pool) -> dict[str, Any]:
    from simulator.policies.sageserve.policy import HOUR, SageServePolicy

    gpu = pool.hosts[0].gpu if pool.hosts else "a100-80g-sxm"
    policy = SageServePolicy("lt-i", gpu=gpu)
    cluster = Cluster(wl, Pool())
    policy.start(cluster, 0.0)
    for r in range(len(wl)):  # what the load predictor has seen: the whole trace
        tier, home = policy._tier[int(wl.tier[r])]
        if tier != "NIW":
            policy._account((wl.model_name(r), home), float(wl.base.arrival[r]),
                            float(wl.base.input_len[r]))
    for k in policy.keys:
        policy.observed[k].append(0.0)  # close the last bin
    now = float(np.ceil(wl.duration / HOUR) * HOUR)
    targets = policy._plan(cluster, now, initial={k: 0 for k in policy.keys})
    return {
        "policy": "sageserve",
        "gpu": gpu,
        "instance_tp": policy.tp,
        "theta_tokens_per_s": policy.theta,
        "next_hour_from_s": now,
        "instances": {f"{m}@{r}": n for (m, r), n in targets.items()},
        "plan": policy.plans[-1],
    }


def show(result: dict[str, Any], console: Console) -> None:
    kind = result["policy"]
    if kind == "oserve":
        t = Table(title=f"OSERVE layout for {result['model']}: {result['layout']} "
                  f"({result['throughput_rps']:.2f} req/s on this mix; best homogeneous "
                  f"{result['homogeneous']['layout']}: "
                  f"{result['homogeneous']['throughput_rps']:.2f})")
        t.add_column("replica")
        for name, (i, o) in result["types"].items():
            t.add_column(f"{name} ({i}/{o} tok)", justify="right")
        for label, shares in result["assignment"].items():
            t.add_row(label, *(f"{100 * x:.0f}%" for x in shares))
        console.print(t)
        check = result.get("check")
        if check:
            served = ", ".join(f"{layout} {rps:.2f}"
                               for layout, rps in check["served_rps"].items())
            console.print(f"serving check ({check['sample_s']:.0f} s sample offered "
                          f"{check['sample_rps']:.2f} req/s): served req/s {served}; "
                          f"launched {check['chosen']}")
    elif kind == "prism":
        t = Table(title="Prism placement (KV pressure ratio per GPU)")
        for c in ("GPU", "models", "KV free GiB", "KVPR"):
            t.add_column(c)
        for g in result["gpus"]:
            t.add_row(str(g["gpu"]), ", ".join(g["models"]) or "-",
                      f"{g['kv_free_gib']:.1f}", f"{g['kvpr']:.3g}")
        console.print(t)
        if result["unplaced"]:
            console.print(f"[yellow]no room for[/] {', '.join(result['unplaced'])}")
    else:
        t = Table(title=f"SageServe: instances next hour ({result['gpu']}, "
                  f"TP{result['instance_tp']} each)")
        t.add_column("model@region")
        t.add_column("instances", justify="right")
        t.add_column("forecast peak tok/s", justify="right")
        peaks = result["plan"]["peak_tokens_per_s"]
        for k, n in result["instances"].items():
            t.add_row(k, str(n), str(peaks.get(k, "-")))
        console.print(t)


def policy_plan_command(
    policy: str, pool_file: Path | None, trace: Path | None, as_json: bool, out: Path | None,
    fail: Callable[[str, int], NoReturn],
) -> None:
    """The `--policy` branch of `otela plan` (pool file and trace required)."""
    import json

    from simulator.placer.cli import _read_mapping
    from simulator.placer.pool import PoolError, pool_from_mapping

    if policy not in PLANNERS:
        fail(f"--policy {policy!r}: choose cpsat or one of {', '.join(PLANNERS)} "
             "(gyges decides at run time: otela sim run --policy gyges)", 2)
    if pool_file is None or trace is None:
        fail(f"--policy {policy} needs --pool FILE and --trace FILE", 2)
    assert pool_file is not None and trace is not None
    try:
        placer_pool = pool_from_mapping(_read_mapping(pool_file, "pool"))
        pool = Pool(tuple(HostSpec(h.variant.gpu, h.gpus) for h in placer_pool.hosts))
        wl = load_cluster_workload(trace)
        planner = {"oserve": plan_oserve, "prism": plan_prism, "sageserve": plan_sageserve}
        result = planner[policy](wl, pool)
    except (PolicyError, PoolError, ValueError, OSError) as exc:
        fail(str(exc), 2)
    text = json.dumps(result, indent=2, default=float)
    if out is not None:
        out.write_text(text + "\n")
    console = make_console()
    if as_json:
        console.print_json(text)
    else:
        show(result, console)

"""Prism's headline in the simulator: eight models on two shared GPUs against one dedicated
GPU per model (Table 1 "GPUs needed for 8 models: 8 vs 2; SLO attainment with 2 GPUs: 99 %",
§7.3 Figure 7), and the GPUs each system needs for 99 % of the dedicated deployment's SLO
attainment (the cost saving of §7.5).

SLOs follow §7.2: each model's P95 TTFT and TPOT on its dedicated GPU, times `slo_scale`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from simulator.engine import DONE
from simulator.policies.baselines import StaticPolicy
from simulator.policies.cluster import PolicyError, Pool, run_cluster
from simulator.policies.interfaces import Shape
from simulator.policies.metrics import Slo, columns, summarize
from simulator.policies.prism import scenario
from simulator.policies.prism.policy import MODES, PrismPolicy
from simulator.policies.workload import ClusterWorkload


def dedicated_slo(wl: ClusterWorkload, scale: float, horizon: float) -> tuple[Slo, dict[str, Any]]:
    """Run every model on its own GPU; SLO = scale x its P95 TTFT and TPOT there."""
    pol = StaticPolicy({m: [Shape(scenario.GPU)] for m in wl.models}, name="dedicated")
    run = run_cluster(wl, pol, Pool.uniform(scenario.GPU, len(wl.models)),
                      models=scenario.EXTRA_MODELS, horizon=horizon)
    cols, q = columns(run), run.cluster.req
    ttft, tpot = {}, {}
    for m in wl.models:
        mask = wl.model_mask(m) & (q.status == DONE)
        ttft[m] = scale * float(np.percentile(cols["ttft"][mask], 95))
        multi = mask & (q.output_len > 1)
        tpot[m] = scale * float(np.percentile(cols["tpot"][multi], 95))
    slo = Slo(ttft_by_model=ttft, tpot_by_model=tpot)
    return slo, summarize(run, slo)


def shared(wl: ClusterWorkload, mode: str, gpus: int, slo: Slo, horizon: float) -> dict[str, Any]:
    pol = PrismPolicy(mode, ttft_slo=dict(slo.ttft_by_model or {}))
    run = run_cluster(wl, pol, Pool.uniform(scenario.GPU, gpus), models=scenario.EXTRA_MODELS,
                      horizon=horizon)
    return summarize(run, slo)


def work_share(wl: ClusterWorkload, gpus: int, horizon: float) -> float:
    """The operating point's utilisation on `gpus` shared GPUs: the GPU-time the offered
    requests need if each model ran alone at its saturated speed (offered rate over one
    dedicated GPU's capacity at the model's mean lengths, `api.max_throughput`), summed over
    the models, per GPU. A lower bound on the busy share a shared deployment reaches (sharing
    adds interference, never removes work); 1.0 = the GPUs' whole time."""
    from simulator.api import Deployment, max_throughput

    need = 0.0
    b = wl.base
    for m in wl.models:
        mask = wl.model_mask(m)
        if not mask.any():
            continue
        spec = scenario.EXTRA_MODELS.get(m, m)
        dep = Deployment(spec, scenario.GPU)
        cap = max_throughput(dep, max(1, round(float(b.input_len[mask].mean()))),
                             max(1, round(float(b.output_len[mask].mean()))))["requests_per_s"]
        need += mask.sum() / horizon / cap if cap > 0 else float("inf")
    return need / gpus


def headline(
    rates: Sequence[float] = (4.0, 8.0, 12.0), duration_s: float = 1800.0,
    slo_scale: float = 5.0, gpus: int = 2, seed: int = 0, modes: Sequence[str] = MODES,
) -> list[dict[str, Any]]:
    """SLO attainment of the dedicated deployment (8 GPUs) and of each sharing mode on
    `gpus` GPUs, at each total request rate."""
    out = []
    for rate in rates:
        wl = scenario.workload(rate, duration_s, seed)
        slo, ded = dedicated_slo(wl, slo_scale, duration_s)
        row: dict[str, Any] = {"rate": rate, "requests": len(wl),
                               "work_share": work_share(wl, gpus, duration_s),
                               "dedicated": _brief(ded, len(wl.models))}
        for mode in modes:
            row[mode] = _brief(shared(wl, mode, gpus, slo, duration_s), gpus)
        out.append(row)
    return out


def gpus_needed(
    rate: float = 8.0, duration_s: float = 1800.0, slo_scale: float = 5.0, seed: int = 0,
    modes: Sequence[str] = MODES, max_gpus: int = 8, target: float = 0.99,
) -> dict[str, Any]:
    """Fewest GPUs with which each mode reaches `target` x the dedicated attainment."""
    wl = scenario.workload(rate, duration_s, seed)
    slo, ded = dedicated_slo(wl, slo_scale, duration_s)
    need = target * ded["slo_attainment"]
    found: dict[str, Any] = {"dedicated": len(wl.models)}
    curves: dict[str, list[float]] = {}
    for mode in modes:
        found[mode] = None
        curves[mode] = []
        for g in range(1, max_gpus + 1):
            try:
                att = shared(wl, mode, g, slo, duration_s)["slo_attainment"]
            except PolicyError:  # fixed placements: the models' weights do not fit g GPUs
                att = 0.0
            curves[mode].append(att)
            if att >= need:
                found[mode] = g
                break
    saving = {m: len(wl.models) / g for m, g in found.items() if g}
    return {"rate": rate, "dedicated_attainment": ded["slo_attainment"], "target": need,
            "gpus": found, "attainment_by_gpus": curves, "cost_saving": saving}


def _brief(s: dict[str, Any], gpus: int) -> dict[str, Any]:
    return {"gpus": gpus, "slo_attainment": s["slo_attainment"],
            "ttft_attainment": s["ttft_attainment"], "tpot_attainment": s["tpot_attainment"],
            "ttft_p99": s["ttft_s"]["p99"], "cost_usd": s["cost_usd"], "wall_s": s["wall_s"],
            "gpu_busy": s["gpu_utilization"],
            "notes": {k: v for k, v in s["notes"].items() if k != "slo_ttft_s"}}

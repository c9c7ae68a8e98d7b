"""Figures of a cluster run: latency, SLO attainment, throughput, GPU- and instance-hours.

One function over the request table and the instances, so that every policy is judged by the
same arithmetic (the comparison table of `otela sim compare` is built from these dicts).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from otela.hardware.catalog import get_gpu
from simulator.engine import DONE, REJECTED, SimOutput
from simulator.policies.cluster import ClusterRun


@dataclass(frozen=True)
class Slo:
    """TTFT/TPOT objectives, optionally per model or per tier (the tier wins)."""

    ttft_s: float = 10.0
    tpot_s: float = 0.1
    ttft_by_model: Mapping[str, float] | None = None
    tpot_by_model: Mapping[str, float] | None = None
    ttft_by_tier: Mapping[str, float] | None = None

    def arrays(self, run: ClusterRun) -> tuple[np.ndarray, np.ndarray]:
        """Per-request TTFT and TPOT limits."""
        wl = run.cluster.wl
        ttft = np.full(len(wl), self.ttft_s)
        tpot = np.full(len(wl), self.tpot_s)
        for name, v in (self.ttft_by_model or {}).items():
            ttft[wl.model_mask(name)] = v
        for name, v in (self.tpot_by_model or {}).items():
            tpot[wl.model_mask(name)] = v
        for name, v in (self.ttft_by_tier or {}).items():
            ttft[wl.tier_mask(name)] = v
        return ttft, tpot


def _pct(x: np.ndarray) -> dict[str, float]:
    if len(x) == 0:
        nan = float("nan")
        return {"mean": nan, "p50": nan, "p90": nan, "p95": nan, "p99": nan}
    p50, p90, p95, p99 = np.percentile(x, [50, 90, 95, 99])
    return {"mean": float(x.mean()), "p50": float(p50), "p90": float(p90), "p95": float(p95),
            "p99": float(p99)}


def columns(run: ClusterRun) -> dict[str, np.ndarray]:
    """Per-request columns (same definitions as `simulator.report.per_request`)."""
    from simulator.report import per_request

    c = run.cluster
    out = SimOutput(req=c.req, replicas=[i.replica for i in c.instances], makespan=run.makespan)
    return per_request(out)


def gpu_busy_fraction(run: ClusterRun) -> float:
    """GPU-time in engine iterations over GPU-time held, both up to the run's last event.
    Engines a policy adopts onto GPUs it holds itself (Prism's shared GPUs) own no GPUs and
    do not count: for those, see `prism.experiment.work_share`."""
    c = run.cluster
    end = max(run.makespan, run.horizon)
    held = c.gpu_seconds(end)
    busy = sum(inst.replica.busy * inst.gpus for inst in c.instances)
    return min(1.0, busy / held) if held > 0 else 0.0


def summarize(run: ClusterRun, slo: Slo | None = None, groups: str | None = None) -> dict[str, Any]:
    """Aggregates of a run; `groups` = "model" or "tier" adds a breakdown per group."""
    slo = slo or Slo()
    c = run.cluster
    q = c.req
    cols = columns(run)
    done = q.status == DONE
    ttft_lim, tpot_lim = slo.arrays(run)
    ok_ttft = done & (cols["ttft"] <= ttft_lim + 1e-12)
    ok_tpot = done & ((cols["tpot"] <= tpot_lim + 1e-12) | (q.output_len <= 1))
    ok = ok_ttft & ok_tpot
    horizon = max(run.horizon, 1e-9)
    by_end = done & (q.finish <= run.horizon + 1e-9)
    tokens_by_end = float((q.input_len[by_end] + q.output_len[by_end]).sum())
    gpu_s = c.gpu_seconds(run.horizon)
    cost = 0.0
    for inst in c.instances:
        stop = inst.retired_at if inst.retired_at is not None else run.horizon
        held = max(0.0, min(stop, run.horizon) - inst.acquired)
        cost += inst.gpus * held / 3600 * get_gpu(inst.shape.gpu).cost_per_hour
    for gpus, gpu, since, until in c.held:
        stop = until if until is not None else run.horizon
        cost += gpus * max(0.0, min(stop, run.horizon) - since) / 3600 * get_gpu(gpu).cost_per_hour
    n = max(1, int(q.n))
    res: dict[str, Any] = {
        "policy": run.policy,
        "requests": int(q.n),
        "completed": int(done.sum()),
        "rejected": int((q.status == REJECTED).sum()),
        "horizon_s": run.horizon,
        "makespan_s": run.makespan,
        "throughput_rps": float(by_end.sum()) / horizon,
        "throughput_tokens_per_s": tokens_by_end / horizon,
        "output_tokens_per_s": float(q.output_len[by_end].sum()) / horizon,
        "slo_attainment": float(ok.sum()) / n,
        "ttft_attainment": float(ok_ttft.sum()) / n,
        "tpot_attainment": float(ok_tpot.sum()) / n,
        "ttft_s": _pct(cols["ttft"][done]),
        "tpot_s": _pct(cols["tpot"][done & (q.output_len > 1)]),
        "e2e_s": _pct(cols["e2e"][done]),
        "preemptions": int(q.preemptions.sum()),
        "gpu_hours": gpu_s / 3600,
        "instance_hours": c.instance_seconds(run.horizon) / 3600,
        "mean_gpus": gpu_s / horizon,
        # share of the GPU-time held (to the last completion) that replicas spent in engine
        # iterations: the operating point's utilisation
        "gpu_utilization": gpu_busy_fraction(run),
        "cost_usd": cost,
        "instances_launched": len(c.instances),
        "events": _count_events(run),
        "wall_s": run.wall_s,
        "notes": run.notes,
    }
    if groups in ("model", "tier"):
        names = c.wl.models if groups == "model" else c.wl.tiers
        res["by_" + groups] = {}
        for name in names:
            m = c.wl.model_mask(name) if groups == "model" else c.wl.tier_mask(name)
            k = max(1, int(m.sum()))
            res["by_" + groups][name] = {
                "requests": int(m.sum()),
                "completed": int((done & m).sum()),
                "slo_attainment": float((ok & m).sum()) / k,
                "ttft_attainment": float((ok_ttft & m).sum()) / k,
                "ttft_s": _pct(cols["ttft"][done & m]),
                "e2e_s": _pct(cols["e2e"][done & m]),
            }
    return res


def _count_events(run: ClusterRun) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in run.cluster.events:
        out[e.kind] = out.get(e.kind, 0) + 1
    return out

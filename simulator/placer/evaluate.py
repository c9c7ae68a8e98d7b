"""Judge a plan the way it will be served: the event simulator on one Poisson workload.

Every plan is evaluated on the same arrivals and lengths (one seeded Poisson stream per
model for `duration` seconds). Each model's stream is split among its groups of replicas
(same GPU variant and TP) by the plan's routing weights (random thinning: each part is
again Poisson), each group is simulated with its replicas behind a least-outstanding router,
and every request runs to completion (overloaded queues drain), so the mean includes all
the waiting an overload causes. Goodput counts requests that meet every SLO target of
their model.

A model the plan gives no GPU is *unserved*: its requests are counted as such (and never in
goodput), and the mean and p99 over served requests say so beside them instead of averaging
the model away. Each model's *utilisation* is its offered rate over the saturated capacity of
its replicas (`api.max_throughput` at the model's mean lengths, times replicas): above 1 the
plan is overloaded and its latency is queue backlog, which is why every comparison is
also made at rates within capacity (benchmarks/placer_table1.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from simulator.api import Deployment, max_throughput, run
from simulator.placer.demand import SLO, Demand
from simulator.placer.pool import Variant
from simulator.roofline import Precision
from simulator.workload import Workload


@dataclass(frozen=True)
class Group:
    service: str
    variant: Variant
    tp: int
    replicas: int
    weight: float


@dataclass(frozen=True)
class ServiceResult:
    service: str
    requests: int
    completed: int
    mean_e2e: float
    p99_e2e: float
    mean_ttft: float
    goodput_rps: float
    throughput_rps: float
    served: bool = True  # False: the plan gives this model no GPU
    offered_rps: float = 0.0
    capacity_rps: float = 0.0  # saturated request rate of its replicas together

    @property
    def utilization(self) -> float:
        """Offered rate over capacity (inf when unserved)."""
        return self.offered_rps / self.capacity_rps if self.capacity_rps > 0 else float("inf")


@dataclass(frozen=True)
class Evaluation:
    services: tuple[ServiceResult, ...]
    mean_e2e: float
    p99_e2e: float
    goodput_rps: float
    throughput_rps: float
    duration_s: float

    @property
    def unserved(self) -> tuple[str, ...]:
        """Models the plan gives no GPU (their requests are in no latency figure)."""
        return tuple(s.service for s in self.services if not s.served)

    @property
    def unserved_rps(self) -> float:
        return sum(s.requests for s in self.services if not s.served) / self.duration_s

    @property
    def max_utilization(self) -> float:
        """The busiest served model's offered rate over its capacity."""
        return max((s.utilization for s in self.services if s.served), default=float("nan"))

    def to_dict(self) -> dict[str, Any]:
        return {"mean_e2e_s": self.mean_e2e, "p99_e2e_s": self.p99_e2e,
                "goodput_rps": self.goodput_rps, "throughput_rps": self.throughput_rps,
                "duration_s": self.duration_s, "unserved": list(self.unserved),
                "unserved_rps": self.unserved_rps,
                "max_utilization": _finite(self.max_utilization),
                "models": [vars(s) | {"utilization": _finite(s.utilization)}
                           for s in self.services]}


def _finite(x: float) -> float | None:
    return x if np.isfinite(x) else None


def workload_for(demand: Demand, duration_s: float, seed: int) -> dict[str, Workload]:
    """The shared workload: one Poisson stream per model, seeded by the model's position."""
    out = {}
    for i, svc in enumerate(demand.services):
        rng = np.random.default_rng([seed, i])
        n = int(svc.rate * duration_s * 1.2 + 10 * np.sqrt(svc.rate * duration_s) + 20)
        arr = np.cumsum(rng.exponential(1.0 / svc.rate, size=n))
        arr = arr[arr < duration_s]
        out[svc.name] = Workload.from_arrays(arr, svc.input.sample(len(arr), rng),
                                             svc.output.sample(len(arr), rng))
    return out


def _take(wl: Workload, mask: np.ndarray) -> Workload:
    return Workload.from_arrays(wl.arrival[mask], wl.input_len[mask], wl.output_len[mask])


def group_capacity_rps(model: str, g: Group, input_mean: float, output_mean: float,
                       precision: Precision) -> float:
    """Saturated request rate of a group's replicas at the model's mean lengths, served
    from a checkpoint of ``precision``."""
    dep = Deployment(model, g.variant.spec(), tp=g.tp, precision=precision)
    one = max_throughput(dep, max(1, round(input_mean)), max(1, round(output_mean)))
    return one["requests_per_s"] * g.replicas


def evaluate(demand: Demand, groups: Sequence[Group], duration_s: float = 300.0,
             seed: int = 0, slo: Mapping[str, SLO] | None = None) -> Evaluation:
    """Simulate `groups` serving the demand's workload; latency, goodput and utilisation per
    model (unserved models flagged, see the module string)."""
    workloads = workload_for(demand, duration_s, seed)
    results = []
    all_e2e: list[np.ndarray] = []
    good_total = done_total = 0.0
    for i, svc in enumerate(demand.services):
        wl = workloads[svc.name]
        mine = [g for g in groups if g.service == svc.name and g.replicas > 0]
        target = (slo or {}).get(svc.name, svc.slo)
        e2e: list[float] = []
        ttft: list[float] = []
        good = 0
        if mine:
            w = np.array([max(g.weight, 0.0) for g in mine], dtype=float)
            w = w / w.sum() if w.sum() > 0 else np.full(len(mine), 1.0 / len(mine))
            pick = np.random.default_rng([seed, i, 7]).choice(len(mine), size=len(wl), p=w)
            for j, g in enumerate(mine):
                part = _take(wl, pick == j)
                if len(part) == 0:
                    continue
                dep = Deployment(svc.model, g.variant.spec(), tp=g.tp,
                                 precision=svc.precision)
                res = run(dep, part, replicas=g.replicas, timeline_points=0,
                          include_requests=True, seed=seed)
                if not res.get("fits"):
                    continue
                for r in res["per_request"]:
                    if r["e2e"] is None:
                        continue
                    e2e.append(r["e2e"])
                    ttft.append(r["ttft"])
                    good += _meets(r, target)
        arr = np.asarray(e2e, dtype=float)
        all_e2e.append(arr)
        good_total += good
        done_total += len(arr)
        mean_in = float(np.mean(wl.input_len)) if len(wl) else 1.0
        mean_out = float(np.mean(wl.output_len)) if len(wl) else 1.0
        capacity = sum(group_capacity_rps(svc.model, g, mean_in, mean_out, svc.precision)
                       for g in mine)
        results.append(ServiceResult(
            svc.name, len(wl), len(arr),
            float(arr.mean()) if len(arr) else float("nan"),
            float(np.percentile(arr, 99)) if len(arr) else float("nan"),
            float(np.mean(ttft)) if ttft else float("nan"),
            good / duration_s, len(arr) / duration_s,
            served=bool(mine), offered_rps=len(wl) / duration_s, capacity_rps=capacity))
    every = np.concatenate(all_e2e) if all_e2e else np.zeros(0)
    return Evaluation(tuple(results),
                      float(every.mean()) if len(every) else float("nan"),
                      float(np.percentile(every, 99)) if len(every) else float("nan"),
                      good_total / duration_s, done_total / duration_s, duration_s)


def _meets(row: Mapping[str, Any], slo: SLO) -> bool:
    if slo.ttft_s is not None and row["ttft"] > slo.ttft_s:
        return False
    if slo.tpot_s is not None and row["output_len"] > 1 and row["tpot"] > slo.tpot_s:
        return False
    return not (slo.e2e_s is not None and row["e2e"] > slo.e2e_s)


def groups_of_plan(plan: Any) -> list[Group]:
    """The groups of a `plan.Plan`: replicas counted per (model, variant, TP), weights from
    the solver's flows."""
    from simulator.placer.plan import Plan

    assert isinstance(plan, Plan)
    variants = {h.variant.name: h.variant for h in plan.pool.hosts}
    out = []
    for i, o in enumerate(plan.problem.options):
        n = plan.solution.replicas[i] + o.existing
        if n > 0:
            var = variants.get(o.variant) or Variant(o.variant)
            out.append(Group(o.service, var, o.tp, n, plan.solution.flows[i]))
    return out

"""From simulated candidates to a solved, concrete plan: replicas on named hosts.

`build_problem` turns candidates (curves) into the constraint model's options with the caps
the objective needs; `make_plan` solves and places each replica on a host of its class
(using the host patterns the solver chose), and predicts latency and utilisation per model
from the curves (not from the linearisation).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from simulator.placer.cpsat import (
    DEFAULT_WORKERS,
    ClassSpec,
    Option,
    PlanError,
    Problem,
    Solution,
    solve,
)
from simulator.placer.demand import Demand, Objective, Service
from simulator.placer.packing import assign_groups
from simulator.placer.pool import Pool
from simulator.placer.profile import Candidate, Rejected

DEFAULT_MAX_UTILIZATION = 0.85
"""Without an SLO, the SLO objectives (goodput, gpus, cost) load a replica up to this share of
its saturated throughput: a margin against bursts that a mean rate hides."""


@dataclass(frozen=True)
class Replica:
    service: str
    model: str
    variant: str
    gpu: str
    tp: int
    host: str | None  # None for a replica already running elsewhere
    existing: bool = False


@dataclass(frozen=True)
class ServiceForecast:
    service: str
    rate: float
    served: float  # req/s routed to replicas (less than rate only for goodput)
    latency_s: float  # predicted mean end-to-end latency (curves, interpolated)
    utilization: float  # served / saturated capacity of its replicas
    gpus: int
    weights: Mapping[str, float]  # option label -> share of the service's requests


@dataclass
class Plan:
    demand: Demand
    pool: Pool
    replicas: list[Replica]
    forecasts: list[ServiceForecast]
    solution: Solution
    problem: Problem
    rejected: list[Rejected] = field(default_factory=list)
    simulated: int = 0

    @property
    def mean_latency_s(self) -> float:
        served = sum(f.served for f in self.forecasts)
        return sum(f.latency_s * f.served for f in self.forecasts) / max(served, 1e-12)

    @property
    def gpus_used(self) -> int:
        return sum(r.tp for r in self.replicas if not r.existing)

    def to_dict(self) -> dict[str, Any]:
        sol = self.solution
        precision = self.demand.precision_labels()
        return {
            "objective": self.demand.objective.value,
            "horizon_s": self.demand.horizon_s,
            "pool": {"gpus": self.pool.total_gpus, "hosts": len(self.pool.hosts),
                     "summary": self.pool.summary(), "skipped": list(self.pool.skipped)},
            "solver": {
                "status": sol.status,
                "optimal": sol.optimal,
                "gap": sol.gap,
                "phases": [{"name": p.name, "status": p.status, "objective": p.objective,
                            "bound": p.bound, "gap": p.gap, "wall_s": p.wall_s,
                            "unit": p.unit} for p in sol.phases],
                "configurations_simulated": self.simulated,
            },
            "predicted": {"mean_latency_s": self.mean_latency_s, "gpus": self.gpus_used},
            "models": [{
                "name": f.service, "precision": precision.get(f.service) or "bf16",
                "rate": f.rate, "served": f.served,
                "latency_s": f.latency_s, "utilization": f.utilization, "gpus": f.gpus,
                "weights": dict(f.weights),
            } for f in self.forecasts],
            "replicas": [{"model": r.service, "sim_model": r.model, "gpu": r.gpu,
                          "variant": r.variant, "tp": r.tp, "host": r.host,
                          "existing": r.existing} for r in self.replicas],
            "rejected": [{"model": r.service, "gpu": r.variant, "tp": r.tp, "reason": r.reason}
                         for r in self.rejected],
        }


def option_label(variant: str, tp: int) -> str:
    return f"{variant} TP{tp}"


def build_problem(demand: Demand, pool: Pool, candidates: Sequence[Candidate],
                  existing: Mapping[tuple[str, str, int], int] | None = None,
                  max_utilization: float = DEFAULT_MAX_UTILIZATION) -> Problem:
    """The model's numbers. Caps: with an SLO, the SLO capacity; without one, the latency
    objective may overload (priced by the fluid model) and the others stop at
    `max_utilization` of the saturated throughput."""
    services = {s.name: s for s in demand.services}
    existing = dict(existing or {})
    options = []
    too_slow: dict[str, int] = {}
    for c in candidates:
        svc = services[c.service]
        curve = c.curve
        if svc.slo.any:
            cap = curve.slo_capacity(svc.slo)
        elif demand.objective is Objective.LATENCY:
            cap = svc.rate
        else:
            cap = max_utilization * curve.mu
        if cap <= 0:
            too_slow[c.service] = too_slow.get(c.service, 0) + 1
            continue
        spec = c.variant.spec()
        options.append(Option(
            service=c.service, variant=c.variant.name, tp=c.tp,
            pieces=tuple(curve.pieces(svc.rate, demand.horizon_s)), cap=cap,
            cost_per_hour=spec.cost_per_hour * c.tp,
            existing=existing.pop((c.service, c.variant.name, c.tp), 0),
        ))
    if demand.objective is not Objective.GOODPUT:
        for name in too_slow:
            if not any(o.service == name for o in options):
                svc = services[name]
                raise PlanError(f"{name}: none of its {too_slow[name]} configurations meets its "
                                f"SLO ({svc.slo.describe()}) even at the lightest simulated "
                                "load; relax the SLO or plan for --objective goodput")
    classes = tuple(ClassSpec(k.variant.name, k.gpus_per_host, k.count, k.one_engine)
                    for k in pool.classes())
    return Problem({s.name: s.rate for s in demand.services}, tuple(options), classes,
                   demand.objective)


def make_plan(demand: Demand, pool: Pool, candidates: Sequence[Candidate],
              rejected: Sequence[Rejected] = (), *, time_limit_s: float = 10.0,
              workers: int = DEFAULT_WORKERS, gap_limit: float = 0.0,
              existing: Mapping[tuple[str, str, int], int] | None = None,
              max_utilization: float = DEFAULT_MAX_UTILIZATION, simulated: int = 0) -> Plan:
    problem = build_problem(demand, pool, candidates, existing, max_utilization)
    sol = solve(problem, time_limit_s=time_limit_s, workers=workers, gap_limit=gap_limit)
    return realize(demand, pool, candidates, problem, sol, rejected, simulated)


def realize(demand: Demand, pool: Pool, candidates: Sequence[Candidate], problem: Problem,
            sol: Solution, rejected: Sequence[Rejected] = (), simulated: int = 0) -> Plan:
    """Concrete replicas (hosts from the chosen patterns) and per-model forecasts."""
    services = {s.name: s for s in demand.services}
    curves = {(c.service, c.variant.name, c.tp): c.curve for c in candidates}
    gpu_of = {c.variant.name: c.variant.gpu for c in candidates}
    replicas: list[Replica] = []
    for k, cls in enumerate(pool.classes()):
        wanted = {i: (o.tp, sol.replicas[i]) for i, o in enumerate(problem.options)
                  if o.variant == cls.variant.name and sol.replicas[i] > 0}
        if not wanted:
            continue
        placed = assign_groups(sol.patterns.get(k, ()), [h.name for h in cls.hosts], wanted)
        for i, hosts in placed.items():
            o = problem.options[i]
            for h in hosts:
                replicas.append(Replica(o.service, services[o.service].model, o.variant,
                                        gpu_of[o.variant], o.tp, h))
    for o in problem.options:
        for _ in range(o.existing):
            replicas.append(Replica(o.service, services[o.service].model, o.variant,
                                    gpu_of[o.variant], o.tp, None, existing=True))
    forecasts = [_forecast(services[name], problem, sol, curves, demand.horizon_s)
                 for name in services]
    return Plan(demand, pool, replicas, forecasts, sol, problem, list(rejected), simulated)


def _forecast(svc: Service, problem: Problem, sol: Solution, curves: Mapping[Any, Any],
              horizon: float) -> ServiceForecast:
    lat_sum = served = capacity = 0.0
    gpus = 0
    weights: dict[str, float] = {}
    for i, o in enumerate(problem.options):
        if o.service != svc.name:
            continue
        n = sol.replicas[i] + o.existing
        fl = sol.flows[i]
        if n <= 0:
            continue
        curve = curves[(o.service, o.variant, o.tp)]
        gpus += n * o.tp
        capacity += n * curve.mu
        if fl > 0:
            lat_sum += fl * curve.latency(fl / n, horizon)
            served += fl
            weights[option_label(o.variant, o.tp)] = fl
    total = sum(weights.values())
    weights = {k: v / total for k, v in weights.items()} if total > 0 else {}
    return ServiceForecast(svc.name, svc.rate, served,
                           lat_sum / served if served > 0 else math.nan,
                           served / capacity if capacity > 0 else math.nan, gpus, weights)

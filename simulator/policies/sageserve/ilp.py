"""SageServe §5: the hourly ILP that sets instance counts per model and region.

Variables: delta[i][j], the change in model i's instance count in region j (one GPU type
here, as in the paper's experiments: g = 1). Constraints, for the next hour's forecast peak
rho[i][j] (tokens/s) and per-instance capacity theta[i] (tokens/s):

* each region serves at least eps of its own peak: (n + delta) theta >= eps rho   (C-region)
* the regions together serve the model's total peak: sum_j (n + delta) theta >= sum_j rho
  (C-global; the rest of a region's load is rerouted)
* never remove more than exist, and stay within [min, max] instances per region.

Objective: minimise gamma + mu, the VM cost alpha * sum(delta) (negative when instances are
released, so fewer instances are cheaper) plus the deployment cost sigma * max(0, delta) of
every instance started (alpha times its start-up time). Solved with CP-SAT on integers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from ortools.sat.python import cp_model

Key = tuple[str, str]  # (model, region)


class ScalingError(ValueError):
    """The ILP has no solution (the demand exceeds every region's maximum)."""


@dataclass(frozen=True)
class ScalingProblem:
    current: Mapping[Key, int]  # n_ij
    peak: Mapping[Key, float]  # rho_ij: forecast peak tokens/s in the next hour
    capacity: Mapping[str, float]  # theta_i: tokens/s one instance of model i serves
    vm_cost: float = 1.0  # alpha ($ per instance-hour)
    start_cost: Mapping[str, float] | None = None  # sigma_i (default: alpha x 10 min)
    eps: float = 1.0
    min_instances: int = 1
    max_instances: int = 64


def solve(p: ScalingProblem, time_limit_s: float = 5.0) -> dict[Key, int]:
    """The optimal change delta per (model, region)."""
    m = cp_model.CpModel()
    scale = 1000  # CP-SAT is integer: costs in milli-units, capacities in whole tokens/s
    keys = sorted(p.peak)
    models = sorted({k[0] for k in keys})
    delta: dict[Key, cp_model.IntVar] = {}
    up: dict[Key, cp_model.IntVar] = {}
    for k in keys:
        n = int(p.current.get(k, 0))
        lo, hi = p.min_instances - n, p.max_instances - n
        if lo > hi:
            raise ScalingError(f"{k}: min {p.min_instances} > max {p.max_instances}")
        delta[k] = m.new_int_var(lo, hi, f"d_{k[0]}_{k[1]}")
        up[k] = m.new_int_var(0, max(0, hi), f"u_{k[0]}_{k[1]}")
        m.add(up[k] >= delta[k])
        theta = max(1, round(p.capacity[k[0]]))
        need = math.ceil(p.eps * p.peak[k])
        m.add((n + delta[k]) * theta >= need)
    for i in models:
        ks = [k for k in keys if k[0] == i]
        theta = max(1, round(p.capacity[i]))
        total = math.ceil(sum(p.peak[k] for k in ks))
        m.add(sum((int(p.current.get(k, 0)) + delta[k]) * theta for k in ks) >= total)
    alpha = round(p.vm_cost * scale)
    sigma = {i: round((p.start_cost or {}).get(i, p.vm_cost / 6) * scale) for i in models}
    m.minimize(sum(alpha * delta[k] + sigma[k[0]] * up[k] for k in keys))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = 1
    status = solver.solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise ScalingError("no instance counts meet the forecast within the per-region maximum")
    return {k: int(solver.value(delta[k])) for k in keys}

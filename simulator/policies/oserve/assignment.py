"""OSERVE §4.2: the lower level, assigning request types to replicas, as a linear program.

The paper builds a flow network (source -> type j -> replica k -> sink) with per-type edge
capacities and a shared node capacity per replica (C3: sum_j x_kj / n_kj <= 1, where n_kj is
replica k's throughput on type j alone) and solves max-flow. Max-flow alone is flat whenever
the demand fits (every deployment that serves it all ties), so otela solves the equivalent
LP that also ranks such deployments: serve every type in full and minimise the busiest
replica's normalised load U. Then 1/U is how far the whole mix can be scaled before some
replica saturates, and sum(lambda)/U is the deployment's throughput on this mix, the upper
level's objective (Phi in the paper). When the demand exceeds capacity (U > 1) the same
flows scaled by 1/U are a maximum flow of the paper's network with proportional service.
Solved with OR-Tools' GLOP.

The min-max LP usually has many optimal flows (two identical replicas can split each type in
any way that balances them), and the simplex returns a vertex, which tends to segregate types
onto replicas: one replica gets all the long prompts. Routing by such flows confines each type
to fewer replicas than necessary, and a burst of one type then queues on them while the others
idle. `spread` adds a second stage: among flows whose load stays within (1 + spread) of the
optimum U, take the one closest (in each type's shares, L1) to the capacity-proportional
split x_kj = lambda_j n_kj / sum_k n_kj, the split a capacity-weighted router would make
without knowing types. On identical replicas that split is itself optimal, so each type goes
to every replica in equal shares; between unlike replicas the LP keeps only the specialisation
the optimum needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from ortools.linear_solver import pywraplp  # type: ignore[import-untyped]


class AssignmentError(ValueError):
    """No assignment exists (a type no replica can serve), or the solver failed."""


@dataclass(frozen=True)
class Assignment:
    """Flows x[k][j] (requests/s of type j sent to replica k) and what they imply."""

    flow: np.ndarray  # shape (replicas, types)
    load: float  # U: the optimum of the min-max LP (the busiest replica's normalised load)
    utilization: np.ndarray  # per replica: sum_j x_kj / n_kj (<= U (1 + spread) when spread)

    @property
    def throughput(self) -> float:
        """Requests/s of this mix the deployment sustains (demand / U)."""
        return float(self.flow.sum()) / self.load if self.load > 0 else float("inf")

    def fractions(self) -> np.ndarray:
        """Share of each type sent to each replica (columns sum to 1)."""
        tot = self.flow.sum(axis=0, keepdims=True)
        return np.divide(self.flow, tot, out=np.zeros_like(self.flow), where=tot > 0)

    def bottlenecks(self, tol: float = 1e-6) -> list[int]:
        """Replicas at the maximum load (the flow network's saturated nodes)."""
        return [k for k, u in enumerate(self.utilization) if u >= self.load * (1 - tol) - tol]


def assign(capacity: ArrayLike, demand: ArrayLike, spread: float | None = None) -> Assignment:
    """Minimise U subject to: every type's demand is fully assigned (sum_k x_kj = lambda_j),
    each replica's mixed load sum_j x_kj / n_kj <= U (C3), x_kj = 0 where n_kj = 0 (the edge
    capacity C2 of a type the replica cannot hold), x >= 0.

    `capacity[k][j]` is n_kj in requests/s; `demand[j]` is lambda_j in requests/s. With
    `spread` (a relative tolerance, 0 to stay on the optimal face) a second stage keeps every
    replica's load within U (1 + spread) and minimises sum_kj |x_kj - p_kj| / lambda_j, the
    distance to the capacity-proportional split p_kj = lambda_j n_kj / sum_k n_kj (module
    docstring). `load` stays the first stage's optimum either way.
    """
    n = np.asarray(capacity, dtype=float)
    lam = np.asarray(demand, dtype=float)
    if n.ndim != 2 or n.shape[1] != len(lam):
        raise AssignmentError(f"capacity is {n.shape}, demand has {len(lam)} types")
    if np.any(lam < 0) or np.any(n < 0):
        raise AssignmentError("capacities and demands must be >= 0")
    replicas, types = n.shape
    for j in range(types):
        if lam[j] > 0 and not np.any(n[:, j] > 0):
            raise AssignmentError(f"no replica can serve type {j}")
    solver = pywraplp.Solver.CreateSolver("GLOP")
    if solver is None:  # pragma: no cover - GLOP ships with OR-Tools
        raise AssignmentError("OR-Tools GLOP is not available")
    inf = solver.infinity()
    u = solver.NumVar(0.0, inf, "U")
    x = [[solver.NumVar(0.0, inf if n[k, j] > 0 else 0.0, f"x{k}_{j}") for j in range(types)]
         for k in range(replicas)]
    for j in range(types):
        solver.Add(sum(x[k][j] for k in range(replicas)) == float(lam[j]))
    for k in range(replicas):
        terms = [x[k][j] * (1.0 / n[k, j]) for j in range(types) if n[k, j] > 0]
        if terms:
            solver.Add(sum(terms) <= u)
    solver.Minimize(u)
    status = solver.Solve()
    if status != pywraplp.Solver.OPTIMAL:
        raise AssignmentError(f"GLOP status {status}")
    best = float(u.solution_value())
    if spread is not None:
        if spread < 0:
            raise AssignmentError("spread must be >= 0")
        u.SetBounds(0.0, best * (1.0 + spread) + 1e-9 * max(best, 1.0))
        dev = []
        for j in range(types):
            if lam[j] <= 0:
                continue
            total = float(n[:, j].sum())
            for k in range(replicas):
                if n[k, j] <= 0:
                    continue
                p = float(lam[j]) * float(n[k, j]) / total
                d = solver.NumVar(0.0, inf, f"d{k}_{j}")
                solver.Add(d >= x[k][j] - p)
                solver.Add(d >= p - x[k][j])
                dev.append(d * (1.0 / float(lam[j])))
        if dev:
            solver.Minimize(sum(dev))
            status = solver.Solve()
            if status != pywraplp.Solver.OPTIMAL:
                raise AssignmentError(f"GLOP status {status} (spreading stage)")
    flow = np.array([[x[k][j].solution_value() for j in range(types)] for k in range(replicas)])
    flow = np.maximum(flow, 0.0)
    util = np.array([
        sum(flow[k, j] / n[k, j] for j in range(types) if n[k, j] > 0) for k in range(replicas)
    ])
    return Assignment(flow, best, util)

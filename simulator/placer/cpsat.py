"""The CP-SAT deployment model (paper §3.5, Eq. 1 with C1-C3). Pure: numbers in, plan out.

Variables, for every option o = (service, GPU variant, TP degree t):

* ``x_o``  new replicas (integer), each a TP group of t GPUs;
* ``f_o``  request rate routed to the option's replicas (integer, in 1/S req/s);
* ``T_o``  latency-seconds per second those requests accumulate (integer, 1/U units);
* ``z_kp`` hosts of class k cut by pattern p (packing.host_patterns).

Constraints:

* C1/C3: per class, ``sum_p z_kp <= hosts``; per (variant, t), the replicas fit in the
  t-slots the chosen patterns provide (a TP group never spans hosts, GPUs = DP x TP; on
  hosts that are otela nodes, one group per host: a node runs one engine);
* C2 is upstream of the model: options exist only for configurations that fit;
* demand: ``sum_o f_o = rate_s`` per service (``<=`` for the goodput objective);
* capacity: ``f_o <= cap_o * (x_o + existing_o)``;
* latency: ``T_o >= A_k (x_o + existing_o) + B_k f_o`` for every affine piece k of the
  option's convex envelope (curves.py): the perspective of the per-replica curve.

Objectives, solved lexicographically (phase 2 keeps phase 1's optimum and minimises the
mean latency, or for latency the GPUs used): latency ``min sum T``; goodput ``max sum f``
(every option loaded within its SLO capacity); gpus ``min sum t x``; cost ``min sum $/h``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from simulator.placer.demand import Objective
from simulator.placer.packing import host_patterns

DEFAULT_WORKERS = 8
"""CP-SAT search workers. Fewer than 8 leave out the portfolio's subsolvers that prove these
models optimal (max_lp, reduced_costs, core, quick_restart): with 2 workers a 64-GPU latency
plan stayed 0.2 % from its bound after 48 s; with 8, time-sliced on the same 2 cores, it is
proved optimal in 2-5 s (docs/placer.md, "Scale")."""


class PlanError(ValueError):
    """No plan: the demand cannot be met under the constraints (the message says why)."""


@dataclass(frozen=True)
class Option:
    service: str
    variant: str
    tp: int
    pieces: tuple[tuple[float, float], ...]  # (a, b): g(rho) = max a + b rho, s*req/s
    cap: float  # highest load per replica allowed, req/s
    cost_per_hour: float = 0.0  # $/h of one replica
    existing: int = 0  # replicas already running (their GPUs are not in the pool)


@dataclass(frozen=True)
class ClassSpec:
    variant: str
    gpus_per_host: int
    hosts: int
    one_group: bool = False  # at most one TP group per host (an otela node runs one engine)


@dataclass(frozen=True)
class Problem:
    rates: Mapping[str, float]  # service -> req/s
    options: tuple[Option, ...]
    classes: tuple[ClassSpec, ...]
    objective: Objective = Objective.LATENCY


@dataclass(frozen=True)
class Phase:
    name: str
    status: str
    objective: float  # in the phase's own unit (see `unit`)
    bound: float
    gap: float  # relative: |objective - bound| / max(|objective|, tiny)
    wall_s: float
    unit: str


@dataclass(frozen=True)
class Solution:
    replicas: tuple[int, ...]  # new replicas per option
    flows: tuple[float, ...]  # req/s per option
    patterns: Mapping[int, tuple[tuple[tuple[int, ...], int], ...]]  # class -> (pattern, hosts)
    phases: tuple[Phase, ...]
    scale: tuple[float, float] = (1.0, 1.0)  # (S, U)
    notes: tuple[str, ...] = field(default=())

    @property
    def optimal(self) -> bool:
        return all(p.status == "OPTIMAL" for p in self.phases)

    @property
    def status(self) -> str:
        return self.phases[0].status if self.phases else "UNKNOWN"

    @property
    def gap(self) -> float:
        return self.phases[0].gap if self.phases else math.inf


def flow_scale(problem: Problem) -> int:
    """S, flow units per req/s: a power of ten giving the smallest rate >= 1000 units.
    Rates are rounded, and per-replica capacities floored, to this grid."""
    min_rate = min(problem.rates.values())
    return int(10 ** max(2, math.ceil(math.log10(1000.0 / min_rate))))


def _scales(problem: Problem) -> tuple[int, float]:
    """S (flow units per req/s) and U (cost units per latency-second per second)."""
    s = flow_scale(problem)
    slopes = [b for o in problem.options for _, b in o.pieces if b > 0]
    min_b = min(slopes) if slopes else 1.0
    u = 1000.0 * s / min_b  # the gentlest slope keeps >= 3 significant digits
    # keep the largest term far from int64 limits
    biggest = max((abs(a) * 1e3 + b * r)
                  for o in problem.options for a, b in o.pieces
                  for r in [problem.rates[o.service]])
    u = min(u, 1e15 / max(biggest, 1e-9))
    return s, u


def solve(problem: Problem, time_limit_s: float = 10.0, workers: int = DEFAULT_WORKERS,
          gap_limit: float = 0.0, seed: int = 0) -> Solution:
    """Build and solve the model; raises PlanError when it is infeasible."""
    if not problem.options:
        raise PlanError("no configuration of any model fits on the pool's GPUs")
    missing = [s for s in problem.rates if not any(o.service == s for o in problem.options)]
    if missing and problem.objective is not Objective.GOODPUT:
        raise PlanError(f"no configuration fits for {', '.join(missing)} "
                        "(see the rejected configurations)")
    s_units, u_units = _scales(problem)
    m = cp_model.CpModel()
    opts = problem.options
    rate_units = {svc: round(r * s_units) for svc, r in problem.rates.items()}

    # replicas: bounded by what the pool could hold of that TP on that variant
    slots_ub: dict[tuple[str, int], int] = {}
    for c in problem.classes:
        for t in {o.tp for o in opts if o.variant == c.variant}:
            per_host = min(1, c.gpus_per_host // t) if c.one_group else c.gpus_per_host // t
            slots_ub[(c.variant, t)] = slots_ub.get((c.variant, t), 0) + c.hosts * per_host
    x = [m.new_int_var(0, slots_ub.get((o.variant, o.tp), 0), f"x{i}") for i, o in
         enumerate(opts)]
    f = [m.new_int_var(0, rate_units[o.service], f"f{i}") for i, o in enumerate(opts)]

    # C1 + C3: patterns per class
    z: dict[int, list[tuple[tuple[int, ...], cp_model.IntVar]]] = {}
    slot_terms: dict[tuple[str, int], list[cp_model.LinearExprT]] = {}
    for k, c in enumerate(problem.classes):
        degrees = sorted({o.tp for o in opts if o.variant == c.variant})
        pats = host_patterns(c.gpus_per_host, degrees, c.one_group)
        z[k] = [(p, m.new_int_var(0, c.hosts, f"z{k}_{j}")) for j, p in enumerate(pats)]
        if z[k]:
            m.add(sum(v for _, v in z[k]) <= c.hosts)
        for p, v in z[k]:
            for t in set(p):
                slot_terms.setdefault((c.variant, t), []).append(p.count(t) * v)
    for (var, t) in {(o.variant, o.tp) for o in opts}:
        used = [x[i] for i, o in enumerate(opts) if o.variant == var and o.tp == t]
        m.add(sum(used) <= sum(slot_terms.get((var, t), [])))

    # demand and capacity
    for svc, units in rate_units.items():
        mine = [f[i] for i, o in enumerate(opts) if o.service == svc]
        if problem.objective is Objective.GOODPUT:
            m.add(sum(mine) <= units)
        else:
            m.add(sum(mine) == units)
    for i, o in enumerate(opts):
        cap_units = math.floor(o.cap * s_units + 1e-9)
        m.add(f[i] <= cap_units * (x[i] + o.existing))

    # latency pieces: only in the phase that minimises latency (as objective or
    # tie-break); a GPU, cost or goodput phase 1 solves faster without them
    t_vars: list[cp_model.IntVar] = []

    def add_latency() -> cp_model.LinearExprT:
        for i, o in enumerate(opts):
            hi = 0
            n_max = slots_ub.get((o.variant, o.tp), 0) + o.existing
            terms = []
            for a, b in o.pieces:
                a_i, b_i = round(a * u_units), round(b * u_units / s_units)
                terms.append((a_i, b_i))
                hi = max(hi, a_i * (n_max if a_i > 0 else 0) + b_i * rate_units[o.service])
            tv = m.new_int_var(0, max(hi, 0), f"T{i}")
            for a_i, b_i in terms:
                m.add(tv >= a_i * (x[i] + o.existing) + b_i * f[i])
            t_vars.append(tv)
        return sum(t_vars)

    total_rate = sum(problem.rates.values())
    gpus_expr = sum(o.tp * x[i] for i, o in enumerate(opts))
    phases: list[Phase] = []
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = max(1, workers)
    if workers <= 1:
        # A lone worker runs the fixed search on the default (partial) LP, which can stall
        # for minutes short of the optimum on a two-service, six-GPU pool (the enumerator
        # property test found one: FEASIBLE at 1.21 s after 48 s, optimum 1.03 s). The full
        # linear relaxation, which the portfolio's max_lp worker uses, proves it in 10 ms.
        solver.parameters.linearization_level = 2
    solver.parameters.random_seed = seed
    if gap_limit > 0:
        solver.parameters.relative_gap_limit = gap_limit
    deadline = time.monotonic() + time_limit_s

    def run(name: str, expr: cp_model.LinearExprT, sense: str, unit: str,
            scale: float, share: float) -> bool:
        if sense == "min":
            m.minimize(expr)
        else:
            m.maximize(expr)
        left = max(0.05, (deadline - time.monotonic()) * share)
        solver.parameters.max_time_in_seconds = left
        t0 = time.monotonic()
        status = solver.solve(m)
        wall = time.monotonic() - t0
        st = solver.status_name(status)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            phases.append(Phase(name, st, math.nan, math.nan, math.inf, wall, unit))
            return False
        obj, bound = solver.objective_value, solver.best_objective_bound
        gap = abs(obj - bound) / max(abs(obj), 1e-9)
        phases.append(Phase(name, st, obj * scale, bound * scale, gap, wall, unit))
        # keep the incumbent as a hint for the next phase
        m.clear_hints()
        for v in [*x, *f, *t_vars, *(zv for zs in z.values() for _, zv in zs)]:
            m.add_hint(v, solver.value(v))
        return True

    lat_scale = 1.0 / (u_units * total_rate)
    obj = problem.objective
    if obj is Objective.LATENCY:
        latency_expr = add_latency()
        ok = run("latency", latency_expr, "min", "s mean e2e", lat_scale, 0.8)
        if ok:
            best = round(solver.objective_value)
            m.add(latency_expr <= best)
            run("gpus", gpus_expr, "min", "GPUs", 1.0, 1.0)
    else:
        if obj is Objective.GOODPUT:
            ok = run("goodput", sum(f), "max", "req/s within SLO", 1.0 / s_units, 0.8)
            if ok:
                m.add(sum(f) >= round(solver.objective_value))
        elif obj is Objective.GPUS:
            ok = run("gpus", gpus_expr, "min", "GPUs", 1.0, 0.8)
            if ok:
                m.add(gpus_expr <= round(solver.objective_value))
        else:
            cents = sum(round(o.cost_per_hour * 100) * x[i] for i, o in enumerate(opts))
            ok = run("cost", cents, "min", "$/h", 0.01, 0.8)
            if ok:
                m.add(cents <= round(solver.objective_value))
        if ok:
            run("latency", add_latency(), "min", "s mean e2e", lat_scale, 1.0)
    if not ok:
        raise PlanError(_infeasible_reason(problem, phases[-1].status))
    # the last successful phase's values are the plan
    if phases[-1].status not in ("OPTIMAL", "FEASIBLE"):
        # phase 2 failed to find anything within time: fall back to the hinted phase-1 values
        raise PlanError(f"phase {phases[-1].name} found no solution in time; raise --time-limit")
    reps = tuple(int(solver.value(v)) for v in x)
    flows = tuple(solver.value(v) / s_units for v in f)
    chosen = {k: tuple((p, int(solver.value(v))) for p, v in zs if solver.value(v) > 0)
            for k, zs in z.items()}
    return Solution(reps, flows, chosen, tuple(phases), (float(s_units), u_units))


def _infeasible_reason(problem: Problem, status: str) -> str:
    if status == "UNKNOWN":
        return "no feasible plan found within the time limit; raise --time-limit"
    short = []
    for svc, rate in problem.rates.items():
        cap = 0.0
        for o in problem.options:
            if o.service == svc:
                slots = sum(c.hosts * (c.gpus_per_host // o.tp) for c in problem.classes
                            if c.variant == o.variant)
                cap = max(cap, o.cap * (slots + o.existing))
        if cap < rate:
            short.append(f"{svc} needs {rate:g} req/s but the whole pool serves at most "
                         f"{cap:.3g} within its limits")
    detail = "; ".join(short) if short else "the models together need more GPUs than the pool"
    if problem.objective is Objective.LATENCY:
        return f"infeasible: {detail} (drop the SLOs, or plan for --objective goodput)"
    return f"infeasible: {detail} (plan for --objective goodput to serve what fits)"


def evaluate(problem: Problem, replicas: Sequence[int], flows: Sequence[float]) -> float:
    """Mean latency (s) the model assigns to a plan, in floating point (no scaling)."""
    total = 0.0
    for o, n, fl in zip(problem.options, replicas, flows, strict=True):
        k = n + o.existing
        if k > 0:
            total += max(a * k + b * fl for a, b in o.pieces)
    return total / sum(problem.rates.values())

"""An exhaustive enumerator of the same model, for small pools: proof that CP-SAT is optimal.

It shares no code with `cpsat` beyond the `Problem` it reads. Every vector of replica
counts is tried; host feasibility is checked by explicit packing (`packing.pack`, not the
host patterns CP-SAT uses); the best flows for fixed replicas are found by filling the
cheapest linear segments first, which is exact for separable convex piecewise-linear costs
(continuous flows: a relaxation of CP-SAT's flows on a 1/S grid, so CP-SAT's latency may
exceed the enumerator's by the grid's rounding only). Rates and capacities are put on the
same 1/S grid CP-SAT uses, so feasibility, goodput and GPU counts agree exactly.
Exponential: meant for pools of a few hosts.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from simulator.placer.cpsat import Option, Problem, flow_scale
from simulator.placer.demand import Objective
from simulator.placer.packing import pack


@dataclass(frozen=True)
class Best:
    value: float  # the phase-1 objective, in the same unit as cpsat's Phase.objective
    replicas: tuple[int, ...]
    tried: int


def _segments(o: Option, n: int, upper: float) -> tuple[float, list[tuple[float, float]]]:
    """Cost at f=0 and the (length, slope) segments of f -> max_k a_k n + b_k f on
    [0, upper], in increasing slope."""
    pieces = [(a * n, b) for a, b in o.pieces]
    f = 0.0
    base = max(a + b * f for a, b in pieces)
    segs: list[tuple[float, float]] = []
    while f < upper - 1e-12:
        # active piece: the max at f; among ties, the steepest (it is the one that stays max)
        val = max(a + b * f for a, b in pieces)
        act = max((p for p in pieces if a_eq(p[0] + p[1] * f, val)), key=lambda p: p[1])
        nxt = upper
        for a, b in pieces:
            if b > act[1]:
                cross = (act[0] - a) / (b - act[1])
                if f + 1e-12 < cross < nxt:
                    nxt = cross
        segs.append((nxt - f, act[1]))
        f = nxt
    return base, segs


def a_eq(x: float, y: float) -> bool:
    return abs(x - y) <= 1e-9 * max(1.0, abs(x), abs(y))


def best_flows(problem: Problem, replicas: Sequence[int]) -> float | None:
    """Minimum total latency-seconds per second for fixed replicas (None: infeasible)."""
    s = flow_scale(problem)
    total = 0.0
    for svc, rate in problem.rates.items():
        need = round(rate * s) / s
        segs: list[tuple[float, float]] = []
        for o, n in zip(problem.options, replicas, strict=True):
            k = n + o.existing
            if o.service != svc or k == 0:
                continue
            upper = math.floor(o.cap * s + 1e-9) / s * k
            base, mine = _segments(o, k, upper)
            total += base
            segs += mine
        for length, slope in sorted(segs, key=lambda ls: ls[1]):
            take = min(length, need)
            total += take * slope
            need -= take
            if need <= 1e-12:
                break
        if need > 1e-9:
            return None
    return total


def capacity_ok(problem: Problem, replicas: Sequence[int]) -> bool:
    s = flow_scale(problem)
    for svc, rate in problem.rates.items():
        cap = sum(math.floor(o.cap * s + 1e-9) * (n + o.existing)
                  for o, n in zip(problem.options, replicas, strict=True) if o.service == svc)
        if cap < round(rate * s):
            return False
    return True


def goodput(problem: Problem, replicas: Sequence[int]) -> float:
    s = flow_scale(problem)
    total = 0
    for svc, rate in problem.rates.items():
        cap = sum(math.floor(o.cap * s + 1e-9) * (n + o.existing)
                  for o, n in zip(problem.options, replicas, strict=True) if o.service == svc)
        total += min(cap, round(rate * s))
    return total / s


def fits_hosts(problem: Problem, replicas: Sequence[int]) -> bool:
    """Explicit packing of every variant's TP groups onto its hosts."""
    for var in {o.variant for o in problem.options}:
        groups: dict[int, int] = {}
        for o, n in zip(problem.options, replicas, strict=True):
            if o.variant == var and n:
                groups[o.tp] = groups.get(o.tp, 0) + n
        if not groups:
            continue
        hosts = [(c.gpus_per_host, c.one_group) for c in problem.classes if c.variant == var
                 for _ in range(c.hosts)]
        if pack(groups, [g for g, _ in hosts], [one for _, one in hosts]) is None:
            return False
    return True


def enumerate_best(problem: Problem) -> Best | None:
    """The optimum of the phase-1 objective by trying every replica vector (None when
    nothing is feasible)."""
    best: Best | None = None
    tried = 0
    total_rate = sum(problem.rates.values())
    for vec in _vectors(problem):
        if not fits_hosts(problem, vec):
            continue
        tried += 1
        obj = problem.objective
        if obj is Objective.GOODPUT:
            value = -goodput(problem, vec)
        elif obj is Objective.LATENCY:
            lat = best_flows(problem, vec)
            if lat is None:
                continue
            value = lat / total_rate
        else:
            if not capacity_ok(problem, vec):
                continue
            if obj is Objective.GPUS:
                value = float(sum(o.tp * n for o, n in zip(problem.options, vec, strict=True)))
            else:
                value = sum(round(o.cost_per_hour * 100) * n
                            for o, n in zip(problem.options, vec, strict=True)) / 100
        if best is None or value < best.value - 1e-12:
            best = Best(value, tuple(vec), tried)
    if best is None:
        return None
    sign = -1.0 if problem.objective is Objective.GOODPUT else 1.0
    return Best(sign * best.value, best.replicas, tried)


def _vectors(problem: Problem) -> Iterator[tuple[int, ...]]:
    """Every replica vector within each variant's GPU count (per variant, then combined)."""
    per_variant: list[tuple[list[int], list[tuple[int, ...]]]] = []
    for var in sorted({o.variant for o in problem.options}):
        idx = [i for i, o in enumerate(problem.options) if o.variant == var]
        budget = sum(c.gpus_per_host * c.hosts for c in problem.classes if c.variant == var)
        found: list[tuple[int, ...]] = []

        def rec(j: int, left: int, acc: list[int], idx: list[int] = idx,
                found: list[tuple[int, ...]] = found) -> None:
            if j == len(idx):
                found.append(tuple(acc))
                return
            tp = problem.options[idx[j]].tp
            for n in range(left // tp + 1):
                acc.append(n)
                rec(j + 1, left - n * tp, acc)
                acc.pop()

        rec(0, budget, [])
        per_variant.append((idx, found))
    for combo in itertools.product(*(found for _, found in per_variant)):
        vec = [0] * len(problem.options)
        for (idx, _), part in zip(per_variant, combo, strict=True):
            for i, n in zip(idx, part, strict=True):
                vec[i] = n
        yield tuple(vec)

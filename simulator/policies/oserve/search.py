"""OSERVE §4.3 and Appendix E: the upper level, choosing replica sizes and parallel shapes.

A layout is a multiset of replica shapes that packs onto the pool's hosts (a replica never
spans hosts). Its value is the lower level's throughput on the demand mix
(`assignment.assign`). `flow_guided_search` is the paper's Algorithm 1: starting from a
uniform layout, it reads the assignment's bottleneck (saturated) and under-used replicas,
merges or swaps GPUs into the bottlenecks and splits or swaps the under-used ones (chosen at
random), re-picks each replica's parallel shape, and keeps the change only if throughput
improves, until `patience` iterations bring nothing. `exhaustive` enumerates every layout
(feasible on one or two hosts) and is the reference the heuristic is checked against, as in
the paper's Figure 16; `best_homogeneous` is the baseline: all replicas alike.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from simulator.policies.interfaces import Shape
from simulator.policies.oserve.assignment import Assignment, AssignmentError, assign

Layout = tuple[Shape, ...]


@dataclass(frozen=True)
class Scored:
    """A layout, where each replica sits, and its assignment on the demand mix."""

    layout: Layout
    hosts: tuple[int, ...]
    assignment: Assignment

    @property
    def throughput(self) -> float:
        return self.assignment.throughput

    def describe(self) -> str:
        counts: dict[str, int] = {}
        for s in self.layout:
            counts[s.label] = counts.get(s.label, 0) + 1
        return ", ".join(f"{k}x{v}" for k, v in sorted(counts.items(), key=lambda kv: kv[0]))


def pack(layout: Sequence[Shape], host_gpus: Sequence[int]) -> tuple[int, ...] | None:
    """Host of each replica by first-fit decreasing, or None if the layout does not fit."""
    free = list(host_gpus)
    where = [-1] * len(layout)
    for i in sorted(range(len(layout)), key=lambda i: -layout[i].gpus):
        for h, f in enumerate(free):
            if f >= layout[i].gpus:
                free[h] -= layout[i].gpus
                where[i] = h
                break
        else:
            return None
    return tuple(where)


def score(
    layout: Sequence[Shape], caps: Mapping[Shape, np.ndarray], demand: np.ndarray,
    host_gpus: Sequence[int],
) -> Scored | None:
    """The layout's assignment, or None when it does not pack or cannot serve every type."""
    if not layout:
        return None
    hosts = pack(layout, host_gpus)
    if hosts is None:
        return None
    try:
        a = assign([caps[s] for s in layout], demand)
    except AssignmentError:
        return None
    return Scored(tuple(layout), hosts, a)


def _better(a: Scored | None, b: Scored | None) -> bool:
    """a beats b: higher throughput; on a tie, fewer GPUs, then fewer replicas."""
    if a is None:
        return False
    if b is None:
        return True
    ta, tb = a.throughput, b.throughput
    if ta > tb * (1 + 1e-9):
        return True
    if ta < tb * (1 - 1e-9):
        return False
    return (sum(s.gpus for s in a.layout), len(a.layout)) < (
        sum(s.gpus for s in b.layout), len(b.layout))


def layouts(shapes: Sequence[Shape], total: int, exact: bool = True) -> list[Layout]:
    """Every multiset of `shapes` using `total` GPUs (at most `total` if not `exact`)."""
    shapes = sorted(set(shapes), key=lambda s: (s.gpus, s.tp, s.pp))
    out: list[Layout] = []

    def rec(i: int, left: int, cur: list[Shape]) -> None:
        if i == len(shapes):
            if cur and (left == 0 or not exact):
                out.append(tuple(cur))
            return
        s = shapes[i]
        for k in range(left // s.gpus + 1):
            rec(i + 1, left - k * s.gpus, cur + [s] * k)

    rec(0, total, [])
    return out


def exhaustive(
    shapes: Sequence[Shape], caps: Mapping[Shape, np.ndarray], demand: np.ndarray,
    host_gpus: Sequence[int],
) -> Scored:
    """The best of all layouts that use every GPU (the reference optimum)."""
    best: Scored | None = None
    for lay in layouts(shapes, sum(host_gpus)):
        s = score(lay, caps, demand, host_gpus)
        if _better(s, best):
            best = s
    if best is None:
        raise AssignmentError("no layout of these shapes fits the pool and serves every type")
    return best


def best_homogeneous(
    shapes: Sequence[Shape], caps: Mapping[Shape, np.ndarray], demand: np.ndarray,
    host_gpus: Sequence[int],
) -> Scored:
    """The best layout of identical replicas, as many as fit (vLLM with one configuration)."""
    best: Scored | None = None
    for s in set(shapes):
        sc = score(homogeneous_layout(s, host_gpus), caps, demand, host_gpus)
        if _better(sc, best):
            best = sc
    if best is None:
        raise AssignmentError("no homogeneous layout fits the pool and serves every type")
    return best


# ---- Algorithm 1 ------------------------------------------------------------------------
@dataclass
class SearchTrace:
    """How the heuristic went: evaluations and accepted improvements."""

    iterations: int = 0
    evaluations: int = 0
    accepted: int = 0


def _pick_shapes(
    sizes: Sequence[int], by_size: Mapping[int, list[Shape]], caps: Mapping[Shape, np.ndarray],
    demand: np.ndarray, host_gpus: Sequence[int], trace: SearchTrace,
    init: Sequence[Shape] | None = None,
) -> Scored | None:
    """Choose each replica's shape for the given GPU counts (coordinate ascent on throughput,
    starting from `init`, by default the first shape of each size: pure TP)."""
    if any(d not in by_size for d in sizes):
        return None
    cur = list(init) if init is not None else [by_size[d][0] for d in sizes]
    best = score(cur, caps, demand, host_gpus)
    trace.evaluations += 1
    improved = True
    while improved:
        improved = False
        for i, d in enumerate(sizes):
            for s in by_size[d]:
                if s == cur[i]:
                    continue
                trial = [*cur[:i], s, *cur[i + 1:]]
                sc = score(trial, caps, demand, host_gpus)
                trace.evaluations += 1
                if _better(sc, best):
                    cur, best, improved = trial, sc, True
    return best


def _bottlenecks(
    cur: Scored, caps: Mapping[Shape, np.ndarray], demand: np.ndarray, trace: SearchTrace
) -> tuple[set[int], set[int]]:
    """Saturated and under-used replicas. The balanced LP loads every replica that carries
    flow to the same U, so saturation alone does not separate them; what does is how much
    throughput is lost per GPU without the replica (its marginal flow). At or above the
    median: a bottleneck to grow; below: under-used, to shrink. When all are alike, every
    replica is both (any mutation may help)."""
    n = len(cur.layout)
    if n == 1:
        return {0}, {0}
    base = cur.throughput
    value = []
    for k in range(n):
        rest = [caps[s] for i, s in enumerate(cur.layout) if i != k]
        trace.evaluations += 1
        try:
            loss = base - assign(rest, demand).throughput
        except AssignmentError:
            loss = base  # the only replica able to serve some type
        value.append(loss / cur.layout[k].gpus)
    med = _median(value)
    over = {k for k in range(n) if value[k] >= med - 1e-9 * abs(med)}
    under = set(range(n)) - over
    return (over, set(range(n))) if not under else (over, under)


def _median(values: list[float]) -> float:
    """`np.median` of a few floats, the same float (the middle one, or the two middle ones'
    sum halved, as numpy's mean of two gives), without numpy's NaN check: that imports
    numpy.ma on first use, ~0.1 s of the first search in a process."""
    if any(v != v for v in values):  # NaN: numpy's answer
        return float(np.median(values))
    s = sorted(values)
    m = len(s) // 2
    return float(s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2)


def _mutate(
    d: list[int], over: list[int], under: list[int], valid: list[int],
    by_size: Mapping[int, list[Shape]], rng: random.Random,
) -> list[int] | None:
    """One of Algorithm 1's moves, picked at random: merge two bottleneck replicas, split an
    under-used one in two, or swap GPUs from an under-used replica to a bottleneck. Returns
    the new replica sizes, or None if the move leaves a size no shape has."""
    op = rng.choice(("merge", "split", "swap"))
    d = list(d)
    if op == "merge" and len(over) > 1:
        a, b = rng.sample(over, 2)
        d[a] += d[b]
        d.pop(b)
    elif op == "split" and under:
        r = rng.choice(under)
        cuts = [c for c in valid if c < d[r] and d[r] - c in by_size]
        if not cuts:
            return None
        c = rng.choice(cuts)
        d[r] -= c
        d.append(c)
    elif op == "swap" and over and under:
        o = rng.choice(over)
        u = rng.choice([x for x in under if x != o] or [o])
        if u == o:
            return None
        delta = rng.choice(valid)
        if d[u] - delta < 0:
            return None
        d[o] += delta
        d[u] -= delta
        d = [x for x in d if x > 0]
    else:
        return None
    return d if all(x in by_size for x in d) else None


def flow_guided_search(
    shapes: Sequence[Shape],
    caps: Mapping[Shape, np.ndarray],
    demand: np.ndarray,
    host_gpus: Sequence[int],
    seed: int = 0,
    patience: int = 20,
    max_iter: int = 200,
    start: Sequence[Shape] | None = None,
) -> tuple[Scored, SearchTrace]:
    """The paper's heuristic; `start` warm-starts from a running layout (adaptive switching).
    Each iteration applies one randomly chosen move (merge / split / swap) guided by the
    current bottlenecks, re-picks every replica's parallel shape and keeps the result only
    if it is better; it stops after `patience` iterations without improvement."""
    rng = random.Random(seed)
    by_size: dict[int, list[Shape]] = {}
    for s in sorted(set(shapes), key=lambda s: (s.pp, s.tp)):
        by_size.setdefault(s.gpus, []).append(s)
    trace = SearchTrace()
    # the running layout, or the best uniform one (the paper starts from a uniform one), with
    # its replicas' shapes re-picked one at a time: mixing shapes of one size (TP2PP4 next to
    # TP4PP2) is a move no merge, split or swap of sizes makes
    init = list(start) if start else list(best_homogeneous(shapes, caps, demand,
                                                           host_gpus).layout)
    best = _pick_shapes([s.gpus for s in init], by_size, caps, demand, host_gpus, trace,
                        init=init)
    if best is None:
        raise AssignmentError("the initial layout does not fit or cannot serve every type")
    valid = sorted(by_size)
    stale = 0
    while stale < patience and trace.iterations < max_iter:
        trace.iterations += 1
        over, under = _bottlenecks(best, caps, demand, trace)
        sizes = _mutate([s.gpus for s in best.layout], sorted(over), sorted(under), valid,
                        by_size, rng)
        if sizes is None:
            stale += 1
            continue
        cand = _pick_shapes(sizes, by_size, caps, demand, host_gpus, trace)
        if _better(cand, best):
            assert cand is not None
            best = cand
            trace.accepted += 1
            stale = 0
        else:
            stale += 1
    return best, trace


# ---- the serving check --------------------------------------------------------------------
# The LP plans with n_kj profiled closed-loop, one type at a time, every request starting at
# once, so decodes run in lockstep. Served open-loop in a mix, nearly every cycle also carries
# prefill chunks, which take micro-batches of their own on a pipeline and leave the decodes
# fewer; the profiles then misjudge shapes and types by different amounts (Llama2-70B, S3
# mix, completed in 10 minutes over LP capacity: TP2PP4 x2 0.93, TP4PP2 x2 0.95, TP2PP2 x4
# 1.04, TP1PP4 x4 1.09; SILO alone, open-loop over closed-loop: 0.69 on TP2PP4, 1.05 on
# TP1PP4), and a layout the LP ranks first can serve less than one it ranks below. The
# policy therefore simulates the searched layout and the near-best homogeneous ones on a
# short open-loop sample of the workload and launches the heterogeneous one only if it
# serves more than all of them (`OservePolicy._choose`).
def homogeneous_layout(shape: Shape, host_gpus: Sequence[int]) -> Layout:
    """As many replicas of `shape` as pack on the hosts."""
    lay = [shape] * (sum(host_gpus) // shape.gpus)
    while lay and pack(lay, host_gpus) is None:
        lay.pop()
    return tuple(lay)


def same_layout(a: Sequence[Shape], b: Sequence[Shape]) -> bool:
    """The same multiset of replica shapes."""
    return sorted(map(str, a)) == sorted(map(str, b))


def homogeneous_candidates(
    shapes: Sequence[Shape], caps: Mapping[Shape, np.ndarray], demand: np.ndarray,
    host_gpus: Sequence[int], keep: float,
) -> list[Scored]:
    """Every shape's homogeneous layout whose LP throughput is at least `keep` of the best
    one's, best first (ties: fewer GPUs, then fewer replicas)."""
    scored = [sc for s in set(shapes)
              if (sc := score(homogeneous_layout(s, host_gpus), caps, demand, host_gpus))]
    if not scored:
        raise AssignmentError("no homogeneous layout fits the pool and serves every type")
    top = max(sc.throughput for sc in scored)
    out = [sc for sc in scored if sc.throughput >= keep * top * (1 - 1e-9)]
    return sorted(out, key=lambda sc: (-sc.throughput, sum(s.gpus for s in sc.layout),
                                       len(sc.layout), str(sc.layout)))


def choose_served(
    plan: Scored | None, homogeneous: Sequence[Scored], served: Callable[[Scored], float],
    margin: float = 0.01,
) -> tuple[Scored, dict[str, float]]:
    """What to launch: the homogeneous candidate that serves most (requests/s on one sample,
    `served`; the first listed on a tie), unless `plan` serves more than `margin` above it.
    A heterogeneous plan that serves less never wins, and a near tie goes to the simpler
    layout. Returns the choice and every candidate's served rate (each simulated once)."""
    rates: dict[str, float] = {}
    for sc in homogeneous:
        rates.setdefault(sc.describe(), served(sc))
    best = max(homogeneous, key=lambda sc: rates[sc.describe()])  # first of equals
    if plan is None or any(same_layout(plan.layout, sc.layout) for sc in homogeneous):
        if plan is not None:
            rates.setdefault(plan.describe(), rates[next(
                sc.describe() for sc in homogeneous if same_layout(plan.layout, sc.layout))])
        return best, rates
    rates[plan.describe()] = got = served(plan)
    return (plan if got > rates[best.describe()] * (1 + margin) else best), rates

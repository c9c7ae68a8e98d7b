"""OSERVE §5.2 and Algorithm 2: moving to a new layout by copying parameters between GPUs.

The model's weights are cut into units (layer x 1/S of the tensor width, S the widest TP in
either layout). In a layout, the GPU at pipeline stage p and tensor rank t of a replica holds
that stage's layers and that rank's slices. Every unit a GPU needs and lacks is fetched from a
GPU that has it, preferring the same host (NVLink) and, among those, the source that has sent
this target the least so far (the paper's greedy). The switch time is the restart of the
engines plus the slowest GPU's transfers; reloading from storage instead costs a fixed time
(the paper measures over 50 s for a 70B model, against about 10 s with copying).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from math import lcm

from simulator.api import Deployment
from simulator.memory import weight_bytes_total
from simulator.policies.interfaces import Shape
from simulator.policies.oserve.search import Scored

NVLINK_BPS = 400e9  # OSERVE §5.2: intra-machine NVLink
INTER_BPS = 200e9  # OSERVE §6.1: InfiniBand between the servers, as the paper states it


@dataclass(frozen=True)
class Transfer:
    """Unit (layer, slice) sent from GPU `src` to GPU `dst`."""

    layer: int
    slice: int
    src: int
    dst: int


@dataclass(frozen=True)
class SwitchCost:
    seconds: float
    bytes_moved: float
    method: str  # "copy" or "reload"


def holdings(
    layout: Sequence[Shape], gpus: Sequence[Sequence[int]], layers: int, slices: int
) -> dict[int, set[tuple[int, int]]]:
    """Units each GPU holds: replica i runs on `gpus[i]` (stage-major: stage p, rank t is
    gpus[i][p * tp + t])."""
    out: dict[int, set[tuple[int, int]]] = defaultdict(set)
    for shape, ids in zip(layout, gpus, strict=True):
        per_stage = -(-layers // shape.pp)
        width = slices // shape.tp
        for p in range(shape.pp):
            for t in range(shape.tp):
                g = ids[p * shape.tp + t]
                for layer in range(p * per_stage, min(layers, (p + 1) * per_stage)):
                    for s in range(t * width, (t + 1) * width):
                        out[g].add((layer, s))
    return out


def greedy_plan(
    before: dict[int, set[tuple[int, int]]],
    after: dict[int, set[tuple[int, int]]],
    host_of: dict[int, int],
) -> list[Transfer]:
    """Algorithm 2: for each needed unit, the least-loaded same-host source, else the
    least-loaded remote one. Raises if a unit is held nowhere (it would need a reload)."""
    sources: dict[tuple[int, int], list[int]] = defaultdict(list)
    for g, units in before.items():
        for u in units:
            sources[u].append(g)
    load: dict[tuple[int, int], int] = defaultdict(int)
    plan: list[Transfer] = []
    for t in sorted(after):
        for u in sorted(after[t] - before.get(t, set())):
            cands = sources.get(u)
            if not cands:
                raise ValueError(f"unit {u} is held by no GPU")
            near = [s for s in cands if host_of.get(s) == host_of.get(t)]
            pool = near or cands
            s = min(pool, key=lambda x: (load[(x, t)], x))
            load[(s, t)] += 1
            plan.append(Transfer(u[0], u[1], s, t))
    return plan


def transfer_seconds(plan: Sequence[Transfer], unit_bytes: float, host_of: dict[int, int]) -> float:
    """The slowest GPU's send or receive time over its links (transfers overlap otherwise)."""
    busy: dict[tuple[str, int], float] = defaultdict(float)
    for x in plan:
        bw = NVLINK_BPS if host_of.get(x.src) == host_of.get(x.dst) else INTER_BPS
        busy[("send", x.src)] += unit_bytes / bw
        busy[("recv", x.dst)] += unit_bytes / bw
    return max(busy.values(), default=0.0)


def _gpu_lists(plan: Scored, host_gpus: int) -> list[list[int]]:
    """GPU ids of each replica, packed host by host in layout order (as the cluster does)."""
    nxt: dict[int, int] = defaultdict(int)
    out = []
    for shape, h in zip(plan.layout, plan.hosts, strict=True):
        start = h * host_gpus + nxt[h]
        out.append(list(range(start, start + shape.gpus)))
        nxt[h] += shape.gpus
    return out


def switch_cost(
    old: Scored,
    new: Scored,
    dep: Deployment,
    restart_s: float = 10.0,
    reload_s: float = 50.0,
    copy: bool = True,
    host_gpus: int = 8,
) -> SwitchCost:
    """Time to switch layouts: restart + greedy copy, or a reload from storage."""
    spec = dep.model_spec
    total = weight_bytes_total(spec, dep.precision)
    if not copy:
        return SwitchCost(reload_s, total * len(new.layout), "reload")
    slices = lcm(*[s.tp for s in (*old.layout, *new.layout)])
    before = holdings(old.layout, _gpu_lists(old, host_gpus), spec.layers, slices)
    after = holdings(new.layout, _gpu_lists(new, host_gpus), spec.layers, slices)
    host_of = {g: g // host_gpus for g in (*before, *after)}
    plan = greedy_plan(before, after, host_of)
    unit = total / (spec.layers * slices)
    return SwitchCost(restart_s + transfer_seconds(plan, unit, host_of), unit * len(plan), "copy")

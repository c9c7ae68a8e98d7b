"""memP, the paper's baseline (§5, "inspired by HexGen"): GPUs in proportion to memory demand.

A model's memory demand is its request rate times its parameter count. Pure and
deterministic:

1. each model runs at one TP degree: the smallest of its allowed degrees at which its
   weights (16-bit in the paper; a quantized checkpoint's at the bits it stores) take at
   most half of the smallest GPU of the pool (the other half is left for the KV cache) —
   13B TP1, 34B TP2, 70B TP4 on A100-80GB/GH200, as in upstream;
2. its share of the pool's GPUs is proportional to its memory demand; models in ascending
   demand round their share *up* to a multiple of their TP degree, and the largest model
   takes what is left, rounded down to its TP degree;
3. the largest model chooses GPUs first, from the GPU type with the most memory down, on
   hosts with room for a whole TP group.

On the Table 1 pool this gives exactly the paper's memP row (tests/placer/test_inputs.py).
Routing weights are proportional to replica counts, as in upstream's experiment file.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from simulator.models import get_model
from simulator.placer.demand import Service
from simulator.placer.pool import Pool


@dataclass(frozen=True)
class MemPGroup:
    service: str
    variant: str
    tp: int
    replicas: int
    hosts: tuple[str, ...]


def memp_tp(svc: Service, smallest_gpu_bytes: float) -> int:
    """Smallest allowed TP degree at which the weights fill at most half of a GPU. The
    paper's models are all 16-bit; a quantized checkpoint's weights are sized at the bits
    it stores (its values and block scales), so an FP8 70B needs half the GPUs."""
    weights = get_model(svc.model).total_params * svc.precision.stored_weight_bits / 8
    for tp in sorted(svc.tp):
        if weights / tp <= 0.5 * smallest_gpu_bytes:
            return tp
    return max(svc.tp)


def memp(services: Sequence[Service], pool: Pool,
         gpu_bytes: Mapping[str, float] | None = None) -> list[MemPGroup]:
    """The memP allocation of `pool` to `services` (docs in the module string).

    `gpu_bytes` (variant name -> usable bytes) defaults to the catalog's runtime memory.
    """
    mem = dict(gpu_bytes or {})
    for h in pool.hosts:
        mem.setdefault(h.variant.name, h.variant.spec().runtime_bytes)
    smallest = min(mem.values())
    demand = {s.name: s.rate * get_model(s.model).total_params for s in services}
    tps = {s.name: memp_tp(s, smallest) for s in services}
    total = pool.total_gpus
    order = sorted(services, key=lambda s: demand[s.name])
    quota: dict[str, int] = {}
    left = total
    whole = sum(demand.values())
    for s in order[:-1]:
        tp = tps[s.name]
        share = total * demand[s.name] / whole
        q = max(tp, math.ceil(share / tp - 1e-9) * tp)
        q = min(q, left - left % tp)
        quota[s.name] = q
        left -= q
    last = order[-1]
    quota[last.name] = left - left % tps[last.name]

    free = {h.name: h.gpus for h in pool.hosts}
    hosts_by_mem = sorted(pool.hosts, key=lambda h: (-mem[h.variant.name], h.name))
    out: list[MemPGroup] = []
    for s in reversed(order):  # largest demand first
        tp = tps[s.name]
        want = quota[s.name] // tp
        placed: dict[str, list[str]] = {}
        for h in hosts_by_mem:
            while want > 0 and free[h.name] >= tp:
                free[h.name] -= tp
                placed.setdefault(h.variant.name, []).append(h.name)
                want -= 1
        for variant in sorted(placed, key=lambda v: -mem[v]):
            hs = placed[variant]
            out.append(MemPGroup(s.name, variant, tp, len(hs), tuple(hs)))
    return out

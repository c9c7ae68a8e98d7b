"""Several engines on one GPU: one memory pool for their KV caches (Prism's kvcached) and
shared compute.

Memory. A `SharedGPU` holds the GPU's usable bytes. Each active engine takes its weights and
activation workspace out of it; what is left is one KV pool from which every engine allocates
blocks on demand (`SharedReplica`): an engine's free block count is whatever the pool's free
bytes hold in its own block size, so memory one model releases is immediately there for
another. A pure-decode run that the engine plans ahead reserves the blocks it will need for
the whole run (and gives back what it did not use), so another engine cannot take them first.
An engine whose next request does not fit waits for the others to free memory instead of
rejecting it; it is re-checked at the next event.

Compute. Engines on one GPU run their iterations concurrently under MPS, sharing its
bandwidth and SMs. otela prices that as a slowdown factor 1 + (the others' busy share over the
last period) on every step (`ScaledCost`), which equals time-slicing when the others are
always busy and vanishes when they are idle, the common case for long-tail models.
"""

from __future__ import annotations

import math
from typing import Any, cast

import numpy as np

from simulator.engine import REJECTED, WAITING, EngineConfig, Replica, RequestTable, _Plan
from simulator.memory import MemoryPlan
from simulator.roofline import Parallelism, StepCost


class ScaledCost:
    """A StepCost whose step times are multiplied by `factor` (compute shared with others)."""

    def __init__(self, base: StepCost) -> None:
        self.base = base
        self.factor = 1.0
        self.model = base.model
        self.request_overhead = base.request_overhead

    def step_time(self, *args: Any, **kwargs: Any) -> float:
        return self.factor * self.base.step_time(*args, **kwargs)

    def decode_base(self, b: int) -> float:
        return self.factor * self.base.decode_base(b)

    @property
    def par(self) -> Parallelism:
        return self.base.par

    @property
    def host_overlap(self) -> bool:
        return self.base.host_overlap

    def cycle_time(self, *args: Any, **kwargs: Any) -> float:
        return self.factor * self.base.cycle_time(*args, **kwargs)

    def decode_cycle_lines(self, b: int, sliding_ctx_sum: float = 0.0) -> list[tuple[float, float]]:
        f = self.factor
        return [(f * a, f * s) for a, s in self.base.decode_cycle_lines(b, sliding_ctx_sum)]

    @property
    def attn_slope(self) -> float:
        return self.factor * self.base.attn_slope

    @property
    def attn_slope_sliding(self) -> float:
        return self.factor * self.base.attn_slope_sliding


class SharedGPU:
    """One GPU's memory (bytes) shared by the engines placed on it."""

    def __init__(self, index: int, usable_bytes: float) -> None:
        self.index = index
        self.usable = usable_bytes
        self.free = usable_bytes  # bytes not held by weights, workspaces or KV blocks
        self.engines: list[Replica] = []
        self.released_at = 0.0  # engine time of the latest KV release

    def reserve(self, nbytes: float) -> bool:
        """Take `nbytes` (weights, workspace) if they are free."""
        if nbytes > self.free + 1e-6:
            return False
        self.free -= nbytes
        return True

    def release(self, nbytes: float) -> None:
        self.free = min(self.usable, self.free + nbytes)

    @property
    def free_fraction(self) -> float:
        return self.free / self.usable if self.usable else 0.0


class SharedReplica(Replica):
    """An engine whose KV blocks come from its GPU's shared pool."""

    def __init__(
        self, idx: int, cost: ScaledCost, plan: MemoryPlan, cfg: EngineConfig,
        req: RequestTable, gpu: SharedGPU,
    ) -> None:
        self._gpu: SharedGPU | None = None
        self._init_free = 0
        super().__init__(idx, cast(StepCost, cost), plan, cfg, req)
        self.scaled = cost
        self._gpu = gpu
        self.block_bytes = plan.kv_bytes_per_token * cfg.block_size
        self.total_blocks = max(1, int(gpu.usable // self.block_bytes))
        self.watermark_blocks = 0
        self.reserved = 0  # blocks held for a planned decode run
        self.stalled = False
        gpu.engines.append(self)

    @property
    def free_blocks(self) -> int:
        if self._gpu is None:
            return self._init_free
        return int(self._gpu.free // self.block_bytes)

    @free_blocks.setter
    def free_blocks(self, value: int) -> None:
        if self._gpu is None:
            self._init_free = value
            return
        delta = value - self.free_blocks
        self._gpu.free += delta * self.block_bytes
        if delta > 0:
            self._gpu.released_at = max(self._gpu.released_at, self.clock)

    @property
    def kv_held_bytes(self) -> float:
        """Bytes of KV this engine holds (its requests' blocks and reservations)."""
        held = sum(int(self.req.blocks[r]) for r in self.running) + self.reserved
        return held * self.block_bytes

    def _can_take_at_once(self, n: int) -> bool:
        """Only when nothing is taken: the free count is the pool's float bytes floored to
        blocks, so one sum and per-request takes can round differently (and preempt
        differently); keep the engine's request-by-request order."""
        return n == 0

    # a planned decode run reserves its blocks up front: other engines share the pool
    def _plan_macro(self, decoding: np.ndarray) -> _Plan | None:
        plan = super()._plan_macro(decoding)
        if plan is None:
            return None
        if plan.grow is not None and plan.grow_k == plan.k_cap:  # the same sum, computed
            need = plan.grow_total
        else:
            need = int(sum(max(0, math.ceil((int(kv) + plan.k_cap) / self.bs) - int(h))
                           for kv, h in zip(plan.kv, plan.held, strict=True)))
        if need and not self._take(need):
            return None
        self.reserved = need
        return plan

    def _commit(self, p: _Plan, k: int) -> None:
        if self.reserved:
            self.free_blocks = self.free_blocks + self.reserved
            self.reserved = 0
        super()._commit(p, k)

    def _stuck(self) -> bool:
        """Nothing running and the head request does not fit the pool as it is now (it would
        fit if the other engines freed memory): wait instead of rejecting it."""
        if self.running or not self.waiting:
            return False
        r = self.waiting[0]
        need = math.ceil(int(self.req.target[r]) / self.bs)
        return need > self._available() and need <= self.total_blocks

    def step(self) -> None:
        if self._stuck():
            self.stalled = True
            return
        if self.stalled and self._gpu is not None:
            # memory came free while this engine waited: it starts when it did, not earlier
            self.clock = max(self.clock, self._gpu.released_at)
        self.stalled = False
        mine = [*self.running, *self.waiting]
        super().step()
        # the engine rejects a request that cannot fit an empty engine; here the engine may be
        # empty because its lone request was just preempted when another model took the
        # pool's last blocks: that request waits for memory instead
        for r in mine:
            if self.req.status[r] == REJECTED and \
                    math.ceil(int(self.req.target[r]) / self.bs) <= self.total_blocks:
                self.req.status[r] = WAITING
                self.waiting.appendleft(r)
                self.stalled = True

    def advance(self, t_until: float) -> None:
        while self.has_work and self.clock < t_until:
            if self.pending is None:
                decoding = self._macro_ready()
                plan = self._plan_macro(decoding) if decoding is not None else None
                if plan is None:
                    self.step()
                    if self.stalled:  # wait for memory; retried at the next event
                        self.clock = t_until
                        return
                    continue
                self.pending = plan
            p = self.pending
            if p.end <= t_until:
                self.pending = None
                self._commit(p, p.k_cap)
                continue
            return

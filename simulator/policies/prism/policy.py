"""Prism in the cluster simulator: many models sharing a few GPUs.

Modes (all single-GPU models, each with at most one engine):

* `prism`: on-demand KV memory shared by a GPU's engines; KVPR placement every
  `place_every_s` with a migration threshold (the moved model keeps serving on its old GPU
  until its weights are loaded on the new one); idle models evicted when the GPU is short of
  memory (larger SLO first) and activated on their next request (0.7-1.5 s, the paper's
  measured activation times); a GPU-level queue admitting requests in Moore-Hodgson order
  only when their engine can start them at once.
* `muxserve`: the same shared memory and the same placement, computed once from the average
  rates and never changed; no eviction; requests go straight to their engine (MuxServe++).
* `static`: the same placement, but each model gets a fixed, equal share of its GPU's KV
  memory (static partition).

The dedicated baseline (one GPU per model) is `baselines.StaticPolicy`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Any, cast

from simulator.api import Deployment
from simulator.engine import Replica
from simulator.policies.cluster import BasePolicy, Cluster, Instance, PolicyError
from simulator.policies.interfaces import Shape
from simulator.policies.prism.core import (
    ModelLoad,
    Queued,
    evict_order,
    kvpr,
    moore_hodgson,
    place,
)
from simulator.policies.prism.shared import ScaledCost, SharedGPU, SharedReplica
from simulator.roofline import StepCost

MODES = ("prism", "muxserve", "static")


def activation_seconds(weight_bytes: float) -> float:
    """Prism Figure 9: an 8B model activates in 0.7 s, a 14B one in 1.3 s, 70B (TP8) 1.5 s."""
    gb = weight_bytes / 1e9
    if gb <= 17:
        return 0.7
    if gb <= 30:
        return 1.3
    return 1.5


class _Model:
    """Per-model bookkeeping: its memory footprint, rate estimate and engine."""

    def __init__(self, name: str, weights: float, kv_per_req: float, slo: float,
                 prefill_s_per_token: float) -> None:
        self.name = name
        self.weights = weights  # weights + workspace bytes
        self.kv_per_req = kv_per_req
        self.slo = slo
        self.prefill = prefill_s_per_token
        self.inst: Instance | None = None
        self.gpu: int | None = None
        self.arrivals: deque[float] = deque()
        self.last_seen = 0.0
        self.expected_rate = 0.0
        self.placed_at = -math.inf
        self.next: tuple[Instance, int | None] | None = None  # engine being loaded elsewhere


class PrismPolicy(BasePolicy):
    """Multi-model GPU sharing on the pool's GPUs (one model per engine, TP1)."""

    def __init__(
        self,
        mode: str = "prism",
        ttft_slo: Mapping[str, float] | None = None,
        default_slo_s: float = 1.0,
        idle_evict_s: float = 30.0,
        evict_below: float = 0.15,
        place_every_s: float = 10.0,
        migrate_threshold: float = 0.5,
        min_dwell_s: float = 120.0,
        rate_window_s: float = 60.0,
        tick_s: float = 0.1,
        contention: bool = True,
        name: str | None = None,
    ) -> None:
        if mode not in MODES:
            raise PolicyError(f"unknown Prism mode {mode!r}; choose from {', '.join(MODES)}")
        self.mode = mode
        self.name = name or ("prism" if mode == "prism" else f"{mode}")
        self.slo = dict(ttft_slo or {})
        self.default_slo = default_slo_s
        self.idle_evict_s = idle_evict_s
        self.evict_below = evict_below
        self.place_every = place_every_s
        self.threshold = migrate_threshold
        self.dwell = min_dwell_s
        self.window = rate_window_s
        self.tick_s = tick_s
        self.contention = contention
        self.gpus: list[SharedGPU] = []
        self.gpu_type = ""
        self.models: dict[str, _Model] = {}
        self.queues: list[deque[int]] = []
        self.waiting_activation: deque[int] = deque()
        self.draining: list[tuple[Instance, SharedGPU, float]] = []
        self.next_place = 0.0
        self.next_contention = 0.0
        self.busy_seen: dict[Replica, float] = {}
        self.scaled: dict[Replica, ScaledCost] = {}  # engine -> its compute-sharing cost
        self.stats = {"evictions": 0, "activations": 0, "migrations": 0, "late_admits": 0}

    # ---- setup ------------------------------------------------------------------------
    def start(self, cluster: Cluster, now: float) -> None:
        if cluster.pool.elastic or len(cluster.pool.gpu_types) != 1:
            raise PolicyError("Prism shares the GPUs of a fixed pool of one GPU type")
        self.gpu_type = cluster.pool.gpu_types[0]
        shape = Shape(self.gpu_type)
        wl = cluster.wl
        b = wl.base
        total = cluster.pool.total_gpus
        cluster.hold(total, self.gpu_type, now)
        for name in wl.models:
            dep, plan = cluster.deployment(name, shape)
            if not plan.fits:
                raise PolicyError(f"{name} does not fit one {self.gpu_type}: {plan.reason}")
            mask = wl.model_mask(name)
            ctx = float((b.input_len[mask] + b.output_len[mask]).mean()) if mask.any() else 1024
            cost = dep.cost()
            chunk = min(2048, dep.engine_config.max_batched_tokens)
            m = _Model(name, plan.weight_bytes + plan.activation_bytes,
                       ctx * plan.kv_bytes_per_token, self.slo.get(name, self.default_slo),
                       cost.step_time(0, 0.0, [(chunk, 0)]) / chunk)
            duration = max(wl.duration, 1.0)
            m.expected_rate = float(mask.sum()) / duration
            self.models[name] = m
        self._cluster = cluster
        usable = cluster.deployment(wl.models[0], shape)[1].usable_bytes
        self.gpus = [SharedGPU(g, usable) for g in range(total)]
        self.queues = [deque() for _ in range(total)]
        # initial placement from the long-run rates (MuxServe's offline colocation input)
        loads = [ModelLoad(m.name, self._weighted(m, m.expected_rate), m.weights)
                 for m in self.models.values()]
        where = place(loads, [g.usable for g in self.gpus], self.threshold)
        missing = [m for m in self.models if m not in where]
        if missing and self.mode != "prism":
            raise PolicyError(f"models {', '.join(missing)} fit on no GPU next to the others")
        if self.mode == "static":
            self._start_static(cluster, where, now)
            return
        for name, g in sorted(where.items(), key=lambda kv: kv[1]):
            self._activate(cluster, self.models[name], g, now, delay=0.0)

    def _weighted(self, m: _Model, rate: float) -> float:
        return rate * m.kv_per_req / max(m.slo, 1e-3)

    def _start_static(self, cluster: Cluster, where: Mapping[str, int], now: float) -> None:
        by_gpu: dict[int, list[str]] = {}
        for name, g in where.items():
            by_gpu.setdefault(g, []).append(name)
        shape = Shape(self.gpu_type)
        for g, names in by_gpu.items():
            left = self.gpus[g].usable - sum(self.models[n].weights for n in names)
            share = left / len(names)
            for n in names:
                m = self.models[n]
                dep, _base = cluster.deployment(n, shape)

                fixed = Deployment(dep.model, dep.gpu, kv_pool_gb=share / 1e9,
                                   calibration=cluster.calibration)
                plan = fixed.memory()
                cost = ScaledCost(dep.cost())
                rep = Replica(0, cast(StepCost, cost), plan, dep.engine_config, cluster.req)
                self.scaled[rep] = cost
                inst = cluster.adopt(n, shape, rep, now, now, host=g, plan=plan)
                m.inst, m.gpu = inst, g
                self.gpus[g].engines.append(rep)

    # ---- engines ----------------------------------------------------------------------
    def _activate(self, cluster: Cluster, m: _Model, g: int, now: float, delay: float) -> bool:
        gpu = self.gpus[g]
        if not gpu.reserve(m.weights):
            return False
        shape = Shape(self.gpu_type)
        dep, plan = cluster.deployment(m.name, shape)
        rep = SharedReplica(0, ScaledCost(dep.cost()), plan, dep.engine_config, cluster.req, gpu)
        self.scaled[rep] = rep.scaled
        inst = cluster.adopt(m.name, shape, rep, now, now + delay, host=g)
        m.inst, m.gpu = inst, g
        m.last_seen = now
        m.placed_at = now
        if delay:
            self.stats["activations"] += 1
            cluster.log(now, "activate", f"{m.name} on GPU {g} (+{delay:g}s)")
        return True

    def _retire(self, cluster: Cluster, m: _Model, now: float, why: str) -> None:
        """Stop routing to m's engine; its memory returns once its requests finish."""
        inst, g = m.inst, m.gpu
        assert inst is not None and g is not None
        cluster.drain(inst, now)
        self.draining.append((inst, self.gpus[g], m.weights))
        m.inst, m.gpu = None, None
        cluster.log(now, why, f"{m.name} from GPU {g}")

    def _reap(self, cluster: Cluster) -> None:
        """Give back the weights of drained engines that have finished."""
        keep = []
        for inst, gpu, weights in self.draining:
            if inst.retired_at is None:
                keep.append((inst, gpu, weights))
                continue
            rep = inst.replica
            if rep in gpu.engines:
                gpu.engines.remove(rep)
                self.scaled.pop(rep, None)
                self.busy_seen.pop(rep, None)
            gpu.release(weights)
        self.draining = keep

    # ---- arrivals ---------------------------------------------------------------------
    def on_arrival(self, cluster: Cluster, r: int, now: float) -> None:
        m = self.models[cluster.wl.model_name(r)]
        m.arrivals.append(now)
        m.last_seen = now
        if m.inst is None:
            if self.mode != "prism":
                raise PolicyError(f"{m.name} has no engine")
            self.waiting_activation.append(r)
            self._activate_waiting(cluster, now)
            return
        if self.mode != "prism":
            cluster.dispatch(r, m.inst, now)
            return
        assert m.gpu is not None
        self.queues[m.gpu].append(r)
        self._dispatch(cluster, m.gpu, now)

    def _activate_waiting(self, cluster: Cluster, now: float) -> None:
        still: deque[int] = deque()
        while self.waiting_activation:
            r = self.waiting_activation.popleft()
            m = self.models[cluster.wl.model_name(r)]
            if m.inst is None and not self._bring_up(cluster, m, now):
                still.append(r)
                continue
            assert m.gpu is not None
            self.queues[m.gpu].append(r)
        self.waiting_activation = still

    def _bring_up(self, cluster: Cluster, m: _Model, now: float) -> bool:
        """Activate an evicted model on the GPU with the lowest KVPR that has room, evicting
        idle models there if that makes room."""
        order = sorted(range(len(self.gpus)), key=lambda g: self._gpu_kvpr(g, now, extra=m))
        for g in order:
            gpu = self.gpus[g]
            if gpu.free < m.weights:
                self._evict_for(cluster, g, m.weights - gpu.free, now, min_idle=0.0)
            if gpu.free >= m.weights:
                return self._activate(cluster, m, g, now, activation_seconds(m.weights))
        return False

    def _idle(self, m: _Model, now: float) -> float | None:
        """Seconds m has been idle (no request queued or in flight), None if busy."""
        if m.inst is None or m.inst.replica.has_work:
            return None
        if m.gpu is not None and any(
                self.models[self._model_of(r)] is m for r in self.queues[m.gpu]):
            return None
        return now - m.last_seen

    def _model_of(self, r: int) -> str:
        return self._cluster.wl.model_name(r)

    def _evict_for(self, cluster: Cluster, g: int, need: float, now: float,
                   min_idle: float) -> None:
        on_gpu = {n: self._idle(m, now) for n, m in self.models.items()
                  if m.gpu == g and m.next is None}
        idle = {n: t for n, t in on_gpu.items() if t is not None}
        freed = 0.0
        for n in evict_order(idle, {k: v.slo for k, v in self.models.items()}, min_idle):
            if freed >= need:
                break
            m = self.models[n]
            freed += m.weights
            self._retire(cluster, m, now, "evict")
            self.stats["evictions"] += 1
        self._reap(cluster)

    # ---- GPU-local admission ----------------------------------------------------------
    def _can_start(self, inst: Instance, r: int, now: float) -> bool:
        """Would the engine start r at its next step (no queueing inside the engine)? Its
        prompt's blocks, and those of requests handed over just before, must be free."""
        rep = inst.replica
        if now < inst.ready_at or rep.outstanding >= rep.cfg.max_num_seqs:
            return False
        req = rep.req
        need = math.ceil(int(req.input_len[r]) / rep.bs)
        need += sum(math.ceil(int(req.target[w]) / rep.bs) for w in rep.waiting)
        return need <= rep._available()

    def _dispatch(self, cluster: Cluster, g: int, now: float) -> None:
        q = self.queues[g]
        if not q:
            return
        wl = cluster.wl
        items = []
        for r in q:
            m = self.models[wl.model_name(r)]
            items.append(Queued(r, float(wl.base.arrival[r]) + m.slo,
                                float(wl.base.input_len[r]) * m.prefill))
        accepted, late = moore_hodgson(items, now)
        sent = set()
        for item in [*accepted, *sorted(late, key=lambda x: (x.deadline, x.id))]:
            m = self.models[wl.model_name(item.id)]
            if m.inst is None or m.gpu != g:
                continue
            if self._can_start(m.inst, item.id, now):
                cluster.dispatch(item.id, m.inst, now)
                sent.add(item.id)
                if item in late:
                    self.stats["late_admits"] += 1
        if sent:
            self.queues[g] = deque(r for r in q if r not in sent)

    # ---- ticks --------------------------------------------------------------------------
    def on_tick(self, cluster: Cluster, now: float) -> None:
        self._cluster = cluster
        if self.contention and now >= self.next_contention:
            self._update_contention(now)
            self.next_contention = now + 1.0
        if self.mode != "prism":
            return
        self._reap(cluster)
        self._handoff(cluster, now)
        if now >= self.next_place:
            self.next_place = now + self.place_every
            self._replace(cluster, now)
        if self.waiting_activation:
            self._activate_waiting(cluster, now)
        for g in range(len(self.gpus)):
            self._dispatch(cluster, g, now)

    def _update_contention(self, now: float) -> None:
        """Slowdown of each engine = 1 + the other engines' busy share over the last second."""
        for gpu in self.gpus:
            shares = []
            for rep in gpu.engines:
                last = self.busy_seen.get(rep, rep.busy)
                self.busy_seen[rep] = rep.busy
                f = self.scaled[rep].factor
                shares.append(min(1.0, max(0.0, (rep.busy - last) / f)))
            tot = sum(shares)
            for rep, u in zip(gpu.engines, shares, strict=True):
                self.scaled[rep].factor = 1.0 + min(3.0, tot - u)

    def _rate(self, m: _Model, now: float) -> float:
        while m.arrivals and m.arrivals[0] < now - self.window:
            m.arrivals.popleft()
        return len(m.arrivals) / self.window

    def _gpu_kvpr(self, g: int, now: float, extra: _Model | None = None) -> float:
        ms = [m for m in self.models.values() if m.gpu == g]
        if extra is not None:
            ms.append(extra)
        w = sum(self._weighted(m, self._rate(m, now)) for m in ms)
        kv = self.gpus[g].usable - sum(m.weights for m in ms)
        return kvpr(w, kv)

    def _replace(self, cluster: Cluster, now: float) -> None:
        """Global scheduler: evict idle models where memory is short, then re-place."""
        for g, gpu in enumerate(self.gpus):
            if gpu.free_fraction < self.evict_below:
                self._evict_for(cluster, g, self.evict_below * gpu.usable - gpu.free, now,
                                self.idle_evict_s)
        active = [m for m in self.models.values() if m.inst is not None]
        loads = [ModelLoad(m.name, self._weighted(m, self._rate(m, now)), m.weights, m.gpu)
                 for m in active]
        where = place(loads, [g.usable for g in self.gpus], self.threshold)
        for m in active:
            dst = where.get(m.name)
            if dst is None or dst == m.gpu or now - m.placed_at < self.dwell:
                continue
            if m.next is not None or self.gpus[dst].free < m.weights:
                continue  # already moving, or the target has no room until something drains
            # load the weights on the target first; the old engine serves until it is ready
            old_inst, old_gpu = m.inst, m.gpu
            if self._activate(cluster, m, dst, now, activation_seconds(m.weights)):
                assert m.inst is not None
                m.next = (m.inst, m.gpu)
                m.inst, m.gpu = old_inst, old_gpu
                self.stats["migrations"] += 1

    def _handoff(self, cluster: Cluster, now: float) -> None:
        """Migrations whose new engine is ready: move the queued requests, drain the old."""
        for m in self.models.values():
            if m.next is None or now < m.next[0].ready_at:
                continue
            new_inst, new_gpu = m.next
            m.next = None
            old = m.gpu
            assert old is not None and new_gpu is not None
            moved = [r for r in self.queues[old] if self.models[self._model_of(r)] is m]
            self.queues[old] = deque(r for r in self.queues[old] if r not in set(moved))
            self._retire(cluster, m, now, "migrate")
            m.inst, m.gpu = new_inst, new_gpu
            self.queues[new_gpu].extend(moved)

    def holding(self) -> int:
        return len(self.waiting_activation) + sum(len(q) for q in self.queues)

    def notes(self) -> dict[str, Any]:
        return {"mode": self.mode, **self.stats,
                "slo_ttft_s": {n: round(m.slo, 3) for n, m in self.models.items()}}

"""A cluster of replicas that policies launch, drain, reshape and route to, over time.

`simulator.engine.simulate` serves one workload on N identical replicas with a fixed router.
The companion systems need more: replicas of different shapes (OSERVE), replicas that appear
after a provisioning delay and disappear when drained (SageServe), several models with their
own replicas (Prism) and replicas merged into a larger TP group and split back (Gyges). This
module keeps the engine's `Replica` (same scheduler, same roofline, same macro-steps) and
adds only what a policy acts on: `Instance` (one replica on named GPUs, an `EndpointView`),
`Cluster` (the live instances, GPU bookkeeping, request migration) and `run_cluster` (the
event loop: arrivals and periodic ticks, each handed to the policy).
"""

from __future__ import annotations

import abc
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, Protocol

import numpy as np

from simulator.api import Deployment
from simulator.engine import WAITING, EngineConfig, Replica, RequestTable
from simulator.memory import MemoryPlan
from simulator.models import ModelSpec
from simulator.policies.interfaces import Shape
from simulator.policies.workload import ClusterWorkload

INF = float("inf")


class PolicyError(ValueError):
    """A policy cannot run on this pool or workload; the message says why."""


# ---- the pool ---------------------------------------------------------------------------
@dataclass(frozen=True)
class HostSpec:
    """One machine: `gpus` GPUs of catalog type `gpu` sharing a fast interconnect."""

    gpu: str
    gpus: int


@dataclass(frozen=True)
class Pool:
    """The GPUs a policy may use. No hosts means an elastic cloud region: GPUs are acquired on
    demand (SageServe's VMs) and only counted."""

    hosts: tuple[HostSpec, ...] = ()

    @classmethod
    def uniform(cls, gpu: str, total: int, per_host: int = 8) -> Pool:
        if total < 1 or per_host < 1:
            raise PolicyError("a pool needs at least one GPU and one GPU per host")
        full, rest = divmod(total, per_host)
        hosts = [HostSpec(gpu, per_host)] * full + ([HostSpec(gpu, rest)] if rest else [])
        return cls(tuple(hosts))

    @property
    def elastic(self) -> bool:
        return not self.hosts

    @property
    def total_gpus(self) -> int:
        return sum(h.gpus for h in self.hosts)

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(h.gpu for h in self.hosts))

    def describe(self) -> str:
        if self.elastic:
            return "elastic (GPUs acquired on demand)"
        parts = [f"{h.gpus}x{h.gpu}" for h in self.hosts]
        return f"{self.total_gpus} GPUs: " + " + ".join(parts)


# ---- one replica on named GPUs ----------------------------------------------------------
class Instance:
    """A replica of one model on named GPUs, with its lifecycle times (an `EndpointView`)."""

    def __init__(
        self,
        iid: int,
        model: str,
        shape: Shape,
        dep: Deployment,
        plan: MemoryPlan,
        replica: Replica,
        host: int,
        gpu_ids: tuple[int, ...],
        acquired: float,
        ready_at: float,
        max_seq: int,
    ) -> None:
        self._id = iid
        self._model = model
        self._shape = shape
        self.dep = dep
        self.plan = plan
        self.replica = replica
        self.host = host
        self.gpu_ids = gpu_ids
        self.acquired = acquired
        self.ready_at = ready_at
        self.max_seq = max_seq
        self.draining = False
        self.retired_at: float | None = None
        self.tags: dict[str, Any] = {}

    # EndpointView
    @property
    def id(self) -> int:
        return self._id

    @property
    def model(self) -> str:
        return self._model

    @property
    def shape(self) -> Shape:
        return self._shape

    @property
    def outstanding(self) -> int:
        return self.replica.outstanding

    @property
    def kv_used_fraction(self) -> float:
        return 1.0 - self.replica.kv_free_fraction

    @property
    def max_sequence(self) -> int:
        return self.max_seq

    def ready(self, now: float) -> bool:
        return self.retired_at is None and not self.draining and now >= self.ready_at

    @property
    def live(self) -> bool:
        return self.retired_at is None

    @property
    def gpus(self) -> int:
        return len(self.gpu_ids)

    def pending_tokens(self) -> int:
        """Prompt tokens still to prefill plus output tokens still to generate (the 'remaining
        tokens' of SageServe's join-the-shortest-queue)."""
        rep, req = self.replica, self.replica.req
        idx = np.fromiter((*rep.waiting, *rep.running), dtype=np.int64)
        if len(idx) == 0:
            return 0
        left_in = np.maximum(req.target[idx] - req.computed[idx], 0)
        left_out = np.maximum(req.output_len[idx] - req.generated[idx], 0)
        return int(left_in.sum() + left_out.sum())

    def __repr__(self) -> str:
        return f"Instance({self.id}, {self.model}, {self.shape.label}, host {self.host})"


def pending_tokens_of(instances: Sequence[Instance]) -> list[int]:
    """`Instance.pending_tokens` of many instances (routers that read every replica's load on
    every arrival). A replica's figure is kept with its `Replica.changes` count and reused
    while that is unchanged; the others are computed together in one numpy pass."""
    out = [0] * len(instances)
    stale: list[int] = []
    for k, inst in enumerate(instances):
        rep = inst.replica
        memo = rep.tokens_memo
        if memo is not None and memo[0] == rep.changes:
            out[k] = memo[1]
        else:
            stale.append(k)
    if stale:
        todo = [instances[k] for k in stale]
        n = 0
        for i in todo:
            n += len(i.replica.waiting) + len(i.replica.running)
        fresh = _pending_tokens_now(todo) if n > 32 else [_pending_tokens_small(i) for i in todo]
        for k, v in zip(stale, fresh, strict=True):
            out[k] = v
            rep = instances[k].replica
            rep.tokens_memo = (rep.changes, v)
    return out


def _pending_tokens_small(inst: Instance) -> int:
    """`Instance.pending_tokens` with Python ints (fewer calls than numpy for a few requests)."""
    rep = inst.replica
    req = rep.req
    target, computed, out, gen = req.target, req.computed, req.output_len, req.generated
    total = 0
    for q in (rep.waiting, rep.running):
        for r in q:
            total += max(target.item(r) - computed.item(r), 0) + max(out.item(r) - gen.item(r), 0)
    return total


def _pending_tokens_now(instances: Sequence[Instance]) -> list[int]:
    """`Instance.pending_tokens` of each of `instances`, in one numpy pass."""
    if not instances:
        return []
    req = instances[0].replica.req
    counts = [len(i.replica.waiting) + len(i.replica.running) for i in instances]
    total = sum(counts)
    if not total:
        return [0] * len(instances)
    # one pass over the queues straight into an int64 array (a long waiting queue in
    # overload made the intermediate Python list the cost of every routing decision)
    idx = np.fromiter(
        chain.from_iterable(q for i in instances for q in (i.replica.waiting, i.replica.running)),
        dtype=np.int64, count=total)
    owner = np.repeat(np.arange(len(instances)), counts)
    left = (np.maximum(req.target[idx] - req.computed[idx], 0)
            + np.maximum(req.output_len[idx] - req.generated[idx], 0))
    tot = np.bincount(owner, weights=left, minlength=len(instances))
    return [int(x) for x in tot]


# ---- the cluster ------------------------------------------------------------------------
@dataclass
class Event:
    """Something a policy did (launch, drain, merge, split, evict ...), for the report."""

    t: float
    kind: str
    detail: str


class Cluster:
    """Live instances over one request table; the policy's `ClusterControl`."""

    def __init__(
        self,
        wl: ClusterWorkload,
        pool: Pool,
        engine: EngineConfig | None = None,
        models: Mapping[str, ModelSpec] | None = None,
        calibration: Mapping[str, float] | None = None,
    ) -> None:
        self.wl = wl
        self.calibration = dict(calibration or {})
        self.pool = pool
        self.engine = engine
        self.models = dict(models or {})
        self.req = RequestTable.from_workload(wl.base)
        self.instances: list[Instance] = []
        self.live: list[Instance] = []
        self.events: list[Event] = []
        self._used: list[set[int]] = [set() for _ in pool.hosts]
        self._deps: dict[tuple[str, Shape], tuple[Deployment, MemoryPlan]] = {}
        self._elastic_gpu = 0
        self.held: list[list[Any]] = []  # [gpus, gpu type, since, until] held by a policy
        # bumped whenever the live or draining instances change (launch, adopt, drain,
        # retire, reshape): policies may cache views of `live` while it stays the same
        self.version = 0

    # ---- configurations -------------------------------------------------------------
    def deployment(self, model: str, shape: Shape) -> tuple[Deployment, MemoryPlan]:
        """The simulator deployment of `model` in `shape` and its memory plan (cached)."""
        key = (model, shape)
        if key not in self._deps:
            spec: str | ModelSpec = self.models.get(model, model)
            dep = Deployment(spec, shape.gpu, tp=shape.tp, pp=shape.pp, engine=self.engine,
                             calibration=self.calibration)
            try:
                self._deps[key] = (dep, dep.memory())
            except KeyError as exc:
                raise PolicyError(str(exc.args[0] if exc.args else exc)) from exc
        return self._deps[key]

    # ---- GPUs -----------------------------------------------------------------------
    def free_gpus(self, host: int) -> list[int]:
        h = self.pool.hosts[host]
        base = self._host_base(host)
        return [base + i for i in range(h.gpus) if base + i not in self._used[host]]

    def _host_base(self, host: int) -> int:
        return sum(h.gpus for h in self.pool.hosts[:host])

    def _allocate(
        self, n: int, gpu: str, host: int | None, gpu_ids: Sequence[int] | None
    ) -> tuple[int, tuple[int, ...]]:
        if self.pool.elastic:
            ids = tuple(range(self._elastic_gpu, self._elastic_gpu + n))
            self._elastic_gpu += n
            return -1, ids
        hosts = range(len(self.pool.hosts)) if host is None else [host]
        for h in hosts:
            if self.pool.hosts[h].gpu != gpu:
                continue
            free = self.free_gpus(h)
            if gpu_ids is not None:
                if all(g in free for g in gpu_ids) and len(gpu_ids) == n:
                    return h, tuple(gpu_ids)
                continue
            if len(free) >= n:
                return h, tuple(free[:n])
        where = "the pool" if host is None else f"host {host}"
        raise PolicyError(f"no {n} free {gpu} GPUs on {where}")

    def _mark(self, host: int, ids: Iterable[int], used: bool) -> None:
        if host < 0:
            return
        for g in ids:
            if used:
                self._used[host].add(g)
            else:
                self._used[host].discard(g)

    # ---- lifecycle ------------------------------------------------------------------
    def launch(
        self,
        model: str,
        shape: Shape,
        now: float,
        delay_s: float = 0.0,
        host: int | None = None,
        gpu_ids: Sequence[int] | None = None,
        max_seq: int | None = None,
        quiet: bool = False,
    ) -> Instance:
        """Start a replica; it serves from `now + delay_s` (model loading), but its GPUs count
        from `now`. `max_seq` caps the longest request below what the KV pool would hold."""
        dep, plan = self.deployment(model, shape)
        if not plan.fits:
            raise PolicyError(f"{model} does not fit {shape.label} on {shape.gpu}: {plan.reason}")
        h, ids = self._allocate(shape.gpus, shape.gpu, host, gpu_ids)
        self._mark(h, ids, True)
        iid = len(self.instances)
        rep = Replica(iid, dep.cost(), plan, dep.engine_config, self.req)
        rep.clock = now + delay_s
        inst = Instance(
            iid, model, shape, dep, plan, rep, h, ids, now, now + delay_s,
            min(plan.max_context, max_seq) if max_seq else plan.max_context,
        )
        self.instances.append(inst)
        self.live.append(inst)
        self.version += 1
        if not quiet:
            self.log(now, "launch", f"{inst.model} {shape.label} on {shape.gpus}x{shape.gpu}"
                     + (f" (ready +{delay_s:g}s)" if delay_s else ""))
        return inst

    def adopt(
        self, model: str, shape: Shape, replica: Replica, now: float, ready_at: float,
        host: int = -1, plan: MemoryPlan | None = None,
    ) -> Instance:
        """Register a replica a policy built itself (Prism's engines sharing a GPU). It holds
        no GPUs of its own: the policy accounts for them with `hold`."""
        dep, base = self.deployment(model, shape)
        plan = plan or base
        replica.clock = max(replica.clock, ready_at)
        inst = Instance(len(self.instances), model, shape, dep, plan, replica, host, (), now,
                        ready_at, plan.max_context)
        replica.idx = inst.id
        self.instances.append(inst)
        self.live.append(inst)
        self.version += 1
        return inst

    def hold(self, gpus: int, gpu: str, now: float) -> list[Any]:
        """Count `gpus` GPUs of type `gpu` as held from `now` (until `release_held`)."""
        entry: list[Any] = [gpus, gpu, now, None]
        self.held.append(entry)
        return entry

    def release_held(self, entry: list[Any], now: float) -> None:
        entry[3] = now

    def drain(self, inst: Instance, now: float) -> None:
        """No new requests; the GPUs are released once the queued and running ones finish."""
        if inst.draining or not inst.live:
            return
        inst.draining = True
        self.version += 1
        self.log(now, "drain", f"{inst.model} {inst.shape.label} #{inst.id}")
        self._retire_if_idle(inst, now)

    def retire(self, inst: Instance, now: float) -> None:
        """Release an instance's GPUs now (it must hold no requests)."""
        if not inst.live:
            return
        if inst.replica.has_work:
            raise PolicyError(f"instance {inst.id} still holds requests")
        inst.retired_at = max(now, inst.acquired)
        self.live.remove(inst)
        self.version += 1
        self._mark(inst.host, inst.gpu_ids, False)

    def _retire_if_idle(self, inst: Instance, now: float) -> None:
        if inst.draining and inst.live and not inst.replica.has_work:
            self.retire(inst, max(now, min(inst.replica.clock, now)))

    def dispatch(self, r: int, inst: Instance, now: float) -> None:
        """Send request r to an instance (it reaches the engine after the frontend overhead)."""
        rep = inst.replica
        t_engine = now + rep.cost.request_overhead
        rep.advance(t_engine)
        rep.enqueue(r, t_engine)

    def log(self, t: float, kind: str, detail: str) -> None:
        self.events.append(Event(t, kind, detail))

    # ---- time -----------------------------------------------------------------------
    def advance(self, t: float) -> None:
        """Run every live replica up to t; drained replicas that emptied release their GPUs.

        Called on every arrival and tick for every replica, so the replicas for which
        `advance(t)` does nothing are skipped here without the call: those without work, and
        those whose pending decode run ends after t (`Replica.advance` and its subclasses
        return at once in both cases)."""
        for inst in list(self.live):
            rep = inst.replica
            if rep.waiting or rep.running:
                p = rep.pending
                if p is None or p.end <= t:
                    rep.advance(t)
            if inst.draining and not inst.replica.has_work:
                self.retire(inst, min(t, max(inst.replica.clock, inst.acquired)))

    def finish(self) -> float:
        """Run everything to completion; returns the makespan."""
        end = 0.0
        for inst in list(self.live):
            rep = inst.replica
            rep.advance(INF)
            while rep.waiting:  # nothing can ever admit these: the engine rejects them
                rep.step()
            end = max(end, rep.clock)
            if inst.draining:
                self.retire(inst, rep.clock)
        return end

    # ---- views ----------------------------------------------------------------------
    def endpoints(self, model: str | None = None, now: float | None = None) -> list[Instance]:
        """Live, non-draining instances (of `model`), ready at `now` if given."""
        return [
            i for i in self.live
            if not i.draining
            and (model is None or i.model == model)
            and (now is None or now >= i.ready_at)
        ]

    def gpu_seconds(self, end: float) -> float:
        """GPU-time held by every instance from acquisition to release (or `end`), plus
        GPUs a policy holds directly."""
        total = 0.0
        for inst in self.instances:
            stop = inst.retired_at if inst.retired_at is not None else end
            total += inst.gpus * max(0.0, min(stop, end) - inst.acquired)
        for gpus, _gpu, since, until in self.held:
            stop = until if until is not None else end
            total += gpus * max(0.0, min(stop, end) - since)
        return total

    def instance_seconds(self, end: float, model: str | None = None) -> float:
        """Replica-time (SageServe's 'instance hours' x 3600) of `model` (all if None)."""
        total = 0.0
        for inst in self.instances:
            if model is not None and inst.model != model:
                continue
            stop = inst.retired_at if inst.retired_at is not None else end
            total += max(0.0, min(stop, end) - inst.acquired)
        return total

    # ---- reshaping replicas (Gyges merges and splits, OSERVE switches) ----------------
    def reshape(
        self,
        olds: Sequence[Instance],
        news: Sequence[tuple[Shape, Sequence[int], int | None]],
        now: float,
        pause_s: float = 0.0,
    ) -> list[Instance] | None:
        """Replace `olds` by new replicas on the same host, given as (shape, GPU ids, longest
        sequence or None). Queued and running requests move with their KV caches (migrated,
        not recomputed); the new replicas resume after `pause_s` (the transformation).
        Returns None, changing nothing, when the running requests' KV blocks cannot be packed
        into the new replicas (or a request is longer than every new replica allows)."""
        if not olds:
            return None
        host = olds[0].host
        req = self.req
        for o in olds:
            o.replica.settle(now)
        running = [r for o in olds for r in o.replica.running]
        waiting = [r for o in olds for r in o.replica.waiting]
        plans = []
        for shape, _ids, max_seq in news:
            _dep, plan = self.deployment(olds[0].model, shape)
            if not plan.fits:
                return None
            cap = min(plan.max_context, max_seq) if max_seq else plan.max_context
            plans.append((plan, cap))
        free = [p.kv_blocks - int(0.01 * p.kv_blocks) for p, _ in plans]
        place: dict[int, int] = {}
        for r in sorted(running, key=lambda x: -int(req.blocks[x])):
            need, length = int(req.blocks[r]), int(req.input_len[r] + req.output_len[r])
            fit = [k for k in range(len(plans)) if free[k] >= need and plans[k][1] >= length]
            if not fit:
                return None
            k = max(fit, key=lambda j: free[j])
            free[k] -= need
            place[r] = k
        for r in waiting:
            if not any(cap >= int(req.input_len[r] + req.output_len[r]) for _, cap in plans):
                return None
        resume = max([now + pause_s] + [o.replica.clock for o in olds])
        for o in olds:
            o.retired_at = max(now, o.acquired)
            self.live.remove(o)
            self.version += 1
            self._mark(o.host, o.gpu_ids, False)
            o.replica.running.clear()
            o.replica.waiting.clear()
            o.replica.changes += 1
            o.replica.pending = None
            o.replica.free_blocks = o.replica.total_blocks
        made = [
            self.launch(olds[0].model, shape, now, 0.0, host=host, gpu_ids=ids, max_seq=ms,
                        quiet=True)
            for shape, ids, ms in news
        ]
        for inst in made:
            inst.replica.clock = resume
            inst.ready_at = resume
        for r, k in place.items():
            rep = made[k].replica
            rep._take(int(req.blocks[r]))
            rep.running.append(r)
            req.replica[r] = rep.idx
        for r in waiting:
            length = int(req.input_len[r] + req.output_len[r])
            ok = [m for m in made if m.max_seq >= length]
            dst = min(ok, key=lambda m: (m.replica.outstanding, m.id))
            dst.replica.waiting.append(r)
            req.replica[r] = dst.replica.idx
        for inst in made:
            inst.replica.changes += 1  # requests moved in
        return made


# ---- policies ---------------------------------------------------------------------------
class ClusterPolicy(Protocol):
    """What `run_cluster` calls: set up, route each arrival, act on each tick."""

    name: str
    tick_s: float | None

    def start(self, cluster: Cluster, now: float) -> None: ...

    def on_arrival(self, cluster: Cluster, r: int, now: float) -> None: ...

    def on_tick(self, cluster: Cluster, now: float) -> None: ...

    def holding(self) -> int:
        """Requests the policy has accepted but not yet dispatched."""
        ...

    def notes(self) -> dict[str, Any]:
        """Policy-specific figures for the report (plans, forecasts, transformations)."""
        ...


class BasePolicy(abc.ABC):
    """Defaults for the optional parts of `ClusterPolicy`; a policy must define `start`
    and `on_arrival` (an abstract base class refuses to instantiate one that does not)."""

    name = "base"
    tick_s: float | None = None

    @abc.abstractmethod
    def start(self, cluster: Cluster, now: float) -> None:
        """Set up the cluster (launch the first replicas) at simulated time ``now``."""

    @abc.abstractmethod
    def on_arrival(self, cluster: Cluster, r: int, now: float) -> None:
        """Place (or hold) request ``r``, arriving at ``now``."""

    def on_tick(self, cluster: Cluster, now: float) -> None:
        return None

    def holding(self) -> int:
        return 0

    def notes(self) -> dict[str, Any]:
        return {}


@dataclass
class ClusterRun:
    """A finished run: the cluster (instances, request table, events) and its timings."""

    policy: str
    cluster: Cluster
    makespan: float
    horizon: float
    wall_s: float
    notes: dict[str, Any] = field(default_factory=dict)


def run_cluster(
    wl: ClusterWorkload,
    policy: ClusterPolicy,
    pool: Pool,
    *,
    engine: EngineConfig | None = None,
    models: Mapping[str, ModelSpec] | None = None,
    calibration: Mapping[str, float] | None = None,
    horizon: float | None = None,
    drain_limit_s: float = 6 * 3600.0,
) -> ClusterRun:
    """Serve `wl` under `policy` on `pool`: every arrival and every `policy.tick_s` tick, in
    time order, first runs the replicas up to that time and then hands the event to the
    policy. After the last arrival, ticks continue while the policy still holds requests."""
    t0 = time.perf_counter()
    cluster = Cluster(wl, pool, engine, models, calibration)
    policy.start(cluster, 0.0)
    arrivals = wl.base.arrival
    n = len(wl)
    tick = policy.tick_s
    next_tick = tick if tick else INF
    last = float(arrivals[-1]) if n else 0.0
    limit = last + drain_limit_s
    i = 0
    while True:
        ta = float(arrivals[i]) if i < n else INF
        if i >= n and (policy.holding() == 0 or next_tick > limit):
            break
        if next_tick <= ta:
            cluster.advance(next_tick)
            policy.on_tick(cluster, next_tick)
            next_tick += tick or INF
        else:
            cluster.advance(ta)
            policy.on_arrival(cluster, i, ta)
            i += 1
    makespan = cluster.finish()
    still = int(np.count_nonzero(cluster.req.status == WAITING))
    notes = policy.notes()
    if still:
        notes["never_dispatched"] = still
    return ClusterRun(
        policy=policy.name,
        cluster=cluster,
        makespan=max(makespan, last),
        horizon=horizon if horizon is not None else max(makespan, last),
        wall_s=time.perf_counter() - t0,
        notes=notes,
    )

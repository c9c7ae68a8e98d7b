"""Gyges in the cluster simulator: TP1 instances on each host that merge into TP2/TP4 when a
request is too long for them and split back when the long requests are gone.

Three routing modes share the same transformation mechanism (as in the paper's §6.2.4):
`gyges` (Algorithm 1: long requests to existing high-TP instances, merges on the least-loaded
block, short requests kept off merged instances so they can scale down), `round_robin` and
`least_loaded` (the router picks blind to TP; a request its instance cannot hold makes that
instance merge with its neighbours). All modes split back by Algorithm 2 on every tick.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import chain
from typing import Any

from simulator.policies.baselines import make_router, request_info
from simulator.policies.cluster import (
    BasePolicy,
    Cluster,
    Instance,
    PolicyError,
    pending_tokens_of,
)
from simulator.policies.gyges.core import (
    Decision,
    Slot,
    baseline_request,
    block_of,
    schedule_request,
    should_scale_down,
)
from simulator.policies.interfaces import Shape

MODES = ("gyges", "round_robin", "least_loaded")


class GygesPolicy(BasePolicy):
    """Dynamic TP transformation on every host of the pool (one model)."""

    def __init__(
        self,
        model: str,
        mode: str = "gyges",
        max_seq: Mapping[int, int] | None = None,
        transform_s: float = 0.5,
        split_load: float = 0.5,
        tick_s: float = 1.0,
    ) -> None:
        if mode not in MODES:
            raise PolicyError(f"unknown Gyges mode {mode!r}; choose from {', '.join(MODES)}")
        self.model = model
        self.mode = mode
        self.name = "gyges" if mode == "gyges" else f"tp-{mode}"
        self.max_seq_cfg = dict(max_seq) if max_seq else None
        self.max_seq: dict[int, int] = {}
        self.transform_s = transform_s
        self.split_load = split_load
        self.tick_s = tick_s
        self.router = make_router(mode) if mode != "gyges" else None
        self.merges = 0
        self.splits = 0
        self.failed_splits = 0
        self._long: dict[int, int] = {}  # instance id -> long requests dispatched to it
        self._req_inst: dict[int, int] = {}
        self._kv1 = 0
        # instance id -> (instance, first GPU on its host, TP, longest sequence): what a
        # `Slot` takes from an instance that never changes over its life
        self._fixed: dict[int, tuple[Instance, int, int, int]] = {}
        # per request: longer than a TP1 instance holds (for the request table of a cluster)
        self._is_long: tuple[list[bool], Cluster] | None = None
        # instance -> (its replica's `changes` count, its Slot then): see `_slots`
        self._slot_cache: dict[Instance, tuple[int, Slot]] = {}
        # (Cluster.version, cluster, its endpoints by id) for the baselines' routers
        self._eps: tuple[int, Cluster | None, list[Instance]] = (-1, None, [])

    # ---- setup ------------------------------------------------------------------------
    def start(self, cluster: Cluster, now: float) -> None:
        if cluster.pool.elastic:
            raise PolicyError("Gyges transforms instances within a host: give a pool of hosts")
        for h, host in enumerate(cluster.pool.hosts):
            for tp in (1, 2, 4, 8):
                if tp > host.gpus:
                    break
                _, plan = cluster.deployment(self.model, Shape(host.gpu, tp))
                if not plan.fits:
                    continue
                cap = plan.max_context
                if self.max_seq_cfg is not None:
                    if tp not in self.max_seq_cfg:
                        continue
                    cap = min(cap, self.max_seq_cfg[tp])
                self.max_seq[tp] = max(self.max_seq.get(tp, 0), cap)
                if tp == 1:
                    self._kv1 = plan.kv_tokens
            if 1 not in self.max_seq:
                raise PolicyError(f"{self.model} does not fit one {host.gpu} GPU (TP1)")
            for g in range(host.gpus):
                base = sum(x.gpus for x in cluster.pool.hosts[:h])
                cluster.launch(self.model, Shape(host.gpu, 1), now, host=h, gpu_ids=[base + g],
                               max_seq=self.max_seq[1])

    # ---- views ------------------------------------------------------------------------
    def _slots(self, cluster: Cluster, hosts: Sequence[int]) -> dict[int, list[Slot]]:
        """The scheduler's view of each of `hosts` (most of a routing decision's cost, paid on
        every arrival). An instance's `Slot` depends only on its replica's queues and their
        requests' progress, so it is kept with the replica's `changes` count and rebuilt only
        when that moved; the loads of the rebuilt ones are read in one pass."""
        wanted = set(hosts)
        cache = self._slot_cache
        insts = [i for i in cluster.live if i.host in wanted]
        stale = []
        for inst in insts:
            c = cache.get(inst)
            if c is None or c[0] != inst.replica.changes:
                stale.append(inst)
        if stale:
            for inst, load in zip(stale, pending_tokens_of(stale), strict=True):
                f = self._fixed.get(inst.id)
                if f is None or f[0] is not inst:
                    base = sum(x.gpus for x in cluster.pool.hosts[:inst.host])
                    f = self._fixed[inst.id] = (inst, min(inst.gpu_ids) - base,
                                                inst.shape.tp, inst.max_seq)
                _, first_gpu, tp, max_seq = f
                # only a merged instance can hold a long request
                cache[inst] = (inst.replica.changes, Slot(
                    inst.id, first_gpu, tp, float(load),
                    self._long_on(cluster, inst) if tp > 1 else 0, max_seq))
        slots: dict[int, list[Slot]] = {h: [] for h in hosts}
        for inst in insts:
            slots[inst.host].append(cache[inst][1])
        return slots

    def _long_on(self, cluster: Cluster, inst: Instance) -> int:
        rep = inst.replica
        if self._is_long is None or self._is_long[1] is not cluster:
            req = cluster.req
            lengths = (req.input_len + req.output_len).tolist()
            self._is_long = ([x > self.max_seq[1] for x in lengths], cluster)
        is_long = self._is_long[0]
        return sum(1 for r in chain(rep.running, rep.waiting) if is_long[r])

    # ---- routing ----------------------------------------------------------------------
    def on_arrival(self, cluster: Cluster, r: int, now: float) -> None:
        length = int(cluster.req.input_len[r] + cluster.req.output_len[r])
        hosts = range(len(cluster.pool.hosts))
        decision: Decision | None = None
        host = 0
        if self.mode == "gyges":
            slots = self._slots(cluster, hosts)
            # one host at a time would merge needlessly: look for a fitting instance anywhere
            everywhere = [s for h in hosts for s in slots[h]]
            fits = schedule_request(length, everywhere, self.max_seq, 0)
            if fits is not None and fits.target is not None:
                decision = fits
            else:
                best = None
                for h in hosts:
                    d = schedule_request(length, slots[h], self.max_seq,
                                         cluster.pool.hosts[h].gpus)
                    if d is None:
                        continue
                    load = sum(s.load for s in slots[h] if s.id in d.merge)
                    if best is None or load < best[0]:
                        best = (load, h, d)
                if best is not None:
                    _, host, decision = best
        else:
            assert self.router is not None
            if self._eps[0] != cluster.version or self._eps[1] is not cluster:
                self._eps = (cluster.version, cluster,
                             sorted(cluster.endpoints(self.model), key=lambda e: e.id))
            eps = self._eps[2]
            eid = self.router.choose(request_info(cluster, r, now), eps, now)
            chosen = next(e for e in eps if e.id == eid)
            host = chosen.host
            on_host = self._slots(cluster, [host])[host]  # the baselines pick the instance first
            slot = next(s for s in on_host if s.id == chosen.id)
            decision = baseline_request(length, on_host, slot, self.max_seq)
        if decision is None:
            # nothing can hold it: let the engine reject it on the largest instance
            target = max(cluster.endpoints(self.model), key=lambda e: e.max_seq)
            cluster.dispatch(r, target, now)
            return
        if decision.merge:
            inst = self._merge(cluster, host, decision, now)
            if inst is None:  # KV did not fit the merged layout: queue on the largest
                inst = max(cluster.endpoints(self.model), key=lambda e: e.max_seq)
        else:
            inst = next(e for e in cluster.live if e.id == decision.target)
        cluster.dispatch(r, inst, now)

    def _merge(self, cluster: Cluster, host: int, d: Decision, now: float) -> Instance | None:
        olds = [i for i in cluster.live if i.id in d.merge]
        base = sum(x.gpus for x in cluster.pool.hosts[:host])
        ids = [base + g for g in block_of(d.first_gpu, d.tp)]
        gpu = cluster.pool.hosts[host].gpu
        made = cluster.reshape(olds, [(Shape(gpu, d.tp), ids, self.max_seq[d.tp])], now,
                               self.transform_s)
        if made is None:
            return None
        self.merges += 1
        cluster.log(now, "merge", f"{len(olds)} instances -> TP{d.tp} on host {host} GPUs "
                    f"{d.first_gpu}-{d.first_gpu + d.tp - 1}")
        return made[0]

    # ---- scale down -------------------------------------------------------------------
    def on_tick(self, cluster: Cluster, now: float) -> None:
        for h, host in enumerate(cluster.pool.hosts):
            for s in self._slots(cluster, [h])[h]:
                if not should_scale_down(s, self.split_load * s.tp * self._kv1):
                    continue
                inst = next(i for i in cluster.live if i.id == s.id)
                news = [(Shape(host.gpu, 1), [g], self.max_seq[1]) for g in inst.gpu_ids]
                made = cluster.reshape([inst], news, now, self.transform_s)
                if made is None:
                    self.failed_splits += 1
                    continue
                self.splits += 1
                cluster.log(now, "split", f"TP{s.tp} -> {s.tp} x TP1 on host {h}")

    def notes(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "max_seq_by_tp": dict(self.max_seq),
            "merges": self.merges,
            "splits": self.splits,
            "splits_refused": self.failed_splits,
            "transform_s": self.transform_s,
        }

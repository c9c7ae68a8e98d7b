"""OSERVE in the cluster simulator: a workload-aware layout and per-type routing.

At start the policy clusters the requests into types, estimates each type's rate, profiles
every candidate shape, chooses a layout (the heuristic search, the exhaustive reference, or
the best homogeneous layout for the baseline) and launches it. Each arrival is classified and
routed: `backlog` (default) sends it to the replica that would clear its queue plus this
request first, each request costing 1 / n_kj of replica k's time (the profiled capacities the
LP plans with); `lp` sends it to the replica with the fewest requests per unit of LP share
among those the LP gives its type (shares spread over every replica that can take a type
without lowering the LP's optimum: `assignment.assign(spread=)`), which confines types to
the replicas of the LP's solution, so bursts of one type cannot use the others; `lp-wrr`
follows the LP fractions alone (smooth weighted round-robin), which lets random bursts pile
up; `least_loaded` ignores types (the baseline). With `adapt_s` set, the policy
re-plans every span from a forecast of the per-type rates and switches layouts by parameter
copying (`switching`), as §5 describes.

Before launching, a serving check (`check_s` > 0, the default) simulates the searched layout
and the homogeneous layouts the LP rates within `check_keep` of the best on a short
open-loop sample of the workload, and launches the heterogeneous layout only if it serves
`check_margin` more than the best of them (`search.choose_served`): the LP's closed-loop
capacities misjudge pipeline shapes in an open-loop mix, and its +1.6 % for Llama2-70B's
TP2PP4 + TP4PP2 at S1-S4 was 2-3 % less served. The homogeneous baseline launches the
best-serving of the same candidates. A re-plan while adapting that proposes a switch is
checked the same way, the running layout against the proposal on a sample of the forecast
mix (`_switch_serves_more`).

The workload the policy reads at start is the run's own trace: for a stationary mix that is
what a perfect predictor would report. Types are assigned from known output lengths; the live
federation would use `max_tokens` or a length predictor (see `RequestInfo`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from simulator.policies.cluster import BasePolicy, Cluster, Instance, PolicyError
from simulator.policies.interfaces import Shape
from simulator.policies.oserve.assignment import AssignmentError, assign
from simulator.policies.oserve.predict import TypeRateForecaster
from simulator.policies.oserve.profile import candidate_shapes, capacity_table
from simulator.policies.oserve.search import (
    Scored,
    best_homogeneous,
    choose_served,
    exhaustive,
    flow_guided_search,
    homogeneous_candidates,
    same_layout,
)
from simulator.policies.oserve.switching import SwitchCost, switch_cost
from simulator.policies.oserve.types import RequestTypes, fit_types
from simulator.policies.workload import ClusterWorkload, Part

LAYOUTS = ("search", "exhaustive", "homogeneous")
ROUTING = ("backlog", "lp", "lp-wrr", "least_loaded")
_SUFFIX = {"backlog": "", "lp": "-lp", "lp-wrr": "-wrr", "least_loaded": "-ll"}


class SmoothWRR:
    """Nginx's smooth weighted round-robin: deterministic, proportional, well interleaved."""

    def __init__(self, weights: ArrayLike) -> None:
        self.w = np.asarray(weights, dtype=float)
        self.shares = self.w.tolist()  # the same weights as floats, read per arrival
        self.cur = np.zeros(len(self.w))

    def pick(self) -> int:
        self.cur += self.w
        i = int(np.argmax(self.cur))
        self.cur[i] -= self.w.sum()
        return i


class OservePolicy(BasePolicy):
    """Workload-aware heterogeneous layout plus per-type assignment (one model)."""

    def __init__(
        self,
        model: str,
        layout: str = "search",
        routing: str = "backlog",
        types: int = 4,
        seed: int = 0,
        shapes: Sequence[Shape] | None = None,
        pipeline: bool = True,
        adapt_s: float | None = None,
        restart_s: float = 10.0,
        reload_s: float = 50.0,
        copy: bool = True,
        calibration: Mapping[str, float] | None = None,
        spread: float | None = 0.0,
        check_s: float = 120.0,
        check_load: float = 1.05,
        check_margin: float = 0.01,
        check_keep: float = 0.95,
        check_warm: float = 1 / 3,
        name: str | None = None,
    ) -> None:
        if layout not in LAYOUTS:
            raise PolicyError(f"OSERVE layout {layout!r}: choose from {', '.join(LAYOUTS)}")
        if routing not in ROUTING:
            raise PolicyError(f"OSERVE routing {routing!r}: choose from {', '.join(ROUTING)}")
        self.model = model
        self.layout_mode = layout
        self.routing = routing
        self.k = types
        self.seed = seed
        self.shapes_cfg = list(shapes) if shapes else None
        self.pipeline = pipeline
        self.adapt_s = adapt_s
        self.tick_s = adapt_s
        self.restart_s = restart_s
        self.reload_s = reload_s
        self.copy = copy
        self.calibration = dict(calibration or {})
        self.spread = spread  # routing shares: see assignment.assign (None: the LP's vertex)
        # the serving check (search.py, `_choose`): the searched layout is launched only if
        # it serves check_margin more than the best homogeneous layout on check_s seconds of
        # the workload's requests offered at check_load x its LP capacity, counted after
        # the first check_warm of the sample (0 s: no check)
        self.check_s = check_s
        self.check_load = check_load
        self.check_margin = check_margin
        self.check_keep = check_keep
        self.check_warm = check_warm
        self.check: dict[str, Any] = {}
        default = "oserve" if layout != "homogeneous" else "homogeneous"
        self.name = name or f"{default}{_SUFFIX[routing]}"
        self.types: RequestTypes | None = None
        self.type_of = np.zeros(0, np.int64)
        self.plan: Scored | None = None
        self.replicas: list[Instance] = []
        self.wrr: list[SmoothWRR] = []
        self.switches: list[dict[str, Any]] = []
        self.refused = 0
        self._backlog: dict[int, list[float]] = {}  # instance id -> [backlog s, finished seen]
        self._routed = 0
        self._types_list: list[int] = []
        self._costs: dict[Shape, list[float]] = {}  # shape -> 1 / n_kj (s per request)
        self._forecast: TypeRateForecaster | None = None
        self._sample: tuple[ClusterWorkload, float] | None = None
        self.switch_checks: list[dict[str, Any]] = []  # re-plans the serving check judged
        # (running layout, proposed layout) -> the forecast mix the check declined it on
        self._declined: dict[tuple[str, str], np.ndarray] = {}

    # ---- planning ---------------------------------------------------------------------
    def _host_gpus(self, cluster: Cluster) -> list[int]:
        if cluster.pool.elastic or len(cluster.pool.gpu_types) != 1:
            raise PolicyError("OSERVE plans one GPU type on fixed hosts: give a uniform pool")
        return [h.gpus for h in cluster.pool.hosts]

    def _solve(self, cluster: Cluster, demand: np.ndarray, start: Sequence[Shape] | None) -> Scored:
        assert self.types is not None
        gpu = cluster.pool.gpu_types[0]
        host_gpus = self._host_gpus(cluster)
        shapes = self.shapes_cfg or candidate_shapes(
            cluster.models.get(self.model, self.model), gpu, max(host_gpus), self.pipeline)
        if not shapes:
            raise PolicyError(f"{self.model} fits no shape on {gpu}")
        spec = cluster.models.get(self.model, self.model)
        caps = capacity_table(spec, shapes, self.types.mean_lengths(),
                              self.calibration or cluster.calibration)
        self._caps = caps
        check = self.check_s > 0 and start is None
        if self.layout_mode == "homogeneous":
            best = best_homogeneous(shapes, caps, demand, host_gpus)
            if check:
                best = self._choose(cluster, None, shapes, demand, host_gpus)
        elif self.layout_mode == "exhaustive":
            best = exhaustive(shapes, caps, demand, host_gpus)
        else:
            best, trace = flow_guided_search(shapes, caps, demand, host_gpus, self.seed,
                                             start=start)
            self._search = trace
            if check:
                best = self._choose(cluster, best, shapes, demand, host_gpus)
        return self._spread(best, demand)

    # ---- the serving check (search.py) ------------------------------------------------
    def _arrivals(self, rng: np.random.Generator, rate: float) -> np.ndarray:
        """Poisson arrival times at `rate` over the check's `check_s` seconds."""
        n = int(rate * self.check_s * 1.2) + 20
        arr = np.cumsum(rng.exponential(1.0 / rate, n))
        return arr[arr < self.check_s]

    def _check_sample(self, cluster: Cluster, rate: float) -> tuple[ClusterWorkload, float]:
        """`check_s` seconds of Poisson arrivals at `rate`, with the lengths of the workload's
        requests in order (those the plan is made for: the first span when adapting)."""
        b = cluster.wl.base
        src = np.flatnonzero(b.arrival < self.adapt_s) if self.adapt_s else np.arange(len(b))
        if len(src) == 0:
            src = np.arange(len(b))
        arr = self._arrivals(np.random.default_rng(self.seed), rate)
        idx = src[np.arange(len(arr)) % len(src)]
        part = Part(arr, b.input_len[idx], b.output_len[idx], self.model, "check")
        return ClusterWorkload.from_parts([part]), rate

    def _served(
        self, cluster: Cluster, plan: Scored, caps: Mapping[Shape, np.ndarray],
        demand: np.ndarray,
    ) -> float:
        """Requests/s the layout serves on the sample with this policy's routing: the output
        generated between `check_warm` x `check_s` and `check_s`, each request counting the
        fraction of its output done (in steady state the rate of completions, without the
        wait for the first ones); the first third is left out because replicas with room
        admit more than they can keep while their KV fills (counted from 0, a 90 s sample
        at 1.2x load rated S5's heterogeneous layout 0.96 of TP2PP4 x2; 600 s: 1.04)."""
        assert self.types is not None and self._sample is not None
        wl = self._sample[0]
        b = wl.base
        trial = OservePolicy(self.model, routing=self.routing, spread=self.spread)
        trial.types = self.types
        trial.type_of = self.types.classify(b.input_len, b.output_len)
        trial._caps = dict(caps)
        sim = Cluster(wl, cluster.pool, cluster.engine, cluster.models, cluster.calibration)
        trial._launch(sim, trial._spread(plan, demand), 0.0, 0.0)
        q = sim.req
        warm = self.check_warm * self.check_s
        before = 0.0
        for r, t in enumerate(b.arrival.tolist()):
            if before == 0.0 and t >= warm > 0:
                sim.advance(warm)
                before = float(np.minimum(q.generated / np.maximum(q.output_len, 1), 1.0).sum())
            sim.advance(t)
            trial.on_arrival(sim, r, t)
        sim.advance(self.check_s)
        done = float(np.minimum(q.generated / np.maximum(q.output_len, 1), 1.0).sum())
        return (done - before) / (self.check_s - warm)

    def _choose(
        self, cluster: Cluster, plan: Scored | None, shapes: Sequence[Shape],
        demand: np.ndarray, host_gpus: Sequence[int],
    ) -> Scored:
        """The serving check (`search.choose_served`): the homogeneous layouts within
        `check_keep` of the best one's LP throughput and the searched plan serve one sample;
        the plan is launched only if it serves `check_margin` more than the best of them."""
        homs = homogeneous_candidates(shapes, self._caps, demand, host_gpus, self.check_keep)
        if plan is not None and len(homs) == 1 and same_layout(plan.layout, homs[0].layout):
            return plan  # nothing to decide: no sample is simulated
        if plan is None and len(homs) == 1:
            return homs[0]
        # offered at the best homogeneous capacity (as the benchmark does): the search and the
        # homogeneous baseline then simulate the same sample and agree on the homogeneous pick
        self._sample = self._check_sample(cluster, self.check_load * homs[0].throughput)
        got, rates = choose_served(
            plan, homs, lambda sc: self._served(cluster, sc, self._caps, demand),
            self.check_margin)
        planned = {sc.describe(): sc.throughput for sc in homs}
        if plan is not None:
            planned[plan.describe()] = plan.throughput
        self.check = {"sample_rps": self._sample[1], "sample_s": self.check_s,
                      "planned_rps": planned, "served_rps": rates,
                      "homogeneous": homs[0].describe(), "chosen": got.describe()}
        if plan is not None:
            self.check.update(searched=plan.describe(), searched_planned_rps=plan.throughput)
        return got

    def _spread(self, plan: Scored, demand: np.ndarray) -> Scored:
        """The chosen layout's routing shares: the layouts are scored with the plain LP
        (faster), the one launched is re-solved with spreading."""
        if self.spread is None:
            return plan
        a = assign([self._caps[s] for s in plan.layout], demand, spread=self.spread)
        return Scored(plan.layout, plan.hosts, a)

    def start(self, cluster: Cluster, now: float) -> None:
        wl = cluster.wl
        if len(wl.models) != 1 or wl.models[0] != self.model:
            raise PolicyError(f"OSERVE serves one model; the workload has {', '.join(wl.models)}"
                              " (use --trace-model)")
        b = wl.base
        self.types = fit_types(b.input_len, b.output_len, self.k, self.seed)
        self.type_of = self.types.classify(b.input_len, b.output_len)
        span = max(wl.duration, 1.0)
        if self.adapt_s:
            self._forecast = TypeRateForecaster(self.types.k)
            first = self.type_of[b.arrival < self.adapt_s]
            demand = np.bincount(first, minlength=self.types.k) / self.adapt_s
        else:
            demand = np.bincount(self.type_of, minlength=self.types.k) / span
        demand = np.maximum(demand, 1e-6)
        self.plan = self._solve(cluster, demand, None)
        self._launch(cluster, self.plan, now, 0.0)

    def _launch(self, cluster: Cluster, plan: Scored, now: float, delay: float) -> None:
        self.replicas = []
        for shape, host in zip(plan.layout, plan.hosts, strict=True):
            self.replicas.append(cluster.launch(self.model, shape, now, delay, host=host))
        frac = plan.assignment.fractions()
        self.wrr = [SmoothWRR(frac[:, j]) for j in range(frac.shape[1])]

    # ---- routing ----------------------------------------------------------------------
    def on_arrival(self, cluster: Cluster, r: int, now: float) -> None:
        j = int(self.type_of[r])
        if self.routing == "least_loaded":
            target = min(self.replicas, key=lambda i: (i.outstanding, i.id))
        elif self.routing == "lp-wrr":
            target = self.replicas[self.wrr[j].pick()]
        elif self.routing == "backlog":
            target = self._least_backlog(j)
        else:
            target = self._weighted_jsq(j)
        if self._forecast is not None:
            self._forecast.observe(j)
        cluster.dispatch(r, target, now)

    def _weighted_jsq(self, j: int) -> Instance:
        """Among the replicas the LP gives type j, the one with the fewest requests per unit
        of its share: the assignment decides where a type may go, the queues decide which
        of those serves it now (fixed fractions alone let random bursts pile up). Equal keys
        (identical replicas with equal shares) go to the fewest outstanding, then the lowest
        id, as least-loaded routing does."""
        w = self.wrr[j].shares  # floats: indexing a numpy array per replica cost ~0.5 s/h
        best, key = self.replicas[0], (float("inf"), 0, 0)
        for k, inst in enumerate(self.replicas):
            if w[k] <= 1e-9:
                continue
            # shares from the LP carry rounding noise: compare them to 9 digits
            cand = (round((inst.outstanding + 1) / w[k], 9), inst.outstanding, inst.id)
            if cand < key:
                best, key = inst, cand
        return best

    def _least_backlog(self, j: int) -> Instance:
        """The replica that would finish its queue plus this request first, in the profiled
        capacities' units: replica k's backlog is sum over its outstanding requests r of
        1 / n_k,type(r) (seconds of its time at saturation), and the request adds 1 / n_kj."""
        self._routed += 1
        if len(self._types_list) != len(self.type_of):
            self._types_list = self.type_of.tolist()
        best, key, best_cost = self.replicas[0], (float("inf"), 0), 0.0
        for inst in self.replicas:
            cost = self._costs.get(inst.shape)
            if cost is None:
                cost = self._costs[inst.shape] = [
                    1.0 / c if c > 0 else float("inf") for c in self._caps[inst.shape].tolist()]
            if cost[j] == float("inf"):
                continue
            b = self._backlog_of(inst, cost) + cost[j]
            cand = (round(b, 9), inst.id)
            if cand < key:
                best, key, best_cost = inst, cand, cost[j]
        if best.id in self._backlog:
            self._backlog[best.id][0] += best_cost
        return best

    def _backlog_of(self, inst: Instance, cost: list[float]) -> float:
        """Replica's backlog, kept incrementally: + each request routed to it, - each one in
        its `finished` list since the last look (as the engine's own router does); summed
        afresh for a new replica and every 1,024 arrivals (requests moved by a switch)."""
        rep, types = inst.replica, self._types_list
        st = self._backlog.get(inst.id)
        if st is None or self._routed % 1024 == 0:
            st = self._backlog[inst.id] = [
                sum(cost[types[r]] for r in (*rep.waiting, *rep.running)),
                len(rep.finished)]
        elif len(rep.finished) > st[1]:
            st[0] -= sum(cost[types[r]] for r in rep.finished[int(st[1]):])
            st[1] = len(rep.finished)
        return st[0]

    # ---- adaptive switching -----------------------------------------------------------
    def on_tick(self, cluster: Cluster, now: float) -> None:
        """Every span: forecast the per-type rates, re-solve the assignment on the running
        layout (cheap, always), and switch to a new layout when it sustains 5 % more."""
        if self._forecast is None or self.plan is None or self.adapt_s is None:
            return
        self._forecast.close_span(self.adapt_s)
        demand = np.maximum(self._forecast.predict(), 1e-6)
        cur = self.plan
        try:
            cur_a = assign([self._caps[s] for s in cur.layout], demand, spread=self.spread)
            self.plan = Scored(cur.layout, cur.hosts, cur_a)
            frac = cur_a.fractions()
            self.wrr = [SmoothWRR(frac[:, j]) for j in range(frac.shape[1])]
        except AssignmentError:  # the running layout cannot serve a type any more
            cur_a = None
        new = self._solve(cluster, demand, cur.layout)
        if cur_a is not None and new.throughput <= cur_a.throughput * 1.05:
            return  # not worth a switch
        if sorted(new.layout, key=str) == sorted(cur.layout, key=str):
            return
        if cur_a is not None and not self._switch_serves_more(
                cluster, Scored(cur.layout, cur.hosts, cur_a), new, demand, now):
            return
        cost = switch_cost(cur, new, cluster.deployment(self.model, cur.layout[0])[0],
                           restart_s=self.restart_s, reload_s=self.reload_s, copy=self.copy)
        self._switch(cluster, new, cost, now)

    def _switch_serves_more(
        self, cluster: Cluster, cur: Scored, new: Scored, demand: np.ndarray, now: float,
    ) -> bool:
        """The serving check on a re-plan: the running and the proposed layout serve one
        sample of the forecast mix, offered at `check_load` x the running layout's LP
        capacity on it; the switch goes ahead only if the proposal serves `check_margin`
        more. The profiles misjudge shapes by different amounts in an open-loop mix (the
        check at launch refused the searched layout at S1-S4 of Table 1), and a switch
        costs a restart. A proposal declined on a mix is not simulated again until the
        forecast mix moves (any type's share, or the total rate, by more than 10 %)."""
        if self.check_s <= 0:
            return True
        key = (cur.describe(), new.describe())
        mix = np.append(demand / demand.sum(), demand.sum())
        seen = self._declined.get(key)
        if seen is not None and np.all(np.abs(mix - seen) <= 0.1 * np.maximum(seen, 1e-9)):
            return False
        sample = self._mix_sample(cluster, demand, self.check_load * cur.throughput, now)
        if sample is None:
            return True  # nothing seen yet to sample lengths from: trust the profiles
        self._sample = sample
        rates = {key[0]: self._served(cluster, cur, self._caps, demand),
                 key[1]: self._served(cluster, new, self._caps, demand)}
        go = rates[key[1]] > rates[key[0]] * (1 + self.check_margin)
        self.switch_checks.append({"t": now, "running": key[0], "proposed": key[1],
                                   "planned_rps": {key[0]: cur.throughput,
                                                   key[1]: new.throughput},
                                   "served_rps": rates, "switched": go})
        if go:
            self._declined.pop(key, None)
        else:
            self._declined[key] = mix
        return go

    def _mix_sample(
        self, cluster: Cluster, demand: np.ndarray, rate: float, now: float,
    ) -> tuple[ClusterWorkload, float] | None:
        """`check_s` seconds of Poisson arrivals at `rate` whose types follow the forecast
        mix `demand`, each with the lengths of a request of its type that arrived before
        `now` (the policy does not look ahead in the trace). None if no type forecast to
        arrive has been seen yet."""
        assert self.types is not None
        b = cluster.wl.base
        past = np.flatnonzero(b.arrival < now)
        of_type = [past[self.type_of[past] == j] for j in range(self.types.k)]
        weights = np.array([d if len(of_type[j]) else 0.0 for j, d in enumerate(demand)])
        if weights.sum() <= 0 or rate <= 0:
            return None
        rng = np.random.default_rng(self.seed + int(now))
        arr = self._arrivals(rng, rate)
        kinds = rng.choice(self.types.k, size=len(arr), p=weights / weights.sum())
        idx = np.zeros(len(arr), np.int64)
        for j in range(self.types.k):
            at = np.flatnonzero(kinds == j)
            if len(at):
                idx[at] = rng.choice(of_type[j], size=len(at))
        part = Part(arr, b.input_len[idx], b.output_len[idx], self.model, "check")
        return ClusterWorkload.from_parts([part]), rate

    def _switch(self, cluster: Cluster, new: Scored, cost: SwitchCost, now: float) -> None:
        """Reshape host by host: running requests' KV moves to the new replicas (the paper
        migrates long sequences and drains short ones; here every sequence migrates)."""
        old_by_host: dict[int, list[Instance]] = {}
        for inst in self.replicas:
            old_by_host.setdefault(inst.host, []).append(inst)
        made: list[Instance] = []
        for h, olds in old_by_host.items():
            base = sum(x.gpus for x in cluster.pool.hosts[:h])
            want = [(s, hh) for s, hh in zip(new.layout, new.hosts, strict=True) if hh == h]
            gpus = sorted(g for o in olds for g in o.gpu_ids)
            free = [base + g for g in range(cluster.pool.hosts[h].gpus)
                    if base + g not in gpus and base + g in cluster.free_gpus(h)]
            pool = gpus + free
            news = []
            for s, _ in sorted(want, key=lambda x: -x[0].gpus):
                news.append((s, pool[: s.gpus], None))
                pool = pool[s.gpus:]
            got = cluster.reshape(olds, news, now, cost.seconds) if news else None
            if got is None:
                self.refused += 1
                return  # leave this switch (KV would not fit): keep the current layout
            made.extend(got)
        self.plan = new
        frac = new.assignment.fractions()
        # map the plan's replica order onto the instances just made
        ordered: list[Instance] = []
        remaining = list(made)
        for s, h in zip(new.layout, new.hosts, strict=True):
            inst = next(i for i in remaining if i.shape == s and i.host == h)
            remaining.remove(inst)
            ordered.append(inst)
        self.replicas = ordered
        self.wrr = [SmoothWRR(frac[:, j]) for j in range(frac.shape[1])]
        self.switches.append({"t": now, "layout": new.describe(), "seconds": cost.seconds,
                              "bytes": cost.bytes_moved, "method": cost.method})
        cluster.log(now, "switch", f"{new.describe()} ({cost.method}, {cost.seconds:.1f} s)")

    def notes(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.types is not None:
            out["types"] = {n: list(ln) for n, ln in
                            zip(self.types.names, self.types.mean_lengths(), strict=True)}
        if self.plan is not None:
            out["layout"] = self.plan.describe()
            out["lp_throughput_rps"] = self.plan.throughput
            out["assignment"] = {
                f"{s.label}#{i}": [round(float(x), 3) for x in row]
                for i, (s, row) in enumerate(
                    zip(self.plan.layout, self.plan.assignment.fractions(), strict=True))
            }
        if self.check:
            out["check"] = self.check
        if self.switches:
            out["switches"] = self.switches
        if self.refused:
            out["switches_refused"] = self.refused
        if self.switch_checks:
            out["switch_checks"] = self.switch_checks
        return out

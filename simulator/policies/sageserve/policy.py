"""SageServe in the cluster simulator: regions of instances that scale over a day.

Routing (§6.1): an interactive request goes to its home region unless that region's effective
memory utilisation is at or above 70 %, then to another region below it (50 ms away), else to
the least utilised; inside a region, to the instance with the fewest tokens left to process.
Batch (NIW) requests wait in the queue manager (§6.2) until an endpoint signals spare capacity
(below 60 %: one request, below 50 %: two, every `niw_signal_s`, 1 s by default), or until
they are 10 h old.
Scaling (§4, §6.4): `reactive` is the O365 baseline; `lt-i`, `lt-u`, `lt-ua` add the hourly
forecast (`forecast`) and ILP (`ilp`) and differ in when they move towards its target
(`rules`); until a region has any history to forecast from (a trace given without one), they
scale it reactively. A new instance holds its GPUs for `provision_s` before it serves (the
paper's 10-minute redeployment), and those GPU-hours count.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np

from simulator.api import Deployment, max_throughput
from simulator.policies.cluster import (
    BasePolicy,
    Cluster,
    Instance,
    PolicyError,
    pending_tokens_of,
)
from simulator.policies.interfaces import Shape
from simulator.policies.sageserve import ilp
from simulator.policies.sageserve.forecast import forecast_series
from simulator.policies.sageserve.rules import MODES, Thresholds, niw_release, scaling_step
from simulator.policies.sageserve.scenario import parse_label

HOUR = 3600.0
NIW = "NIW"


class SageServePolicy(BasePolicy):
    """Forecast-aware (or reactive) scaling of one shape per model across regions."""

    def __init__(
        self,
        mode: str = "lt-ua",
        gpu: str = "a100-80g-sxm",
        tp: int = 4,
        provision_s: float = 600.0,
        thresholds: Thresholds | None = None,
        history: Mapping[tuple[str, str], np.ndarray] | None = None,
        bin_s: float = 300.0,
        season_s: float = 86_400.0,
        eps: float = 0.9,
        theta_fraction: float = 0.7,
        niw_signal_s: float = 1.0,
        niw_priority_age_s: float = 10 * HOUR,
        network_s: float = 0.05,
        signal: str = "load",
        window_s: float = 60.0,
        name: str | None = None,
    ) -> None:
        if mode not in MODES:
            raise PolicyError(f"unknown SageServe mode {mode!r}; choose from {', '.join(MODES)}")
        self.mode = mode
        self.name = name or ("reactive" if mode == "reactive" else f"sageserve-{mode}")
        self.gpu = gpu
        self.tp = tp
        self.provision_s = provision_s
        self.th = thresholds or Thresholds()
        self.history = {k: np.asarray(v, float) for k, v in (history or {}).items()}
        self.bin_s = bin_s
        self.season = round(season_s / bin_s)
        self.eps = eps
        self.theta_fraction = theta_fraction
        self.tick_s = niw_signal_s
        self.niw_age = niw_priority_age_s
        self.network_s = network_s
        if signal not in ("load", "kv"):
            raise PolicyError(f"utilisation signal {signal!r}: choose load or kv")
        self.signal = signal
        self.window_s = window_s
        self.theta: dict[str, float] = {}
        self.capacity: dict[str, float] = {}  # saturated prompt tokens/s of one instance
        self.recent: dict[tuple[str, str], deque[tuple[float, float]]] = {}
        self.recent_sum: dict[tuple[str, str], float] = {}
        self.keys: list[tuple[str, str]] = []
        self.target: dict[tuple[str, str], int] = {}
        self.predicted: dict[tuple[str, str], np.ndarray] = {}
        self.last_event: dict[tuple[str, str], float] = {}
        self.observed: dict[tuple[str, str], list[float]] = {}
        self.niw_queue: dict[str, deque[tuple[int, float]]] = {}
        self.niw_tokens_hour: dict[str, float] = {}
        self.next_hour = HOUR
        self.plans: list[dict[str, Any]] = []
        self._tier: list[tuple[str, str]] = []
        self.blind: set[tuple[str, str]] = set()  # no history to forecast from yet
        self._groups: dict[tuple[str, Any], list[Instance]] = {}  # see `_members`
        self._groups_at = -1
        self._groups_of: Cluster | None = None

    # ---- setup ------------------------------------------------------------------------
    def start(self, cluster: Cluster, now: float) -> None:
        if not cluster.pool.elastic:
            raise PolicyError("SageServe scales VMs on demand: use an elastic pool (no hosts)")
        wl = cluster.wl
        self._tier = [parse_label(t) for t in wl.tiers]
        regions = sorted({r for t, r in self._tier})
        self.keys = [(m, r) for m in wl.models for r in regions]
        b = wl.base
        for m in wl.models:
            mask = wl.model_mask(m)
            mean_in = float(b.input_len[mask].mean()) if mask.any() else 1024.0
            mean_out = float(b.output_len[mask].mean()) if mask.any() else 256.0
            dep = Deployment(cluster.models.get(m, m), self.gpu, tp=self.tp,
                             calibration=cluster.calibration)
            rps = max_throughput(dep, round(mean_in), round(mean_out))["requests_per_s"]
            self.capacity[m] = rps * mean_in
            self.theta[m] = rps * mean_in * self.theta_fraction
            self.niw_queue[m] = deque()
            self.niw_tokens_hour[m] = 0.0
        for k in self.keys:
            self.observed[k] = [0.0]
            self.last_event[k] = -math.inf
            self.recent[k] = deque()
            self.recent_sum[k] = 0.0
        start = self._plan(cluster, now, initial={k: 0 for k in self.keys})
        self.target = dict(start)
        for k, n in start.items():
            for _ in range(n):
                self._launch(cluster, k, now, delay=0.0)

    def _shape(self) -> Shape:
        return Shape(self.gpu, self.tp)

    def _launch(self, cluster: Cluster, key: tuple[str, str], now: float, delay: float) -> None:
        inst = cluster.launch(key[0], self._shape(), now, delay)
        inst.tags["region"] = key[1]
        self._groups_at = -1  # the region tag is set after the launch

    # ---- views ------------------------------------------------------------------------
    def _members(self, cluster: Cluster, key: tuple[str, str]) -> list[Instance]:
        """The live, non-draining instances of (model, region), in `cluster.live` order.

        Read several times per arrival; the grouping of `cluster.live` by key is rebuilt only
        when the cluster's instances changed (`Cluster.version`). Callers must not modify
        the list returned."""
        if self._groups_at != cluster.version or self._groups_of is not cluster:
            groups: dict[tuple[str, Any], list[Instance]] = {}
            for i in cluster.live:
                if not i.draining:
                    groups.setdefault((i.model, i.tags.get("region")), []).append(i)
            self._groups = groups
            self._groups_at = cluster.version
            self._groups_of = cluster
        return self._groups.get(key, [])

    def _util(self, cluster: Cluster, key: tuple[str, str], now: float) -> float:
        """The endpoint's utilisation signal. `kv` is the paper's literal one: KV in use over
        KV available on the ready instances. `load` (default) is what that signal stands for
        in the paper, "a reliable proxy for the request load": prompt tokens sent to the
        region in the last `window_s`, over the ready instances' saturated token rate. In
        otela's engine KV fills only close to saturation (an A100 TP4 Llama-2-70B instance
        holds 16 % of its KV at 92 % of its capacity), so the literal signal would fire only
        under overload."""
        ready = [i for i in self._members(cluster, key) if now >= i.ready_at]
        if not ready:
            return 1.0
        if self.signal == "kv":
            used = total = 0
            for i in ready:
                rep = i.replica
                total += rep.total_blocks
                used += rep.total_blocks - rep.free_blocks - rep.evictable
            return used / total if total else 1.0
        q = self.recent[key]
        while q and q[0][0] < now - self.window_s:
            self.recent_sum[key] -= q.popleft()[1]
        rate = max(0.0, self.recent_sum[key]) / self.window_s
        return rate / (len(ready) * self.capacity[key[0]])

    def _sent(self, key: tuple[str, str], now: float, tokens: float) -> None:
        self.recent[key].append((now, tokens))
        self.recent_sum[key] += tokens

    # ---- forecasting and the ILP ------------------------------------------------------
    def _series(self, key: tuple[str, str]) -> np.ndarray:
        obs = np.array(self.observed[key][:-1])  # completed bins only
        hist = self.history.get(key, np.zeros(0))
        return np.concatenate([hist, obs])

    def _plan(self, cluster: Cluster, now: float,
              initial: Mapping[tuple[str, str], int] | None = None) -> dict[tuple[str, str], int]:
        """Forecast the next hour per (model, region), solve the ILP; returns target counts."""
        steps = round(HOUR / self.bin_s)
        peak: dict[tuple[str, str], float] = {}
        self.blind = set()
        for k in self.keys:
            series = self._series(k)
            if len(series) == 0:  # nothing seen yet: scale reactively until there is
                self.blind.add(k)
                pred = np.full(steps, self.theta[k[0]] * self.th.min_instances)
            else:
                pred = forecast_series(series, self.season, steps)
            self.predicted[k] = pred
            buffer = 0.1 * self.niw_tokens_hour[k[0]] / HOUR / max(1, len(self.keys))
            peak[k] = float(pred.max()) + buffer
        current = initial if initial is not None else {
            k: len(self._members(cluster, k)) for k in self.keys}
        problem = ilp.ScalingProblem(
            current=current, peak=peak, capacity=self.theta, eps=self.eps,
            min_instances=self.th.min_instances, max_instances=self.th.max_instances)
        try:
            delta = ilp.solve(problem)
        except ilp.ScalingError:
            delta = {k: self.th.max_instances - current[k] for k in self.keys}
        targets = {k: current[k] + delta[k] for k in self.keys}
        self.plans.append({"t": now, "peak_tokens_per_s": {f"{m}@{r}": round(v)
                                                           for (m, r), v in peak.items()},
                           "targets": {f"{m}@{r}": v for (m, r), v in targets.items()}})
        for m in self.niw_tokens_hour:
            self.niw_tokens_hour[m] = 0.0
        return targets

    # ---- arrivals ---------------------------------------------------------------------
    def on_arrival(self, cluster: Cluster, r: int, now: float) -> None:
        wl = cluster.wl
        model = wl.model_name(r)
        tier, home = self._tier[int(wl.tier[r])]
        tokens = float(wl.base.input_len[r])
        if tier == NIW:
            self.niw_queue[model].append((r, now))
            self.niw_tokens_hour[model] += tokens
            return
        key = (model, home)
        if key not in self.observed:
            raise PolicyError(f"request for unknown model/region {key}")
        self._account(key, now, tokens)
        region = self._route_region(cluster, model, home, now)
        target = self._least_tokens(cluster, (model, region), now)
        delay = self.network_s if region != home else 0.0
        cluster.dispatch(r, target, now + delay)
        self._sent((model, region), now, tokens)
        self._scale(cluster, (model, region), now)

    def _account(self, key: tuple[str, str], now: float, tokens: float) -> None:
        b = int(now // self.bin_s)
        obs = self.observed[key]
        while len(obs) <= b:
            obs.append(0.0)
        obs[b] += tokens / self.bin_s

    def _route_region(self, cluster: Cluster, model: str, home: str, now: float) -> str:
        regions = [home, *sorted(r for m, r in self.keys if m == model and r != home)]
        utils = {r: self._util(cluster, (model, r), now) for r in regions}
        for r in regions:
            if utils[r] < self.th.scale_out:
                return r
        return min(regions, key=lambda r: utils[r])

    def _least_tokens(self, cluster: Cluster, key: tuple[str, str], now: float) -> Instance:
        ready = [i for i in self._members(cluster, key) if now >= i.ready_at]
        if not ready:  # the whole region is provisioning: any ready instance of the model
            ready = [i for i in cluster.endpoints(key[0], now)] or self._members(cluster, key)
        if not ready:
            raise PolicyError(f"no instance of {key[0]} at all")
        loads = pending_tokens_of(ready)
        return min(zip(loads, ready, strict=True), key=lambda x: (x[0], x[1].id))[1]

    # ---- scaling ----------------------------------------------------------------------
    def _scale(self, cluster: Cluster, key: tuple[str, str], now: float) -> None:
        if self.mode == "lt-i" and key not in self.blind:
            return
        members = self._members(cluster, key)
        ratio = None
        if self.mode == "lt-ua":
            pred = self.predicted.get(key)
            b = int((now % HOUR) // self.bin_s)
            if pred is not None and len(pred) > b and pred[b] > 0:
                ratio = self.observed[key][-1] / pred[b]
        mode = "reactive" if key in self.blind else self.mode
        step = scaling_step(
            mode, self._util(cluster, key, now), len(members), now,
            self.last_event[key], self.th, self.target.get(key), ratio, now % HOUR)
        if step > 0:
            self._launch(cluster, key, now, self.provision_s)
            self.last_event[key] = now
        elif step < 0:
            self._drain_one(cluster, key, now)
            self.last_event[key] = now

    def _drain_one(self, cluster: Cluster, key: tuple[str, str], now: float) -> None:
        members = self._members(cluster, key)
        if len(members) <= self.th.min_instances:
            return
        # a still-provisioning instance goes first (its start is wasted anyway), then the
        # instance with the least work left
        victim = min(members, key=lambda i: (now >= i.ready_at, i.pending_tokens(), -i.id))
        cluster.drain(victim, now)

    def on_tick(self, cluster: Cluster, now: float) -> None:
        if now >= self.next_hour:
            self.next_hour += HOUR
            if self.mode != "reactive":
                self.target = self._plan(cluster, now)
                if self.mode == "lt-i":
                    self._apply_targets(cluster, now)
        self._release_niw(cluster, now)

    def _apply_targets(self, cluster: Cluster, now: float) -> None:
        for key, want in self.target.items():
            have = len(self._members(cluster, key))
            for _ in range(want - have):
                self._launch(cluster, key, now, self.provision_s)
            for _ in range(have - want):
                self._drain_one(cluster, key, now)

    def _release_niw(self, cluster: Cluster, now: float) -> None:
        for model, q in self.niw_queue.items():
            while q and now - q[0][1] >= self.niw_age:  # deadline approaching: priority 0
                r, _ = q.popleft()
                region = self._route_region(cluster, model, self.keys[0][1], now)
                cluster.dispatch(r, self._least_tokens(cluster, (model, region), now), now)
                self._sent((model, region), now, float(cluster.req.input_len[r]))
            for key in self.keys:
                if key[0] != model or not q:
                    continue
                for _ in range(niw_release(self._util(cluster, key, now))):
                    if not q:
                        break
                    r, _ = q.popleft()
                    cluster.dispatch(r, self._least_tokens(cluster, key, now), now)
                    self._sent(key, now, float(cluster.req.input_len[r]))

    def holding(self) -> int:
        return sum(len(q) for q in self.niw_queue.values())

    def notes(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "theta_tokens_per_s": {m: round(v) for m, v in self.theta.items()},
            "hourly_plans": len(self.plans),
            "first_plan": self.plans[0] if self.plans else None,
        }

"""Simulating candidate configurations once: curves from the simulator's public API, cached.

For each (model, GPU variant, TP) that fits (C2: weights, runtime reserves and KV for at least
one sequence of the demand's 99th-percentile context), the simulator measures

1. the saturated throughput `mu` of one replica: a closed batch of requests with the
   demand's lengths, all queued at t=0; `mu` is the completion rate in the middle 60 % of
   the run (no ramp-up or drain), and the saturated latency the mean in-engine time there;
2. open-loop Poisson runs at fixed fractions of `mu` (LOAD_FRACTIONS), each long enough for
   `requests` requests, the first 10 % of arrivals dropped as warm-up.

Results are cached in memory and, when a directory is given, on disk as one JSON file per
configuration (keyed by a hash of the key, PROFILE_VERSION and the device the simulator
prices: its datasheet figures and calibration profile), so a configuration is never
simulated twice: not within a plan, and not across runs (`--cache DIR`,
``OTELA_PLACER_CACHE``). A change to a device's profile in the catalog makes new keys by
itself; a change to the simulator's model code must bump PROFILE_VERSION.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from simulator.api import Deployment, fits, run
from simulator.placer.curves import ConfigKey, Curve, Point
from simulator.placer.demand import Service, precision_label
from simulator.placer.pool import Variant
from simulator.workload import Workload

# 2: issue 37's second round (16-bit all-reduce messages, per-hop all-reduce latency,
# inter-node links): curves simulated by version 1 price TP groups differently
PROFILE_VERSION = 2
LOAD_FRACTIONS = (0.1, 0.3, 0.5, 0.7, 0.85, 0.95)
WARMUP = 0.1


@dataclass(frozen=True)
class Candidate:
    """A configuration the model may use: a service on a variant at one TP degree."""

    service: str
    variant: Variant
    tp: int
    curve: Curve


@dataclass(frozen=True)
class Rejected:
    """A configuration left out, and why (C2 memory rule, context too long, ...)."""

    service: str
    variant: str
    tp: int
    reason: str


@dataclass
class Profiler:
    """Simulates configurations on demand and remembers them."""

    cache_dir: Path | None = None
    requests: int = 600
    seed: int = 0
    simulated: int = 0  # configurations actually simulated (not served from a cache)
    _memo: dict[ConfigKey, Curve | str] = field(default_factory=dict)

    def candidates(
        self,
        services: Iterable[Service],
        variants: Iterable[Variant],
        max_tp: Callable[[Variant], int],
        progress: Callable[[str], None] | None = None,
    ) -> tuple[list[Candidate], list[Rejected]]:
        """Every (service, variant, TP) that fits, with its curve; and those that do not."""
        out: list[Candidate] = []
        rejected: list[Rejected] = []
        variants = list(variants)
        for svc in services:
            for var in variants:
                for tp in svc.tp:
                    if tp > max_tp(var):
                        continue
                    key = ConfigKey(svc.model, var.name, tp, svc.input.label, svc.output.label,
                                    precision_label(svc.precision))
                    if progress is not None:
                        progress(key.label())
                    res = self.curve(key, svc, var)
                    if isinstance(res, str):
                        rejected.append(Rejected(svc.name, var.name, tp, res))
                    else:
                        out.append(Candidate(svc.name, var, tp, res))
        return out, rejected

    def curve(self, key: ConfigKey, svc: Service, var: Variant) -> Curve | str:
        """The curve of `key`, or the reason it cannot serve (a string)."""
        if key in self._memo:
            return self._memo[key]
        path = self._path(key, var)
        if path is not None and path.exists():
            try:
                data = json.loads(path.read_text())
                res: Curve | str = data["reason"] if "reason" in data else Curve.from_dict(data)
                self._memo[key] = res
                return res
            except (ValueError, KeyError, TypeError):
                pass  # a damaged cache entry: simulate again
        res = self._simulate(key, svc, var)
        self.simulated += 1
        self._memo[key] = res
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"reason": res} if isinstance(res, str) else res.to_dict()))
            tmp.replace(path)
        return res

    def _path(self, key: ConfigKey, var: Variant) -> Path | None:
        if self.cache_dir is None:
            return None
        device = repr(var.spec())  # datasheet figures and calibration profile, as priced
        fields = asdict(key)
        if not key.precision:  # BF16: the key as before precisions, so caches stay warm
            del fields["precision"]
        blob = json.dumps([PROFILE_VERSION, fields, self.requests, self.seed, device],
                          sort_keys=True)
        return self.cache_dir / f"{hashlib.sha256(blob.encode()).hexdigest()[:24]}.json"

    def _simulate(self, key: ConfigKey, svc: Service, var: Variant) -> Curve | str:
        dep = Deployment(svc.model, var.spec(), tp=key.tp, precision=svc.precision)
        ok, reason = fits(dep)
        if not ok:
            return reason
        p99_ctx = int(svc.input.quantile(0.99) + svc.output.quantile(0.99))
        plan = dep.memory()
        if plan.max_batch(min(p99_ctx, plan.max_context)) < 1:
            return (f"KV cache holds no sequence of the demand's p99 context ({p99_ctx} "
                    "tokens)")
        rng = np.random.default_rng(self.seed)
        mu, sat = self._saturation(dep, svc, rng)
        if mu <= 0:
            return "serves no request (every request rejected)"
        points = tuple(self._point(dep, svc, f * mu, rng) for f in LOAD_FRACTIONS)
        return Curve(key, mu, sat, points, gpus=key.tp)

    def _saturation(self, dep: Deployment, svc: Service,
                    rng: np.random.Generator) -> tuple[float, float]:
        n = max(self.requests, 4 * dep.engine_config.max_num_seqs)
        n = min(n, 4000)
        wl = Workload.from_arrays(np.zeros(n), svc.input.sample(n, rng),
                                  svc.output.sample(n, rng))
        res = run(dep, wl, timeline_points=0, include_requests=True, seed=self.seed)
        rows = [r for r in res["per_request"] if r["e2e"] is not None]
        if not rows:
            return 0.0, 0.0
        finish = np.array([r["arrival"] + r["e2e"] for r in rows])
        end = float(finish.max())
        lo, hi = 0.2 * end, 0.8 * end
        mid = (finish >= lo) & (finish < hi)
        mu = float(mid.sum()) / (hi - lo) if hi > lo else 0.0
        inside = np.array([r["e2e"] - r["queueing"] for r in rows])
        sat = float(inside[mid].mean()) if mid.any() else float(inside.mean())
        return mu, sat

    def _point(self, dep: Deployment, svc: Service, load: float,
               rng: np.random.Generator) -> Point:
        n = self.requests
        gaps = rng.exponential(1.0 / load, size=n)
        arrival = np.cumsum(gaps)
        wl = Workload.from_arrays(arrival, svc.input.sample(n, rng), svc.output.sample(n, rng))
        res = run(dep, wl, timeline_points=0, include_requests=True, seed=self.seed)
        rows = res["per_request"]
        cut = int(WARMUP * n)
        kept = [r for r in rows[cut:]]
        done = [r for r in kept if r["e2e"] is not None]
        stats = {m: _stats([r[m] for r in done if m != "tpot" or r["output_len"] > 1])
                 for m in ("ttft", "tpot", "e2e")}
        return Point(load, stats, rejected=1.0 - len(done) / max(1, len(kept)))


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {k: 0.0 for k in ("mean", "p50", "p90", "p95", "p99")}
    arr = np.asarray(values, dtype=float)
    p50, p90, p95, p99 = np.percentile(arr, [50, 90, 95, 99])
    return {"mean": float(arr.mean()), "p50": float(p50), "p90": float(p90),
            "p95": float(p95), "p99": float(p99)}


def default_cache_dir() -> Path:
    """``$OTELA_PLACER_CACHE``, else ``$XDG_CACHE_HOME/otela/placer``."""
    env = os.environ.get("OTELA_PLACER_CACHE")
    if env:
        return Path(env)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "otela" / "placer"

"""Latency-vs-load curves of one replica configuration and their piecewise-linear form.

A curve holds what the simulator measured for one (model, GPU variant, TP, lengths)
configuration: its saturated capacity `mu` (req/s), the in-engine latency at saturation, and
latency statistics at a handful of open-loop Poisson loads below `mu`. Pure functions turn it
into what the constraint model needs (docs/placer.md, "The latency objective"):

* ``latency(rho)``: mean end-to-end latency of one replica at load ``rho``, interpolated
  between simulated loads; beyond the highest simulated load, a fluid overload model over
  the planning horizon H: the replica serves ``mu`` and the backlog grows, so a request
  arriving at ``t`` waits ``t (rho/mu - 1)``, on average ``H/2 (rho/mu - 1)``.
* ``pieces(max_load, H)``: affine pieces ``(a, b)`` whose maximum is the lower convex
  envelope of ``g(rho) = rho * latency(rho)`` (latency-seconds per second of one replica).
  For ``x`` replicas sharing flow ``f`` equally, total latency per second is the
  perspective ``x g(f/x) = max_k (a_k x + b_k f)``: linear in the integers x and f.
* ``slo_capacity(slo)``: the highest load at which the SLO's percentile of each targeted
  metric is within its target (linear between simulated loads; 0 if even the lightest fails).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from simulator.placer.demand import SLO

OVERLOAD_RATIOS = (1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0, 34.0, 55.0, 89.0)


@dataclass(frozen=True)
class ConfigKey:
    """What a simulation depends on: the cache key of a curve."""

    model: str
    variant: str
    tp: int
    input: str
    output: str
    precision: str = ""  # ``demand.precision_label`` of the checkpoint: "" is BF16

    def label(self) -> str:
        served = f"{self.model} ({self.precision})" if self.precision else self.model
        return f"{served} on {self.variant} TP{self.tp}"


@dataclass(frozen=True)
class Point:
    """Open-loop Poisson load `load` req/s on one replica: latency statistics in seconds
    (``{metric: {"mean", "p50", "p90", "p95", "p99"}}`` for ttft, tpot, e2e)."""

    load: float
    stats: Mapping[str, Mapping[str, float]]
    rejected: float = 0.0  # fraction of requests the engine refused (too long)

    def value(self, metric: str, stat: str) -> float:
        return float(self.stats[metric][stat])


@dataclass(frozen=True)
class Curve:
    key: ConfigKey
    mu: float  # saturated throughput of one replica, req/s
    sat_latency: float  # mean in-engine latency at saturation (no queueing), s
    points: tuple[Point, ...]  # increasing load, all below mu
    gpus: int  # GPUs per replica (= TP)

    def to_dict(self) -> dict[str, Any]:
        return {"key": asdict(self.key), "mu": self.mu, "sat_latency": self.sat_latency,
                "gpus": self.gpus,
                "points": [{"load": p.load, "stats": {k: dict(v) for k, v in p.stats.items()},
                            "rejected": p.rejected} for p in self.points]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Curve:
        return cls(ConfigKey(**d["key"]), float(d["mu"]), float(d["sat_latency"]),
                   tuple(Point(float(p["load"]), p["stats"], float(p.get("rejected", 0.0)))
                         for p in d["points"]), int(d["gpus"]))

    # -- latency ---------------------------------------------------------------------------
    def _top(self) -> tuple[float, float]:
        """(load, latency) where the fluid overload model takes over: at `mu`, latency no
        lower than the highest simulated point nor the saturated in-engine latency."""
        top = max((p.value("e2e", "mean") for p in self.points), default=self.sat_latency)
        return self.mu, max(top, self.sat_latency)

    def latency(self, rho: float, horizon_s: float) -> float:
        """Mean end-to-end latency (s) of one replica at load `rho` req/s."""
        pts = [(p.load, p.value("e2e", "mean")) for p in self.points]
        if not pts:
            raise ValueError(f"{self.key.label()}: no simulated loads")
        mu, l_mu = self._top()
        if rho <= pts[0][0]:
            return pts[0][1]
        for (x0, y0), (x1, y1) in zip(pts, [*pts[1:], (mu, l_mu)], strict=True):
            if rho <= x1:
                return y0 + (y1 - y0) * (rho - x0) / (x1 - x0)
        return l_mu + horizon_s / 2.0 * (rho / mu - 1.0)

    def g_points(self, max_load: float, horizon_s: float) -> list[tuple[float, float]]:
        """Points of g(rho) = rho * latency(rho) from 0 to `max_load` (simulated loads plus
        the overload grid), the input of the convex envelope."""
        xs = [0.0] + [p.load for p in self.points if p.load < max_load]
        xs += [r * self.mu for r in OVERLOAD_RATIOS if r * self.mu < max_load]
        xs.append(max_load)
        xs = sorted(set(xs))
        return [(x, x * self.latency(x, horizon_s) if x > 0 else 0.0) for x in xs]

    def pieces(self, max_load: float, horizon_s: float) -> list[tuple[float, float]]:
        """Affine pieces (a, b): g(rho) ~ max_k a_k + b_k rho on [0, max_load]."""
        return envelope_pieces(self.g_points(max_load, horizon_s))

    # -- SLOs ------------------------------------------------------------------------------
    def slo_capacity(self, slo: SLO) -> float:
        """Highest per-replica load (req/s) meeting `slo`; `mu` when the SLO has no target
        (the replica must still not be overloaded)."""
        if not slo.any:
            return self.mu
        stat = f"p{slo.percentile}"
        targets = {"ttft": slo.ttft_s, "tpot": slo.tpot_s, "e2e": slo.e2e_s}

        def slack(p: Point) -> float:  # >= 0 when every targeted metric is within target
            return min((t - p.value(m, stat)) / t for m, t in targets.items() if t is not None)

        best = 0.0
        prev: Point | None = None
        for p in self.points:
            s = slack(p)
            if s < 0:
                if prev is not None:
                    s0 = slack(prev)
                    best = prev.load + (p.load - prev.load) * s0 / (s0 - s)
                return best
            best, prev = p.load, p
        return best


def envelope_pieces(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Affine pieces (intercept, slope) of the lower convex envelope of `points` (x sorted
    ascending, first at x=0); one piece per hull edge."""
    hull: list[tuple[float, float]] = []
    for p in points:
        while len(hull) >= 2 and _cross(hull[-2], hull[-1], p) <= 0:
            hull.pop()
        hull.append(p)
    out = []
    for (x0, y0), (x1, y1) in itertools.pairwise(hull):
        if x1 <= x0:
            continue
        b = (y1 - y0) / (x1 - x0)
        out.append((y0 - b * x0, b))
    if not out:  # a single point: flat
        out.append((hull[0][1], 0.0))
    return out


def _cross(o: tuple[float, float], a: tuple[float, float], b: tuple[float, float]) -> float:
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


def envelope_value(pieces: Sequence[tuple[float, float]], x: float) -> float:
    """max_k a_k + b_k x: the piecewise-linear g the model optimises."""
    return max(a + b * x for a, b in pieces)


def replica_cost(pieces: Sequence[tuple[float, float]], replicas: int, flow: float) -> float:
    """Latency-seconds per second of `replicas` replicas sharing `flow` req/s equally."""
    if replicas <= 0:
        return 0.0 if flow <= 0 else math.inf
    return replicas * envelope_value(pieces, flow / replicas)

"""Arrival processes and token-length distributions: pure, seeded, vectorised.

The simulator's workload generator and `otela trace gen` both draw from here, so a trace and
a simulation that name the same spec see the same statistics.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

LENGTH_KINDS = ("fixed", "normal", "uniform", "lognormal", "exp", "empirical")


# ---- arrival processes ------------------------------------------------------------------
def poisson_arrivals(rate: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """Poisson process: exponential gaps with mean 1/rate."""
    if rate <= 0:
        raise ValueError("rate must be > 0")
    return np.cumsum(rng.exponential(1.0 / rate, size=n))


def gamma_arrivals(rate: float, cv: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """Gamma renewal process with mean gap 1/rate and coefficient of variation `cv`
    (cv=1 is Poisson, cv>1 bursty, cv<1 smoother)."""
    if rate <= 0 or cv <= 0:
        raise ValueError("rate and cv must be > 0")
    shape = 1.0 / cv**2
    scale = 1.0 / (rate * shape)
    return np.cumsum(rng.gamma(shape, scale, size=n))


def renewal_arrivals(rate: float, cv: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """Poisson when cv == 1, else Gamma with that CV."""
    return poisson_arrivals(rate, n, rng) if cv == 1.0 else gamma_arrivals(rate, cv, n, rng)


@dataclass(frozen=True)
class Diurnal:
    """A daily (or any periodic) rate curve around the mean rate:
    rate(t) = mean * (1 + amplitude * cos(2 pi (t - peak) / period)).

    `amplitude` in [0, 1): 0 is flat, 0.8 swings between 0.2x and 1.8x the mean rate.
    """

    amplitude: float
    period_s: float = 86_400.0
    peak_s: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.amplitude < 1:
            raise ValueError("diurnal amplitude must be in [0, 1)")
        if self.period_s <= 0:
            raise ValueError("diurnal period must be > 0")

    def factor(self, t: np.ndarray) -> np.ndarray:
        return 1.0 + self.amplitude * np.cos(2 * np.pi * (t - self.peak_s) / self.period_s)

    def cumulative(self, t: np.ndarray) -> np.ndarray:
        """Integral of factor(s) ds from 0 to t (closed form)."""
        w = 2 * np.pi / self.period_s
        return t + self.amplitude / w * (np.sin(w * (t - self.peak_s)) - np.sin(-w * self.peak_s))


def time_rescale(points: np.ndarray, curve: Diurnal) -> np.ndarray:
    """Map the points of a flat-rate process (seconds at the mean rate) through the inverse of
    the curve's cumulative factor, so a renewal process (Poisson or Gamma) follows the curve
    while keeping its burstiness: arrivals are dense where the factor is high."""
    if len(points) == 0:
        return points
    end = float(points[-1])
    # cumulative(t) >= (1 - amplitude) t, so the inverse of `end` lies below end/(1-amplitude)
    t_max = end / (1 - curve.amplitude) + curve.period_s
    grid = np.linspace(0.0, t_max, max(10_000, int(200 * t_max / curve.period_s)))
    return np.interp(points, curve.cumulative(grid), grid)


def arrivals(
    rate: float,
    rng: np.random.Generator,
    *,
    n: int | None = None,
    duration: float | None = None,
    cv: float = 1.0,
    diurnal: Diurnal | None = None,
) -> np.ndarray:
    """Arrival times for `n` requests or for `duration` seconds at mean `rate` req/s."""
    if n is None and duration is None:
        raise ValueError("give a duration or a number of requests")
    if rate <= 0:
        raise ValueError("rate must be > 0")
    if n is None:
        assert duration is not None
        mean = rate * duration
        n = max(1, int(mean * 1.2 + 10 * np.sqrt(mean) + 10 * max(cv, 1.0) ** 2 + 10))
    times = renewal_arrivals(rate, cv, n, rng)
    if diurnal is not None:
        times = time_rescale(times, diurnal)
    if duration is not None:
        times = times[times < duration]
    return times


# ---- token lengths ----------------------------------------------------------------------
@dataclass(frozen=True)
class LengthDist:
    """A parsed length spec: ``fixed:N`` (or ``N``), ``normal:MEAN,STD``, ``uniform:LO,HI``,
    ``lognormal:MEAN,STD`` (of the lengths themselves), ``exp:MEAN``, or ``empirical`` with
    values taken from another trace. Samples are rounded and clipped to [min_len, max_len]."""

    kind: str
    params: tuple[float, ...] = ()
    values: tuple[int, ...] = ()
    min_len: int = 1
    max_len: int = 1 << 20

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        p = self.params
        if self.kind == "fixed":
            x = np.full(n, p[0])
        elif self.kind == "normal":
            x = rng.normal(p[0], p[1], size=n)
        elif self.kind == "uniform":  # integers LO..HI inclusive, each equally likely
            x = rng.integers(int(p[0]), int(p[1]) + 1, size=n).astype(float)
        elif self.kind == "lognormal":
            mean, std = p
            sigma2 = np.log(1 + (std / mean) ** 2)
            x = rng.lognormal(np.log(mean) - sigma2 / 2, np.sqrt(sigma2), size=n)
        elif self.kind == "exp":
            x = rng.exponential(p[0], size=n)
        elif self.kind == "empirical":
            x = rng.choice(np.asarray(self.values, dtype=float), size=n, replace=True)
        else:  # pragma: no cover - parse_lengths rejects unknown kinds
            raise ValueError(self.kind)
        return np.clip(np.rint(x), self.min_len, self.max_len).astype(np.int64)


_ARITY = {"fixed": 1, "normal": 2, "uniform": 2, "lognormal": 2, "exp": 1, "exponential": 1}


def parse_lengths(
    spec: str,
    empirical: Callable[[str], list[int]] | None = None,
    max_len: int = 1 << 20,
) -> LengthDist:
    """Parse a length spec; ``empirical:FILE[:input|output]`` calls `empirical(rest)` for the
    values. Errors are ValueErrors whose message says what is wrong and what is accepted."""
    kind, _, args = spec.strip().partition(":")
    kind = kind.strip().lower()
    if not args and kind.replace(".", "", 1).isdigit():
        kind, args = "fixed", kind
    if kind == "empirical":
        if empirical is None or not args:
            raise ValueError("empirical lengths need a trace: empirical:FILE[:input|output]")
        values = [v for v in empirical(args) if v >= 0]
        if not values:
            raise ValueError(f"no lengths found in {args!r}")
        return LengthDist("empirical", values=tuple(values), min_len=0, max_len=max_len)
    if kind not in _ARITY:
        raise ValueError(
            f"unknown length distribution {spec!r}; use fixed:N, normal:M,S, uniform:A,B, "
            "lognormal:M,S, exp:M or empirical:FILE"
        )
    try:
        p = tuple(float(x) for x in args.split(",") if x.strip())
    except ValueError as e:
        raise ValueError(f"bad numbers in length distribution {spec!r}") from e
    if len(p) != _ARITY[kind]:
        raise ValueError(f"{kind} takes {_ARITY[kind]} number(s), got {spec!r}")
    if any(v < 0 for v in p) or (kind in ("lognormal", "exp", "exponential") and p[0] <= 0):
        raise ValueError(f"length distribution {spec!r} needs positive parameters")
    kind = "exp" if kind == "exponential" else kind
    return LengthDist(kind, p, max_len=max_len)


def sample_lengths(
    spec: str, n: int, rng: np.random.Generator, max_len: int = 1 << 20
) -> np.ndarray:
    """Sample `n` token lengths from a spec string (see `LengthDist`)."""
    return parse_lengths(spec, max_len=max_len).sample(n, rng)

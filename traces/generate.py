"""Synthetic traces: an arrival process, length distributions and a model mix, seeded.

Pure apart from reading an `empirical:` source trace (done through the `empirical` callback
the caller passes), so the same spec and seed always give the same trace.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from otela.tracing.schema import TraceRecord, make_header
from traces.distributions import Diurnal, arrivals, parse_lengths
from traces.io import Trace

PRESETS: dict[str, dict[str, Any]] = {
    # OpenTela paper sec. 5: Poisson arrivals, lengths Normal(764, 561) in, Normal(674, 412) out
    # ("derived from real-world traces collected from our deployment").
    "opentela-s5": {
        "cv": 1.0,
        "input": "normal:764,561",
        "output": "normal:674,412",
    },
}


@dataclass
class GenSpec:
    """Everything that determines a generated trace."""

    rate: float
    duration: float | None = None
    requests: int | None = None
    cv: float = 1.0
    diurnal: Diurnal | None = None
    input: str = "fixed:512"
    output: str = "fixed:128"
    models: list[tuple[str, float]] = field(default_factory=lambda: [("default", 1.0)])
    seed: int = 0
    prefix_groups: int = 0
    prefix_len: int = 0
    max_len: int = 1 << 20

    def __post_init__(self) -> None:
        if self.rate <= 0:
            raise ValueError("rate must be > 0")
        if self.requests is not None and self.requests < 1:
            raise ValueError("requests must be >= 1")
        if self.duration is not None and self.duration <= 0:
            raise ValueError("duration must be > 0")
        if self.cv <= 0:
            raise ValueError("cv must be > 0")
        if self.prefix_groups < 0 or self.prefix_len < 0:
            raise ValueError("prefix groups and length must be >= 0")

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "rate": self.rate,
            "cv": self.cv,
            "input": self.input,
            "output": self.output,
            "models": [list(m) for m in self.models],
            "seed": self.seed,
        }
        if self.duration is not None:
            d["duration"] = self.duration
        if self.requests is not None:
            d["requests"] = self.requests
        if self.diurnal is not None:
            d["diurnal"] = [self.diurnal.amplitude, self.diurnal.period_s, self.diurnal.peak_s]
        if self.prefix_groups:
            d["prefix"] = [self.prefix_groups, self.prefix_len]
        return d


def parse_models(items: list[str]) -> list[tuple[str, float]]:
    """``["llama:3", "qwen"]`` -> [("llama", 3.0), ("qwen", 1.0)]: a weighted model mix."""
    out = []
    for item in items:
        name, sep, weight = item.rpartition(":")
        if not sep or not _is_number(weight):
            name, weight = item, "1"
        w = float(weight)
        if not name or w <= 0:
            raise ValueError(f"bad model {item!r}: use NAME or NAME:WEIGHT with WEIGHT > 0")
        out.append((name, w))
    return out or [("default", 1.0)]


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def generate(spec: GenSpec, empirical: Callable[[str], list[int]] | None = None) -> Trace:
    """Build the trace `spec` describes (requests sorted by arrival, ids r0, r1, ...)."""
    rng = np.random.default_rng(spec.seed)
    t = arrivals(
        spec.rate,
        rng,
        n=spec.requests,
        duration=spec.duration,
        cv=spec.cv,
        diurnal=spec.diurnal,
    )
    n = len(t)
    inp = parse_lengths(spec.input, empirical, spec.max_len).sample(n, rng)
    out = parse_lengths(spec.output, empirical, spec.max_len).sample(n, rng)
    out = np.maximum(out, 1)
    names = [m for m, _ in spec.models]
    w = np.array([x for _, x in spec.models], dtype=float)
    pick = rng.choice(len(names), size=n, p=w / w.sum())
    prefix = np.full(n, -1)
    if spec.prefix_groups > 0 and spec.prefix_len > 0:  # Zipf-popular shared system prompts
        zw = 1.0 / np.arange(1, spec.prefix_groups + 1)
        prefix = rng.choice(spec.prefix_groups, size=n, p=zw / zw.sum())
    records = []
    for i in range(n):
        rec = TraceRecord(
            arrival=float(t[i]),
            model=names[pick[i]],
            input_tokens=int(inp[i]) + (spec.prefix_len if prefix[i] >= 0 else 0),
            output_tokens=int(out[i]),
            request_id=f"r{i}",
            max_tokens=int(out[i]),
        )
        if prefix[i] >= 0:
            rec.prefix_hash = f"p{prefix[i]}"
            rec.prefix_len = spec.prefix_len
        records.append(rec)
    return Trace(make_header("otela trace gen", start_time=0.0, generator=spec.describe()), records)

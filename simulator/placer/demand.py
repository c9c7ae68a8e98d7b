"""Demand: what each model must serve (rate and token lengths), its SLOs, the objective.

Pure apart from `demand_from_trace`, which reads a trace through `traces.io`. A demand file
is TOML or JSON with ``[[models]]`` entries (docs/placer.md has the format).
"""

from __future__ import annotations

import enum
import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from otela.hardware.precision import BITS_KEYS, stored_bits
from simulator.models import get_model
from simulator.roofline import WEIGHT_FORMATS, Precision
from traces.distributions import LengthDist, parse_lengths


class DemandError(ValueError):
    """A demand entry that cannot be planned for; the message says which and why."""


class Objective(enum.StrEnum):
    """What the plan optimises (docs/placer.md: "Objectives")."""

    LATENCY = "latency"  # the paper's Eq. 1: mean end-to-end latency over all requests
    GOODPUT = "goodput"  # requests per second served within every SLO
    GPUS = "gpus"  # fewest GPUs that serve all demand within every SLO
    COST = "cost"  # cheapest $/h that serves all demand within every SLO


@dataclass(frozen=True)
class SLO:
    """Latency targets in seconds (None: no target); met at a load when the `percentile`
    of each targeted metric, over the simulated requests, is within it."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    percentile: int = 90

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.ttft_s, self.tpot_s, self.e2e_s))

    def describe(self) -> str:
        parts = [f"{k}<={v:g}s" for k, v in (("TTFT", self.ttft_s), ("TPOT", self.tpot_s),
                                              ("e2e", self.e2e_s)) if v is not None]
        return f"p{self.percentile} " + ", ".join(parts) if parts else "none"


@dataclass(frozen=True)
class Lengths:
    """A token-length distribution with a stable label (cache keys and display)."""

    label: str
    dist: LengthDist = field(compare=False, hash=False)

    @classmethod
    def parse(cls, spec: str) -> Lengths:
        try:
            return cls(spec.strip(), parse_lengths(spec))
        except ValueError as exc:
            raise DemandError(str(exc)) from None

    @classmethod
    def empirical(cls, values: Sequence[int], what: str) -> Lengths:
        arr = np.asarray(values, dtype=np.int64)
        digest = hashlib.sha256(arr.tobytes()).hexdigest()[:12]
        label = f"empirical:{what}(n={len(arr)},mean={arr.mean():.0f},#{digest})"
        return cls(label, LengthDist("empirical", values=tuple(int(v) for v in arr), min_len=1))

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return self.dist.sample(n, rng)

    def quantile(self, q: float, n: int = 4000) -> float:
        """A quantile of the clipped distribution (sampled with a fixed seed: deterministic)."""
        return float(np.quantile(self.sample(n, np.random.default_rng(12345)), q))


@dataclass(frozen=True)
class Service:
    """One model to serve: its simulator model, served name, rate, lengths and SLO."""

    name: str  # the model id clients request (and engines are started with)
    model: str  # simulator catalog key
    rate: float  # requests per second
    input: Lengths
    output: Lengths
    slo: SLO = SLO()
    tp: tuple[int, ...] = (1, 2, 4, 8)  # tensor-parallel degrees to consider
    # The checkpoint it is served from: a quantized one holds weights in fewer bytes, so it
    # fits on fewer or smaller GPUs and leaves more memory to the KV cache.
    precision: Precision = field(default_factory=Precision)


def precision_label(precision: Precision) -> str:
    """A precision's short name in plans and cache keys: "" for BF16 (the default), else
    e.g. "fp8 w8a8" or "int4-g128 w4a16 kv8"."""
    if precision == Precision():
        return ""
    label = (f"{precision.format.name} w{precision.weight_bits:g}a{precision.act_bits:g}")
    if precision.kv_bits != 16:
        label += f" kv{precision.kv_bits:g}"
    return label


@dataclass(frozen=True)
class Demand:
    services: tuple[Service, ...]
    objective: Objective = Objective.LATENCY
    horizon_s: float = 300.0  # how long an overload lasts when demand exceeds the pool

    @property
    def total_rate(self) -> float:
        return sum(s.rate for s in self.services)

    def precision_labels(self) -> dict[str, str]:
        """Each model's checkpoint precision (``precision_label``: "" for BF16), by name."""
        return {s.name: precision_label(s.precision) for s in self.services}


_PRECISION_KEYS = {"weight_bits", "act_bits", "kv_bits", "weight_format"}
_MODEL_KEYS = {"model", "name", "rate", "input", "output", "trace", "ttft", "tpot", "e2e",
               "percentile", "tp"} | _PRECISION_KEYS


def demand_from_mapping(data: Mapping[str, Any], *, base: Path | None = None,
                        objective: Objective | None = None) -> Demand:
    """Parse a demand file's content; `base` resolves relative trace paths."""
    entries = data.get("models")
    if not isinstance(entries, list) or not entries:
        raise DemandError("demand has no [[models]] entries")
    defaults = {k: data.get(k) for k in ("ttft", "tpot", "e2e", "percentile")}
    services = []
    for i, raw in enumerate(entries):
        where = f"models[{i}]"
        if not isinstance(raw, Mapping):
            raise DemandError(f"{where}: expected a table")
        unknown = set(raw) - _MODEL_KEYS
        if unknown:
            raise DemandError(f"{where}: unknown keys {sorted(unknown)} "
                              f"(known: {', '.join(sorted(_MODEL_KEYS))})")
        merged = {**{k: v for k, v in defaults.items() if v is not None}, **raw}
        try:
            services.append(_service(merged, base))
        except DemandError as exc:
            raise DemandError(f"{where}: {exc}") from None
    names = [s.name for s in services]
    if len(set(names)) != len(names):
        raise DemandError(f"two [[models]] entries serve the same name: {names}")
    obj = objective or Objective(str(data.get("objective", "latency")))
    horizon = float(data.get("horizon_s", 300.0))
    if not horizon > 0:
        raise DemandError("horizon_s must be > 0")
    return Demand(tuple(services), obj, horizon)


def _service(raw: Mapping[str, Any], base: Path | None) -> Service:
    if "model" not in raw:
        raise DemandError("missing 'model' (a simulator catalog key, alias or HF id)")
    try:
        spec = get_model(str(raw["model"]))
    except KeyError as exc:
        raise DemandError(str(exc.args[0])) from None
    name = str(raw.get("name") or spec.source or spec.name)
    if "trace" in raw:
        path = Path(str(raw["trace"]))
        if base is not None and not path.is_absolute():
            path = base / path
        rate, inp, out = demand_from_trace(path, name)
        rate = float(raw.get("rate", rate))
    else:
        for key in ("rate", "input", "output"):
            if key not in raw:
                raise DemandError(f"missing '{key}' (or give a 'trace')")
        rate = float(raw["rate"])
        inp, out = Lengths.parse(str(raw["input"])), Lengths.parse(str(raw["output"]))
    if not (rate > 0 and math.isfinite(rate)):
        raise DemandError(f"rate must be a positive number of requests/s, not {raw.get('rate')}")
    slo = SLO(
        ttft_s=_opt_seconds(raw.get("ttft"), "ttft"),
        tpot_s=_opt_seconds(raw.get("tpot"), "tpot"),
        e2e_s=_opt_seconds(raw.get("e2e"), "e2e"),
        percentile=int(raw.get("percentile", 90)),
    )
    if slo.percentile not in (50, 90, 95, 99):
        raise DemandError("percentile must be 50, 90, 95 or 99")
    tp = tuple(sorted({int(t) for t in raw.get("tp", (1, 2, 4, 8))}))
    if not tp or any(t not in (1, 2, 4, 8, 16) for t in tp):
        raise DemandError(f"tp must list degrees among 1, 2, 4, 8, 16; got {raw.get('tp')}")
    return Service(name=name, model=spec.name, rate=rate, input=inp, output=out, slo=slo, tp=tp,
                   precision=_precision(raw))


def _precision(raw: Mapping[str, Any]) -> Precision:
    """The checkpoint's precision from a demand entry, named as `otela sim run` names it:
    ``weight_bits``, ``act_bits``, ``kv_bits`` (16 unless given) and ``weight_format``
    (one of the simulator's formats; by default the one checkpoints of those bits ship
    in: 8 bits fp8, 4 bits int4-g128, or nvfp4 with 4-bit activations)."""
    bits = {}
    for key in BITS_KEYS:
        try:
            bits[key] = stored_bits(raw.get(key, 16))
        except ValueError as exc:
            raise DemandError(f"{key} {exc}") from None
    fmt = str(raw.get("weight_format", ""))
    if fmt and fmt not in WEIGHT_FORMATS:
        raise DemandError(f"weight_format {fmt!r} is not one of {', '.join(WEIGHT_FORMATS)}")
    return Precision(bits["weight_bits"], bits["act_bits"], bits["kv_bits"], weight_format=fmt)


def _opt_seconds(value: Any, what: str) -> float | None:
    if value is None:
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise DemandError(f"{what} must be seconds, not {value!r}") from None
    if not v > 0:
        raise DemandError(f"{what} must be > 0 seconds")
    return v


def demand_from_trace(path: Path, model: str | None = None) -> tuple[float, Lengths, Lengths]:
    """Rate and empirical length distributions of the requests for `model` in an otela trace
    (or any trace `traces.io` reads); all requests when the trace names no such model."""
    from otela.tracing.schema import TraceError
    from traces.io import read_trace

    try:
        trace = read_trace(path)
    except (OSError, TraceError, ValueError) as exc:
        raise DemandError(f"cannot read trace {path}: {exc}") from None
    recs = trace.records
    if model is not None and any(r.model == model for r in recs):
        recs = [r for r in recs if r.model == model]
    if len(recs) < 2:
        raise DemandError(f"trace {path} has fewer than 2 requests for {model!r}")
    arrivals = sorted(r.arrival for r in recs)
    span = arrivals[-1] - arrivals[0]
    if span <= 0:
        raise DemandError(f"trace {path}: all requests arrive at once; give 'rate'")
    rate = (len(recs) - 1) / span
    inp = Lengths.empirical([max(1, r.input_tokens) for r in recs], "input")
    out = Lengths.empirical([max(1, r.output_tokens) for r in recs], "output")
    return rate, inp, out

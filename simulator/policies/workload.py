"""Cluster workloads: requests that name a model and a service tier.

The single-deployment simulator's `Workload` has arrivals and lengths only; the companion
policies also need to know which model a request asks for (Prism, SageServe) and which tier it
belongs to (SageServe's interactive and batch tiers). The extra columns ride alongside one
`Workload` so the engine and the report code stay unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from otela.tracing.schema import HEADER_KEY, TraceRecord, make_header
from simulator.workload import Workload, load_trace, workload_from_trace
from traces.io import Trace, read_trace

DEFAULT_TIER = "default"


@dataclass
class Part:
    """One slice of a generated workload: arrivals and lengths of one model and tier."""

    arrival: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    model: str
    tier: str = DEFAULT_TIER


@dataclass
class ClusterWorkload:
    """A `Workload` plus, per request, the index of its model and of its tier."""

    base: Workload
    model: np.ndarray  # index into `models`
    models: tuple[str, ...]
    tier: np.ndarray  # index into `tiers`
    tiers: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.base)

    @property
    def duration(self) -> float:
        return float(self.base.arrival[-1]) if len(self) else 0.0

    def model_name(self, r: int) -> str:
        return self.models[int(self.model[r])]

    def tier_name(self, r: int) -> str:
        return self.tiers[int(self.tier[r])]

    def model_mask(self, name: str) -> np.ndarray:
        if name not in self.models:
            return np.zeros(len(self), dtype=bool)
        return self.model == self.models.index(name)

    def tier_mask(self, name: str) -> np.ndarray:
        if name not in self.tiers:
            return np.zeros(len(self), dtype=bool)
        return self.tier == self.tiers.index(name)

    def only_model(self, name: str) -> ClusterWorkload:
        """The requests of one model (a single-model policy on a multi-model trace)."""
        keep = self.model_mask(name)
        if not keep.any():
            raise ValueError(f"no requests for model {name!r} (models: {', '.join(self.models)})")
        return _subset(self, keep)

    def window(self, start: float, end: float) -> ClusterWorkload:
        """Requests arriving in [start, end), shifted so `start` becomes 0."""
        keep = (self.base.arrival >= start) & (self.base.arrival < end)
        out = _subset(self, keep)
        out.base.arrival = out.base.arrival - start
        return out

    # ---- construction ---------------------------------------------------------------
    @classmethod
    def from_parts(cls, parts: Sequence[Part]) -> ClusterWorkload:
        """Merge generated slices into one workload sorted by arrival time."""
        models = tuple(dict.fromkeys(p.model for p in parts))
        tiers = tuple(dict.fromkeys(p.tier for p in parts))
        if not parts:
            raise ValueError("a workload needs at least one part")
        arr = np.concatenate([np.asarray(p.arrival, float) for p in parts])
        inp = np.concatenate([np.asarray(p.input_len, np.int64) for p in parts])
        out = np.concatenate([np.asarray(p.output_len, np.int64) for p in parts])
        mi = np.concatenate([np.full(len(p.arrival), models.index(p.model)) for p in parts])
        ti = np.concatenate([np.full(len(p.arrival), tiers.index(p.tier)) for p in parts])
        order = np.argsort(arr, kind="stable")
        base = Workload.from_arrays(arr[order], inp[order], out[order])
        return cls(base, mi[order].astype(np.int64), models, ti[order].astype(np.int64), tiers)

    @classmethod
    def single(cls, wl: Workload, model: str, tier: str = DEFAULT_TIER) -> ClusterWorkload:
        """A one-model workload (the generators of `simulator.workload`)."""
        n = len(wl)
        return cls(wl, np.zeros(n, np.int64), (model,), np.zeros(n, np.int64), (tier,))

    @classmethod
    def from_trace(cls, trace: Trace) -> ClusterWorkload:
        """An otela trace: the model per record, the tier from an extra `tier` field."""
        recs = sorted(trace.records, key=lambda r: r.arrival)
        base = workload_from_trace(Trace(trace.header, recs))
        models = tuple(dict.fromkeys(r.model for r in recs))
        tiers = tuple(dict.fromkeys(_tier(r) for r in recs)) or (DEFAULT_TIER,)
        mi = np.array([models.index(r.model) for r in recs], np.int64)
        ti = np.array([tiers.index(_tier(r)) for r in recs], np.int64)
        return cls(base, mi, models, ti, tiers)

    def to_trace(self, source: str = "otela companion scenario") -> Trace:
        """The workload as an otela trace (tier in each record's extra fields), so a scenario
        can be written once and replayed by `otela sim compare --trace`."""
        b = self.base
        recs = [
            TraceRecord(
                arrival=float(b.arrival[i]),
                model=self.model_name(i),
                input_tokens=int(b.input_len[i]),
                output_tokens=int(b.output_len[i]),
                request_id=f"r{i}",
                max_tokens=int(b.output_len[i]),
                extra={} if self.tier_name(i) == DEFAULT_TIER else {"tier": self.tier_name(i)},
            )
            for i in range(len(self))
        ]
        return Trace(make_header(source, start_time=0.0), recs)


def load_cluster_workload(path: str | Path, default_model: str | None = None) -> ClusterWorkload:
    """Read a trace file: an otela trace keeps models and tiers; a plain CSV/JSONL trace has
    no model column, so all of it is `default_model`'s."""
    p = Path(path)
    if _is_otela(p):
        return ClusterWorkload.from_trace(read_trace(p))
    if default_model is None:
        raise ValueError(f"{p}: not an otela trace (no model column); give --model")
    return ClusterWorkload.single(load_trace(p), default_model)


def _is_otela(p: Path) -> bool:
    if p.name.endswith(".gz"):
        return True
    with p.open(encoding="utf-8", errors="replace") as fh:
        return HEADER_KEY in fh.readline()


def _tier(r: TraceRecord) -> str:
    t = r.extra.get("tier")
    return str(t) if t not in (None, "") else DEFAULT_TIER


def _subset(w: ClusterWorkload, keep: np.ndarray) -> ClusterWorkload:
    b = w.base
    base = Workload.from_arrays(
        b.arrival[keep], b.input_len[keep], b.output_len[keep], b.prefix_hash[keep],
        b.prefix_len[keep],
    )
    return ClusterWorkload(base, w.model[keep], w.models, w.tier[keep], w.tiers)

"""Workloads: request arrival processes, length distributions and trace files.

A workload is a set of column arrays (arrival time, input/output lengths, optional prefix
hash and length for prefix caching) so the engine and reports can stay vectorised.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from otela.tracing.schema import HEADER_KEY
from traces.distributions import gamma_arrivals, poisson_arrivals, renewal_arrivals, sample_lengths
from traces.io import Trace, read_trace


@dataclass
class Workload:
    """Requests sorted by arrival time (seconds from the start of the run)."""

    arrival: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    prefix_hash: np.ndarray  # -1 where a request shares no cached prefix
    prefix_len: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.arrival)
        for name in ("input_len", "output_len", "prefix_hash", "prefix_len"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries, expected {n}")
        if n and (np.min(self.input_len) < 1 or np.min(self.output_len) < 1):
            raise ValueError("input and output lengths must be >= 1 token")
        order = np.argsort(self.arrival, kind="stable")
        for name in ("arrival", "input_len", "output_len", "prefix_hash", "prefix_len"):
            setattr(self, name, np.asarray(getattr(self, name))[order])
        self.prefix_len = np.minimum(self.prefix_len, self.input_len)

    def __len__(self) -> int:
        return len(self.arrival)

    @property
    def duration(self) -> float:
        return float(self.arrival[-1] - self.arrival[0]) if len(self) else 0.0

    @classmethod
    def from_arrays(
        cls,
        arrival: np.ndarray | list[float],
        input_len: np.ndarray | list[int],
        output_len: np.ndarray | list[int],
        prefix_hash: np.ndarray | list[int] | None = None,
        prefix_len: np.ndarray | list[int] | None = None,
    ) -> Workload:
        a = np.asarray(arrival, dtype=float)
        n = len(a)
        return cls(
            arrival=a,
            input_len=np.asarray(input_len, dtype=np.int64),
            output_len=np.asarray(output_len, dtype=np.int64),
            prefix_hash=np.full(n, -1, np.int64)
            if prefix_hash is None
            else np.asarray(prefix_hash, np.int64),
            prefix_len=np.zeros(n, np.int64)
            if prefix_len is None
            else np.asarray(prefix_len, np.int64),
        )


# Arrival processes and length distributions live in traces.distributions (one pure core
# for the simulator and `otela trace gen`); re-exported here for existing callers.
__all__ = [
    "Workload",
    "gamma_arrivals",
    "load_trace",
    "poisson_arrivals",
    "sample_lengths",
    "synthetic",
    "workload_from_trace",
]


def synthetic(
    rate: float,
    duration: float | None = None,
    n: int | None = None,
    input_dist: str = "fixed:512",
    output_dist: str = "fixed:128",
    cv: float = 1.0,
    seed: int = 0,
    prefix_groups: int = 0,
    prefix_len: int = 0,
) -> Workload:
    """Generated workload: Poisson (cv=1) or Gamma arrivals for `duration` s or `n` requests.

    `prefix_groups` > 0 gives each request one of that many shared system prompts of
    `prefix_len` tokens (Zipf-ish popularity), to exercise prefix caching.
    """
    rng = np.random.default_rng(seed)
    if n is None:
        if duration is None:
            raise ValueError("give duration or n")
        n = max(1, int(rate * duration * 1.2 + 10 * np.sqrt(rate * duration) + 10))
    arr = renewal_arrivals(rate, cv, n, rng)
    if duration is not None:
        arr = arr[arr < duration]
    n = len(arr)
    inp = sample_lengths(input_dist, n, rng)
    out = sample_lengths(output_dist, n, rng)
    ph = np.full(n, -1, np.int64)
    pl = np.zeros(n, np.int64)
    if prefix_groups > 0 and prefix_len > 0:
        w = 1.0 / np.arange(1, prefix_groups + 1)
        ph = rng.choice(prefix_groups, size=n, p=w / w.sum()).astype(np.int64)
        inp = inp + prefix_len
        pl = np.full(n, prefix_len, np.int64)
    return Workload.from_arrays(arr, inp, out, ph, pl)


_COLS = {
    "arrival": ("arrival", "arrival_time", "timestamp", "time", "t"),
    "input_len": (
        "input_len",
        "input_tokens",
        "prompt_tokens",
        "num_prefill_tokens",
        "context_tokens",
    ),
    "output_len": (
        "output_len",
        "output_tokens",
        "completion_tokens",
        "num_decode_tokens",
        "generated_tokens",
    ),
    "prefix_hash": ("prefix_hash", "prefix_id"),
    "prefix_len": ("prefix_len", "prefix_tokens", "cached_tokens"),
}


def _pick(row: dict[str, object], field: str) -> object | None:
    for c in _COLS[field]:
        if c in row and row[c] not in (None, ""):
            return row[c]
    return None


def _hash(v: object) -> int:
    if isinstance(v, int):
        return v & 0x7FFF_FFFF_FFFF_FFFF
    s = str(v)
    return int(s) if s.isdigit() else abs(hash(s)) & 0x7FFF_FFFF_FFFF_FFFF


def load_trace(path: str | Path) -> Workload:
    """Load a CSV or JSON-lines trace. Columns (any of the aliases in `_COLS`): arrival time in
    seconds (or ISO-8601 timestamps), input and output token counts, optional prefix hash/length.
    Arrival times are shifted so the first request arrives at t=0."""
    p = Path(path)
    if _is_otela_trace(p):
        return workload_from_trace(read_trace(p))
    rows: list[dict[str, object]]
    if p.suffix in (".jsonl", ".json", ".ndjson"):
        text = p.read_text()
        rows = (
            json.loads(text)
            if text.lstrip().startswith("[")
            else [json.loads(line) for line in text.splitlines() if line.strip()]
        )
    else:
        with p.open(newline="") as fh:
            rows = list(csv.DictReader(fh))
    arr, inp, out, ph, pl = [], [], [], [], []
    for i, r in enumerate(rows):
        a, x, y = _pick(r, "arrival"), _pick(r, "input_len"), _pick(r, "output_len")
        if a is None or x is None or y is None:
            raise ValueError(
                f"{p}:{i + 1}: need arrival, input and output columns; got {sorted(r)}"
            )
        arr.append(_to_seconds(a))
        inp.append(max(1, int(float(str(x)))))
        out.append(max(1, int(float(str(y)))))
        h = _pick(r, "prefix_hash")
        ph.append(-1 if h is None else _hash(h))
        q = _pick(r, "prefix_len")
        pl.append(0 if q is None or h is None else int(float(str(q))))
    a0 = min(arr) if arr else 0.0
    return Workload.from_arrays(np.array(arr) - a0, inp, out, ph, pl)


def _is_otela_trace(p: Path) -> bool:
    if p.name.endswith(".gz"):
        return True
    with p.open(encoding="utf-8", errors="replace") as fh:
        return HEADER_KEY in fh.readline()


def workload_from_trace(trace: Trace) -> Workload:
    """The arrivals and lengths of an otela trace (requests with 0 output tokens, e.g. failed
    ones in a replay result, are simulated as 1-token answers). Prefix hashes become ids."""
    recs = trace.records
    a0 = recs[0].arrival if recs else 0.0
    return Workload.from_arrays(
        [r.arrival - a0 for r in recs],
        [max(1, r.input_tokens) for r in recs],
        [max(1, r.output_tokens) for r in recs],
        [-1 if r.prefix_hash is None else _hash(r.prefix_hash) for r in recs],
        [r.prefix_len or 0 if r.prefix_hash is not None else 0 for r in recs],
    )


def _to_seconds(v: object) -> float:
    try:
        return float(str(v))
    except ValueError:
        from datetime import datetime

        return datetime.fromisoformat(str(v).replace("Z", "+00:00")).timestamp()

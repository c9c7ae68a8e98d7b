"""Prism's decisions, free of simulation: where models go (KV-pressure-ratio placement,
Algorithm 1), which idle model to evict, and in what order a GPU admits queued requests
(Moore-Hodgson on TTFT deadlines, Algorithm 2).

KVPR of a GPU = (sum of the SLO-weighted request rates of its models) / (memory left for KV
once their weights are loaded). A model's SLO-weighted rate is its KV demand per second,
rate x KV bytes of an average request, divided by its TTFT SLO: a tighter SLO means the
memory is needed sooner. (The paper's formulas did not survive the text conversion; this is
the definition its prose gives.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelLoad:
    """What placement knows about one active model."""

    name: str
    weighted_rate: float  # SLO-weighted request rate (KV bytes per second per second of SLO)
    weight_bytes: float  # weights + workspace it takes on a GPU
    current: int | None = None  # GPU it is on now (None: not loaded)


def kvpr(weighted: float, kv_bytes: float) -> float:
    """KV pressure ratio of a GPU; infinite when no memory is left for KV."""
    return weighted / kv_bytes if kv_bytes > 0 else float("inf")


def place(
    models: Sequence[ModelLoad], gpu_bytes: Sequence[float], threshold: float = 0.1
) -> dict[str, int]:
    """Algorithm 1: models by weighted rate (descending), each to the GPU whose KVPR after
    adding it is lowest (weights must fit). A model stays on its current GPU unless moving
    lowers the KVPR it would see by more than `threshold` (relative), since a migration
    reloads its weights. Returns model -> GPU; models that fit nowhere are left out."""
    weighted = [0.0] * len(gpu_bytes)
    free = list(gpu_bytes)
    out: dict[str, int] = {}
    for m in sorted(models, key=lambda x: (-x.weighted_rate, x.name)):
        options = [
            (kvpr(weighted[g] + m.weighted_rate, free[g] - m.weight_bytes), g)
            for g in range(len(free)) if free[g] - m.weight_bytes > 0
        ]
        if not options:
            continue
        best_p, best = min(options)
        if m.current is not None and m.current != best:
            cur = [p for p, g in options if g == m.current]
            if cur and cur[0] - best_p <= threshold * cur[0]:
                best = m.current
        out[m.name] = best
        weighted[best] += m.weighted_rate
        free[best] -= m.weight_bytes
    return out


def evict_order(
    idle_s: Mapping[str, float], slo_s: Mapping[str, float], min_idle_s: float
) -> list[str]:
    """Idle models that may be evicted, first to go first: larger TTFT SLO first (they can
    best afford the reload), then longer idle."""
    cands = [m for m, t in idle_s.items() if t >= min_idle_s]
    return sorted(cands, key=lambda m: (-slo_s.get(m, 0.0), -idle_s[m], m))


@dataclass(frozen=True)
class Queued:
    """A request waiting in a GPU-level queue."""

    id: int
    deadline: float  # arrival + TTFT SLO: when its prefill must be done
    prefill_s: float  # its prompt length / the engine's chunked-prefill speed


def moore_hodgson(requests: Sequence[Queued], now: float) -> tuple[list[Queued], list[Queued]]:
    """Algorithm 2: earliest deadline first, dropping from the schedule the longest job each
    time the newest one would be late; returns (accepted in order, late ones). Minimises the
    number of requests that miss their deadline when prefills run one after another."""
    accepted: list[Queued] = []
    late: list[Queued] = []
    t = now
    for q in sorted(requests, key=lambda x: (x.deadline, x.id)):
        accepted.append(q)
        t += q.prefill_s
        if t > q.deadline:
            worst = max(accepted, key=lambda x: (x.prefill_s, x.id))
            accepted.remove(worst)
            late.append(worst)
            t -= worst.prefill_s
    return accepted, late

"""The workloads of OSERVE §6.3: four request types (short/long input x short/long output)
mixed in the proportions of Table 1 (spatial heterogeneity, S1-S5) and changing span by span
as in Table 2 (temporal heterogeneity, T1-T4), for Llama2-70B on 16 H100s.

The paper derives its types from the Azure traces by k-means and does not list their
lengths; here a short input is ~256 tokens, a long one ~2,048, a short output ~64 and a long
one ~1,024 (lognormal spreads), all within Llama-2's 4,096-token context.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from simulator.policies.workload import ClusterWorkload, Part
from traces.distributions import LengthDist, poisson_arrivals

MODEL = "llama-2-70b"
GPU = "h100-sxm"
GPUS = 16
TYPE_NAMES = ("SILO", "LILO", "SISO", "LISO")
INPUT = {"SI": LengthDist("lognormal", (256.0, 128.0), max_len=1_024),
         "LI": LengthDist("lognormal", (2_048.0, 512.0), min_len=1_025, max_len=2_800)}
OUTPUT = {"SO": LengthDist("lognormal", (64.0, 32.0), max_len=256),
          "LO": LengthDist("lognormal", (1_024.0, 256.0), min_len=257, max_len=1_280)}

# Table 1: CV over the four proportions, then SILO/LILO/SISO/LISO (%), then OSERVE's speedup
TABLE1: dict[str, tuple[float, tuple[float, float, float, float], float]] = {
    "S1": (0.112, (26.3, 26.2, 27.3, 20.2), 1.14),
    "S2": (0.186, (30.0, 28.0, 24.2, 17.8), 1.41),
    "S3": (0.275, (18.8, 18.9, 35.5, 26.8), 1.89),
    "S4": (0.472, (13.2, 14.2, 41.1, 31.5), 2.15),
    "S5": (0.688, (8.2, 8.2, 47.1, 36.6), 2.66),
}
# Table 2: the levels a trace moves through (one span each), its CV and the average speedup
TABLE2: dict[str, tuple[tuple[str, ...], float, float]] = {
    "T1": (("S1", "S2", "S1"), 0.052, 1.23),
    "T2": (("S1", "S3", "S2"), 0.172, 1.48),
    "T3": (("S2", "S4", "S3"), 0.263, 1.82),
    "T4": (("S1", "S4", "S5"), 0.348, 1.98),
}


def mix_cv(mix: Sequence[float]) -> float:
    """Coefficient of variation of the type proportions (the paper's heterogeneity index,
    with the population standard deviation: S1's 26.3/26.2/27.3/20.2 gives 0.112)."""
    p = np.asarray(mix, dtype=float)
    return float(p.std() / p.mean())


def workload(
    mix: Sequence[float], rate: float, duration_s: float, seed: int = 0, start: float = 0.0,
    model: str = MODEL, scale: float = 1.0,
) -> ClusterWorkload:
    """Poisson arrivals at `rate` req/s split among the four types by `mix` (percentages);
    `scale` multiplies every length (0.5 fits OPT's 2,048-token context)."""
    return ClusterWorkload.from_parts(_parts(mix, rate, duration_s, seed, start, model, scale))


def _scaled(d: LengthDist, scale: float) -> LengthDist:
    if scale == 1.0:
        return d
    return LengthDist(d.kind, tuple(p * scale for p in d.params),
                      min_len=max(1, round(d.min_len * scale)), max_len=round(d.max_len * scale))


def _parts(
    mix: Sequence[float], rate: float, duration_s: float, seed: int, start: float, model: str,
    scale: float = 1.0,
) -> list[Part]:
    rng = np.random.default_rng(seed)
    p = np.asarray(mix, dtype=float) / float(np.sum(mix))
    parts = []
    for name, share in zip(TYPE_NAMES, p, strict=True):
        if share <= 0:
            continue
        r = rate * share
        arr = poisson_arrivals(r, int(r * duration_s * 1.3 + 20), rng)
        arr = arr[arr < duration_s] + start
        inp = _scaled(INPUT[name[:2]], scale).sample(len(arr), rng)
        out = _scaled(OUTPUT[name[2:]], scale).sample(len(arr), rng)
        parts.append(Part(arr, inp, out, model, name))
    return parts


def temporal(
    levels: Sequence[str], rate: float, span_s: float, seed: int = 0, model: str = MODEL,
    scale: float = 1.0,
) -> ClusterWorkload:
    """One span per level of Table 1, back to back (Table 2's traces)."""
    parts: list[Part] = []
    for i, lv in enumerate(levels):
        parts += _parts(TABLE1[lv][1], rate, span_s, seed + i, i * span_s, model, scale)
    return ClusterWorkload.from_parts(parts)

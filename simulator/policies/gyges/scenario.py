"""The workload of Gyges §6.2.4: short requests (1K-token prompts) at 60 per minute as the
background, long requests (50K-token prompts) at one per minute, served by one 8-GPU host of
TP1 instances. Output lengths are not stated for this experiment; both kinds draw them from
the production output distribution the simulator's docs use for this model (mean 674,
sd 412 tokens), capped so a short request stays within TP1's 3.75K-token limit.
"""

from __future__ import annotations

import numpy as np

from simulator.policies.workload import ClusterWorkload, Part
from traces.distributions import poisson_arrivals, sample_lengths

MODEL = "qwen2.5-32b"
GPU = "h20"
SHORT_INPUT = 1_024
LONG_INPUT = 50_000
SHORT_PER_MIN = 60.0
LONG_PER_MIN = 1.0
OUTPUT = "normal:674,412"


def workload(
    duration_s: float = 1800.0,
    load: float = 1.0,
    seed: int = 0,
    model: str = MODEL,
    short_input: int = SHORT_INPUT,
    long_input: int = LONG_INPUT,
) -> ClusterWorkload:
    """Poisson short and long streams at `load` x the paper's rates."""
    rng = np.random.default_rng(seed)
    parts = []
    for per_min, inp, tier in ((SHORT_PER_MIN, short_input, "short"),
                               (LONG_PER_MIN, long_input, "long")):
        rate = per_min / 60.0 * load
        n = int(rate * duration_s * 1.5 + 20)
        arr = poisson_arrivals(rate, n, rng)
        arr = arr[arr < duration_s]
        out = sample_lengths(OUTPUT, len(arr), rng, max_len=2_048)
        parts.append(Part(arr, np.full(len(arr), inp), out, model, tier))
    return ClusterWorkload.from_parts(parts)

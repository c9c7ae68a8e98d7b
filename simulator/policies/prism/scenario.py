"""Prism §7.3's first experiment: eight models, long-tail popularity, idle periods and bursts
(the Hyperbolic trace's character, §3.1), served by two shared H100s or one H100 each.

The traces are not public. Each model's traffic alternates busy and idle periods (popular
models are busy most of the time, tail models mostly idle, as Figure 2 shows: many models have
median idle gaps over 30 s), and within a busy period arrives in bursts (Gamma, CV 2: the
per-minute CVs above 1 of Figure 2(d)). Popularity is Zipf over the eight models, so the top
three carry about two thirds of the requests. The paper's model table lists 1B-8B models for
these runs; Llama-3.2-1B and 3B are not in otela's catalog, so their Hugging Face configs are
written out here.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from simulator.models import ModelSpec
from simulator.policies.workload import ClusterWorkload, Part
from traces.distributions import LengthDist, gamma_arrivals

GPU = "h100-sxm"

LLAMA_32_1B = ModelSpec(
    name="llama-3.2-1b", hidden=2048, layers=16, heads=32, kv_heads=8, head_dim=64,
    intermediate=8192, vocab=128256, tie_embeddings=True, max_context=131072,
    source="meta-llama/Llama-3.2-1B-Instruct (config.json)",
)
LLAMA_32_3B = ModelSpec(
    name="llama-3.2-3b", hidden=3072, layers=28, heads=24, kv_heads=8, head_dim=128,
    intermediate=8192, vocab=128256, tie_embeddings=True, max_context=131072,
    source="meta-llama/Llama-3.2-3B-Instruct (config.json)",
)
EXTRA_MODELS: Mapping[str, ModelSpec] = {m.name: m for m in (LLAMA_32_1B, LLAMA_32_3B)}

# most popular first
MODELS = (
    "llama-3.1-8b", "qwen2.5-7b", "llama-3.2-3b", "mistral-7b",
    "qwen3-8b", "llama-3.2-1b", "llama-2-7b", "qwen3-1.7b",
)
INPUT = LengthDist("lognormal", (800.0, 700.0), min_len=8, max_len=4_000)
OUTPUT = LengthDist("lognormal", (200.0, 180.0), min_len=2, max_len=1_000)
BURST_CV = 2.0


def popularity(n: int = len(MODELS), s: float = 1.0) -> np.ndarray:
    w = 1.0 / np.arange(1, n + 1) ** s
    return w / w.sum()


def _on_off(duration: float, busy_s: float, idle_s: float,
            rng: np.random.Generator) -> list[tuple[float, float]]:
    """Alternating busy/idle periods (exponential lengths), starting at a random phase."""
    t = -rng.uniform(0, busy_s + idle_s)
    out = []
    on = bool(rng.random() < busy_s / (busy_s + idle_s))
    while t < duration:
        d = rng.exponential(busy_s if on else idle_s)
        if on:
            a, b = max(t, 0.0), min(t + d, duration)
            if b > a:
                out.append((a, b))
        t += d
        on = not on
    return out


def workload(total_rate: float, duration_s: float = 1800.0, seed: int = 0,
             models: tuple[str, ...] = MODELS) -> ClusterWorkload:
    """`total_rate` req/s on average over all models."""
    rng = np.random.default_rng(seed)
    parts = []
    for rank, (name, share) in enumerate(zip(models, popularity(len(models)), strict=True)):
        # popular models are busy most of the time; the tail is mostly idle
        busy = 300.0 if rank < 2 else 60.0
        idle = 20.0 if rank < 2 else 30.0 + 30.0 * rank
        duty = busy / (busy + idle)
        rate_on = total_rate * share / duty
        arr: list[np.ndarray] = []
        for a, b in _on_off(duration_s, busy, idle, rng):
            n = int(rate_on * (b - a) * 2 + 20)
            x = a + gamma_arrivals(rate_on, BURST_CV, n, rng)
            arr.append(x[x < b])
        times = np.sort(np.concatenate(arr)) if arr else np.zeros(0)
        parts.append(Part(times, INPUT.sample(len(times), rng), OUTPUT.sample(len(times), rng),
                          name))
    return ClusterWorkload.from_parts(parts)

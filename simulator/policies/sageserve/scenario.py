"""A day of SageServe-like traffic: one model in three US regions, interactive tiers (IW-F,
IW-N) with a daily cycle and minute-scale bursts, and a flat, non-periodic batch tier (NIW).

The O365 traces are not public; this follows the paper's characterisation (§3): IW load has
strong diurnal periodicity and East > Central > West, NIW is lower, steady and almost absent
in West, IW-F is the largest tier and IW is ~3/4 of requests, most prompts are over 1K tokens
and most outputs under 1K. Regions are encoded in the tier label as ``TIER@REGION``. Earlier
days of the same process (other seeds) are the forecaster's history, as the paper's ARIMA is
fitted on past weeks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from simulator.policies.workload import ClusterWorkload, Part
from traces.distributions import Diurnal, LengthDist, arrivals

MODEL = "llama-2-70b"
GPU = "a100-80g-sxm"
TP = 4
DAY_S = 86_400.0
REGIONS: Mapping[str, float] = {"east": 0.5, "central": 0.3, "west": 0.2}  # share of IW
TIERS: Mapping[str, float] = {"IW-F": 0.47, "IW-N": 0.25, "NIW": 0.28}
NIW_REGIONS: Mapping[str, float] = {"east": 0.6, "central": 0.4}
PEAK_S = 14 * 3600.0  # daily IW peak at 14:00
AMPLITUDE = 0.6
IW_CV = 1.5  # minute-scale burstiness of interactive arrivals
INPUT = LengthDist("lognormal", (1_500.0, 1_000.0), min_len=16, max_len=3_000)
OUTPUT = LengthDist("lognormal", (250.0, 200.0), min_len=4, max_len=1_000)


def tier_label(tier: str, region: str) -> str:
    return f"{tier}@{region}"


def parse_label(label: str) -> tuple[str, str]:
    """(tier, region) of a ``TIER@REGION`` label; region 'default' when there is none."""
    tier, _, region = label.partition("@")
    return tier, region or "default"


def day(rate: float, seed: int = 0, duration_s: float = DAY_S, model: str = MODEL,
        start_s: float = 0.0,
        bursts: Sequence[tuple[float, float, float]] = ()) -> ClusterWorkload:
    """`duration_s` of traffic from `start_s` into the day, at a daily mean of `rate` req/s.

    `bursts` adds unforecast spikes, the paper's Figure 16a test ("randomly increasing the
    incoming load to 8x"): (start, length, factor) windows, in seconds from `start_s`, during
    which every interactive stream runs at `factor` times its rate (extra Poisson arrivals
    at factor - 1 times the stream's diurnal rate at the window's middle)."""
    rng = np.random.default_rng(seed)
    parts: list[Part] = []
    curve = Diurnal(AMPLITUDE, DAY_S, PEAK_S - start_s)
    for tier, share in TIERS.items():
        regions = NIW_REGIONS if tier == "NIW" else REGIONS
        for region, rshare in regions.items():
            r = rate * share * rshare
            if tier == "NIW":
                arr = arrivals(r, rng, duration=duration_s)
            else:
                arr = arrivals(r, rng, duration=duration_s, cv=IW_CV, diurnal=curve)
                extra = [
                    b0 + arrivals(r * (f - 1) * float(curve.factor(np.asarray(b0 + bl / 2))),
                                  rng, duration=bl)
                    for b0, bl, f in bursts if f > 1 and b0 < duration_s]
                arr = np.sort(np.concatenate([arr, *extra])) if extra else arr
            parts.append(Part(arr, INPUT.sample(len(arr), rng), OUTPUT.sample(len(arr), rng),
                              model, tier_label(tier, region)))
    return ClusterWorkload.from_parts(parts)


def history(
    rate: float, days: int = 3, bin_s: float = 300.0, seed: int = 1_000, model: str = MODEL
) -> dict[tuple[str, str], np.ndarray]:
    """Interactive prompt tokens/s per `bin_s` bin, per (model, region), over `days` earlier
    days: what the load predictor has seen before the simulated day."""
    out: dict[tuple[str, str], list[np.ndarray]] = {}
    bins = int(DAY_S // bin_s)
    for d in range(days):
        wl = day(rate, seed + d, model=model)
        b = wl.base
        for region in REGIONS:
            mask = np.zeros(len(wl), dtype=bool)
            for tier in TIERS:
                if tier != "NIW":
                    mask |= wl.tier_mask(tier_label(tier, region))
            idx = np.minimum((b.arrival[mask] // bin_s).astype(int), bins - 1)
            tok = np.bincount(idx, weights=b.input_len[mask], minlength=bins) / bin_s
            out.setdefault((model, region), []).append(tok)
    return {k: np.concatenate(v) for k, v in out.items()}

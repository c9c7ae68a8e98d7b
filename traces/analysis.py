"""The OpenTela paper's sec. 6 views of a trace, computed (pure; plotting is in plots.py).

* arrivals over time (requests and tokens per bin), overall and per model;
* model usage (tokens per model, ranked) and per-model burstiness: peak-to-average tokens
  per bin over *active* bins (bins with at least one request), as the paper defines it;
* input/output length distributions per model with the aggregate P50/P95/P99;
* the output-token ratio output / (input + output) over time;
* prefix reuse: the fraction of input tokens covered by a prefix already seen;
* latency distributions (TTFT, TPOT, end-to-end) and per-provider / per-node breakdowns.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from otela.tracing.schema import TraceRecord
from traces.stats import dist

NICE_BINS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 86400)


def bin_width(duration: float, target_bins: int = 120) -> float:
    """A readable bin width giving about `target_bins` bins (one minute for long traces)."""
    if duration >= 3600:
        return 60.0
    want = max(duration, 1e-3) / target_bins
    return next((b for b in NICE_BINS if b >= want), NICE_BINS[-1])


@dataclass
class Analysis:
    """Everything the plots, the HTML report and the text summary show."""

    n: int
    duration: float
    bin_s: float
    bins: np.ndarray  # left edges
    requests_per_bin: np.ndarray
    tokens_per_bin: np.ndarray
    per_model_bins: dict[str, np.ndarray]
    model_tokens: list[tuple[str, int, int, int]]  # (model, requests, input, output) ranked
    burstiness: dict[str, float]  # peak / mean tokens per active bin
    lengths: dict[str, dict[str, np.ndarray]]  # model -> input/output arrays ("*" = all)
    length_marks: dict[str, dict[str, float]]  # input/output -> p50/p95/p99 over all
    output_ratio_bins: np.ndarray  # per bin: output / (input + output) tokens
    prefix_reuse: dict[str, float]  # model -> reused input fraction (only if prefixes)
    latency: dict[str, dict[str, np.ndarray]]  # model -> ttft/tpot/e2e arrays ("*" = all)
    providers: list[dict[str, Any]]
    nodes: list[dict[str, Any]]
    errors: dict[str, int]
    extra: dict[str, Any] = field(default_factory=dict)


def analyze(records: list[TraceRecord], bin_s: float | None = None) -> Analysis:
    """Compute the sec. 6 views of `records` (sorted or not)."""
    recs = sorted(records, key=lambda r: r.arrival)
    n = len(recs)
    t = np.array([r.arrival for r in recs], dtype=float)
    t0 = float(t[0]) if n else 0.0
    rel = t - t0
    duration = float(rel[-1]) if n else 0.0
    width = bin_s or bin_width(duration)
    nb = max(1, int(np.floor(duration / width)) + 1)
    idx = np.minimum((rel / width).astype(int), nb - 1) if n else np.zeros(0, int)
    inp = np.array([r.input_tokens for r in recs], dtype=float)
    out = np.array([r.output_tokens for r in recs], dtype=float)
    tok = inp + out
    req_bins = np.bincount(idx, minlength=nb).astype(float)
    tok_bins = np.bincount(idx, weights=tok, minlength=nb)
    out_bins = np.bincount(idx, weights=out, minlength=nb)
    ratio = np.divide(out_bins, tok_bins, out=np.full(nb, np.nan), where=tok_bins > 0)
    models = sorted({r.model for r in recs})
    by_model: dict[str, np.ndarray] = {m: np.array([r.model == m for r in recs]) for m in models}
    per_model_bins = {
        m: np.bincount(idx[mask], weights=tok[mask], minlength=nb) for m, mask in by_model.items()
    }
    usage = sorted(
        (
            (m, int(mask.sum()), int(inp[mask].sum()), int(out[mask].sum()))
            for m, mask in by_model.items()
        ),
        key=lambda x: -(x[2] + x[3]),
    )
    burst = {}
    for m, b in per_model_bins.items():
        active = b[b > 0]
        burst[m] = float(active.max() / active.mean()) if len(active) else 0.0
    lengths = {"*": {"input": inp, "output": out}}
    lengths.update({m: {"input": inp[k], "output": out[k]} for m, k in by_model.items()})
    marks = {
        name: {f"p{q}": float(np.percentile(arr, q)) if n else 0.0 for q in (50, 95, 99)}
        for name, arr in (("input", inp), ("output", out))
    }
    latency = {"*": _latency(recs)}
    latency.update({m: _latency([r for r in recs if r.model == m]) for m in models})
    errors: dict[str, int] = defaultdict(int)
    for r in recs:
        if not r.ok:
            errors[r.error or f"http_{r.status}"] += 1
    return Analysis(
        n=n,
        duration=duration,
        bin_s=width,
        bins=np.arange(nb) * width,
        requests_per_bin=req_bins,
        tokens_per_bin=tok_bins,
        per_model_bins=per_model_bins,
        model_tokens=usage,
        burstiness=burst,
        lengths=lengths,
        length_marks=marks,
        output_ratio_bins=ratio,
        prefix_reuse=_prefix_reuse(recs),
        latency=latency,
        providers=_breakdown(recs, "provider"),
        nodes=_breakdown(recs, "node"),
        errors=dict(sorted(errors.items(), key=lambda kv: -kv[1])),
    )


def _latency(recs: list[TraceRecord]) -> dict[str, np.ndarray]:
    ok = [r for r in recs if r.ok]
    return {
        "ttft": np.array([r.ttft for r in ok if r.ttft is not None], dtype=float),
        "tpot": np.array([x for r in ok if (x := r.tpot) is not None], dtype=float),
        "e2e": np.array([r.e2e for r in ok if r.e2e is not None], dtype=float),
    }


def _prefix_reuse(recs: list[TraceRecord]) -> dict[str, float]:
    """Per model: input tokens covered by a prefix hash seen earlier / all input tokens."""
    if not any(r.prefix_hash for r in recs):
        return {}
    seen: set[tuple[str, str]] = set()
    reused: dict[str, float] = defaultdict(float)
    total: dict[str, float] = defaultdict(float)
    for r in recs:
        total[r.model] += r.input_tokens
        if r.prefix_hash:
            key = (r.model, r.prefix_hash)
            if key in seen:
                reused[r.model] += min(r.prefix_len or 0, r.input_tokens)
            seen.add(key)
    return {m: reused[m] / total[m] if total[m] else 0.0 for m in sorted(total)}


def _breakdown(recs: list[TraceRecord], attr: str) -> list[dict[str, Any]]:
    groups: dict[str, list[TraceRecord]] = defaultdict(list)
    for r in recs:
        v = getattr(r, attr)
        if v:
            groups[v].append(r)
    rows = []
    for name, rs in groups.items():
        ok = [r for r in rs if r.ok]
        rows.append(
            {
                attr: name,
                "requests": len(rs),
                "failed": len(rs) - len(ok),
                "output_tokens": sum(r.output_tokens for r in ok),
                "ttft_p50": dist([r.ttft for r in ok if r.ttft is not None])["p50"],
                "e2e_p50": dist([r.e2e for r in ok if r.e2e is not None])["p50"],
            }
        )
    return sorted(rows, key=lambda x: -x["requests"])

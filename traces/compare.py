"""Per-metric comparison of two traces (e.g. simulated vs replayed): pure.

Error = (first - second) / second, so `compare SIM REAL` reports how far the prediction is
from the measurement, with the sign telling optimistic (negative latency error) from
pessimistic.
"""

from __future__ import annotations

from typing import Any

from otela.tracing.schema import TraceRecord
from traces.stats import SLO, summarize

METRICS: tuple[tuple[str, str | None, str], ...] = (
    ("ttft_s", "p50", "TTFT p50"),
    ("ttft_s", "p90", "TTFT p90"),
    ("ttft_s", "p99", "TTFT p99"),
    ("tpot_s", "p50", "TPOT p50"),
    ("tpot_s", "p90", "TPOT p90"),
    ("tpot_s", "p99", "TPOT p99"),
    ("e2e_s", "p50", "end-to-end p50"),
    ("e2e_s", "p90", "end-to-end p90"),
    ("e2e_s", "p99", "end-to-end p99"),
    ("throughput_rps", None, "throughput (req/s)"),
    ("output_tokens_per_s", None, "output tokens/s"),
    ("goodput_rps", None, "goodput (req/s)"),
)


def _get(summary: dict[str, Any], key: str, sub: str | None) -> float | None:
    v = summary.get(key)
    if sub is not None:
        v = v.get(sub) if isinstance(v, dict) else None
    return float(v) if isinstance(v, int | float) else None


def compare(
    first: list[TraceRecord], second: list[TraceRecord], slo: SLO | None = None
) -> list[dict[str, Any]]:
    """One row per metric: both values and the relative error of `first` against `second`."""
    a, b = summarize(first, slo), summarize(second, slo)
    rows = []
    for key, sub, label in METRICS:
        x, y = _get(a, key, sub), _get(b, key, sub)
        err = (x - y) / y if x is not None and y not in (None, 0.0) else None
        rows.append({"metric": label, "first": x, "second": y, "error": err})
    return rows


def max_abs_error(rows: list[dict[str, Any]], metrics: tuple[str, ...]) -> float:
    """Largest |error| among the named metrics (inf if one cannot be compared)."""
    errs = [r["error"] for r in rows if r["metric"] in metrics]
    if len(errs) < len(metrics) or any(e is None for e in errs):
        return float("inf")
    return max(abs(e) for e in errs)

"""Summary statistics of a trace with measured latencies: pure functions over records.

Used by replay (its summary), analysis (the text summary and report) and compare.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from otela.tracing.schema import TraceRecord

PCTS = (50, 90, 99)


@dataclass(frozen=True)
class SLO:
    """Latency objectives for goodput: a request counts only if it succeeded and met both."""

    ttft_s: float = 10.0
    tpot_s: float = 0.1


def dist(values: list[float] | np.ndarray) -> dict[str, float | None]:
    """mean, p50, p90, p99 and max (None for no values)."""
    x = np.asarray([v for v in values if v is not None], dtype=float)
    if len(x) == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    p = np.percentile(x, PCTS)
    out: dict[str, float | None] = {"mean": float(x.mean())}
    out.update({f"p{q}": float(v) for q, v in zip(PCTS, p, strict=True)})
    out["max"] = float(x.max())
    return out


def columns(records: list[TraceRecord]) -> dict[str, np.ndarray]:
    """Column arrays (NaN for missing values)."""

    def col(get: Any) -> np.ndarray:
        return np.array([np.nan if (v := get(r)) is None else v for r in records], dtype=float)

    return {
        "arrival": col(lambda r: r.arrival),
        "input_tokens": col(lambda r: r.input_tokens),
        "output_tokens": col(lambda r: r.output_tokens),
        "ttft": col(lambda r: r.ttft),
        "tpot": col(lambda r: r.tpot),
        "e2e": col(lambda r: r.e2e),
        "itl_mean": col(lambda r: r.itl_mean),
        "send_lag": col(lambda r: r.send_lag),
        "ok": np.array([r.ok for r in records], dtype=bool),
    }


def summarize(records: list[TraceRecord], slo: SLO | None = None) -> dict[str, Any]:
    """Throughput, goodput under `slo`, latency distributions and errors by kind.

    The span runs from the first arrival to the last completion, so throughput is what the
    endpoint sustained over the whole run, including its drain.
    """
    slo = slo or SLO()
    n = len(records)
    ok = [r for r in records if r.ok]
    if n == 0:
        return {"requests": 0}
    start = min(r.arrival for r in records)
    end = max((r.arrival + (r.e2e or 0.0)) for r in records)
    span = max(end - start, 1e-9)
    measured = any(r.e2e is not None for r in records)
    good = [
        r
        for r in ok
        if r.ttft is not None and r.ttft <= slo.ttft_s and (r.tpot is None or r.tpot <= slo.tpot_s)
    ]
    errors = Counter(r.error or f"http_{r.status}" for r in records if not r.ok)
    out_tok = sum(r.output_tokens for r in ok)
    in_tok = sum(r.input_tokens for r in ok)
    res: dict[str, Any] = {
        "requests": n,
        "succeeded": len(ok),
        "failed": n - len(ok),
        "errors": dict(errors.most_common()),
        "duration_s": span,
        "offered_rps": (n - 1) / max(records[-1].arrival - start, 1e-9) if n > 1 else 0.0,
        "throughput_rps": len(ok) / span if measured else None,
        "output_tokens_per_s": out_tok / span if measured else None,
        "input_tokens_per_s": in_tok / span if measured else None,
        "goodput_rps": len(good) / span if measured else None,
        "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s},
        "slo_attainment": len(good) / n if measured else None,
        "input_tokens": dist([r.input_tokens for r in records]),
        "output_tokens": dist([r.output_tokens for r in records]),
        "ttft_s": dist([r.ttft for r in ok if r.ttft is not None]),
        "tpot_s": dist([t for r in ok if (t := r.tpot) is not None]),
        "itl_s": dist([r.itl_mean for r in ok if r.itl_mean is not None]),
        "e2e_s": dist([r.e2e for r in ok if r.e2e is not None]),
    }
    lags = [r.send_lag for r in records if r.send_lag is not None]
    if lags:
        res["send_lag_s"] = dist([abs(x) for x in lags])
    return res

"""Turn raw simulation arrays into per-request records and aggregate metrics.

Pure functions over numpy arrays; rendering to rich tables lives in `cli.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from simulator.engine import DONE, REJECTED, SimOutput


@dataclass(frozen=True)
class SLO:
    """Latency objectives for goodput: a request counts only if it meets both."""

    ttft_s: float = 10.0
    tpot_s: float = 0.1


def _pct(x: np.ndarray) -> dict[str, float]:
    if len(x) == 0:
        return {"mean": float("nan"), "p50": float("nan"), "p90": float("nan"), "p99": float("nan")}
    p50, p90, p99 = np.percentile(x, [50, 90, 99])
    return {"mean": float(x.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def per_request(out: SimOutput) -> dict[str, np.ndarray]:
    """Per-request latency columns (NaN where a request never got that far)."""
    q = out.req
    ttft = q.first_token - q.sent
    decode_tokens = np.maximum(q.output_len - 1, 1)
    tpot = np.where(q.output_len > 1, (q.finish - q.first_token) / decode_tokens, 0.0)
    return {
        "id": np.arange(q.n),
        "arrival": q.sent,
        "input_len": q.input_len,
        "output_len": q.output_len,
        "replica": q.replica,
        "queueing": q.first_sched - q.sent,
        "ttft": ttft,
        "tpot": tpot,
        "e2e": q.finish - q.sent,
        "max_itl": q.max_itl,
        "preemptions": q.preemptions,
        "cached_tokens": q.cached_tokens,
        "status": q.status,
    }


def kv_timeline(out: SimOutput, points: int = 200) -> list[dict[str, float]]:
    """KV occupancy (fraction of blocks) over time, averaged over replicas on a fixed grid."""
    if out.makespan <= 0:
        return []
    grid = np.linspace(0.0, out.makespan, points)
    total = np.zeros_like(grid)
    for rep in out.replicas:
        if not rep.timeline:
            continue
        t = np.array([x[0] for x in rep.timeline])
        used = np.array([x[1] for x in rep.timeline], dtype=float) / max(1, rep.total_blocks)
        pos = np.searchsorted(t, grid, side="right") - 1
        total += np.where(pos >= 0, used[np.clip(pos, 0, None)], 0.0)
    occ = total / max(1, len(out.replicas))
    return [{"t": float(a), "kv_occupancy": float(b)} for a, b in zip(grid, occ, strict=True)]


def span_s(out: SimOutput) -> float:
    """Seconds from the first request sent to the end of the last iteration: what every rate
    of `summarize` is per (at least 1 ns)."""
    q = out.req
    span = out.makespan - (float(q.sent.min()) if q.n else 0.0)
    return max(span, 1e-9)


def throughput(out: SimOutput) -> tuple[float, float]:
    """`summarize`'s throughput_rps and output_tokens_per_s (the same floats) without the
    rest of it: latency percentiles, goodput and KV occupancy that a capacity probe
    (`api.max_throughput`, run 32 times to profile OSERVE's shapes) would discard."""
    q = out.req
    done = q.status == DONE
    span = span_s(out)
    return float(done.sum()) / span, float(q.output_len[done].sum()) / span


def summarize(out: SimOutput, slo: SLO | None = None, timeline_points: int = 200) -> dict[str, Any]:
    """Aggregate metrics: throughput, goodput under `slo`, latency percentiles, utilisation,
    KV occupancy, preemptions and prefix-cache hits."""
    slo = slo or SLO()
    q = out.req
    cols = per_request(out)
    done = q.status == DONE
    span = span_s(out)
    ok = done & (cols["ttft"] <= slo.ttft_s) & (cols["tpot"] <= slo.tpot_s)
    reps = []
    for rep in out.replicas:
        t = np.array([x[0] for x in rep.timeline]) if rep.timeline else np.zeros(0)
        used = np.array([x[1] for x in rep.timeline], dtype=float) if rep.timeline else np.zeros(0)
        if len(t) > 1:
            w = np.diff(t)
            mean_occ = float((used[:-1] * w).sum() / max(w.sum(), 1e-12)) / max(1, rep.total_blocks)
        else:
            mean_occ = 0.0
        reps.append(
            {
                "replica": rep.idx,
                "served": len(rep.finished),
                "utilization": rep.busy / span,
                "steps": rep.steps,
                "kv_blocks": rep.total_blocks,
                "kv_occupancy_mean": mean_occ,
                "kv_occupancy_max": float(used.max()) / max(1, rep.total_blocks)
                if len(used)
                else 0.0,
            }
        )
    prompt_tokens = float(q.input_len[done].sum())
    out_tokens = float(q.output_len[done].sum())
    return {
        "requests": int(q.n),
        "completed": int(done.sum()),
        "rejected": int((q.status == REJECTED).sum()),
        "duration_s": span,
        "throughput_rps": float(done.sum()) / span,
        "output_tokens_per_s": out_tokens / span,
        "total_tokens_per_s": (out_tokens + prompt_tokens) / span,
        "goodput_rps": float(ok.sum()) / span,
        "slo_attainment": float(ok.sum()) / max(1, int(q.n)),
        "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s},
        "queueing_s": _pct(cols["queueing"][done]),
        "ttft_s": _pct(cols["ttft"][done]),
        "tpot_s": _pct(cols["tpot"][done & (q.output_len > 1)]),
        "e2e_s": _pct(cols["e2e"][done]),
        "max_itl_s": _pct(cols["max_itl"][done & (q.output_len > 1)]),
        "preemptions": int(q.preemptions.sum()),
        "prefix_hit_tokens": int(q.cached_tokens.sum()),
        "prefix_hit_rate": float(q.cached_tokens.sum()) / max(1.0, float(q.input_len.sum())),
        "utilization_mean": float(np.mean([r["utilization"] for r in reps])) if reps else 0.0,
        "kv_occupancy_mean": float(np.mean([r["kv_occupancy_mean"] for r in reps]))
        if reps
        else 0.0,
        "replicas": reps,
        "kv_timeline": kv_timeline(out, timeline_points) if timeline_points else [],
    }


def requests_json(out: SimOutput) -> list[dict[str, Any]]:
    """Per-request records as JSON-ready dicts (NaN becomes None)."""
    cols = per_request(out)
    names = list(cols)
    rows = []
    for i in range(out.req.n):
        row: dict[str, Any] = {}
        for k in names:
            v = cols[k][i]
            if isinstance(v, np.floating | float):
                row[k] = None if np.isnan(v) else float(v)
            else:
                row[k] = int(v)
        rows.append(row)
    return rows


def result_trace(res: dict[str, Any], model: str) -> Any:
    """The per-request rows of a `run(..., include_requests=True)` result as an otela trace
    (arrival, lengths, TTFT, end-to-end, TPOT as the mean inter-token latency), so that
    `otela trace compare SIM REAL` can set it against a replayed one."""
    from otela.tracing.schema import TraceRecord, make_header
    from traces.io import Trace

    records = []
    for row in res.get("per_request", []):
        done = row["status"] == DONE
        records.append(
            TraceRecord(
                arrival=float(row["arrival"]),
                model=model,
                input_tokens=int(row["input_len"]),
                output_tokens=int(row["output_len"]) if done else 0,
                request_id=f"r{row['id']}",
                ttft=row["ttft"] if done else None,
                e2e=row["e2e"] if done else None,
                itl_mean=row["tpot"] if done and row["output_len"] > 1 else None,
                itl_max=row["max_itl"] if done and row["output_len"] > 1 else None,
                status=200 if done else 0,
                error=None if done else ("rejected" if row["status"] == REJECTED else "unfinished"),
                node=f"replica-{row['replica']}",
            )
        )
    meta = {"deployment": res.get("deployment")}
    return Trace(make_header("otela sim run", start_time=0.0, simulation=meta), records).sorted()

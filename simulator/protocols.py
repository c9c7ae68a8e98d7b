"""Benchmark clients' protocols: how `vllm bench serve`, `trtllm-bench throughput` and
AIPerf send a fixed number of prompts, and how each turns the responses into its figures.

A published serving figure is the product of an engine *and* of the client that measured it:
the same server gives a different mean TTFT when the client sends every prompt at once and
counts that first burst than when it discards it, and a different throughput when the window
starts at the first request than when it starts once the queue is full. To compare with a
published number the simulator must send and measure the same way. Pure functions, no I/O:
`client_workload` builds the arrivals, `measure` reads the simulated per-request columns
(`simulator.report.per_request`) as the client would.

Protocols (each cited from the tool's own source or documentation):

* ``vllm-bench-serve`` (vLLM `benchmarks/serve.py`, formerly `benchmark_serving.py`; SGLang's
  `bench_serving` is the same): `num_prompts` requests; with ``--request-rate inf`` all are
  released at t = 0, otherwise at Gamma intervals (shape `burstiness`, mean 1/rate; 1 =
  Poisson); ``--max-concurrency`` holds at most that many in flight (a semaphore: a request
  is sent when a slot frees). TTFT counts from the send; TPOT of a request is
  (latency - TTFT) / (output tokens - 1); the duration runs from the first send to the last
  completion and every throughput is per that duration -- the first burst *is* included.
* ``trtllm-bench`` (TensorRT-LLM `trtllm-bench throughput`): every request queued at once
  (or at most `max_concurrency` in flight), offline: pre-tokenized, no HTTP front end;
  "Total Output Throughput" = output tokens / (last completion - first send).
* ``aiperf`` (NVIDIA AIPerf / GenAI-Perf, the NIM tables): a closed loop of
  `max_concurrency` clients; its warm-up requests are not measured, modelled here by
  ``exclude_first_burst`` (the first `max_concurrency` requests, sent together, are left out
  of the means and the throughput window starts at the first measured send).

``exclude_first_burst`` can be asked of any protocol: the steady state a published table
sometimes reports instead of the whole run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from simulator.workload import Workload

PROTOCOLS = ("vllm-bench-serve", "trtllm-bench", "aiperf")


@dataclass(frozen=True)
class ClientProtocol:
    """One benchmark client run: how many prompts, how they are released, how measured.

    `request_rate` inf releases every prompt at once (bounded by `max_concurrency` if set);
    `frontend` False is an offline client that talks to the engine in-process (no HTTP
    server, prompts pre-tokenized): the profile's per-request front-end cost does not apply.
    """

    name: str = "vllm-bench-serve"
    num_prompts: int = 1000
    max_concurrency: int | None = None
    request_rate: float = math.inf
    burstiness: float = 1.0
    exclude_first_burst: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.name not in PROTOCOLS:
            known = ", ".join(PROTOCOLS)
            raise ValueError(f"unknown client protocol {self.name!r}; known: {known}")
        if self.num_prompts < 1:
            raise ValueError("num_prompts must be at least 1")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        if not self.request_rate > 0:
            raise ValueError("request_rate must be positive (inf: all at once)")

    @property
    def frontend(self) -> bool:
        """Whether requests cross an HTTP server and tokenizer (trtllm-bench is offline)."""
        return self.name != "trtllm-bench"

    @property
    def burst(self) -> int:
        """How many requests the client releases together at the start: the first burst."""
        if self.max_concurrency is not None:
            return min(self.max_concurrency, self.num_prompts)
        return self.num_prompts if math.isinf(self.request_rate) else 1


def arrivals(p: ClientProtocol) -> np.ndarray:
    """The times the client *would* release each prompt if no concurrency limit held it back:
    all at 0 for an infinite rate, else cumulative Gamma intervals (shape `burstiness`, mean
    1 / `request_rate`), the first at 0 (vLLM's `get_request` sleeps after each request)."""
    n = p.num_prompts
    if math.isinf(p.request_rate):
        return np.zeros(n)
    rng = np.random.default_rng(p.seed)
    shape = p.burstiness
    gaps = rng.gamma(shape, 1.0 / (p.request_rate * shape), size=n)
    return np.concatenate([[0.0], np.cumsum(gaps[:-1])])


def client_workload(
    p: ClientProtocol, input_lens: np.ndarray | int, output_lens: np.ndarray | int
) -> Workload:
    """The prompts of one client run: fixed lengths (ints) or per-prompt arrays."""
    n = p.num_prompts
    inp = np.broadcast_to(np.asarray(input_lens, dtype=np.int64), (n,)).copy()
    out = np.broadcast_to(np.asarray(output_lens, dtype=np.int64), (n,)).copy()
    return Workload.from_arrays(arrivals(p), inp, out)


def _mean(x: np.ndarray) -> float:
    return float(x.mean()) if len(x) else float("nan")


def _median(x: np.ndarray) -> float:
    return float(np.median(x)) if len(x) else float("nan")


def _p99(x: np.ndarray) -> float:
    return float(np.percentile(x, 99)) if len(x) else float("nan")


def measure(cols: dict[str, np.ndarray], p: ClientProtocol) -> dict[str, Any]:
    """The figures the client prints, from simulated per-request columns (`arrival` is the
    send time, `ttft` / `e2e` count from it, `output_len` the tokens generated).

    Requests that never completed (rejected) are left out, as the clients count failures
    apart. Returns mean / median / p99 TTFT, TPOT and end-to-end latency (seconds), the
    request and token throughputs over the client's window, that window and how many
    requests it measured.
    """
    order = np.argsort(cols["arrival"], kind="stable")
    sent = np.asarray(cols["arrival"], dtype=float)[order]
    ttft = np.asarray(cols["ttft"], dtype=float)[order]
    e2e = np.asarray(cols["e2e"], dtype=float)[order]
    out = np.asarray(cols["output_len"], dtype=float)[order]
    inp = np.asarray(cols["input_len"], dtype=float)[order]
    ok = np.isfinite(e2e)
    keep = np.ones(len(sent), dtype=bool)
    if p.exclude_first_burst and len(sent) > p.burst:
        keep[: p.burst] = False
    sel = keep & ok
    start = float(sent[keep].min()) if keep.any() else 0.0
    end = float((sent + e2e)[sel].max()) if sel.any() else start
    window = max(end - start, 1e-9)
    multi = sel & (out > 1)
    tpot = (e2e[multi] - ttft[multi]) / (out[multi] - 1)
    outputs = float(out[sel].sum())
    return {
        "protocol": p.name,
        "measured_requests": int(sel.sum()),
        "failed_requests": int((keep & ~ok).sum()),
        "duration_s": window,
        "request_throughput": float(sel.sum()) / window,
        "output_throughput": outputs / window,
        "total_token_throughput": (outputs + float(inp[sel].sum())) / window,
        "mean_ttft_s": _mean(ttft[sel]),
        "median_ttft_s": _median(ttft[sel]),
        "p99_ttft_s": _p99(ttft[sel]),
        "mean_tpot_s": _mean(tpot),
        "median_tpot_s": _median(tpot),
        "p99_tpot_s": _p99(tpot),
        "mean_e2el_s": _mean(e2e[sel]),
        "median_e2el_s": _median(e2e[sel]),
        "p99_e2el_s": _p99(e2e[sel]),
    }

"""The widened validation set (catalog/validation.toml): its split, its data, the engine and
client protocols it is reproduced with, and a fast subset of its figures.

The whole set takes a couple of minutes (`python -m simulator.validation --held-out`,
figures in docs/simulator.md); here only the figures that simulate in well under a second.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from otela.hardware.catalog import get_gpu
from simulator import published as P
from simulator.engine import simulate
from simulator.engines import deployment, engine_profile, trtllm_bench_settings
from simulator.models import get_model
from simulator.protocols import ClientProtocol, client_workload, measure
from simulator.report import per_request
from simulator.roofline import Precision, StepCost

FIGS = P.load_figures()
HALVES = P.split(FIGS, P.seen_before_split())


def test_every_figure_cites_its_source_and_has_a_unique_id() -> None:
    assert len({f.id for f in FIGS}) == len(FIGS) >= 80
    for f in FIGS:
        assert f.url.startswith("https://"), f.id
        assert f.published > 0, f.id
        engine_profile(f.engine)  # every engine named exists


def test_split_is_fixed_by_the_ids_alone() -> None:
    shuffled = FIGS[:]
    random.Random(7).shuffle(shuffled)
    assert P.split(shuffled, P.seen_before_split()) == HALVES
    # the salt decides: another salt gives another split of the same figures
    salt = P.SPLIT_SALT
    try:
        P.SPLIT_SALT = salt + "-other"
        assert P.split(FIGS, P.seen_before_split()) != HALVES
    finally:
        P.SPLIT_SALT = salt


def test_split_alternates_within_every_table() -> None:
    seen = set(P.seen_before_split())
    tables: dict[str, list[str]] = {}
    for f in FIGS:
        tables.setdefault(f.table, []).append(f.id)
    for table, ids in tables.items():
        free = [i for i in ids if i not in seen]
        cal = sum(HALVES[i] == P.CALIBRATION for i in free)
        assert abs(cal - (len(free) - cal)) <= 1 + len(ids) - len(free), table
        if len(free) >= 2:
            assert 0 < cal < len(free), table
    assert all(HALVES[i] == P.CALIBRATION for i in seen)
    assert all(HALVES[i] == P.HELD_OUT for i in P.seen_after_split())


def test_trtllm_bench_settings_follow_its_heuristic() -> None:
    # 8B FP8 on one H100, 5000/500: ~203 requests fit -> batch 224 (multiple of 32); tokens
    # 203 * 11 rounded to 2304, then raised to a whole prompt plus a token per sequence
    spec, h100 = get_model("llama-3.1-8b"), get_gpu("h100")
    prec = Precision(8, 8, 8)
    assert trtllm_bench_settings(spec, h100.runtime_bytes, 1, 1, prec, 5000, 500) == (224, 5224)
    assert trtllm_bench_settings(
        spec, h100.runtime_bytes, 1, 1, prec, 5000, 500, chunked_prefill=True
    ) == (224, 2304)
    # short sequences: the 4096 cap and 8192 tokens
    assert trtllm_bench_settings(spec, h100.runtime_bytes, 1, 1, prec, 128, 128) == (4096, 8192)


def test_engine_profiles_change_what_they_say() -> None:
    trt = deployment("llama-3.1-8b", "h100", "trtllm", frontend=False)
    vll = deployment("llama-3.1-8b", "h100", "vllm")
    assert trt.engine_config.reserve_output_ratio == 1.0 and not trt.engine_config.chunk_prompts
    assert vll.engine_config.reserve_output_ratio == 0.0 and vll.engine_config.chunk_prompts
    assert trt.cost().host_overlap and not vll.cost().host_overlap
    assert trt.cost().request_overhead == 0.0 < vll.cost().request_overhead


@pytest.mark.parametrize("overlap", [0.0, 1.0])
def test_overlapped_host_work_prices_the_longer_of_the_two(overlap: float) -> None:
    g = get_gpu("h100").with_calibration(host_overlap=overlap, seq_overhead_s=100e-6)
    c = StepCost(get_model("llama-3.1-8b"), g)
    for b in (1, 64, 2048):
        gpu = c.gpu_time(b, b * 1000.0)
        host = c.host_time(b)
        expect = max(gpu, host) if overlap else gpu + host
        assert c.step_time(b, b * 1000.0) == pytest.approx(expect, rel=1e-12)
        ops = c.step_ops(b, b * 1000.0)
        assert sum(o.time_s for o in ops) == pytest.approx(c.step_time(b, b * 1000.0), rel=1e-9)
    # a small batch is GPU-bound, a big one host-bound (100 us per sequence)
    assert c.gpu_time(8, 8000.0) > c.host_time(8)
    assert c.host_time(4096) > c.gpu_time(4096, 4096 * 200.0)


def test_macro_steps_stay_exact_with_overlapped_host_work() -> None:
    dep = deployment("llama-3.1-8b", "h100", "trtllm", frontend=False,
                     calibration={"seq_overhead_s": 200e-6})
    wl = client_workload(ClientProtocol("trtllm-bench", num_prompts=300), 300, 200)
    runs = []
    for macro in (True, False):
        cfg = dep.engine_config.__class__(**{**dep.engine_config.__dict__, "macro_steps": macro})
        runs.append(simulate(wl, dep.cost(), dep.memory(), cfg, 1, "least_outstanding", None, 0))
    np.testing.assert_allclose(runs[0].req.finish, runs[1].req.finish, rtol=1e-9)
    np.testing.assert_allclose(runs[0].req.first_token, runs[1].req.first_token, rtol=1e-9)


def test_gqa_unaware_decode_reads_more_kv() -> None:
    m = get_model("llama-2-70b")  # 64 query heads, 8 KV heads
    base = StepCost(m, get_gpu("h100"), prec=Precision(8, 8, 8))
    old = StepCost(m, get_gpu("h100").with_calibration(decode_kv_per_query_head=1.0),
                   prec=Precision(8, 8, 8))
    assert old.attn_slope > 4 * base.attn_slope  # 8x the KV bytes, decode KV is memory-bound
    assert old.tokens_time(64) == base.tokens_time(64)  # nothing else changes


# ---- protocols ----------------------------------------------------------------------------


def _cols(sent: list[float], ttft: list[float], e2e: list[float], out: list[int]) -> dict:  # type: ignore[type-arg]
    n = len(sent)
    return {"arrival": np.array(sent), "ttft": np.array(ttft), "e2e": np.array(e2e),
            "output_len": np.array(out), "input_len": np.full(n, 100)}


def test_measure_counts_the_first_burst_unless_asked_not_to() -> None:
    # two requests sent together at 0 (slow first tokens), two later ones
    cols = _cols([0.0, 0.0, 2.0, 2.5], [1.0, 1.2, 0.1, 0.1], [2.0, 2.5, 1.0, 1.5], [11, 11, 11, 11])
    incl = measure(cols, ClientProtocol("vllm-bench-serve", num_prompts=4, max_concurrency=2))
    excl = measure(cols, ClientProtocol("vllm-bench-serve", num_prompts=4, max_concurrency=2,
                                        exclude_first_burst=True))
    assert incl["mean_ttft_s"] == pytest.approx((1.0 + 1.2 + 0.1 + 0.1) / 4)
    assert excl["mean_ttft_s"] == pytest.approx(0.1)
    assert incl["duration_s"] == pytest.approx(4.0)  # first send 0 -> last completion 4.0
    assert excl["duration_s"] == pytest.approx(2.0)  # first measured send 2.0 -> 4.0
    assert incl["output_throughput"] == pytest.approx(44 / 4.0)
    # TPOT of a request: (latency - TTFT) / (tokens - 1)
    assert incl["median_tpot_s"] == pytest.approx(np.median([0.1, 0.13, 0.09, 0.14]))


def test_client_arrivals() -> None:
    p = ClientProtocol("vllm-bench-serve", num_prompts=2000, request_rate=10.0, seed=3)
    wl = client_workload(p, 100, 10)
    gaps = np.diff(wl.arrival)
    assert wl.arrival[0] == 0.0 and gaps.mean() == pytest.approx(0.1, rel=0.06)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.1)  # Poisson: CV 1
    bursty = client_workload(ClientProtocol(num_prompts=2000, request_rate=10.0, burstiness=0.25),
                             100, 10)
    assert np.diff(bursty.arrival).std() / 0.1 == pytest.approx(2.0, rel=0.15)  # CV 1/sqrt(k)
    assert client_workload(ClientProtocol(num_prompts=5), 100, 10).arrival.tolist() == [0.0] * 5
    with pytest.raises(ValueError):
        ClientProtocol("locust")


def test_concurrency_limited_ttft_includes_the_queue_of_the_first_burst() -> None:
    # 16 prompts of 2000 tokens at once, 8 at a time, on vLLM: the first eight queue behind
    # each other's prefills; `vllm bench serve` counts them, a steady-state window does not
    dep = deployment("llama-3.1-8b", "h100", "vllm")
    p = ClientProtocol("vllm-bench-serve", num_prompts=64, max_concurrency=8)
    wl = client_workload(p, 2000, 64)
    out = simulate(wl, dep.cost(), dep.memory(), dep.engine_config, 1, "least_outstanding", 8, 0)
    cols = per_request(out)
    whole = measure(cols, p)
    steady = measure(cols, ClientProtocol("vllm-bench-serve", num_prompts=64, max_concurrency=8,
                                          exclude_first_burst=True))
    assert whole["p99_ttft_s"] > steady["p99_ttft_s"]
    assert whole["measured_requests"] == 64 and steady["measured_requests"] == 56


# ---- a fast subset of the figures ---------------------------------------------------------


def _quick(f: P.Figure) -> bool:
    if f.protocol == "static":
        return True
    return f.protocol == "trtllm-bench" and f.n * (f.isl + f.osl) <= 9_000_000 and f.isl >= 2000


QUICK = [f for f in FIGS if _quick(f)]


def test_fast_subset_matches_as_documented() -> None:
    """Static batches and long-prompt trtllm-bench rows (a few seconds in all): within the
    worst error docs/simulator.md reports for them, and a median that stays small."""
    assert len(QUICK) >= 25
    errs = {f.id: P.rel_err(P.predict(f), f.published) for f in QUICK}
    for k, e in errs.items():
        print(f"{k}: {100 * e:+.1f}%")
    assert all(abs(e) <= 0.35 for e in errs.values()), errs
    assert float(np.median([abs(e) for e in errs.values()])) <= 0.10
    cal = [abs(e) for k, e in errs.items() if HALVES[k] == P.CALIBRATION]
    assert float(np.median(cal)) <= 0.10
    assert not math.isnan(sum(errs.values()))


def test_serve_figures_run_the_client_at_its_request_rate() -> None:
    """The multi-node SGLang figures: one id per request rate, reproduced as `bench_serving`
    at that rate on a TP16 replica that spans two 8-GPU nodes."""
    serve = [f for f in FIGS if f.protocol == "serve"]
    assert len(serve) == 8 and len({f.rate for f in serve}) == 4
    assert all(f.tp * f.pp > get_gpu(f.gpu).efficiency.gpus_per_node for f in serve)
    # they are the only figures whose replica spans nodes (405B TP8 fills one 8-GPU node)
    assert {f.id for f in FIGS if P.spans_nodes(f)} == {f.id for f in serve}
    f = next(x for x in serve if x.rate == 1 and x.bits[2] == 16)
    assert f.id.endswith("/rps1/1024-1024") and f.mem_util == 0.8
    res = P.serve(f.model, f.gpu, f.tp, f.pp, f.precision, f.engine, f.isl, f.osl, f.n,
                  f.rate, f.mem_util)
    assert res["measured_requests"] == f.n
    # the client's window: 300 prompts at 1/s take at least ~300 s to send
    assert res["duration_s"] > 250
    assert P.predict(f) == pytest.approx(res["median_tpot_s"] * 1e3)

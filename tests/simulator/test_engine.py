"""Serving engine behaviour: conservation, queueing, preemption, chunking, prefix cache."""

import numpy as np
import pytest

from otela.hardware.catalog import get_gpu
from simulator.engine import DONE, REJECTED, EngineConfig, Replica, simulate
from simulator.memory import plan_memory
from simulator.models import get_model
from simulator.report import SLO, summarize
from simulator.roofline import StepCost
from simulator.workload import Workload, synthetic

M, G = get_model("llama-3.1-8b"), get_gpu("a100-40g-sxm")
COST = StepCost(M, G)


def _run(wl: Workload, kv_gb: float | None = None, **kw):  # type: ignore[no-untyped-def]
    cfg = EngineConfig(**{k: v for k, v in kw.items() if k in EngineConfig.__dataclass_fields__})
    plan = plan_memory(M, G, kv_pool_bytes=None if kv_gb is None else kv_gb * 1e9)
    rest = {k: v for k, v in kw.items() if k not in EngineConfig.__dataclass_fields__}
    return simulate(wl, COST, plan, cfg, **rest)


def test_single_request_matches_roofline_exactly() -> None:
    wl = Workload.from_arrays([0.5], [1000], [50])
    out = _run(wl)
    q = out.req
    # the frontend's request overhead delays the engine's view of the arrival
    ttft = COST.request_overhead + COST.step_time(0, 0, [(1000, 0)])
    decode = sum(COST.step_time(1, 1000.0 + k + 1) for k in range(49))
    assert q.first_token[0] - 0.5 == pytest.approx(ttft, rel=1e-9)
    assert q.finish[0] - 0.5 == pytest.approx(ttft + decode, rel=1e-9)


def test_memory_pressure_queues_and_preempts_but_never_drops() -> None:
    wl = synthetic(
        20, duration=30, input_dist="normal:800,300", output_dist="normal:400,200", seed=2
    )
    out = _run(wl, kv_gb=1.0)  # ~7.6k tokens of KV: a handful of requests at a time
    s = summarize(out, timeline_points=0)
    assert s["completed"] == len(wl) and s["rejected"] == 0
    assert s["preemptions"] > 0
    assert s["queueing_s"]["p90"] > 1.0  # waited for memory rather than vanished
    used = [u for _, u in out.replicas[0].timeline]
    assert max(used) <= out.replicas[0].total_blocks
    assert np.all(
        out.req.generated[out.req.status == DONE] >= out.req.output_len[out.req.status == DONE]
    )


def test_request_longer_than_kv_is_rejected_explicitly() -> None:
    wl = Workload.from_arrays([0.0, 0.1], [100, 50_000], [10, 10])
    out = _run(wl, kv_gb=1.0)
    assert out.req.status[0] == DONE and out.req.status[1] == REJECTED
    assert summarize(out, timeline_points=0)["rejected"] == 1


def test_macro_steps_are_exact() -> None:
    wl = synthetic(
        6, duration=40, input_dist="normal:800,300", output_dist="normal:300,200", seed=3
    )
    a = _run(wl, kv_gb=2.0)
    b = _run(wl, kv_gb=2.0, macro_steps=False)
    assert a.req.preemptions.sum() == b.req.preemptions.sum() > 0
    np.testing.assert_allclose(a.req.finish, b.req.finish, rtol=1e-9)
    np.testing.assert_allclose(a.req.first_token, b.req.first_token, rtol=1e-9)


def test_chunked_prefill_protects_decode_latency() -> None:
    # long prompts arriving while others decode: without chunking, whole prefills stall decodes
    wl = synthetic(3, duration=60, input_dist="fixed:6000", output_dist="fixed:200", seed=4)
    chunked = summarize(_run(wl, max_batched_tokens=1024), timeline_points=0)
    whole = summarize(_run(wl, chunked_prefill=False), timeline_points=0)
    assert chunked["max_itl_s"]["p50"] < 0.5 * whole["max_itl_s"]["p50"]
    # ...at a modest cost in mean TPOT (chunks re-read the prompt's KV): within 30 %
    assert chunked["tpot_s"]["mean"] < 1.3 * whole["tpot_s"]["mean"]


def test_prefix_cache_hits_cut_ttft() -> None:
    wl = synthetic(
        4,
        duration=60,
        input_dist="fixed:200",
        output_dist="fixed:50",
        seed=5,
        prefix_groups=3,
        prefix_len=2000,
    )
    on = summarize(_run(wl, prefix_caching=True), timeline_points=0)
    off = summarize(_run(wl, prefix_caching=False), timeline_points=0)
    assert off["prefix_hit_tokens"] == 0
    assert on["prefix_hit_rate"] > 0.7
    assert on["ttft_s"]["mean"] < 0.5 * off["ttft_s"]["mean"]


def test_routing_policies() -> None:
    wl = synthetic(
        24,
        duration=60,
        input_dist="lognormal:800,800",
        output_dist="lognormal:300,300",
        seed=6,
        cv=3.0,
    )
    rr = _run(wl, replicas=4, router="round_robin")
    assert np.bincount(rr.req.replica, minlength=4).min() >= len(wl) // 4 - 1
    lo = summarize(_run(wl, replicas=4, router="least_outstanding"), timeline_points=0)
    rnd = summarize(_run(wl, replicas=4, router="random"), timeline_points=0)
    assert lo["e2e_s"]["p99"] <= rnd["e2e_s"]["p99"]


def test_goodput_and_utilization_respond_to_load() -> None:
    light = summarize(_run(synthetic(1, duration=60, seed=7)), SLO(1.0, 0.05))
    heavy = summarize(_run(synthetic(40, duration=60, seed=7)), SLO(1.0, 0.05))
    assert light["slo_attainment"] > 0.95
    assert heavy["slo_attainment"] < light["slo_attainment"]
    assert heavy["utilization_mean"] > light["utilization_mean"]
    assert heavy["kv_occupancy_mean"] > light["kv_occupancy_mean"]
    assert len(heavy["kv_timeline"]) == 200


def test_closed_loop_client_caps_concurrency() -> None:
    wl = Workload.from_arrays(np.zeros(40), np.full(40, 256), np.full(40, 64))
    out = _run(wl, max_concurrency=4)
    sent, fin = out.req.sent, out.req.finish
    for t in sent:
        assert ((sent <= t + 1e-12) & (fin > t + 1e-12)).sum() <= 4


def test_whole_prompt_scheduling_never_splits_or_shares_long_prompts() -> None:
    # TensorRT-LLM without chunked context: a 5000-token prompt runs whole; two of them do
    # not fit one 8192-token step, so the second waits a step instead of being chunked
    wl = Workload.from_arrays([0.0, 0.0], [5000, 5000], [20, 20])
    whole = _run(wl, chunk_prompts=False, max_batched_tokens=8192)
    split = _run(wl, chunk_prompts=True, max_batched_tokens=8192)
    assert whole.req.first_token[0] < split.req.first_token[0]  # R1 alone in its step
    first = whole.req.first_token
    assert first[1] - first[0] == pytest.approx(COST.step_time(1, 5001.0, [(5000, 0)]), rel=1e-9)


def test_closed_loop_never_sends_before_a_slot_frees() -> None:
    wl = Workload.from_arrays(np.zeros(30), np.full(30, 3000), np.full(30, 64))
    out = _run(wl, max_concurrency=4)
    sent, finish = out.req.sent, out.req.finish
    for r in range(len(sent)):
        # at any send time, at most 3 earlier requests are still in flight
        in_flight = ((sent[:r] <= sent[r]) & (finish[:r] > sent[r] + 1e-12)).sum()
        assert in_flight <= 3, (r, in_flight)
    assert (out.req.status == DONE).all()


@pytest.mark.parametrize(
    "kw",
    [
        {"kv_gb": 1.0},  # preemptions
        {"kv_gb": 2.0, "max_batched_tokens": 512},  # prompts over several chunks
        {"prefix_caching": True},
        {"chunk_prompts": False},
        {"chunked_prefill": False},
        {"kv_gb": 2.0, "macro_steps": False},
    ],
)
def test_reused_decode_batch_is_the_running_split(kw, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # the engine reuses the decoding batch an iteration or decode run left behind instead of
    # splitting the running list again: it must be exactly that split, in order
    split = Replica._split_running
    uses = 0

    def checked(self: Replica) -> tuple[np.ndarray, list[int]]:
        nonlocal uses
        decoding, prefilling = split(self)
        run = np.asarray(self.running, dtype=np.int64)
        ready = self.req.computed[run] >= self.req.target[run]
        assert decoding.tolist() == run[ready].tolist()
        assert prefilling == run[~ready].tolist()
        uses += 1
        return decoding, prefilling

    monkeypatch.setattr(Replica, "_split_running", checked)
    wl = synthetic(
        20, duration=20, input_dist="normal:800,300", output_dist="normal:300,200", seed=7,
        prefix_groups=3, prefix_len=600,
    )
    out = _run(wl, **kw)
    assert uses > 100 and summarize(out, timeline_points=0)["completed"] == len(wl)

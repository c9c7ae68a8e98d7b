"""Roofline physics: bounds that must hold for every model/GPU pair."""

import itertools

import pytest

from simulator.api import Deployment, analyze
from simulator.hardware import get_gpu, list_gpus
from simulator.memory import plan_memory, weight_bytes_per_gpu
from simulator.models import get_model, list_models
from simulator.roofline import Parallelism, Precision, StepCost, operator_breakdown


def _pairs() -> list[tuple[str, str]]:
    out = []
    for m in list_models():
        for g in list_gpus():
            if plan_memory(m, g).fits:
                out.append((m.name, g.key))
    return out


@pytest.mark.parametrize(("model", "gpu"), _pairs())
def test_decode_never_beats_weight_streaming(model: str, gpu: str) -> None:
    m, g = get_model(model), get_gpu(gpu)
    cost = StepCost(m, g)
    weights = weight_bytes_per_gpu(m, Parallelism(), Precision())
    if not m.tie_embeddings:  # the input embedding table is gathered (a few rows), not streamed
        weights -= m.vocab * m.hidden * 2
    floor = weights / g.mem_bw
    if m.is_moe:  # one token reads only its routed experts (+ everything dense)
        expert = m.layers * m.experts * m.expert_params * Precision().expert_bits_for(m) / 8
        active = (
            m.layers * m.experts_per_token * m.expert_params * Precision().expert_bits_for(m) / 8
        )
        floor = (floor * g.mem_bw - expert + active) / g.mem_bw
    t = cost.step_time(1, 512.0)
    assert t >= floor * 0.999


def test_prefill_long_prompt_is_compute_bound_and_small_decode_memory_bound() -> None:
    m, g = get_model("llama-3.1-8b"), get_gpu("h100")
    pre = operator_breakdown(m, g, Parallelism(), Precision(), 1, 8192, 0)
    dec = operator_breakdown(m, g, Parallelism(), Precision(), 4, 1, 2048)
    gemm = [o for o in pre if o.name.startswith(("qkv", "o_proj", "mlp"))]
    assert all(o.bound == "compute" for o in gemm)
    compute_share = sum(o.time_s for o in pre if o.bound == "compute") / sum(o.time_s for o in pre)
    assert compute_share > 0.8
    assert all(o.bound == "memory" for o in dec if o.bound != "overhead")


def test_throughput_saturates_with_batch() -> None:
    cost = StepCost(get_model("llama-3.1-8b"), get_gpu("a100-80g-sxm"))
    tput = [b / cost.step_time(b, b * 1024.0) for b in (1, 8, 64, 256, 512, 1024)]
    assert all(b > a for a, b in itertools.pairwise(tput))  # more batch, more tokens/s
    gains = [b / a for a, b in itertools.pairwise(tput)]
    assert gains[0] > 5  # memory-bound: almost free
    assert gains[-1] < 1.2  # saturated: doubling batch gains < 20 %


def test_tensor_parallel_shards_weights_and_adds_allreduce() -> None:
    m, g = get_model("llama-3.3-70b"), get_gpu("h100")
    ops1 = operator_breakdown(m, g, Parallelism(1), Precision(), 8, 1, 1024)
    ops4 = operator_breakdown(m, g, Parallelism(4), Precision(), 8, 1, 1024)
    assert not any(o.bound == "comm" for o in ops1)
    ar = [o for o in ops4 if o.name.startswith("all_reduce")]
    assert len(ar) == 1 and ar[0].time_s > 2 * m.layers * g.efficiency.collective_latency_s * 0.99
    w1 = sum(o.bytes for o in ops1 if o.name == "mlp_gate_up")
    w4 = sum(o.bytes for o in ops4 if o.name == "mlp_gate_up")
    assert w4 == pytest.approx(w1 / 4, rel=0.01)
    t1, t4 = sum(o.time_s for o in ops1), sum(o.time_s for o in ops4)
    assert t1 / 4 < t4 < t1  # faster, but not perfectly 4x


def test_pipeline_parallel_adds_p2p_and_keeps_latency() -> None:
    m, g = get_model("llama-2-70b"), get_gpu("a100-80g-sxm")
    a = sum(o.time_s for o in operator_breakdown(m, g, Parallelism(1, 1), Precision(), 1, 1, 512))
    b = operator_breakdown(m, g, Parallelism(1, 2), Precision(), 1, 1, 512)
    assert any(o.name.startswith("p2p") for o in b)
    assert sum(o.time_s for o in b) > a  # PP does not cut single-request latency


def test_quantization_speeds_decode_and_8bit_math_speeds_prefill() -> None:
    m, g = get_model("llama-3.1-8b"), get_gpu("h100")
    bf16 = analyze(Deployment(m, g), 1, 4096, 64)["totals"]
    w4 = analyze(Deployment(m, g, precision=Precision(weight_bits=4)), 1, 4096, 64)["totals"]
    fp8 = analyze(Deployment(m, g, precision=Precision(8, 8, 8)), 1, 4096, 64)["totals"]
    assert w4["tpot_s"] < 0.5 * bf16["tpot_s"]
    assert w4["ttft_s"] == pytest.approx(bf16["ttft_s"], rel=0.1)  # W4A16 still uses 16-bit math
    assert fp8["ttft_s"] < 0.7 * bf16["ttft_s"]


def test_moe_reads_only_active_experts_at_batch_one() -> None:
    m, g = get_model("qwen3-30b-a3b"), get_gpu("h100")
    ops = operator_breakdown(m, g, Parallelism(), Precision(), 1, 1, 512)
    ex = next(o for o in ops if o.name.startswith("moe_experts"))
    assert ex.bytes < 0.1 * m.layers * m.experts * m.expert_params * 2
    big = operator_breakdown(m, g, Parallelism(), Precision(), 512, 1, 512)
    ex_big = next(o for o in big if o.name.startswith("moe_experts"))
    assert ex_big.bytes > 0.9 * m.layers * m.experts * m.expert_params * 2

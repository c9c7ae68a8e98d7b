"""Roofline physics: bounds that must hold for every model/GPU pair."""

import itertools

import pytest

from otela.hardware.catalog import get_gpu, list_gpus
from simulator.api import Deployment, analyze
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
    assert compute_share > 0.75  # near-ridge blending (ridge_sharpness) lengthens memory ops too
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
    # FP8 math: 2x the peak but ~1.4x in practice (compute_fp8 / compute = 0.5 / 0.7, set from
    # NIM's Llama-3.3-70B FP8 TP2 long-prompt TTFT)
    assert 0.6 * bf16["ttft_s"] < fp8["ttft_s"] < 0.8 * bf16["ttft_s"]


def test_moe_reads_only_active_experts_at_batch_one() -> None:
    m, g = get_model("qwen3-30b-a3b"), get_gpu("h100")
    ops = operator_breakdown(m, g, Parallelism(), Precision(), 1, 1, 512)
    ex = next(o for o in ops if o.name.startswith("moe_experts"))
    assert ex.bytes < 0.1 * m.layers * m.experts * m.expert_params * 2
    big = operator_breakdown(m, g, Parallelism(), Precision(), 512, 1, 512)
    ex_big = next(o for o in big if o.name.startswith("moe_experts"))
    assert ex_big.bytes > 0.9 * m.layers * m.experts * m.expert_params * 2


def test_mla_decode_reads_the_latent_once_per_token_on_every_rank() -> None:
    m, g = get_model("deepseek-v2-lite"), get_gpu("h100")
    one = StepCost(m, g, Parallelism(1), Precision())
    two = StepCost(m, g, Parallelism(2), Precision())
    # the latent KV is not sharded: per-token attention bytes stay, FLOPs halve with heads
    f1, b1 = one._decode_attn_per_token()
    f2, b2 = two._decode_attn_per_token()
    assert b1 == b2 == (512 + 64) * 2 and f2 == pytest.approx(f1 / 2)
    # and 93 % less KV than the same model with standard 16-head MHA (head_dim 128+64)
    assert m.kv_bytes_per_token() < 0.2 * 2 * m.layers * 16 * 192 * 2


def test_expert_parallel_pays_for_its_busiest_rank_at_small_batch() -> None:
    m, g = get_model("qwen3-30b-a3b"), get_gpu("h100")
    tp = StepCost(m, g, Parallelism(4), Precision())
    ep = StepCost(m, g, Parallelism(4, 1, 4), Precision())
    # same expected work per rank, but whole experts per rank: the busiest rank is slower
    assert ep.step_time(8, 8 * 1000.0) > tp.step_time(8, 8 * 1000.0)
    # at large batches every rank touches all its experts: the gap closes
    small = ep.step_time(8, 8000.0) / tp.step_time(8, 8000.0)
    large = ep.step_time(512, 512 * 1000.0) / tp.step_time(512, 512 * 1000.0)
    assert large < small


def test_non_gated_mlp_costs_two_thirds_of_a_gated_one() -> None:
    opt, g = get_model("opt-13b"), get_gpu("a100-80g-sxm")
    ops = {o.name: o for o in operator_breakdown(opt, g, Parallelism(), Precision(), 1, 1, 512)}
    assert "mlp_up" in ops and "mlp_gate_up" not in ops
    assert ops["mlp_up"].bytes == pytest.approx(
        opt.hidden * opt.intermediate * 2 * opt.layers, rel=0.01
    )


def test_memory_uses_runtime_gib_and_per_rank_reserves() -> None:
    from simulator.memory import GIB, activation_reserve_bytes, runtime_reserve_bytes

    m, g = get_model("llama-3.1-8b"), get_gpu("h100")
    p1 = plan_memory(m, g)
    assert p1.capacity_bytes == pytest.approx(79.1 * GIB)  # what the CUDA runtime reports
    # not the datasheet's "80 GB" read as 80e9 bytes (74.5 GiB): HBM ships in GiB
    assert p1.capacity_bytes > g.mem_bytes
    cal = g.calibration
    two = Parallelism(2)
    extra = runtime_reserve_bytes(g, two) - runtime_reserve_bytes(g, Parallelism(1))
    assert extra == pytest.approx(cal.tp_reserve_gib * GIB)  # NCCL buffers on every rank
    p2 = plan_memory(m, g, two)
    act = activation_reserve_bytes(m, two, Precision(), 8192, 256)
    assert p2.activation_bytes == pytest.approx(act + runtime_reserve_bytes(g, two))


def test_allreduce_latency_grows_with_the_ring_steps() -> None:
    """A ring all-reduce over n ranks takes 2(n-1) steps: the profile's latency is the
    two-rank one, every further rank adds two hops (NCCL's cost model)."""
    from simulator.roofline import allreduce_latency, allreduce_time

    g = get_gpu("h100")
    cal = g.efficiency
    assert cal.collective_hop_s > 0
    assert allreduce_latency(1, g) == 0.0
    assert allreduce_latency(2, g) == pytest.approx(cal.collective_latency_s)
    eight = cal.collective_latency_s + 12 * cal.collective_hop_s
    assert allreduce_latency(8, g) == pytest.approx(eight)
    flat = g.with_efficiency(collective_hop_s=0.0)
    tiny = 1024.0  # latency-bound message
    assert allreduce_time(tiny, 8, g) - allreduce_time(tiny, 8, flat) == pytest.approx(
        12 * cal.collective_hop_s
    )


def test_fp8_all_reduces_carry_the_16_bit_residual_stream() -> None:
    """FP8 GEMMs write BF16 outputs: the TP all-reduce moves 2 bytes per element whatever the
    GEMMs' input precision, so its bytes are those of a BF16 deployment."""
    m, g = get_model("llama-3.3-70b"), get_gpu("h100")

    def ar_bytes(prec: Precision) -> float:
        ops = operator_breakdown(m, g, Parallelism(4), prec, 64, 1, 1024)
        return sum(o.bytes for o in ops if o.name.startswith("all_reduce"))

    fp8, bf16 = ar_bytes(Precision(8, 8, 8)), ar_bytes(Precision())
    assert fp8 == pytest.approx(bf16)
    assert fp8 > 0


def test_context_launch_cost_only_on_passes_with_prompt_tokens() -> None:
    """`context_launch_per_layer_s` (a runtime without CUDA graphs in its context phase) is
    paid per layer by a pass carrying prompt tokens and never by a pure decode step."""
    m = get_model("llama-2-7b")
    base = get_gpu("h100")
    extra = 100e-6
    slow = base.with_efficiency(context_launch_per_layer_s=extra)
    a, b = StepCost(m, base, max_tokens=512), StepCost(m, slow, max_tokens=512)
    assert b.step_time(8, 8 * 300.0) == pytest.approx(a.step_time(8, 8 * 300.0))
    assert b.step_time(0, 0.0, [(128, 0)]) - a.step_time(0, 0.0, [(128, 0)]) == pytest.approx(
        extra * m.layers
    )
    assert b.gpu_time(4, 4 * 300.0, [(128, 0)]) - a.gpu_time(4, 4 * 300.0, [(128, 0)]) == (
        pytest.approx(extra * m.layers)
    )
    ops = b.step_ops(0, 0.0, [(128, 0)])
    assert sum(o.time_s for o in ops) == pytest.approx(b.step_time(0, 0.0, [(128, 0)]), rel=1e-9)


def test_groups_larger_than_a_node_cross_the_network() -> None:
    """A TP group of 16 H100s spans two 8-GPU nodes: two of its 30 ring steps cross the
    network at its hop latency, and its bus bandwidth is the NICs' of one node's eight GPUs
    when that is below NVLink's; the same group on one NVLink domain (GB200 NVL72) does not."""
    from simulator.roofline import (
        allreduce_bandwidth,
        allreduce_latency,
        allreduce_time,
        nodes_spanned,
    )

    g = get_gpu("h100")
    cal = g.efficiency
    assert (nodes_spanned(8, g), nodes_spanned(9, g), nodes_spanned(16, g)) == (1, 2, 2)
    assert nodes_spanned(16, get_gpu("gb200")) == 1
    one_node = g.with_efficiency(gpus_per_node=16)
    lat = allreduce_latency(16, g) - allreduce_latency(16, one_node)
    assert lat == pytest.approx(2 * (cal.internode_hop_s - cal.collective_hop_s))
    assert allreduce_bandwidth(8, g) == pytest.approx(g.interconnect_bw / 2 * cal.comm)
    assert allreduce_bandwidth(16, g) == pytest.approx(8 * cal.internode_gbs * 1e9)
    assert allreduce_bandwidth(16, g) < allreduce_bandwidth(16, one_node)
    big = 64e6  # bandwidth-bound message
    ratio = allreduce_time(big, 16, g) / allreduce_time(big, 16, one_node)
    assert ratio > 1.05
    # a faster network than NVLink never makes the group faster than NVLink allows
    fat = g.with_efficiency(internode_gbs=1000.0)
    assert allreduce_bandwidth(16, fat) == pytest.approx(allreduce_bandwidth(16, one_node))


def test_pipeline_hand_offs_between_nodes_use_the_network() -> None:
    from simulator.roofline import internode_handoffs, p2p_time

    g = get_gpu("h100")
    assert internode_handoffs(4, 2, g) == 0  # 8 GPUs: one node
    assert internode_handoffs(8, 2, g) == 1
    assert internode_handoffs(4, 4, g) == 1  # stages 0-1 on node 0, 2-3 on node 1
    assert internode_handoffs(1, 16, g) == 1
    assert internode_handoffs(8, 4, g) == 3
    m = get_model("llama-3.1-405b")
    cross = StepCost(m, g, Parallelism(8, 2), Precision(8, 8, 8), max_tokens=256)
    local = StepCost(
        m, g.with_efficiency(gpus_per_node=16), Parallelism(8, 2), Precision(8, 8, 8),
        max_tokens=256,
    )
    msg = 256 * m.hidden * 2
    extra = float(p2p_time(msg, g, internode=True)) - float(p2p_time(msg, g))
    assert extra > 0
    assert cross.handoff_time(256) - local.handoff_time(256) == pytest.approx(extra)

"""Quantized checkpoints as engines load them: block scales are stored and read with the
weights, and the embedding and lm_head stay BF16 (docs/simulator.md, "Quantized
checkpoints")."""

import pytest

from otela.hardware.catalog import get_gpu
from simulator import published
from simulator.api import Deployment, analyze
from simulator.memory import plan_memory, weight_bytes_per_gpu, weight_bytes_total
from simulator.models import get_model
from simulator.roofline import WEIGHT_FORMATS, Parallelism, Precision, StepCost


@pytest.mark.parametrize(
    ("prec", "name", "stored"),
    [
        (Precision(), "bf16", 16.0),
        (Precision(8, 8, 8), "fp8", 8.0),  # one scale per tensor: nothing per weight
        (Precision(8, 16, 16), "int8", 8.0),  # weight-only, one scale per channel
        (Precision(4, 4, 8), "nvfp4", 4.5),  # an FP8 scale per 16 weights
        (Precision(4, 16, 16), "int4-g128", 4 + 20 / 128),  # FP16 scale + 4-bit zero per 128
        (Precision(4, 16, 16, weight_format="mxfp4"), "mxfp4", 4.25),  # 8-bit scale per 32
        (Precision(8, 8, 16, weight_format="fp8-block"), "fp8-block", 8 + 32 / 128**2),
    ],
)
def test_each_format_stores_its_scales(prec: Precision, name: str, stored: float) -> None:
    assert prec.format.name == name
    assert prec.stored_weight_bits == pytest.approx(stored)
    assert prec.head_weight_bits == 16.0


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown weight format"):
        Precision(4, 4, 8, weight_format="nf4")
    assert set(WEIGHT_FORMATS) >= {"fp8", "nvfp4", "mxfp4", "int4-g128"}


def test_fp8_8b_weights_include_a_bf16_embedding_and_lm_head() -> None:
    m = get_model("llama-3.1-8b")
    emb = m.vocab * m.hidden  # the embedding and the (untied) lm_head: one such matrix each
    fp8 = weight_bytes_total(m, Precision(8, 8, 8))
    # every weight at one byte, plus one more byte for each of the 2 x 525 M head weights
    assert fp8 == pytest.approx(m.total_params + 2 * emb)
    assert fp8 / 1e9 == pytest.approx(9.08, abs=0.01)  # was 8.03 GB at 8 bits throughout
    # on one GPU both matrices sit with the layers; a checkpoint that quantized its head says so
    one = weight_bytes_per_gpu(m, Parallelism(), Precision(8, 8, 8))
    quantized_head = weight_bytes_per_gpu(m, Parallelism(), Precision(8, 8, 8, head_bits=8))
    assert one - quantized_head == pytest.approx(2 * emb)
    assert quantized_head == pytest.approx(m.total_params)


def test_bf16_models_are_unchanged() -> None:
    m = get_model("qwen2.5-32b")
    assert weight_bytes_total(m, Precision()) == pytest.approx(2 * m.total_params)


def test_nvfp4_70b_is_seven_gb_larger_than_its_nominal_four_bits() -> None:
    m = get_model("llama-3.3-70b")
    emb = m.embedding_params
    w = weight_bytes_total(m, Precision(4, 4, 8))
    assert w == pytest.approx((m.total_params - emb) * 4.5 / 8 + emb * 2)
    assert (w - m.total_params * 4 / 8) / 1e9 == pytest.approx(7.4, abs=0.1)


def test_the_bf16_head_takes_kv_cache_room() -> None:
    m, g = get_model("llama-3.1-8b"), get_gpu("h100")
    bf16_head = plan_memory(m, g, None, Precision(8, 8, 8))
    fp8_head = plan_memory(m, g, None, Precision(8, 8, 8, head_bits=8))
    lost = fp8_head.kv_pool_bytes - bf16_head.kv_pool_bytes
    assert lost == pytest.approx(2 * m.vocab * m.hidden)
    assert bf16_head.kv_tokens < fp8_head.kv_tokens


def test_the_lm_head_reads_bf16_weights_at_the_16_bit_peak() -> None:
    m, g = get_model("llama-3.1-8b"), get_gpu("h100")
    cost = StepCost(m, g, Parallelism(), Precision(8, 8, 8), max_tokens=256)
    head = cost.head_term(1)
    weights = m.vocab * m.hidden
    assert float(head.bytes) == pytest.approx(2 * weights + (m.hidden + m.vocab) * 1)
    # the FP8 layers run at the FP8 peak, the BF16 head at the BF16 one
    assert head.compute_scale == pytest.approx(g.effective_peak(16) / g.effective_peak(8))
    assert cost.head_time(4096) == pytest.approx(
        float(cost._t(float(head.flops) * 4096 / head.compute_scale,
                      2 * weights + 4096 * (m.hidden + m.vocab))), rel=1e-9)
    # and a decode step is slower than with an FP8 head by about the extra byte per weight
    fp8_head = StepCost(m, g, Parallelism(), Precision(8, 8, 8, head_bits=8), max_tokens=256)
    extra = cost.step_time(1, 1000.0) - fp8_head.step_time(1, 1000.0)
    assert extra == pytest.approx(weights / cost.bw, rel=0.05)


def test_the_analyzer_reports_the_format() -> None:
    res = analyze(Deployment("llama-3.3-70b", "b200", precision=Precision(4, 4, 8)), 1, 128, 8)
    p = res["precision"]
    assert (p["weight_format"], p["stored_weight_bits"], p["head_bits"]) == ("nvfp4", 4.5, 16.0)


def test_validation_figures_carry_their_checkpoint_format() -> None:
    figs = published.load_figures()
    nvfp4 = [f for f in figs if f.bits == (4.0, 4.0, 8.0)]
    assert nvfp4 and all(f.precision.format.name == "nvfp4" for f in nvfp4)
    deepseek = [f for f in figs if f.model == "deepseek-v3"]
    assert deepseek and all(f.precision.format.name == "fp8-block" for f in deepseek)
    assert all(f.precision.head_weight_bits == 16.0 for f in figs)

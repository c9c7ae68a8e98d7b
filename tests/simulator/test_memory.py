"""Memory model: weights, KV pool, limits and 'does not fit' reasons."""

import pytest

from otela.hardware.catalog import get_gpu
from simulator.memory import GIB, plan_memory, weight_bytes_total
from simulator.models import get_model
from simulator.roofline import Parallelism, Precision


def test_gyges_qwen25_32b_weights() -> None:
    # Gyges sec. 3.1: "The model size of Qwen2.5-32B (BF16 datatype) is 62.34 GB"; the value is
    # what vLLM logs (GiB). Tolerance 3 %.
    w = weight_bytes_total(get_model("qwen2.5-32b"), Precision()) / GIB
    assert w == pytest.approx(62.34, rel=0.03)


def test_tp_splits_weights_and_grows_kv_superlinearly() -> None:
    m, g = get_model("qwen2.5-32b"), get_gpu("h20")
    p1, p4 = plan_memory(m, g, Parallelism(1)), plan_memory(m, g, Parallelism(4))
    assert p4.weight_bytes == pytest.approx(p1.weight_bytes / 4, rel=0.01)
    # 4 GPUs hold > 4x the KV tokens because each GPU carries only a quarter of the weights
    assert p4.kv_tokens > 4 * 4 * p1.kv_tokens / 4 * 1.5


def test_does_not_fit_says_why() -> None:
    p = plan_memory(get_model("llama-2-70b"), get_gpu("rtx3090"))
    assert not p.fits
    assert "weights" in p.reason and "exceed" in p.reason and "rtx3090" in p.reason
    p = plan_memory(get_model("llama-2-70b"), get_gpu("rtx3090"), Parallelism(tp=3))
    assert not p.fits and "does not divide" in p.reason


def test_quantization_makes_70b_fit_on_one_h100() -> None:
    m, g = get_model("llama-3.3-70b"), get_gpu("h100")
    assert not plan_memory(m, g).fits
    assert plan_memory(m, g, None, Precision(weight_bits=4)).fits


def test_max_batch_and_context_are_consistent() -> None:
    p = plan_memory(get_model("llama-3.1-8b"), get_gpu("a100-40g-sxm"))
    assert p.fits
    kv_per_tok = 2 * 32 * 8 * 128 * 2
    assert p.kv_tokens == pytest.approx(p.kv_pool_bytes / kv_per_tok, abs=16)
    assert p.max_batch(2048) == min(256, p.kv_blocks // 128)
    assert p.max_context == min(p.kv_tokens, 131072)
    small = plan_memory(get_model("llama-3.1-8b"), get_gpu("a100-40g-sxm"), kv_pool_bytes=1e9)
    assert small.kv_pool_bytes == pytest.approx(1e9)
    assert small.max_batch(4096) < p.max_batch(4096)


def test_kv_precision_halves_kv_bytes() -> None:
    m, g = get_model("qwen3-8b"), get_gpu("l40s")
    a = plan_memory(m, g)
    b = plan_memory(m, g, None, Precision(kv_bits=8))
    assert b.kv_bytes_per_token == pytest.approx(a.kv_bytes_per_token / 2)
    assert b.kv_tokens == pytest.approx(2 * a.kv_tokens, rel=0.01)

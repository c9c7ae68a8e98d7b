"""One roofline: the event engine's step pricing and the analyzer's operator list agree."""

import pytest

from otela.hardware.catalog import get_gpu
from simulator.api import Deployment, analyze
from simulator.models import get_model
from simulator.roofline import Parallelism, Precision, StepCost, operator_breakdown

CASES = [
    ("llama-3.1-8b", "h100", Parallelism(1), Precision()),
    ("qwen2.5-32b", "h20", Parallelism(4), Precision()),
    ("llama-2-70b", "a100-80g-sxm", Parallelism(2, 2), Precision(8, 8, 8)),
    ("gpt-oss-20b", "h100", Parallelism(2), Precision()),
    ("qwen3-30b-a3b", "h100", Parallelism(2, 1, 2), Precision()),
    ("deepseek-v2-lite", "a100-80g-sxm", Parallelism(1), Precision()),
    ("opt-13b", "a10", Parallelism(2), Precision()),
    # NVFP4 layers at the FP4 peak, its BF16 lm_head at the 16-bit one
    ("llama-3.3-70b", "b200", Parallelism(2), Precision(4, 4, 8)),
]

STEPS = [
    (1, 513.0, []),
    (32, 32 * 1500.0, []),
    (0, 0.0, [(2048, 0)]),
    (8, 8000.0, [(512, 1024), (100, 0)]),
]


@pytest.mark.parametrize(("model", "gpu", "par", "prec"), CASES)
@pytest.mark.parametrize(("decode", "ctx", "chunks"), STEPS)
def test_step_ops_sum_to_step_time(  # type: ignore[no-untyped-def]
    model, gpu, par, prec, decode, ctx, chunks
) -> None:
    cost = StepCost(get_model(model), get_gpu(gpu), par, prec, max_tokens=4096)
    ops = cost.step_ops(decode, ctx, chunks)
    assert sum(o.time_s for o in ops) == pytest.approx(
        cost.step_time(decode, ctx, chunks), rel=1e-9
    )
    assert all(o.time_s >= 0 for o in ops)


@pytest.mark.parametrize(("model", "gpu", "par", "prec"), CASES)
def test_analyzer_prices_like_the_engine(model, gpu, par, prec) -> None:  # type: ignore[no-untyped-def]
    m, g = get_model(model), get_gpu(gpu)
    cost = StepCost(m, g, par, prec, max_tokens=8192)
    pre = operator_breakdown(m, g, par, prec, 4, 1000, 0)
    assert sum(o.time_s for o in pre) == pytest.approx(
        cost.step_time(0, 0.0, [(1000, 0)] * 4, sampled=4), rel=1e-9
    )
    dec = operator_breakdown(m, g, par, prec, 16, 1, 700)
    assert sum(o.time_s for o in dec) == pytest.approx(cost.step_time(16, 16 * 701.0), rel=1e-9)


def test_analyze_ttft_is_the_engine_prefill_plus_frontend() -> None:
    dep = Deployment("llama-3.1-8b", "h100")
    res = analyze(dep, 1, 2000, 10)
    cost = dep.cost()
    expected = cost.step_time(0, 0.0, [(2000, 0)], sampled=1) + cost.request_overhead
    assert res["totals"]["ttft_s"] == pytest.approx(expected, rel=1e-9)

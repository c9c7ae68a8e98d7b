"""Validation against published measurements, with the tolerances docs/simulator.md states.

Every comparison prints its numbers (run with -s) so failures show the remaining error.
"""

import pytest

from simulator import validation as v


@pytest.fixture(scope="module")
def gyges() -> dict:  # type: ignore[type-arg]
    return v.gyges_table1()


def test_gyges_weights(gyges: dict) -> None:  # type: ignore[type-arg]
    assert gyges["weights_gib"] == pytest.approx(62.34, rel=0.03)


def test_calibrated_figures_median_and_worst_error() -> None:
    """Every published latency/throughput/memory figure in validation.figures(): median
    |error| <= 10 %, all within 25 % but the two documented gaps (TP4 on H20; TTFT of a
    phase-locked 5-client closed loop), each guarded separately."""
    import numpy as np

    rows = v.figures()
    errs = {f"{src} {setting}": v.rel_err(pred, pub) for src, setting, pub, pred in rows}
    for k, e in errs.items():
        print(f"{k}: {100 * e:+.1f}%")
    assert float(np.median([abs(e) for e in errs.values()])) <= 0.10
    gaps = [k for k in errs if "TP4" in k or ("TTFT" in k and "C=5 " in k)]
    assert len(gaps) == 2
    assert all(abs(e) <= 0.25 for k, e in errs.items() if k not in gaps), errs


def test_nim_70b_fp8_tp2_single_stream_within_10_percent() -> None:
    res = v.nim_llama70b_fp8_tp2()
    for (i, o, c), x in res.items():
        assert abs(v.rel_err(x["itl_ms"], x["pub_itl_ms"])) <= 0.10, (i, o, c, x)
        assert abs(v.rel_err(x["tput"], x["pub_tput"])) <= 0.10, (i, o, c, x)
        if c == 1:  # short and long prompts alone: launch cost near the ridge, FP8 efficiency
            assert abs(v.rel_err(x["ttft_ms"], x["pub_ttft_ms"])) <= 0.10, (i, o, c, x)
        elif c >= 25:  # TTFT under load, steady state
            assert abs(v.rel_err(x["ttft_ms"], x["pub_ttft_ms"])) <= 0.20, (i, o, c, x)
        else:  # C=5: phase-locked clients (documented gap), pessimistic but bounded
            assert 0 < v.rel_err(x["ttft_ms"], x["pub_ttft_ms"]) <= 0.40, (i, o, c, x)


def test_before_calibration_was_optimistic() -> None:
    """The uncalibrated profile reproduces the biases the issue listed (guards BEFORE)."""
    res = v.nim_llama70b_fp8_tp2(before=True)
    single = res[(500, 2000, 1)]
    assert single["ttft_ms"] < 0.7 * single["pub_ttft_ms"]  # short prompt too fast
    assert single["itl_ms"] < 0.8 * single["pub_itl_ms"]  # no per-step overhead


def test_gyges_tp_ordering_and_loss(gyges: dict) -> None:  # type: ignore[type-arg]
    agg = gyges["aggregate"]
    pred = gyges["predicted"]
    print("Gyges predicted", pred, "aggregate", agg, "loss", gyges["loss_predicted"])
    # single instance: more TP is faster...
    assert pred[1] < pred[2] < pred[4]
    # ...but in aggregate over the same 4 GPUs: 4xTP1 > 2xTP2 > TP4 (the published ordering)
    assert agg[1] > agg[2] > agg[4]
    # TP1 absolute within 25 % of the published 448 tok/s
    assert v.rel_err(pred[1], 448.0) == pytest.approx(0.0, abs=0.25)
    # Loss 4xTP1 -> TP4: published 57 %; the roofline + NVLink model explains only part of it
    # (documented gap). Guard the part it does explain: at least 15 %, at most the published.
    assert 0.15 <= gyges["loss_predicted"] <= gyges["loss_published"]


def test_prism_kv_growth_more_than_doubles_throughput() -> None:
    p = v.prism_kv()
    print("Prism", p)
    # published: "more than 2x"; tolerance 10 % below the bound
    assert p["ratio"] > 0.9 * p["published_ratio_min"]
    assert p["throughput"][15.0] > p["throughput"][5.0]


@pytest.mark.parametrize("model", ["qwen3-1.7b", "llama-2-7b"])
def test_opentela_q4_speedups_are_physical(model: str) -> None:
    q = v.opentela_q4(model)
    print(model, [(r["config"], round(r["speedup"], 2)) for r in q["rows"]])
    speed = [r["speedup"] for r in q["rows"]]
    # H100 is faster, never by more than its compute advantage
    assert all(1.0 < s < q["compute_ratio"] for s in speed)
    # decode-heavy configs sit near the bandwidth ratio (within 35 %, the rest is fixed
    # per-step overhead), the prefill-heavier (2048, 512, 4) config is the fastest on H100
    assert speed[1] == max(speed)
    assert all(s > 0.65 * q["bandwidth_ratio"] for s in speed) or model == "qwen3-1.7b"


def test_opentela_q4_speedup_grows_with_model_size() -> None:
    small = v.opentela_q4("qwen3-1.7b")["rows"]
    big = v.opentela_q4("llama-2-7b")["rows"]
    assert all(b["speedup"] > s["speedup"] for s, b in zip(small, big, strict=True))


def test_a100_llama31_single_stream_and_batch_gain() -> None:
    a = v.a100_llama31_sweep()
    print("A100", a)
    assert v.rel_err(a["decode_tok_s"], 75.0) == pytest.approx(0.0, abs=0.05)  # 5 %
    assert v.rel_err(a["gain_c8"], 6.6) == pytest.approx(0.0, abs=0.10)  # 10 %


def test_rtx4090_mistral_concurrency_sweep() -> None:
    r = v.rtx4090_mistral_sweep()
    print("4090", r)
    for c, pub in r["published"].items():
        err = v.rel_err(r["predicted"][c], pub)
        assert abs(err) <= 0.10, (c, err)  # 10 %
    # saturation: the published curve bends (throughput per concurrency falls) and so must ours
    pred = r["predicted"]
    assert pred[48] / 48 < pred[16] / 16 < pred[4] / 4

"""The four papers' headline comparisons, shortened (minutes of simulated traffic instead of
hours) and with tolerant thresholds; the full runs are benchmarks/companion_*.py and their
figures are in docs/companion.md. Each test asserts the direction the paper reports and a
margin the short run reliably clears."""

from __future__ import annotations

import pytest

from simulator.policies.gyges.experiment import figure12
from simulator.policies.oserve.experiment import OPT, level
from simulator.policies.prism.experiment import headline
from simulator.policies.sageserve.experiment import run_day

pytestmark = pytest.mark.slow


def test_gyges_sustains_more_than_round_robin_and_least_load() -> None:
    # paper Figure 12: +26 % to +39 % throughput; full benchmark here: about +49 %
    res = figure12(loads=(2.0, 3.0), duration_s=600.0)
    assert res["sustainable"]["gyges"]["load"] == 3.0
    for mode in ("round_robin", "least_loaded"):
        assert res["gain_over"][mode] >= 0.15
        assert res["sustainable"][mode]["load"] == 2.0  # they miss the SLO at 3x
    # the mechanism: the baselines merge more often for the same long requests
    rows = {m: {r["load"]: r for r in rs} for m, rs in res["rows"].items()}
    assert rows["gyges"][2.0]["merges"] < rows["round_robin"][2.0]["merges"]


def test_oserve_gain_grows_with_the_mix_cv() -> None:
    # paper Table 1: 1.14x at CV 0.112 to 2.66x at CV 0.688 (Llama2-70B) over vLLM (static).
    # otela: on its closed-loop profiles the search promises Llama2-70B +1.6 % at S1-S4
    # (TP2PP4 + TP4PP2), which completed 0.970-0.981 of TP2PP4x2 in 10 minutes; the serving
    # check now launches TP2PP4x2 there (measured 1.001 at S3) and keeps S5's TP1PP4x2 +
    # TP2PP4 (planned 1.018, measured 1.042). No layout of these shapes served 1 % more than
    # the best homogeneous one at S1 or S3 (docs/companion-oserve.md).
    s3 = level("S3", duration_s=600.0)
    assert s3["searched_planned_speedup"] >= 1.01  # what the profiles promise
    assert s3["simulated_speedup"] >= 0.99  # what is launched never serves materially less
    s5 = level("S5", duration_s=600.0)
    assert s5["oserve_layout"] != s5["homogeneous_layout"]
    assert s5["simulated_speedup"] >= 1.02
    assert s5["simulated_speedup"] >= s3["simulated_speedup"] + 0.015
    # OPT-30B at S5: the search's TP1PP4 + TP2PP2 + TP4x2 (profiles: +3.5 %) completed 0.943
    # of the best homogeneous layout in 10 minutes; the check serves it less than TP2PP2x4
    # and launches the best-serving layout
    opt = level("S5", model=OPT["model"], scale=OPT["scale"])
    assert opt["searched_planned_speedup"] >= 1.02
    served = opt["check"]["served_rps"]
    assert served[opt["oserve_layout"]] == max(served.values())
    assert opt["oserve_layout"] == opt["homogeneous_layout"]


def test_sageserve_uses_fewer_instance_hours_than_reactive() -> None:
    # paper Figure 11: 19.7 % to 24.2 % fewer instance-hours at similar tail TTFT; here the
    # morning ramp (07:00-09:00) of a lighter day
    res = run_day(rate=5.0, hours=2.0, start_h=7.0, modes=("reactive", "lt-ua"),
                  history_days=2)
    reactive, lt = res["modes"]["reactive"], res["modes"]["lt-ua"]
    assert lt["instance_hours"] <= 0.85 * reactive["instance_hours"]
    assert lt["iw_ttft_p95_mean"] <= 1.5 * reactive["iw_ttft_p95_mean"] + 0.5
    assert lt["completed"] == lt["requests"] == reactive["completed"]


def test_prism_on_two_gpus_meets_slos_like_eight_dedicated() -> None:
    # paper Table 1: 8 models need 8 dedicated GPUs or 2 with Prism (99 % attainment)
    (row,) = headline(rates=(8.0,), duration_s=600.0)
    dedicated, prism = row["dedicated"], row["prism"]
    assert dedicated["gpus"] == 8 and prism["gpus"] == 2  # cost saving 4x (> 2x)
    assert prism["slo_attainment"] >= 0.97 * dedicated["slo_attainment"]
    assert prism["slo_attainment"] >= row["static"]["slo_attainment"] - 0.005

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
    # otela (PP micro-batches overlapped): Llama2-70B plans +1-2 % at every level; OPT-30B a
    # small gain growing with skew, measured 1.023 (S1) and 1.035 (S5) over the best
    # homogeneous layout of each level, 1.086 at S5 over TP4x4, the layout that is best on
    # S1's mix (docs/companion-oserve.md: before the search re-picked its starting layout's
    # shapes it missed S1's optimum and planned 1.002 there, hence the older 2-point margin)
    s1 = level("S1", model=OPT["model"], scale=OPT["scale"])
    s5 = level("S5", model=OPT["model"], scale=OPT["scale"], duration_s=240.0,
               static_from="S1")
    assert s5["planned_speedup"] > s1["planned_speedup"] + 0.01
    assert s5["planned_speedup"] >= 1.02
    assert s5["static_layout"] == "TP4x4"
    assert s5["static_planned_speedup"] >= 1.06
    assert s5["static_planned_speedup"] > s1["planned_speedup"] + 0.05
    # the event simulator agrees against the static layout (1.028 measured in 240 s with the
    # default backlog routing, 1.060 with `lp`); against the PP-heavy best homogeneous layout
    # a short run's completions depend on its warm-up (1.34 in 240 s, 0.94 in 600 s), so that
    # ratio is not asserted here
    assert s5["static_simulated_speedup"] >= 1.01
    llama = level("S5")
    assert llama["planned_speedup"] >= 1.01  # measured 1.018 (TP1PP4x2 + TP2PP4x1)


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

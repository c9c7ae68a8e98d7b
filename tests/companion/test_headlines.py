"""The four papers' headline comparisons, shortened (minutes of simulated traffic instead of
hours) and with tolerant thresholds; the full runs are benchmarks/companion_*.py and their
figures are in docs/companion.md. Each test asserts the direction the paper reports and a
margin the short run reliably clears."""

from __future__ import annotations

import pytest

from simulator.policies.gyges.experiment import figure12
from simulator.policies.oserve.experiment import operating_point
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


def test_oserve_p99_gain_at_the_skewed_mix() -> None:
    # paper Table 1: P99 speedup 1.14x at CV 0.112 to 2.66x at CV 0.688 (Llama2-70B, 16 H100)
    # over vLLM (static). otela (docs/companion-oserve.md, 600 s x 3 seeds): at 90 % of the
    # LP's homogeneous capacity the searched layout with type-matched routing cuts P99 by
    # 1.62-1.70x at S5 and loses at S3 (0.47-0.53x); the policy's serving check (capacity in
    # overload) launches the homogeneous layout at both
    s5 = operating_point("S5", 0.9, seeds=(0,), duration_s=300.0)
    assert s5["p99_speedup"]["oserve-het"][0] >= 1.3
    assert s5["runs"]["oserve-het"][0]["layout"] != s5["runs"]["homogeneous"][0]["layout"]
    assert s5["p99_speedup"]["oserve"][0] == pytest.approx(1.0, abs=0.02)
    s3 = operating_point("S3", 0.9, seeds=(0,), duration_s=300.0)
    assert s3["p99_speedup"]["oserve-het"][0] < 0.9


def test_sageserve_uses_fewer_instance_hours_than_reactive() -> None:
    # paper Figure 11: 19.7 % to 24.2 % fewer instance-hours at similar tail TTFT; here the
    # morning ramp (07:00-09:00) of a lighter day
    res = run_day(rate=5.0, hours=2.0, start_h=7.0, modes=("reactive", "lt-ua"),
                  history_days=2)
    reactive, lt = res["modes"]["reactive"], res["modes"]["lt-ua"]
    assert lt["instance_hours"] <= 0.85 * reactive["instance_hours"]
    assert lt["iw_ttft_p95_mean"] <= 1.5 * reactive["iw_ttft_p95_mean"] + 0.5
    assert lt["completed"] == lt["requests"] == reactive["completed"]
    # the same work on fewer instance-hours: the instances ran fuller, and neither mode ran
    # them past saturation (the operating point the comparison is made at)
    assert 0 < reactive["utilisation"] < lt["utilisation"] <= 0.9
    assert lt["utilisation"] / reactive["utilisation"] == pytest.approx(
        reactive["instance_hours"] / lt["instance_hours"], rel=0.02)


def test_prism_on_two_gpus_meets_slos_like_eight_dedicated() -> None:
    # paper Table 1: 8 models need 8 dedicated GPUs or 2 with Prism (99 % attainment)
    (row,) = headline(rates=(8.0,), duration_s=600.0)
    dedicated, prism = row["dedicated"], row["prism"]
    assert dedicated["gpus"] == 8 and prism["gpus"] == 2  # cost saving 4x (> 2x)
    assert prism["slo_attainment"] >= 0.97 * dedicated["slo_attainment"]
    assert prism["slo_attainment"] >= row["static"]["slo_attainment"] - 0.005

"""SageServe's cores: the forecast on a synthetic seasonal series, the ILP on hand-checkable
demands, the per-request scaling rules and the NIW release rule."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.policies.sageserve.forecast import SeasonalAR, forecast_series
from simulator.policies.sageserve.ilp import ScalingError, ScalingProblem, solve
from simulator.policies.sageserve.rules import Thresholds, niw_release, scaling_step


def _seasonal(days: int, season: int = 48, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(days * season)
    level = 100 + 0.05 * t  # slow growth
    daily = 60 * np.sin(2 * np.pi * t / season)
    return level + daily + rng.normal(0, 4, len(t))


def test_forecast_tracks_a_seasonal_series() -> None:
    season = 48
    y = _seasonal(6, season)
    hist, future = y[: 5 * season], y[5 * season: 5 * season + 12]
    pred = forecast_series(hist, season, 12)
    mape = float(np.mean(np.abs(pred - future) / future))
    assert mape < 0.06
    # far better than persistence of the last value and than the mean
    persist = float(np.mean(np.abs(hist[-1] - future) / future))
    mean = float(np.mean(np.abs(hist.mean() - future) / future))
    assert mape < 0.5 * persist
    assert mape < 0.5 * mean


def test_forecast_without_a_season_of_history_is_persistence() -> None:
    assert forecast_series(np.array([3.0, 5.0]), 48, 4) == pytest.approx([5.0] * 4)
    assert forecast_series(np.zeros(0), 48, 2) == pytest.approx([0.0, 0.0])
    with pytest.raises(ValueError):
        SeasonalAR.fit(np.ones(10), season=48)


def test_forecast_is_exact_on_a_pure_season() -> None:
    y = np.tile(np.arange(24.0), 3)
    m = SeasonalAR.fit(y, 24, order=1)
    assert m.forecast(y, 24) == pytest.approx(np.arange(24.0), abs=1e-6)


def test_ilp_meets_each_region_peak_with_fewest_instances() -> None:
    # theta 100 tokens/s per instance; peaks 250 and 120 with eps = 1: 3 and 2 instances
    p = ScalingProblem(current={("m", "east"): 1, ("m", "west"): 4},
                       peak={("m", "east"): 250.0, ("m", "west"): 120.0},
                       capacity={"m": 100.0}, eps=1.0)
    d = solve(p)
    assert d == {("m", "east"): 2, ("m", "west"): -2}


def test_ilp_reroutes_when_eps_below_one() -> None:
    # eps 0.5: each region needs ceil(0.5 * peak / 100) (2 and 1), all regions together
    # 370 -> 4 instances. Starting from (2, 2), nothing needs to change (no start cost), and
    # dropping below 4 in total is infeasible.
    p = ScalingProblem(current={("m", "a"): 2, ("m", "b"): 2},
                       peak={("m", "a"): 250.0, ("m", "b"): 120.0},
                       capacity={"m": 100.0}, eps=0.5)
    assert solve(p) == {("m", "a"): 0, ("m", "b"): 0}
    # with (1, 4): region a must grow to 2, and b may shrink to 2: -2 + 1 saves more than the
    # start cost of one instance
    p2 = ScalingProblem(current={("m", "a"): 1, ("m", "b"): 4}, peak=p.peak,
                        capacity=p.capacity, eps=0.5)
    d = solve(p2)
    assert d[("m", "a")] == 1 and d[("m", "a")] + d[("m", "b")] + 5 == 4


def test_ilp_respects_bounds_and_reports_infeasible() -> None:
    p = ScalingProblem(current={("m", "a"): 0}, peak={("m", "a"): 10.0}, capacity={"m": 100.0},
                       min_instances=2, max_instances=5)
    assert solve(p) == {("m", "a"): 2}
    big = ScalingProblem(current={("m", "a"): 0}, peak={("m", "a"): 1e6},
                         capacity={"m": 100.0}, max_instances=5)
    with pytest.raises(ScalingError):
        solve(big)


TH = Thresholds(min_instances=1, max_instances=5)


def test_reactive_thresholds_and_cooldown() -> None:
    assert scaling_step("reactive", 0.8, 2, now=100, last_event=0, th=TH) == 1
    assert scaling_step("reactive", 0.2, 2, now=100, last_event=0, th=TH) == -1
    assert scaling_step("reactive", 0.5, 2, now=100, last_event=0, th=TH) == 0
    assert scaling_step("reactive", 0.8, 2, now=100, last_event=90, th=TH) == 0  # cooldown
    assert scaling_step("reactive", 0.8, 5, now=100, last_event=0, th=TH) == 0  # at max
    assert scaling_step("reactive", 0.2, 1, now=100, last_event=0, th=TH) == 0  # at min


def test_forecast_aware_modes_stop_at_the_target() -> None:
    assert scaling_step("lt-u", 0.8, 2, 100, 0, TH, target=3) == 1
    assert scaling_step("lt-u", 0.8, 3, 100, 0, TH, target=3) == 0
    assert scaling_step("lt-u", 0.2, 3, 100, 0, TH, target=2) == -1
    assert scaling_step("lt-u", 0.2, 2, 100, 0, TH, target=2) == 0
    assert scaling_step("lt-i", 0.9, 1, 100, 0, TH, target=4) == 0  # LT-I jumps hourly only
    # LT-UA: past the target only in the hour's last 20 minutes, and only on a 5x miss
    assert scaling_step("lt-ua", 0.8, 3, 100, 0, TH, 3, 6.0, hour_elapsed_s=3000) == 1
    assert scaling_step("lt-ua", 0.8, 3, 100, 0, TH, 3, 6.0, hour_elapsed_s=1000) == 0
    assert scaling_step("lt-ua", 0.8, 3, 100, 0, TH, 3, 2.0, hour_elapsed_s=3000) == 0
    assert scaling_step("lt-ua", 0.2, 3, 100, 0, TH, 3, 0.4, hour_elapsed_s=3000) == -1
    with pytest.raises(ValueError):
        scaling_step("bogus", 0.5, 1, 0, 0, TH)


def test_niw_release() -> None:
    assert niw_release(0.4) == 2
    assert niw_release(0.55) == 1
    assert niw_release(0.65) == 0

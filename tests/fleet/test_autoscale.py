"""The autoscaler: wishes from load, hysteresis, cooldowns, scale to zero, forecasts."""

from __future__ import annotations

import math
import random

from otela.fleet.autoscale import Signals, forecast_rate, record_history, step
from otela.fleet.memory import ScaleState
from otela.fleet.spec import Autoscale

SPEC = Autoscale(target_rps=6.0, up_cooldown=30, down_cooldown=120, down_window=60,
                 idle_timeout=300)


class Load:
    """A counter of answered requests fed at a given rate, read every ``tick`` seconds."""

    def __init__(self) -> None:
        self.count = 0.0
        self.now = 0.0

    def advance(self, rate: float, seconds: float) -> None:
        self.count += rate * seconds
        self.now += seconds


def drive(spec: Autoscale, state: ScaleState, load: Load, rate: float, seconds: float,
          current: int, low: int = 1, high: int = 10, tick: float = 5.0,
          jitter: float = 0.0, rng: random.Random | None = None) -> list[int]:
    targets = []
    for _ in range(int(seconds / tick)):
        noisy = rate * (1 + (rng.uniform(-jitter, jitter) if rng else 0.0))
        load.advance(noisy, tick)
        result = step(spec, low, high, state, Signals(requests=load.count), load.now,
                      current)
        current = result.target
        targets.append(result.target)
    return targets


def test_a_step_in_load_scales_up_at_once_and_steady_load_does_not_flap():
    state, load = ScaleState(), Load()
    rng = random.Random(1)
    before = drive(SPEC, state, load, 2.0, 120, current=2, jitter=0.1, rng=rng)
    assert before[-1] == 1 or before[-1] == 2  # 2 req/s: one replica's worth (down later)
    after = drive(SPEC, state, load, 20.0, 60, current=before[-1], jitter=0.1, rng=rng)
    first_four = next(i for i, t in enumerate(after) if t == 4)
    assert first_four <= 3  # within a rate window and a pass of the step
    steady = drive(SPEC, state, load, 20.0, 600, current=after[-1], jitter=0.1, rng=rng)
    assert set(steady) == {4}, steady  # 20 / 6 = 3.33 -> 4, never flapping


def test_scale_down_waits_for_a_whole_calm_window_and_the_cooldown():
    state, load = ScaleState(), Load()
    drive(SPEC, state, load, 20.0, 60, current=4)
    assert state.target == 4
    quiet = drive(SPEC, state, load, 5.0, 300, current=4)
    first_down = next(i for i, t in enumerate(quiet) if t < 4)
    assert first_down * 5 >= 60  # not before a whole down window of lower wishes
    assert quiet[-1] == 1
    # a burst inside the window keeps the count
    state2, load2 = ScaleState(), Load()
    drive(SPEC, state2, load2, 20.0, 60, current=4)
    for _ in range(10):
        drive(SPEC, state2, load2, 5.0, 30, current=4)
        drive(SPEC, state2, load2, 20.0, 20, current=4)
    assert state2.target == 4


def test_tolerance_keeps_a_load_on_a_boundary_from_adding_a_replica():
    state, load = ScaleState(), Load()
    targets = drive(SPEC, state, load, 18.3, 200, current=3)  # 3.05 replicas' worth
    assert set(targets) == {3}


def test_scale_to_zero_after_idle_and_back_at_once_for_a_held_request():
    spec = Autoscale(target_rps=6.0, down_window=30, down_cooldown=30, idle_timeout=60)
    state, load = ScaleState(), Load()
    drive(spec, state, load, 1.0, 30, current=1, low=0)
    assert state.target == 1
    idle = drive(spec, state, load, 0.0, 200, current=1, low=0)
    assert idle[-1] == 0
    zero_at = next(i for i, t in enumerate(idle) if t == 0) * 5
    assert zero_at >= 60  # idle_timeout
    # a held request wakes it at once, whatever the cooldowns
    load.advance(0.0, 1)
    result = step(spec, 0, 3, state, Signals(requests=load.count, held=1), load.now, 0)
    assert result.target == 1 and "waiting for a first replica" in (result.reason or "")


def test_in_flight_and_windowed_ttft_targets():
    spec = Autoscale(target_in_flight=8, ttft=1.0, up_cooldown=20)
    state = ScaleState()
    result = step(spec, 1, 10, state, Signals(requests=0, in_flight=30, serving=2), 0.0, 2)
    assert result.target == 4  # 30 / 8 = 3.75
    # the first-byte counters: a mean over the last window, not since the ingress started
    quiet = Signals(requests=0, ttft_sum=500.0, ttft_count=1000, serving=4)
    assert step(spec, 1, 10, state, quiet, 1.0, 4).target == 4
    slow = Signals(requests=0, ttft_sum=500.0 + 250, ttft_count=1100, serving=4)  # 2.5 s
    result = step(spec, 1, 10, state, slow, 25.0, 4)
    assert result.target == 5 and "ttft 2.50s" in (result.reason or "")
    # still slow, but one replica at a time: not before up_cooldown
    slower = Signals(requests=0, ttft_sum=750.0 + 300, ttft_count=1200, serving=4)
    assert step(spec, 1, 10, state, slower, 31.0, 5).target == 5
    fast = Signals(requests=0, ttft_sum=1050.0 + 20, ttft_count=1300, serving=5)
    assert step(spec, 1, 10, state, fast, 50.0, 5).target == 5  # 0.2 s: no more


def test_the_arrival_rate_counts_requests_still_in_flight():
    state = ScaleState()
    step(SPEC, 1, 10, state, Signals(requests=100), 0.0, 2)
    # 2 replicas answer 12 req/s while 20 arrive: the backlog grows by 8 req/s
    result = step(SPEC, 1, 10, state, Signals(requests=160, in_flight=40), 5.0, 2)
    assert result.rate == 20.0 and result.target == 4


def test_a_restarted_controller_starts_from_what_runs():
    state = ScaleState()
    result = step(SPEC, 1, 10, state, Signals(requests=1000), 0.0, current=5)
    assert result.target == 5 and result.reason is None


def test_the_forecast_provisions_a_daily_peak_before_it_arrives():
    spec = Autoscale(target_rps=6.0, forecast=True, forecast_bin=60, season=86400)
    state = ScaleState()

    def daily(t: float) -> float:  # a peak of 30 req/s around minute 720 of each "day"
        minute = (t / 60) % 1440
        return 3 + 27 * math.exp(-((minute - 720) / 60) ** 2)

    for minute in range(3 * 1440 + 600):  # three days and ten hours of history
        record_history(state, daily(minute * 60), minute * 60.0, 60)
    now = (3 * 1440 + 600) * 60.0
    assert daily(now) < 6  # quiet now, at minute 600 of the day
    predicted = forecast_rate(state, spec, lead=3 * 3600)
    assert predicted is not None and predicted > 25  # the peak three hours ahead
    result = step(spec, 1, 10, ScaleState(), Signals(requests=0), now, 1, predicted)
    assert result.target >= 5


def test_a_down_window_of_two_passes_still_scales_down():
    spec = Autoscale(target_rps=4.0, down_window=10, down_cooldown=10, idle_timeout=20)
    state, load = ScaleState(), Load()
    drive(spec, state, load, 8.0, 30, current=2, low=0)
    assert state.target == 2
    quiet = drive(spec, state, load, 0.0, 60, current=2, low=0)
    assert quiet[-1] == 0, quiet


def test_a_load_on_a_boundary_settles_without_going_back_and_forth():
    # 19 req/s +-10 % at 5 req/s per replica: 3.4 to 4.2 replicas' worth, now and then
    # just above 4.1 (which asks for a fifth)
    spec = Autoscale(target_rps=5.0, down_window=120, down_cooldown=300, up_cooldown=20)
    state, load = ScaleState(), Load()
    targets = drive(spec, state, load, 19.0, 3600, current=6, low=2, high=6, jitter=0.1,
                    rng=random.Random(7))
    changes = [(i, t) for i, t in enumerate(targets) if i and t != targets[i - 1]]
    assert [t for _, t in changes] == [5], changes  # one settle from the overshoot, no more

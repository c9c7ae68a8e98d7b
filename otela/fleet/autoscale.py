"""Autoscaling: how many replicas a deployment with ``min``/``max`` should have now, from
signals the federation already has. Pure: the controller passes the time and the signals
in, and keeps the state (``memory.ScaleState``) between passes.

The wish: enough replicas that each takes at most ``target_rps`` requests per second
(the request rate at the ingresses; with ``forecast``, the SageServe forecast of the next
lead time when it is higher) and ``target_in_flight`` concurrent requests (on its serving
nodes); one more than serve now while the mean time to first byte is above ``ttft``; at
least one while a request is held for a first replica (scale to zero) or while the
deployment saw a request within ``idle_timeout``. A load within ``tolerance`` of a whole
replica is not rounded up for a scale-up, and rounded up for a scale-down: a load on a
boundary keeps the count it has.

Hysteresis: up at once to what the load asks for (one replica at a time, at most every
``up_cooldown``, when only the first-byte time asks for more); down
only when every wish over the last ``down_window`` was lower, at most every
``down_cooldown``, and only to the highest of those wishes. A burst raises the count; it
takes a whole quiet window to lower it again, so the count does not flap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from otela.fleet.memory import ScaleState
from otela.fleet.spec import Autoscale

RATE_WINDOW_S = 5.0  # rates and the mean TTFT are measured over at least this long


@dataclass(frozen=True)
class Signals:
    requests: float | None  # requests answered so far at the ingresses (a counter)
    in_flight: float = 0.0  # concurrent requests on the deployment's serving nodes
    held: float = 0.0  # requests held at ingresses for a first replica
    queued: float = 0.0  # requests waiting at ingresses for room on a replica
    ttft_sum: float | None = None  # first-byte seconds so far at the ingresses (a counter)
    ttft_count: float | None = None  # and how many requests they are
    serving: int = 0  # replicas serving now


@dataclass(frozen=True)
class Step:
    target: int
    reason: str | None  # why it changed; None if it did not
    wish: int
    rate: float


def update_rate(state: ScaleState, arrived: float | None, now: float) -> float:
    """The arrival rate, over at least ``RATE_WINDOW_S``, from a counter of requests that
    arrived (answered + in flight: answers alone are capped at what the replicas manage,
    and would hide an overload). A counter that went back (an ingress restarted) starts
    afresh."""
    if arrived is None:
        return state.rate
    if state.requests is None or arrived < 0.9 * state.requests:
        state.requests, state.requests_at = arrived, now
        return state.rate
    elapsed = now - state.requests_at
    if elapsed >= RATE_WINDOW_S:
        state.rate = max(0.0, arrived - state.requests) / elapsed
        state.requests, state.requests_at = arrived, now
    return state.rate


def update_ttft(state: ScaleState, total: float | None, count: float | None, now: float
                ) -> float | None:
    """The mean time to first byte of the requests answered over the last window (at least
    ``RATE_WINDOW_S``); ``None`` when none were."""
    if total is None or count is None:
        return None
    if state.ttft_count is None or count < state.ttft_count:
        state.ttft_sum, state.ttft_count, state.ttft_at = total, count, now
        return None
    if now - state.ttft_at >= RATE_WINDOW_S:
        answered = count - state.ttft_count
        state.ttft = (total - state.ttft_sum) / answered if answered > 0 else None
        state.ttft_sum, state.ttft_count, state.ttft_at = total, count, now
    return state.ttft


def record_history(state: ScaleState, rate: float, now: float, bin_s: float) -> None:
    """Add ``rate`` to the forecaster's history (mean rate per ``bin_s`` bin)."""
    if state.bin_start == 0.0:
        state.bin_start = now
    while now - state.bin_start >= bin_s:
        state.history.append(state.bin_sum / state.bin_samples if state.bin_samples else rate)
        state.bin_start += bin_s
        state.bin_sum, state.bin_samples = 0.0, 0
    state.bin_sum += rate
    state.bin_samples += 1


def forecast_rate(state: ScaleState, spec: Autoscale, lead: float) -> float | None:
    """The highest rate the SageServe forecaster expects over the next ``lead`` seconds
    (plus one bin), from the deployment's own history; ``None`` without history."""
    if not state.history:
        return None
    import numpy as np

    from simulator.policies.sageserve.forecast import forecast_series

    season = max(round(spec.season / spec.forecast_bin), 1)
    steps = max(math.ceil(lead / spec.forecast_bin) + 1, 1)
    predicted = forecast_series(np.asarray(state.history, dtype=float), season, steps)
    return float(max(predicted)) if len(predicted) else None


def wish(spec: Autoscale, rate: float, signals: Signals, ttft: float | None = None) -> int:
    """Replicas the load asks for, before limits and hysteresis."""
    return max(load_wish(spec, rate, signals), ttft_wish(spec, ttft, signals.serving))


def load_wish(spec: Autoscale, rate: float, signals: Signals, margin: float | None = None
              ) -> int:
    """Replicas the request rate and the in-flight requests ask for: the load in
    replicas' worth, rounded up after taking ``margin`` off (``-tolerance`` by default:
    a load just above a whole number of replicas does not add one; ``+tolerance`` for
    the wish a scale-down must see, so that between the two lies a dead band and a load
    on a boundary keeps the count it has)."""
    loads = [0.0]
    if spec.target_rps:
        loads.append(rate / spec.target_rps)
    if spec.target_in_flight:  # a queued request is one more the replicas should hold
        loads.append((signals.in_flight + signals.queued) / spec.target_in_flight)
    load = max(loads)
    if load <= 0:
        return 0
    return max(0, math.ceil(load + (-spec.tolerance if margin is None else margin)))


def ttft_wish(spec: Autoscale, ttft: float | None, serving: int) -> int:
    """One more than serve now while the first bytes come slower than the target."""
    if spec.ttft is not None and ttft is not None and ttft > spec.ttft and serving > 0:
        return serving + 1
    return 0


def step(spec: Autoscale, low: int, high: int, state: ScaleState, signals: Signals,
         now: float, current: int, forecast: float | None = None) -> Step:
    """The deployment's target now. ``current``: replicas it has (the target a restarted
    controller starts from, so it never scales just because it restarted)."""
    # (queued: requests the replicas have no room for yet have arrived too)
    arrived = None if signals.requests is None else \
        signals.requests + signals.in_flight + signals.queued
    rate = update_rate(state, arrived, now)
    ttft = update_ttft(state, signals.ttft_sum, signals.ttft_count, now)
    if rate > 0 or signals.in_flight > 0 or signals.held > 0 or signals.queued > 0:
        state.last_request = now
    effective = max(rate, forecast or 0.0)
    by_load = load_wish(spec, effective, signals)
    slow = ttft_wish(spec, ttft, signals.serving)
    awake = signals.held > 0 or bool(state.last_request and
                                     now - state.last_request < spec.idle_timeout)

    def limited(wish: int) -> int:
        return min(max(wish, 1 if awake else 0, low), high)

    raw = limited(max(by_load, slow))
    # What a scale-down must have seen over its whole window: the same, rounded up.
    state.recent.append((now, limited(max(load_wish(spec, effective, signals,
                                                    spec.tolerance), slow))))
    # The wishes of the last ``down_window``, and the one before it (whose wish held at
    # the window's start): the window is full once that one is at least a window old.
    inside = [i for i, (t, _) in enumerate(state.recent) if now - t < spec.down_window]
    state.recent = state.recent[max(inside[0] - 1, 0):]
    target = state.target if state.target is not None else min(max(current, low), high)
    reason = None
    if raw > target:
        # A load-based wish is absolute: straight to it. A TTFT-based one adds a replica
        # at a time, and waits ``up_cooldown`` for the last one to start helping.
        if target == 0 or min(by_load, high) > target or \
                now - state.last_up >= spec.up_cooldown:
            why = "a request is waiting for a first replica" if target == 0 and \
                signals.held > 0 else _load_text(spec, signals, forecast, rate, ttft)
            reason = f"up {target} -> {raw}: {why}"
            target, state.last_up = raw, now
    elif raw < target:
        window_full = now - state.recent[0][0] >= spec.down_window
        highest = max(w for _, w in state.recent)
        calm = now - max(state.last_up, state.last_down) >= spec.down_cooldown
        if window_full and highest < target and calm:
            reason = (f"down {target} -> {highest}: every wish over the last "
                      f"{spec.down_window:.0f}s was at most {highest} "
                      f"({_load_text(spec, signals, forecast, rate, ttft)})")
            target, state.last_down = highest, now
    state.target = target
    return Step(target, reason, raw, rate)


def _load_text(spec: Autoscale, signals: Signals, forecast: float | None, measured: float,
               ttft: float | None) -> str:
    parts = [f"{measured:.2f} req/s"]
    if forecast is not None and forecast > measured:
        parts.append(f"forecast {forecast:.2f} req/s")
    if spec.target_rps:
        parts.append(f"target {spec.target_rps:g} req/s per replica")
    if spec.target_in_flight:
        parts.append(f"{signals.in_flight:.0f} in flight (target "
                     f"{spec.target_in_flight:g} per replica)")
    if spec.ttft is not None and ttft is not None:
        parts.append(f"ttft {ttft:.2f}s (target {spec.ttft:g}s)")
    return ", ".join(parts)

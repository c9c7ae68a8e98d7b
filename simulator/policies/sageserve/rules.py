"""SageServe's per-request scaling rules (§4, §6.4) and NIW release rule (§6.2), as pure
functions of what an endpoint reports: its effective memory utilisation, its instance count,
the time of its last scaling event, and (for the forecast-aware modes) the hourly target.

* reactive (the O365 baseline): scale out above 70 % utilisation, in below 30 %, at most one
  event per 15 s cooldown, within [min, max];
* LT-I: jump to the hourly target at once (applied by the policy, not per request);
* LT-U: the reactive thresholds, but only towards the target (out while below it, in while
  above it);
* LT-UA: LT-U, and in the hour's last 20 minutes keep scaling past the target when the
  observed load is >= 5x (out) or <= 0.5x (in) the forecast.
"""

from __future__ import annotations

from dataclasses import dataclass

MODES = ("reactive", "lt-i", "lt-u", "lt-ua")


@dataclass(frozen=True)
class Thresholds:
    scale_out: float = 0.70
    scale_in: float = 0.30
    cooldown_s: float = 15.0
    min_instances: int = 1
    max_instances: int = 64
    ua_window_s: float = 1200.0  # LT-UA: the last 20 minutes of the hour
    ua_over: float = 5.0
    ua_under: float = 0.5


def scaling_step(
    mode: str,
    util: float,
    count: int,
    now: float,
    last_event: float,
    th: Thresholds,
    target: int | None = None,
    observed_over_forecast: float | None = None,
    hour_elapsed_s: float = 0.0,
) -> int:
    """+1 (launch one instance), -1 (drain one) or 0, for one request's arrival."""
    if mode not in MODES:
        raise ValueError(f"unknown scaling mode {mode!r}")
    if mode == "lt-i" or now - last_event < th.cooldown_s:
        return 0
    want = 0
    if util > th.scale_out and count < th.max_instances:
        want = 1
    elif util < th.scale_in and count > th.min_instances:
        want = -1
    if mode == "reactive" or want == 0:
        return want
    assert target is not None, "forecast-aware modes need the hourly target"
    if (want > 0 and count < target) or (want < 0 and count > target):
        return want
    if mode == "lt-ua" and hour_elapsed_s >= 3600.0 - th.ua_window_s and observed_over_forecast:
        if want > 0 and observed_over_forecast >= th.ua_over:
            return want
        if want < 0 and observed_over_forecast <= th.ua_under:
            return want
    return 0


def niw_release(util: float, one_below: float = 0.60, two_below: float = 0.50) -> int:
    """How many queued batch requests an endpoint signalling `util` receives (§6.2)."""
    if util < two_below:
        return 2
    if util < one_below:
        return 1
    return 0

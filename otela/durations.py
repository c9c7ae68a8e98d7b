"""Durations as people type them (``90s``, ``15m``, ``24h``, ``7d``, ``2w``); pure."""

from __future__ import annotations

import math

_DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}


def parse_duration(text: str, *, unit_required: bool = False) -> float:
    """Seconds from ``90``, ``90s``, ``15m``, ``24h``, ``7d`` or ``2w`` (a bare number is
    seconds unless ``unit_required``); ``ValueError`` otherwise."""
    value = text.strip().lower()
    unit = _DURATION_UNITS.get(value[-1:]) if value else None
    number = value[:-1].strip() if unit else value
    try:
        if unit is None and unit_required:
            raise ValueError
        seconds = float(number) * (unit or 1.0)
    except ValueError:
        raise ValueError(f"not a duration: {text!r} (use e.g. 90s, 15m, 24h, 7d)") from None
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"duration must be positive: {text!r}")
    return seconds

"""OSERVE §5.1 S2: per-type arrival-rate forecasts for the next span.

The paper trains an LSTM on two weeks of Azure traces (50 spans of history -> the next one).
A simulated run has no such training set, so otela forecasts each type's count with Holt's
linear exponential smoothing (level + trend), the classical short-horizon forecaster: it
follows a drifting composition one span ahead, which is what the switching decision needs,
and it needs no fitting. The paper's own "moving average" baseline is Holt without the trend.
"""

from __future__ import annotations

import numpy as np


def holt(series: np.ndarray, alpha: float = 0.5, beta: float = 0.3) -> float:
    """One-step-ahead forecast of a series by Holt's method (0 for an empty series)."""
    if len(series) == 0:
        return 0.0
    level, trend = float(series[0]), 0.0
    for y in series[1:]:
        prev = level
        level = alpha * float(y) + (1 - alpha) * (level + trend)
        trend = beta * (level - prev) + (1 - beta) * trend
    return max(0.0, level + trend)


class TypeRateForecaster:
    """Counts arrivals per type per span; predicts each type's rate (req/s) for the next."""

    def __init__(self, types: int, alpha: float = 0.5, beta: float = 0.3) -> None:
        self.types = types
        self.alpha = alpha
        self.beta = beta
        self.current = np.zeros(types)
        self.history: list[np.ndarray] = []
        self.span_s = 1.0

    def observe(self, type_index: int) -> None:
        self.current[type_index] += 1

    def close_span(self, span_s: float) -> None:
        self.history.append(self.current / span_s)
        self.current = np.zeros(self.types)
        self.span_s = span_s

    def predict(self) -> np.ndarray:
        if not self.history:
            return np.zeros(self.types)
        h = np.array(self.history)
        return np.array([holt(h[:, j], self.alpha, self.beta) for j in range(self.types)])

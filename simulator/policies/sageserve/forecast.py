"""SageServe §6.3: forecasting each region's interactive token load for the next hour.

The paper fits ARIMA per region and model (orders chosen by AIC) to traffic with strong daily
periodicity. otela fits the seasonal ARIMA that such series reduce to, ARIMA(p,0,0) x
(0,1,0)_s: difference at the season s (one day of bins), then an AR(p) on what is left,
fitted by least squares; forecasts add the AR's prediction of the seasonal difference to last
season's value. With no full season of history yet it falls back to persistence (the last
observed value), which is what a reactive system effectively assumes. This keeps the
dependency list as it is (no statsmodels) and it is what the AIC search lands on for a daily
series with a slowly varying level.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SeasonalAR:
    """y_t - y_{t-s} = c + sum_i phi_i (y_{t-i} - y_{t-i-s}) + e_t."""

    season: int
    phi: tuple[float, ...]
    const: float

    @classmethod
    def fit(cls, y: np.ndarray, season: int, order: int = 2) -> SeasonalAR:
        """Least-squares fit; needs more than one season plus `order` points."""
        y = np.asarray(y, dtype=float)
        d = y[season:] - y[:-season]
        if len(d) <= order + 1:
            raise ValueError(f"need more than {season + order + 1} observations to fit")
        rows = [d[t - order:t][::-1] for t in range(order, len(d))]
        x = np.column_stack([np.ones(len(rows)), np.array(rows)]) if order else np.ones((len(d), 1))
        target = d[order:]
        coef, *_ = np.linalg.lstsq(x, target, rcond=None)
        phi = tuple(float(c) for c in coef[1:])
        # keep the AR part stationary: shrink explosive fits (short or odd histories)
        s = sum(abs(p) for p in phi)
        if s >= 0.98:
            phi = tuple(p * 0.98 / s for p in phi)
        return cls(season, phi, float(coef[0]))

    def forecast(self, y: np.ndarray, steps: int) -> np.ndarray:
        """The next `steps` values after the series `y` (at least one season long)."""
        hist = list(np.asarray(y, dtype=float))
        s, p = self.season, len(self.phi)
        diffs = [hist[t] - hist[t - s] for t in range(s, len(hist))]
        out = []
        for _ in range(steps):
            lagged = diffs[-p:][::-1] if p else []
            lagged += [0.0] * (p - len(lagged))
            d = self.const + sum(c * v for c, v in zip(self.phi, lagged, strict=True))
            nxt = max(0.0, hist[-s] + d)
            hist.append(nxt)
            diffs.append(nxt - hist[-1 - s])
            out.append(nxt)
        return np.array(out)


def forecast_series(y: np.ndarray, season: int, steps: int, order: int = 2) -> np.ndarray:
    """Forecast `steps` bins ahead: the seasonal AR when there is enough history, else
    persistence of the last bin (zeros for an empty series)."""
    y = np.asarray(y, dtype=float)
    if len(y) == 0:
        return np.zeros(steps)
    try:
        model = SeasonalAR.fit(y, season, order)
    except ValueError:
        return np.full(steps, float(y[-1]))
    return model.forecast(y, steps)

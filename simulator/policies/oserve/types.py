"""OSERVE §5.1 S1: request types by k-means over (input, output) lengths.

Clustering runs in log space: lengths span three orders of magnitude and "short" versus
"long" is a ratio, not a difference. The four types of the paper's Table 1 (short/long input
x short/long output) are what k = 4 finds on a workload mixing them; `name_types` labels the
centroids that way so reports read like the paper.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RequestTypes:
    """Centroids in (log input, log output) space; type j is the j-th centroid."""

    centroids: np.ndarray  # shape (k, 2), natural log of token counts
    names: tuple[str, ...]

    @property
    def k(self) -> int:
        return len(self.centroids)

    def classify(self, input_len: np.ndarray, output_len: np.ndarray) -> np.ndarray:
        """Type index of each request: the nearest centroid."""
        x = _features(input_len, output_len)
        d = ((x[:, None, :] - self.centroids[None, :, :]) ** 2).sum(axis=2)
        return np.asarray(d.argmin(axis=1), dtype=np.int64)

    def mean_lengths(self) -> list[tuple[int, int]]:
        """(input, output) tokens at each centroid (the lengths capacities are profiled at)."""
        return [(round(float(np.exp(c[0]))), round(float(np.exp(c[1])))) for c in self.centroids]


def _features(input_len: np.ndarray, output_len: np.ndarray) -> np.ndarray:
    return np.column_stack([np.log(np.maximum(input_len, 1)), np.log(np.maximum(output_len, 1))])


def kmeans(
    x: np.ndarray, k: int, seed: int = 0, iters: int = 100, restarts: int = 8
) -> np.ndarray:
    """Lloyd's algorithm with k-means++ seeding, best of `restarts` runs (lowest inertia:
    one run easily splits a big cluster and merges two small ones); returns the centroids
    sorted by first coordinate, then second."""
    if len(x) < k:
        raise ValueError(f"k-means needs at least {k} points, got {len(x)}")
    best, best_inertia = None, np.inf
    for i in range(restarts):
        c = _lloyd(x, k, np.random.default_rng(seed + i), iters)
        inertia = float(_sq_dist(x, c).min(axis=1).sum())
        if inertia < best_inertia:
            best, best_inertia = c, inertia
    assert best is not None
    order = np.lexsort((best[:, 1], best[:, 0]))
    return best[order]


def _sq_dist(x: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Squared distances of points to centroids, (n, k). Two features, summed in the order
    ``((x - c) ** 2).sum(axis=2)`` sums them (the same floats), without its (n, k, 2)
    temporaries: k-means' distance steps were a fifth of OSERVE's planning time."""
    if x.shape[1] != 2:
        return ((x[:, None, :] - c[None]) ** 2).sum(axis=2)
    d0 = x[:, 0:1] - c[None, :, 0]
    d1 = x[:, 1:2] - c[None, :, 1]
    d0 *= d0
    d1 *= d1
    d0 += d1
    return d0


def _lloyd(x: np.ndarray, k: int, rng: np.random.Generator, iters: int) -> np.ndarray:
    cents = [x[rng.integers(len(x))]]
    for _ in range(1, k):
        d = np.min(_sq_dist(x, np.array(cents)), axis=1)
        p = d / d.sum() if d.sum() > 0 else np.full(len(x), 1 / len(x))
        cents.append(x[rng.choice(len(x), p=p)])
    c = np.array(cents, dtype=float)
    for _ in range(iters):
        lab = _sq_dist(x, c).argmin(axis=1)
        new = np.array([x[lab == j].mean(axis=0) if np.any(lab == j) else c[j] for j in range(k)])
        if np.allclose(new, c):
            break
        c = new
    return c


def fit_types(
    input_len: np.ndarray, output_len: np.ndarray, k: int = 4, seed: int = 0,
    sample: int = 20_000,
) -> RequestTypes:
    """Cluster requests into `k` types (a random sample of at most `sample` requests)."""
    x = _features(np.asarray(input_len), np.asarray(output_len))
    if len(x) > sample:
        x = x[np.random.default_rng(seed).choice(len(x), sample, replace=False)]
    c = kmeans(x, k, seed)
    return RequestTypes(c, name_types(c))


def name_types(centroids: np.ndarray) -> tuple[str, ...]:
    """SI/LI x SO/LO labels relative to the middle of the centroids' range in log space (e.g.
    'SILO': short input, long output), numbered when two centroids share a label."""
    mi = (centroids[:, 0].min() + centroids[:, 0].max()) / 2
    mo = (centroids[:, 1].min() + centroids[:, 1].max()) / 2
    names: list[str] = []
    for c in centroids:
        base = ("LI" if c[0] > mi else "SI") + ("LO" if c[1] > mo else "SO")
        names.append(base if base not in names else f"{base}{names.count(base) + 1}")
    return tuple(names)

"""Prometheus metrics for a node: counters, gauges and histograms with labels, and the
text exposition format (0.0.4) that ``GET /metrics`` serves.

Written for the request path's budget rather than taken from ``prometheus_client``: a
node's loop is single-threaded, so an increment is a dictionary update with no lock, and
the few values that already live elsewhere (registry size, liveness counters, pool
statistics) are read when scraped (``Registry.collect``), never copied on every change.
Names follow Prometheus conventions: ``otela_`` prefix, base units (seconds, bytes),
``_total`` for counters.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

LabelValues = tuple[str, ...]
# Who sees which series of a metric: given the scraper's ``Authorization``, a filter over
# label values (``None``: every series). Set on metrics whose labels say something about
# someone (the ingress service's per-key series); ``None``: public.
Viewer = Callable[[str | None], Callable[[LabelValues], bool] | None]

# Seconds, for request latency and time to first byte: 0.5 ms to 2 minutes.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                   2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
# Seconds, for how late the event loop runs.
LAG_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: tuple[str, ...], values: LabelValues, extra: str = "") -> str:
    pairs = [f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        pairs.append(extra)
    return "{" + ",".join(pairs) + "}" if pairs else ""


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


@dataclass
class Counter:
    name: str
    help: str
    labels: tuple[str, ...] = ()
    values: dict[LabelValues, float] = field(default_factory=dict)
    kind: str = "counter"
    viewer: Viewer | None = None

    def inc(self, *label_values: str, by: float = 1.0) -> None:
        self.values[label_values] = self.values.get(label_values, 0.0) + by

    def set(self, *label_values: str, value: float) -> None:
        self.values[label_values] = value

    def lines(self, shown: Callable[[LabelValues], bool] | None = None) -> Iterable[str]:
        for values, number in self.values.items():
            if shown is not None and not shown(values):
                continue
            yield f"{self.name}{_labels(self.labels, values)} {_number(number)}"


def Gauge(name: str, help: str, labels: tuple[str, ...] = ()) -> Counter:
    """A gauge: set, not only incremented (same storage as a counter)."""
    return Counter(name, help, labels, kind="gauge")


@dataclass
class Histogram:
    name: str
    help: str
    buckets: tuple[float, ...] = LATENCY_BUCKETS
    labels: tuple[str, ...] = ()
    series: dict[LabelValues, list[float]] = field(default_factory=dict)  # counts.., sum
    kind: str = "histogram"
    viewer: Viewer | None = None

    def observe(self, value: float, *label_values: str) -> None:
        counts = self.series.get(label_values)
        if counts is None:
            counts = self.series[label_values] = [0.0] * (len(self.buckets) + 2)
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                counts[i] += 1
                break
        else:
            counts[len(self.buckets)] += 1
        counts[-1] += value

    def count(self, *label_values: str) -> int:
        counts = self.series.get(label_values)
        return int(sum(counts[:-1])) if counts else 0

    def quantile_bound(self, q: float, *label_values: str) -> float | None:
        """The upper bound of the bucket holding quantile ``q`` (None: no samples)."""
        counts = self.series.get(label_values)
        total = self.count(*label_values)
        if not counts or not total:
            return None
        running = 0.0
        for bound, count in zip((*self.buckets, math.inf), counts, strict=False):
            running += count
            if running >= q * total:
                return bound
        return math.inf

    def lines(self, shown: Callable[[LabelValues], bool] | None = None) -> Iterable[str]:
        for values, counts in self.series.items():
            if shown is not None and not shown(values):
                continue
            running = 0.0
            for bound, count in zip((*self.buckets, math.inf), counts, strict=False):
                running += count
                le = f'le="{_number(bound)}"'
                yield f"{self.name}_bucket{_labels(self.labels, values, le)} {_number(running)}"
            yield f"{self.name}_sum{_labels(self.labels, values)} {_number(counts[-1])}"
            yield f"{self.name}_count{_labels(self.labels, values)} {_number(running)}"


Metric = Counter | Histogram


class Registry:
    """The metrics of one process, and callbacks that refresh read-on-scrape values."""

    def __init__(self) -> None:
        self.metrics: dict[str, Metric] = {}
        self._collectors: list[Callable[[], None]] = []

    def add(self, metric: Metric) -> Metric:
        self.metrics[metric.name] = metric
        return metric

    def counter(self, name: str, help: str, labels: tuple[str, ...] = ()) -> Counter:
        metric = self.add(Counter(name, help, labels))
        assert isinstance(metric, Counter)
        return metric

    def gauge(self, name: str, help: str, labels: tuple[str, ...] = ()) -> Counter:
        metric = self.add(Gauge(name, help, labels))
        assert isinstance(metric, Counter)
        return metric

    def histogram(self, name: str, help: str, buckets: tuple[float, ...] = LATENCY_BUCKETS,
                  labels: tuple[str, ...] = ()) -> Histogram:
        metric = self.add(Histogram(name, help, buckets, labels))
        assert isinstance(metric, Histogram)
        return metric

    def collect(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` before every rendering (to copy values kept elsewhere)."""
        self._collectors.append(callback)

    def state(self) -> dict[str, list[list[Any]]]:
        """Every series's current value, for another process to add up (``absorb``)."""
        for callback in self._collectors:
            callback()
        out: dict[str, list[list[Any]]] = {}
        for name, metric in self.metrics.items():
            if isinstance(metric, Histogram):
                out[name] = [[list(k), list(v)] for k, v in metric.series.items()]
            else:
                out[name] = [[list(k), v] for k, v in metric.values.items()]
        return out

    def absorb(self, states: Iterable[dict[str, list[list[Any]]]]) -> None:
        """Set each series that appears in ``states`` (other processes' ``state()``, e.g.
        data-path workers) to its sum over them; series they do not have are untouched."""
        counters: dict[tuple[str, LabelValues], float] = {}
        series: dict[tuple[str, LabelValues], list[float]] = {}
        for state in states:
            for name, rows in state.items():
                metric = self.metrics.get(name)
                for labels, value in rows:
                    key = (name, tuple(labels))
                    if isinstance(metric, Histogram):
                        total = series.setdefault(key, [0.0] * len(value))
                        for i, count in enumerate(value[:len(total)]):
                            total[i] += count
                    elif metric is not None:
                        counters[key] = counters.get(key, 0.0) + float(value)
        for (name, labels), value in counters.items():
            counter = self.metrics[name]
            assert isinstance(counter, Counter)
            counter.values[labels] = value
        for (name, labels), counts in series.items():
            histogram = self.metrics[name]
            assert isinstance(histogram, Histogram)
            histogram.series[labels] = counts

    def render(self, authorization: str | None = None) -> bytes:
        """The exposition text for a scraper sending ``authorization``: series of metrics
        with a ``viewer`` only as far as it shows them to this scraper."""
        for callback in self._collectors:
            callback()
        out: list[str] = []
        for metric in self.metrics.values():
            out.append(f"# HELP {metric.name} {metric.help}")
            out.append(f"# TYPE {metric.name} {metric.kind}")
            shown = None if metric.viewer is None else metric.viewer(authorization)
            out.extend(metric.lines(shown))
        return ("\n".join(out) + "\n").encode()


CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"

"""How busy each serving node is, as this ingress knows it. Pure: callers pass times in.

Two sources, combined per node:

- this ingress's own requests in flight there (``Router.busy``: exact, but blind to other
  ingresses' traffic);
- the node's own report: requests in flight at the node (from every ingress), and what
  its engine says in its Prometheus metrics (running, waiting, KV cache use), plus a
  capacity weight from its hardware. Reports arrive on every answer the node sends
  (``x-otela-load``, the way Envoy's ORCA load reports ride on responses: fresh exactly
  where traffic flows, no control-plane bytes) and as soft state sent straight to the
  ingress nodes at a bounded rate (``otela.load.reports``), so an ingress also knows
  about nodes it has not used lately. Reports expire: a node that stops reporting falls
  back to what this ingress sees itself.

The estimate of a node's outstanding work is ``max(ours, reported + sent since)``:
requests sent after a report are not in it yet, and ours are a lower bound of the node's.
Policies compare ``estimate / weight``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from otela.dataplane.headers import LOAD

LOAD_HEADER = LOAD
_FIELDS = {"f": "in_flight", "r": "running", "w": "waiting", "kv": "kv_usage",
           "c": "capacity", "m": "slots"}
KV_FULL = 0.98  # an engine whose KV cache is this full has no room for another request
MAX_REPORTED = 1_000_000  # a node cannot claim absurd numbers to distort others' math
MAX_CAPACITY = 1_000.0


@dataclass(frozen=True)
class NodeLoad:
    """One node's report about itself."""

    in_flight: int = 0  # engine requests the node has open (from every ingress)
    running: int | None = None  # engine's own figures, when it exposes them
    waiting: int | None = None
    kv_usage: float | None = None  # 0..1
    capacity: float = 1.0  # relative serving capacity (1 = one mid-range GPU)
    slots: int | None = None  # requests its engine takes at once (--max-concurrency)

    @property
    def outstanding(self) -> int:
        """Requests at the node not yet answered: the engine's count when it has one (it
        includes work the node's counters cannot see, e.g. engine-side queueing)."""
        if self.running is None and self.waiting is None:
            return self.in_flight
        return max(self.in_flight, (self.running or 0) + (self.waiting or 0))

    def header(self) -> bytes:
        parts = [b"f=%d" % self.in_flight]
        if self.running is not None:
            parts.append(b"r=%d" % self.running)
        if self.waiting is not None:
            parts.append(b"w=%d" % self.waiting)
        if self.kv_usage is not None:
            parts.append(b"kv=%.3f" % self.kv_usage)
        parts.append(b"c=%.3g" % self.capacity)
        if self.slots is not None:
            parts.append(b"m=%d" % self.slots)
        return b";".join(parts)

    def room(self, outstanding: float, held_back: float = 0.0) -> float:
        """Requests the node can take beyond ``outstanding`` (infinite: it declares no
        limit; 0: its engine's KV cache is full), leaving ``held_back`` of its slots (a
        fraction, rounded down) to the best priority class."""
        if self.slots is None:
            return math.inf
        if self.kv_usage is not None and self.kv_usage >= KV_FULL:
            return 0.0
        return max(0.0, self.slots - math.floor(self.slots * held_back) - outstanding)

    def to_dict(self) -> dict[str, float | int | None]:
        return {"in_flight": self.in_flight, "running": self.running,
                "waiting": self.waiting, "kv_usage": self.kv_usage,
                "capacity": self.capacity, "slots": self.slots}


def parse_load(raw: bytes | str) -> NodeLoad | None:
    """A report as ``NodeLoad.header`` wrote it; ``None`` if it is not one (a report is
    advice: a malformed one is ignored, never an error)."""
    text = raw.decode("latin-1") if isinstance(raw, bytes) else raw
    values: dict[str, float] = {}
    for part in text.split(";"):
        key, _, value = part.strip().partition("=")
        if key not in _FIELDS:
            continue
        try:
            number = float(value)
        except ValueError:
            return None
        if not math.isfinite(number) or number < 0:
            return None
        values[_FIELDS[key]] = number
    if "in_flight" not in values:
        return None

    def count(name: str) -> int | None:
        return None if name not in values else min(int(values[name]), MAX_REPORTED)

    kv = values.get("kv_usage")
    return NodeLoad(
        in_flight=min(int(values["in_flight"]), MAX_REPORTED),
        running=count("running"), waiting=count("waiting"),
        kv_usage=None if kv is None else min(kv, 1.0),
        capacity=min(max(values.get("capacity", 1.0), 1e-3), MAX_CAPACITY),
        slots=count("slots"))


@dataclass
class _Report:
    load: NodeLoad
    at: float
    ttl: float
    sent_since: int = 0  # requests this ingress sent there after the report

    def live(self, now: float) -> bool:
        return now - self.at <= self.ttl


@dataclass
class LoadBoard:
    """The latest report per node session, each valid for ``ttl`` seconds."""

    ttl: float = 15.0
    _reports: dict[str, _Report] = field(default_factory=dict)
    # Sessions whose latest report declares a concurrency: where none does, every node has
    # room and the ingress queue is never consulted (one set lookup per request).
    limited: set[str] = field(default_factory=set)

    def report(self, session: str, load: NodeLoad, now: float, ttl: float | None = None
               ) -> None:
        """Take ``session``'s report, valid ``ttl`` seconds (default: the board's)."""
        current = self._reports.get(session)
        if current is None or now >= current.at:
            self._reports[session] = _Report(load, now, self.ttl if ttl is None else ttl)
            if load.slots is None:
                self.limited.discard(session)
            else:
                self.limited.add(session)

    def sent(self, session: str) -> None:
        report = self._reports.get(session)
        if report is not None:
            report.sent_since += 1

    def latest(self, session: str, now: float) -> NodeLoad | None:
        report = self._reports.get(session)
        if report is None or not report.live(now):
            return None
        return report.load

    def estimate(self, session: str, ours: int, now: float) -> float:
        """Outstanding requests at the node, as well as this ingress can tell."""
        return self.estimate_and_capacity(session, ours, now)[0]

    def estimate_and_capacity(self, session: str, ours: int, now: float
                              ) -> tuple[float, float]:
        """``estimate`` and ``capacity`` at once: what routing reads for every candidate
        it looks at, with one lookup."""
        report = self._reports.get(session)
        if report is None or not report.live(now):
            return float(ours), 1.0
        load = report.load
        return float(max(ours, load.outstanding + report.sent_since)), load.capacity

    def in_flight(self, session: str, ours: int, now: float) -> float:
        """Requests open at the node through otela, as well as this ingress can tell: the
        room a node has is counted in these (its engine's own running and waiting counts
        are read every few seconds, and a busy engine's last reading would keep a slot
        that just freed looking taken until the next)."""
        report = self._reports.get(session)
        if report is None or not report.live(now):
            return float(ours)
        return float(max(ours, report.load.in_flight + report.sent_since))

    def capacity(self, session: str, now: float) -> float:
        load = self.latest(session, now)
        return 1.0 if load is None else load.capacity

    def snapshot(self, now: float) -> dict[str, dict[str, float | int | None]]:
        """Live reports (for /v1/network and for data-path workers)."""
        return {s: {**r.load.to_dict(), "age_s": round(now - r.at, 3),
                    "ttl_s": round(r.ttl - (now - r.at), 3)}
                for s, r in self._reports.items() if r.live(now)}

    def absorb(self, snapshot: Mapping[str, Mapping[str, Any]], now: float) -> None:
        """Take reports from another process's ``snapshot`` (data-path workers)."""
        for session, fields in snapshot.items():
            try:
                load = NodeLoad(
                    in_flight=int(fields["in_flight"]), running=_opt_int(fields["running"]),
                    waiting=_opt_int(fields["waiting"]),
                    kv_usage=None if fields["kv_usage"] is None else float(fields["kv_usage"]),
                    capacity=float(fields["capacity"]), slots=_opt_int(fields.get("slots")))
                self.report(session, load, now - float(fields["age_s"]),
                            float(fields["ttl_s"]) + float(fields["age_s"]))
            except (KeyError, TypeError, ValueError):
                continue

    def forget_except(self, sessions: set[str] | frozenset[str]) -> None:
        self._reports = {s: r for s, r in self._reports.items() if s in sessions}
        self.limited &= set(sessions)


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def capacity_of_gpus(bandwidths_gbs: list[float]) -> float:
    """A node's capacity weight from its GPUs' memory bandwidths (decode, the bulk of LLM
    serving time, is memory-bound): in units of 2 TB/s, about one A100-80G; a node with
    no GPU counts as 1 (CPU test nodes are all alike)."""
    if not bandwidths_gbs:
        return 1.0
    return round(sum(bandwidths_gbs) / 2000.0, 3) or 1.0

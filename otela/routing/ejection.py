"""Passive outlier ejection, Envoy-style: a node that keeps failing stops getting traffic
from this ingress for a while, before the failure detector would evict it (which it may
never do: a node whose engine answers 500s is alive).

A failure is a connection that could not be made, an engine that answered 5xx, or one
that took a request and said nothing within the first-byte timeout; 4xx answers are the
client's problem and count for nothing; any other answer resets the count. A refused
connection ejects at once: nothing listens at the node's address (its process is gone),
and a least-loaded policy would otherwise favour it, since it fails fast and so always
looks idle (seen in benchmarks/chaos.py: the request after half the nodes were killed
tried three dead ones). So does a connection attempt nobody answers (the host is down or
cut off: each request sent there would wait out the connect timeout first; seen in the
chaos benchmark's partition, where requests tried three cut-off nodes in a row).
After ``consecutive`` failures in a row a node is ejected for
``base * 2**(ejections-1)`` seconds (capped at ``max_time``): each relapse keeps it out
longer. At most ``max_share`` of a model's candidates are ejected at once: when more
would be, the oldest ejection ends first — ejecting everything would turn one bad minute
into an outage.
Pure: callers pass times in.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field


@dataclass
class _Health:
    failures: int = 0  # in a row
    ejections: int = 0  # so far: the next ejection lasts longer
    ejected_until: float = 0.0
    ejected_at: float = 0.0


@dataclass
class Ejections:
    consecutive: int = 5
    base: float = 10.0
    max_time: float = 300.0
    max_share: float = 0.5
    _health: dict[str, _Health] = field(default_factory=dict)
    total: int = 0  # ejections so far (metrics)
    # When the last ejection in force ends: before it, routing asks ``ejected``; after it,
    # no node is ejected and the per-request scan of candidates is skipped.
    in_force_until: float = 0.0

    def success(self, session: str) -> None:
        health = self._health.get(session)
        if health is not None:
            health.failures = 0

    def failure(self, session: str, now: float, unreachable: bool = False) -> bool:
        """Count a failure (``unreachable``: a connection refused or not answered, which
        ejects at once); whether the node is ejected now."""
        health = self._health.setdefault(session, _Health())
        health.failures = max(health.failures + 1, self.consecutive if unreachable else 0)
        if health.failures < self.consecutive or health.ejected_until > now:
            return False
        health.failures = 0
        health.ejections += 1
        health.ejected_at = now
        health.ejected_until = now + min(self.max_time,
                                         self.base * 2 ** (health.ejections - 1))
        self.in_force_until = max(self.in_force_until, health.ejected_until)
        self.total += 1
        return True

    def any_in_force(self, now: float) -> bool:
        """Whether some node may be ejected now (False: ``ejected`` would leave none out)."""
        return self.in_force_until > now

    def ejected(self, sessions: Collection[str], now: float) -> frozenset[str]:
        """Which of ``sessions`` (one model's candidates) to leave out now."""
        out = [(h.ejected_at, s) for s in sessions
               if (h := self._health.get(s)) is not None and h.ejected_until > now]
        allowed = int(self.max_share * len(sessions))
        out.sort(reverse=True)  # the most recent ejections stay; the oldest end first
        return frozenset(s for _, s in out[:allowed])

    def report(self, now: float) -> dict[str, dict[str, float]]:
        """For /v1/network: every node ejected now, for how much longer, how often so far
        (it may still get traffic: see ``max_share``)."""
        return {s: {"remaining_s": round(h.ejected_until - now, 3),
                    "ejections": h.ejections}
                for s, h in self._health.items() if h.ejected_until > now}

    def count(self, now: float) -> int:
        return sum(1 for h in self._health.values() if h.ejected_until > now)

    def forget_except(self, sessions: Collection[str]) -> None:
        """Drop the state of sessions that are gone (LEFT, compacted)."""
        self._health = {s: h for s, h in self._health.items() if s in sessions}

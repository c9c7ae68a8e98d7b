"""Members that misbehave within their rights, as this node sees them. Pure: callers pass
the time.

A member's signature proves who wrote something, not that it should have: it may flood
the registry with its own updates, sign evictions without the failure detector's evidence
(``otela.registry.evidence``) or faster than any failure could explain. Such writes are
refused and counted where they arrive (``otela.replication.replicator``); the member that
made them is *reported* here: listed in ``/v1/health`` (``replication.misbehaving``), named
in a warning within a log budget, and kept out of this node's routing for ``EXCLUDE_S``
after its last offence, as if suspected (a node that lies about others is not trusted
with users' requests either). Bounded: at most ``MAX_OFFENDERS`` are remembered, the
oldest forgotten first.

``PeerRates`` are the per-peer token buckets the replicator meters those writes with.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

EXCLUDE_S = 600.0
MAX_OFFENDERS = 1024

# What a member did (the keys of ``Offence.kinds``).
UNJUSTIFIED_EVICTION = "eviction without evidence"
EVICTION_RATE = "evictions beyond the rate"
GOSSIP_RATE = "registry gossip beyond the rate"


@dataclass
class Offence:
    first_at: float
    last_at: float
    kinds: Counter[str] = field(default_factory=Counter)


class Misconduct:
    def __init__(self, exclude_s: float = EXCLUDE_S) -> None:
        self.exclude_s = exclude_s
        self._offenders: OrderedDict[str, Offence] = OrderedDict()
        self._excluded: frozenset[str] = frozenset()
        self._excluded_until = float("inf")  # when ``_excluded`` next changes by expiry

    def report(self, peer_id: str, kind: str, now: float) -> bool:
        """Count an offence; True when it is news (the peer's first, or its first in
        ``exclude_s``): worth a warning."""
        offence = self._offenders.pop(peer_id, None)
        fresh = offence is None or now - offence.last_at >= self.exclude_s
        if offence is None:
            offence = Offence(now, now)
        offence.last_at = now
        offence.kinds[kind] += 1
        self._offenders[peer_id] = offence  # last: the most recent offender is kept longest
        while len(self._offenders) > MAX_OFFENDERS:
            self._offenders.popitem(last=False)
        if peer_id not in self._excluded:
            self._excluded = self._excluded | {peer_id}
        self._excluded_until = min(self._excluded_until, now + self.exclude_s)
        return fresh

    def excluded(self, now: float) -> frozenset[str]:
        """Peers routing should avoid now. Cheap: the request path asks it every time."""
        if now >= self._excluded_until:
            live = {p: o for p, o in self._offenders.items() if now - o.last_at < self.exclude_s}
            self._excluded = frozenset(live)
            self._excluded_until = min((o.last_at + self.exclude_s for o in live.values()),
                                       default=float("inf"))
        return self._excluded

    def snapshot(self, now: float) -> list[dict[str, Any]]:
        """For ``/v1/health``: every remembered offender, most recent first."""
        return [{"peer_id": peer_id, "offences": dict(o.kinds),
                 "first_s_ago": round(now - o.first_at, 1),
                 "last_s_ago": round(now - o.last_at, 1),
                 "excluded_from_routing": now - o.last_at < self.exclude_s}
                for peer_id, o in reversed(self._offenders.items())]


class PeerRates:
    """A token bucket per peer: ``burst`` at once, then ``per_second``. Bounded memory:
    past ``max_peers`` buckets, the full ones (peers quiet long enough) are dropped."""

    def __init__(self, burst: float, per_second: float, max_peers: int = 4096) -> None:
        self.burst = burst
        self.per_second = per_second
        self.max_peers = max_peers
        self._buckets: dict[str, tuple[float, float]] = {}  # peer -> (level, at)

    def _level(self, peer_id: str, now: float) -> float:
        level, at = self._buckets.get(peer_id, (self.burst, now))
        return min(self.burst, level + max(0.0, now - at) * self.per_second)

    def allows(self, peer_id: str, now: float) -> bool:
        """Whether ``take`` would succeed now (takes nothing)."""
        return self._level(peer_id, now) >= 1.0

    def take(self, peer_id: str, now: float) -> bool:
        """Take one token if there is one; whether there was."""
        level = self._level(peer_id, now)
        if level < 1.0:
            self._buckets[peer_id] = (level, now)
            return False
        self._buckets[peer_id] = (level - 1.0, now)
        if len(self._buckets) > self.max_peers:
            self._buckets = {p: (lvl, t) for p, (lvl, t) in self._buckets.items()
                             if lvl + (now - t) * self.per_second < self.burst}
        return True

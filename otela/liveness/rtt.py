"""Per-peer probe timeouts that follow measured round trips (TCP's RTO estimator). Pure.

A fixed probe timeout is either too long for a healthy federation (slow detection) or
too short for a loaded one: with 128 daemons on 2 cores each process waits hundreds of
ms for its turn on a core, and a 1 s timeout turned that queueing into false suspicions,
each answered by a refutation, both gossiped to every node (more load, more queueing).
So, as TCP does for retransmissions (Jacobson/Karels, RFC 6298), each node keeps a
smoothed round-trip time and its variation per peer, from acks only, and waits
``srtt + 4 x rttvar`` for a peer's ack, never less than the configured probe timeout and
never more than ``ceiling``. A peer with no history gets the configured timeout.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ALPHA = 1 / 8  # weight of a new sample in the smoothed RTT (RFC 6298)
BETA = 1 / 4  # weight of a new sample's deviation in the RTT variation


@dataclass
class RoundTrips:
    floor: float  # the configured probe timeout
    ceiling: float
    _srtt: dict[str, float] = field(default_factory=dict)
    _rttvar: dict[str, float] = field(default_factory=dict)

    def observe(self, peer_id: str, seconds: float) -> None:
        """A round trip to ``peer_id`` that got its answer (timeouts are not samples)."""
        srtt = self._srtt.get(peer_id)
        if srtt is None:
            self._srtt[peer_id], self._rttvar[peer_id] = seconds, seconds / 2
            return
        self._rttvar[peer_id] = (1 - BETA) * self._rttvar[peer_id] + BETA * abs(srtt - seconds)
        self._srtt[peer_id] = (1 - ALPHA) * srtt + ALPHA * seconds

    def timeout(self, peer_id: str) -> float:
        srtt = self._srtt.get(peer_id)
        if srtt is None:
            return self.floor
        return min(self.ceiling, max(self.floor, srtt + 4 * self._rttvar[peer_id]))

    def smoothed(self, peer_id: str) -> float | None:
        return self._srtt.get(peer_id)

    def forget(self, peer_id: str) -> None:
        """Drop the history of a peer no longer a member."""
        self._srtt.pop(peer_id, None)
        self._rttvar.pop(peer_id, None)

    def forget_except(self, peer_ids: set[str]) -> None:
        """Drop the history of peers no longer members."""
        for table in (self._srtt, self._rttvar):
            for peer_id in set(table) - peer_ids:
                del table[peer_id]

"""Whom the failure detector probes: its neighbours, and neighbours it lost. Pure.

SWIM probes every member, which over UDP is free. Over libp2p, contacting a peer we hold
no connection to costs a TCP + Noise + Yamux handshake, identify and a GossipSub hello on
both ends (tens of ms of CPU), and peering then trims the extra connection again. So a
node watches the peers it is connected to anyway (peering keeps 4-10 random ones, so every
node is watched by several others), and every neighbour whose connection dropped without
our closing it: a vanished connection is the strongest early sign of a crash, so such a
*lost* neighbour is probed before anyone else, every round, until a probe decides (it
answered, directly or through a helper, or it is now suspected).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class NeighbourWatch:
    neighbours: set[str] = field(default_factory=set)  # connected members, as last observed
    lost: dict[str, float] = field(default_factory=dict)  # lost neighbour -> last probed
    rng: random.Random = field(default_factory=random.Random)
    _order: list[str] = field(default_factory=list)

    def observe(self, connected: set[str], watchable: set[str], now: float) -> list[str]:
        """Take the current connections; ``watchable`` are members still worth probing
        (alive, not LEFT). Returns neighbours newly lost."""
        connected &= watchable
        newly_lost = sorted(self.neighbours - connected - set(self.lost))
        for peer_id in newly_lost:
            self.lost[peer_id] = now
        self.neighbours = connected
        self.lost = {p: t for p, t in self.lost.items() if p in watchable and p not in connected}
        return newly_lost

    def forget(self, peer_id: str) -> None:
        """We close this connection on purpose: its disappearance is no sign of failure."""
        self.neighbours.discard(peer_id)
        self.lost.pop(peer_id, None)

    def decided(self, peer_id: str) -> None:
        """A probe reached ``peer_id`` (or it is now suspected): no longer lost."""
        self.lost.pop(peer_id, None)

    def watched(self) -> set[str]:
        return self.neighbours | set(self.lost)

    def next_target(self, now: float) -> str | None:
        """The least recently probed lost neighbour, else the next neighbour of a shuffled
        round (each neighbour is probed once per pass, as in SWIM)."""
        if self.lost:
            target = min(self.lost, key=self.lost.__getitem__)
            self.lost[target] = now
            return target
        self._order = [p for p in self._order if p in self.neighbours]
        if not self._order:
            self._order = sorted(self.neighbours)
            self.rng.shuffle(self._order)
        return self._order.pop() if self._order else None

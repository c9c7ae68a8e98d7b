"""Whom the failure detector probes: its neighbours, and neighbours it lost. Pure.

SWIM probes every member, which over UDP is free. Over libp2p, contacting a peer we hold
no connection to costs a TCP + Noise + Yamux handshake, identify and a GossipSub hello on
both ends (tens of ms of CPU), and peering then trims the extra connection again. So a
node watches the peers it is connected to anyway (peering keeps 4-16 random ones, so every
node is watched by several others), and every neighbour whose connection dropped without
our closing it: a vanished connection is the strongest early sign of a crash, so such a
*lost* neighbour is probed before anyone else, every round, until a probe decides (it
answered, directly or through a helper, or it is now suspected).

Two races are closed: a connection that opened and closed between two observations is
reported by the caller in ``appeared`` (from libp2p's connection notifications), and a
peer lost before its registry record reached us stays pending for ``PENDING_S``, so a node
that joins and crashes within a second is still detected.

A suspect we were picked to verify (``verify``) is probed next in the same way, connected
to us or not.

Members we are not connected to are left to their own neighbours, which is enough until a
partition puts all of a member's neighbours on the other side: nobody on ours would ever
probe it, and it would stay listed as serving here until the heal. So the prober also
checks, now and then, one member it is not connected to (``next_unwatched``: the one
checked longest ago), with a plain TCP connect; one that does not accept is then probed as
a lost neighbour (``verify``).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Container, Iterable
from dataclasses import dataclass, field

PENDING_S = 30.0  # how long a lost peer we know no record of yet stays lost


@dataclass
class NeighbourWatch:
    neighbours: set[str] = field(default_factory=set)  # connected peers, as last observed
    lost: dict[str, float] = field(default_factory=dict)  # lost neighbour -> last probed
    rng: random.Random = field(default_factory=random.Random)
    _order: list[str] = field(default_factory=list)
    _watchable: set[str] = field(default_factory=set)
    _lost_at: dict[str, float] = field(default_factory=dict)
    _parted: set[str] = field(default_factory=set)  # closed by us since the last call
    # Members in the order ``next_unwatched`` looks at them: never checked, then checked
    # longest ago; and the same members as a set (``admit`` adds them).
    _rotation: deque[str] = field(default_factory=deque)
    _rotating: set[str] = field(default_factory=set)

    def observe(self, connected: set[str], watchable: set[str], known: set[str], now: float,
                appeared: frozenset[str] = frozenset()) -> list[str]:
        """Take the current connections. ``watchable``: members worth probing (not LEFT,
        not confirmed dead); ``known``: every peer the registry names; ``appeared``: peers
        that connected since the last call (maybe gone again). Returns newly lost peers
        that can be probed now."""
        newly_lost = (self.neighbours | appeared) - connected - set(self.lost) - self._parted
        self._parted = set()
        for peer_id in newly_lost:
            self.lost[peer_id] = now
            self._lost_at[peer_id] = now
        self.neighbours = connected
        self._watchable = watchable
        self.lost = {
            p: t for p, t in self.lost.items() if p not in connected and (
                p in watchable or (p not in known and now - self._lost_at[p] < PENDING_S))
        }
        self._lost_at = {p: t for p, t in self._lost_at.items() if p in self.lost}
        return sorted(p for p in newly_lost if p in watchable)

    def forget(self, peer_id: str) -> None:
        """We close this connection on purpose: its disappearance is no sign of failure."""
        self.neighbours.discard(peer_id)
        self.lost.pop(peer_id, None)
        self._parted.add(peer_id)

    def decided(self, peer_id: str) -> None:
        """A probe reached ``peer_id`` (or it is now suspected): no longer lost."""
        self.lost.pop(peer_id, None)

    def verify(self, peer_id: str, now: float) -> bool:
        """Probe ``peer_id`` next: we were picked to check a suspicion of it first-hand
        (``LivenessTable.should_verify``). Not connected to it, we treat it as lost (probed
        until a probe decides); connected, it goes to the front of the round. Returns
        False if it was lost already (probed first anyway)."""
        if peer_id in self.neighbours:
            if peer_id in self._order:
                self._order.remove(peer_id)
            self._order.append(peer_id)
            return True
        if peer_id in self.lost:
            return False
        self.lost[peer_id] = float("-inf")  # never probed: ahead of every lost peer
        self._lost_at[peer_id] = now
        return True

    def admit(self, peers: Iterable[str]) -> None:
        """Members seen for the first time (never checked): to the front of the unwatched
        check's rotation, in random order. A member already in it keeps its place."""
        fresh = sorted(set(peers) - self._rotating)
        self.rng.shuffle(fresh)
        self._rotation.extendleft(fresh)
        self._rotating.update(fresh)

    def next_unwatched(self, members: Container[str], unhealthy: Container[str],
                       now: float) -> str | None:
        """Among ``members`` (those ``admit`` has seen) not ``unhealthy``, those we neither
        hold a connection to nor probe as lost, the one checked longest ago (never checked
        first, ties at random); it counts as checked now. None if every member is watched.

        A rotation, not a search: each member looked at, checked or passed over (watched
        anyway, or suspected), moves to the back, and one no longer a member leaves it. So
        a call costs a step or two, where sorting every member with a Python key cost
        ~1 ms at 1,000 members, ~20 ms at 10,000 and ~280 ms at 100,000 (the event loop
        stalled that long every ten periods, requests included)."""
        watched = self.neighbours.union(self.lost)
        for _ in range(len(self._rotation)):
            peer_id = self._rotation.popleft()
            if peer_id not in members:  # left: re-enters through ``admit`` if it returns
                self._rotating.discard(peer_id)
                continue
            self._rotation.append(peer_id)  # checked now, or passed over until its turn
            if peer_id not in watched and peer_id not in unhealthy:
                return peer_id
        return None

    def watched(self) -> set[str]:
        return (self.neighbours | set(self.lost)) & self._watchable

    def next_target(self, now: float) -> str | None:
        """The least recently probed lost neighbour, else the next neighbour of a shuffled
        round (each neighbour is probed once per pass, as in SWIM)."""
        probeable = [p for p in self.lost if p in self._watchable]
        if probeable:
            target = min(probeable, key=self.lost.__getitem__)
            self.lost[target] = now
            return target
        neighbours = self.neighbours & self._watchable
        self._order = [p for p in self._order if p in neighbours]
        if not self._order:
            self._order = sorted(neighbours)
            self.rng.shuffle(self._order)
        return self._order.pop() if self._order else None

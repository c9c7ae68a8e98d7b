"""When a peer's replica has drifted from ours: anti-entropy on evidence, not on a timer.

Every liveness message (probe, ack, indirect probe, each way) carries a short summary of
the sender's registry and how long it has been unchanged. Two replicas that differ while
both have been still for ``settle`` seconds hold a difference that gossip is not about to
fill: a delta lost on every path, history from the other side of a partition, an entry one
of them learned by anti-entropy (which is not re-gossiped). Those are the exchanges worth a
stream. Differences that come and go are deltas in flight and cost nothing.

This replaced anti-entropy with a random peer every 5 s as the main repair path: each
exchange opened a libp2p stream (multistream-select and Yamux set-up, ~10 frames), which
on an idle federation was about a sixth of a node's CPU for nothing, the replicas being
equal nearly always. The periodic exchange remains as a backstop, every 30 s.

Pure: the caller supplies the clock and acts on the answer.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

SUMMARY_BYTES = 8
SETTLE_S = 2.0  # both replicas unchanged this long: the difference is not in flight
FIRST_GAP_S = 10.0  # at most one drift exchange per peer this often...
MAX_GAP_S = 300.0  # ...doubling while exchanges leave the difference in place
PEERS_KEPT = 4096  # peers remembered; a peer minting identities cannot grow the map


def summary(root: bytes, revoked: list[str]) -> bytes:
    """A replica in a few bytes: the map's root hash and the revoked serials."""
    h = hashlib.blake2b(root, digest_size=SUMMARY_BYTES)
    for serial in revoked:
        h.update(serial.encode())
    return h.digest()


@dataclass
class _Peer:
    gap: float = FIRST_GAP_S
    last_sync: float = float("-inf")


class DriftWatch:
    """Decides, from one peer's summary and ours, whether to run anti-entropy with it."""

    def __init__(self, settle: float = SETTLE_S, first_gap: float = FIRST_GAP_S,
                 max_gap: float = MAX_GAP_S) -> None:
        self.settle = settle
        self.first_gap = first_gap
        self.max_gap = max_gap
        self._peers: dict[str, _Peer] = {}

    def compare(self, peer: str, theirs: bytes, their_age: float, ours: bytes,
                our_age: float, now: float, *, leader: bool) -> bool:
        """Whether an exchange with ``peer`` is due now (and, if so, count it as made).

        Both sides see the difference at about the same moment and one exchange repairs
        both replicas, so the ``leader`` of the pair (the caller breaks the tie, e.g. by
        the lower peer id) goes first; the other waits ``first_gap`` longer, in case the
        leader could not. Equal summaries reset the peer's back-off. A peer whose
        difference outlives the exchanges meant to repair it (replicas that legitimately
        disagree, such as a record only one side accepts) is asked less and less often,
        down to every ``max_gap`` seconds."""
        if theirs == ours:
            self._peers.pop(peer, None)
            return False
        settle = self.settle if leader else self.settle + self.first_gap
        if their_age < settle or our_age < settle:
            return False
        state = self._peers.get(peer)
        if state is None:
            if len(self._peers) >= PEERS_KEPT:
                self._peers.clear()
            state = self._peers[peer] = _Peer(self.first_gap)
        elif now - state.last_sync < state.gap:
            return False
        else:
            state.gap = min(2 * state.gap, self.max_gap)
        state.last_sync = now
        return True

    def forget(self, peer: str) -> None:
        self._peers.pop(peer, None)

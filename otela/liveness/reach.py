"""Whether this node can still reach most of the federation: a sample of TCP connects to
members picked at random. Pure: no I/O, no clock reads.

Why: a node on the smaller side of a partition suspects the members it probes on the
other side, and those suspicions run their course like any other. Each eviction needs two
independent signers (``otela.registry.evidence``), which a cut-off region of many nodes
has: 90 nodes cut off from 1,000 (the mesh simulator, ``docs/scale.md``) kept evicting
live members of the other 910, each one LEFT on every replica at the heal and forced to
rejoin. The number of members a node suspects does not tell the sides apart: a node
suspects only the peers it probes (its dozen neighbours, and those it checks), and
peering soon refills its neighbours from its own side, so on the cut-off side of that run
no node suspected more than a tenth of the federation.

A connect to a member picked at random does tell them apart: from the larger side most
are answered, from the smaller side most are not. So while this node holds suspects (a
decision may come), each probe period it connects to members picked at random (any
status, any connection: an unbiased sample of the federation; ``BATCH`` at once while the
sample is short, else one) and keeps the answers. An answer of any kind, the connection
accepted or refused (nothing listens, but the host and the network are there), counts as
reached; no answer in time counts as not reached; a member with no plain TCP address
(behind NAT) is not counted. When more than half of the last
``SAMPLE`` answers within ``WINDOW_S`` (and at least ``MIN_ANSWERS``) went unanswered, by
more than ``SILENT_FLOOR`` distinct members (one host down, picked again and again in a
small federation, is not a partition), the node is *cut off*
(``LivenessTable.observe_reach``): it confirms no one and signs no eviction, and the
suspicions it raised meanwhile are dropped once it reaches most members again, since they
are what the cut produced.

The price, the same as Kubernetes' node controller pays when every zone looks unhealthy
(it stops evicting): when more than half of the federation's hosts go down at once, the
survivors keep them suspected, out of routing, and never evict them while most members
stay unreachable. A crashed daemon whose host is up refuses connections, which counts as
reached, so only whole hosts lost together hold evictions back.
"""

from __future__ import annotations

from collections import deque

SAMPLE = 8  # the most recent answers that count
MIN_ANSWERS = 4  # fewer than this in the window: no verdict (the state stays)
WINDOW_S = 30.0  # answers older than this no longer count
SILENT_FLOOR = 3  # cut off only when more distinct members than this did not answer
BATCH = 4  # connects at once while the sample is short


class ReachSample:
    """The most recent connect answers from random members, and what they say."""

    def __init__(self) -> None:
        self._answers: deque[tuple[float, str, bool]] = deque(maxlen=SAMPLE)

    def note(self, peer: str, answer: str, now: float) -> None:
        """A connect's answer (``otela.mesh.listening.ConnectAnswer``): ``accepted`` or
        ``refused`` reached the member's host, ``unknown`` did not, ``none`` (no address to
        try) says nothing."""
        if answer in ("accepted", "refused"):
            self._answers.append((now, peer, True))
        elif answer == "unknown":
            self._answers.append((now, peer, False))

    def wanted(self, now: float) -> int:
        """How many members to connect to now: up to ``BATCH`` at once while fewer than
        ``SAMPLE`` answers are recent (a verdict is needed before a grace runs out, and a
        node on the cut-off side spends seconds per probe round), else one."""
        recent = sum(1 for at, _, _ in self._answers if now - at <= WINDOW_S)
        return min(BATCH, max(1, SAMPLE - recent))

    def cut_off(self, now: float) -> bool | None:
        """True when more than half of the recent answers found nobody, at more than
        ``SILENT_FLOOR`` members: most of the federation is out of this node's reach. False
        when most answers reached someone. None, no verdict either way (the caller keeps
        its state), with fewer than ``MIN_ANSWERS`` recent answers (a cut-off node whose
        loop stalled must not take silence for the heal) or when the silent ones are too
        few members to tell a partition from a host or two down (a small federation's
        cut-off side flapping out of "cut off" would confirm and evict meanwhile)."""
        recent = [(peer, reached) for at, peer, reached in self._answers if now - at <= WINDOW_S]
        if len(recent) < MIN_ANSWERS:
            return None
        silent = [peer for peer, reached in recent if not reached]
        if 2 * len(silent) <= len(recent):
            return False
        return True if len(set(silent)) > SILENT_FLOOR else None

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
decision may come), each probe period it connects to members it has not asked recently
(any status, any connection: an unbiased sample of the federation; all it lacks at once
while the sample is short, else one) and keeps each one's latest answer, for the last
``SAMPLE`` members asked (a federation that small is asked in full: a census). An answer
of any kind, the connection accepted or refused (nothing listens, but the host and the
network are there), counts as reached; no answer in time counts as not reached; a member
with no plain TCP address (behind NAT) is asked but not counted. When more than half of
the members answering within ``WINDOW_S`` (and at least ``MIN_ANSWERS``) did not, and
more than ``SILENT_FLOOR`` of them (a host or two down in a small federation is not a
partition), the node is *cut off* (``LivenessTable.observe_reach``): it confirms no one
and signs no eviction, and the suspicions it raised meanwhile are dropped once it
reaches most members again, since they are what the cut produced.

The verdict must come before any confirmation, not race it: a suspicion is confirmed only
once the whole sample was taken after it began (``taken_since``). A race lost showed on 2
busy cores with seven daemons, two cut off: the two suspected the five, and on the
cut-off side a probe round takes seconds (every path times out), so by the time their
samples were full the grace of the first suspicions had run out and they had evicted two
live members. Counting each member once matters there too: with repeats, two batches of
four picks from six members could hold the one reachable member twice and only three of
the five silent ones, no verdict.

The price, the same as Kubernetes' node controller pays when every zone looks unhealthy
(it stops evicting): when more than half of the federation's hosts go down at once, the
survivors keep them suspected, out of routing, and never evict them while most members
stay unreachable. A crashed daemon whose host is up refuses connections, which counts as
reached, so only whole hosts lost together hold evictions back.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Sequence

SAMPLE = 8  # the most members whose latest answers count
MIN_ANSWERS = 4  # fewer answers than this in the window: no verdict (the state stays)
WINDOW_S = 30.0  # answers older than this no longer count
SILENT_FLOOR = 3  # cut off only when more members than this did not answer
_ANSWERED = {"accepted": True, "refused": True, "unknown": False}  # ``none``: no address


class ReachSample:
    """The latest connect answer of each of up to ``SAMPLE`` members asked recently, and
    what they say."""

    def __init__(self) -> None:
        # member -> (when asked, reached; None: no plain TCP address to try), oldest first
        self._asked: OrderedDict[str, tuple[float, bool | None]] = OrderedDict()

    def note(self, peer: str, answer: str, now: float) -> None:
        """A connect's answer (``otela.mesh.listening.ConnectAnswer``): ``accepted`` or
        ``refused`` reached the member's host, ``unknown`` did not, ``none`` (no address to
        try) says nothing but counts as asked."""
        self._asked.pop(peer, None)
        self._asked[peer] = (now, _ANSWERED.get(answer))
        while len(self._asked) > SAMPLE:
            self._asked.popitem(last=False)

    def _recent(self, now: float, since: float | None = None) -> dict[str, bool | None]:
        """The answers within ``WINDOW_S``, and no older than ``since`` if given."""
        oldest = now - WINDOW_S if since is None else max(since, now - WINDOW_S)
        return {peer: reached for peer, (at, reached) in self._asked.items() if at >= oldest}

    def taken_since(self, now: float, members: int) -> float:
        """The moment since which the whole sample was taken: when the oldest of the
        ``SAMPLE`` (or, in a federation that small, every member's) answers came; minus
        infinity while the sample is short. The caller confirms only suspicions that
        began before it: a verdict on a short sample came too late (the grace of the
        suspicions a cut raised ran out first) or said too little (the few members asked
        may all be on this node's side), and one taken before a suspicion began says
        nothing of the cut that may have raised it."""
        needed = min(SAMPLE, members)
        if needed == 0:
            return now
        times = sorted((at for at, _ in self._asked.values() if now - at <= WINDOW_S),
                       reverse=True)
        return times[needed - 1] if len(times) >= needed else float("-inf")

    def wanted(self, now: float, members: int, since: float | None = None) -> int:
        """How many members to connect to now: as many as the sample taken since
        ``since`` (when the newest suspicion held began) lacks, all at once (the verdict
        comes in one period, even on the cut-off side, where a probe round takes seconds),
        else one (the oldest answer is replaced: the sample stays fresh)."""
        return max(1, min(SAMPLE, members) - len(self._recent(now, since)))

    def targets(self, members: Sequence[str], rng: random.Random, now: float,
                since: float | None = None) -> list[str]:
        """The members to connect to now (``wanted`` of them). A federation of at most
        ``SAMPLE`` members is asked in full, least recently asked first: a census, whose
        verdict no unlucky pick can turn (up to ``4 * SAMPLE`` members the same order
        keeps the picks fresh). A larger one is sampled at random among the members not
        asked since ``since`` (any status, any connection: an unbiased sample)."""
        want = min(self.wanted(now, len(members), since), len(members))
        fresh = self._recent(now, since)
        if len(members) <= 4 * SAMPLE:
            order = list(members)
            rng.shuffle(order)
            order.sort(key=lambda p: self._asked[p][0] if p in fresh else -1.0)
            return sorted(order[:want])
        picks: set[str] = set()
        for _ in range(4 * want):
            peer = rng.choice(members)
            if peer not in fresh:
                picks.add(peer)
                if len(picks) == want:
                    break
        return sorted(picks)

    def cut_off(self, now: float) -> bool | None:
        """True when more than half of the recently asked members found nobody, and more
        than ``SILENT_FLOOR`` of them: most of the federation is out of this node's
        reach. False when most answers reached someone. None, no verdict either way (the
        caller keeps its state), with fewer than ``MIN_ANSWERS`` recent answers (a
        cut-off node whose loop stalled must not take silence for the heal) or when the
        silent ones are too few members to tell a partition from a host or two down (a
        small federation's cut-off side flapping out of "cut off" would confirm and
        evict meanwhile)."""
        answers = [reached for reached in self._recent(now).values() if reached is not None]
        if len(answers) < MIN_ANSWERS:
            return None
        silent = answers.count(False)
        if 2 * silent <= len(answers):
            return False
        return True if silent > SILENT_FLOOR else None

"""The failure detector's state, pure: who is alive or suspected, and what to tell others.

Liveness never enters the registry CRDT (a few probe messages per node per period, not
mesh-wide writes). Each peer has an *incarnation* number only it may raise. The paper's
two-stage policy (§3.4):
1. a peer whose direct probe, indirect probes and recent-contact check all failed becomes
   SUSPECT: routing drops it at once, nothing irreversible happens;
2. a SUSPECT that does not refute (announce a higher incarnation) within its suspicion
   timeout is *confirmed*: the caller then evicts its sessions (LEFT).
The timeout shrinks with independent evidence (Lifeguard's dynamic suspicion timeout):
a suspicion raised by one member alone waits ``max_multiplier`` x ``suspicion_timeout``,
one that ``expected_confirmations`` further members raised independently (or as many as
there are: two survivors of three nodes) waits ``suspicion_timeout``, log-scaled in
between (``timeout_for``). A dead node loses every neighbour's connection and is
suspected by all of them at once, so it is evicted as fast as before; a node that only
one overloaded neighbour could not reach gets several times longer to hear of it and
refute.
Verification: a crashed node that only one member was connected to (peering keeps a few
random connections, and a node that crashes seconds after joining may have just the one
to its bootstrap peer) would be suspected by that member alone and wait the longest
timeout. So when a suspicion is published (strong evidence: a dropped connection or two
suspecters), ``expected_confirmations + 1`` members chosen by a hash of member and suspect
probe the suspect themselves; their failures are the independent confirmations a crash
deserves, and a constant number of probes per suspicion, whatever the federation's size.
Who signs the eviction: every member holding a suspicion confirms it at about the same
moment. If each then signed an eviction, one death (or one false suspicion under load)
would flood N evictions, each delivered to N nodes: N² messages, the very load that set
off cascades of false suspicions in 64-node federations on 2 cores. So first-hand
suspecters sign in a rank order every node computes alike (a hash of suspecter and
suspect), ``eviction_stagger`` apart, and a member that only heard of the suspicion
signs only as a backup, after ``2 x suspicion_timeout``. The first eviction to arrive
ends it for everyone (LEFT removes the member from this table). Both waits grow with the
measured ``dissemination_delay`` (how late gossip arrives): when gossip runs minutes
behind on an overloaded federation, a fixed stagger had each live-but-slow suspect evicted
by twenty or more members, every one of those evictions another flood.
The eviction brake: many members suspected at once (more than ``brake_fraction`` of them,
and more than ``brake_floor``) is rarely many independent crashes; it is this node's own
trouble, a partition, or a federation overloaded as a whole, where every eviction makes a
rejoin and more load (Kubernetes' node controller slows evictions in an unhealthy zone for
the same reason). While the brake is on (and a ``suspicion_timeout`` after), suspects stay
suspected (out of routing, free to refute) and a suspicion is confirmed only when no other
confirmed member awaits its eviction and none was confirmed within ``suspicion_timeout``,
and it is the same one at every node: nodes that really died are still evicted, one at a
time; and suspicions are not published on the liveness topic (they still ride on probes).
Cut off: a node that cannot reach most of the federation (``otela.liveness.reach``: the
caller's sample of connects to random members, ``observe_reach``) is on the smaller side
of a partition, or cut off alone: whatever it suspects, it is more likely the one
unreachable. Then it confirms no one and signs no eviction (confirmations heard from
others included) and spreads no suspicion (the buddy system still shows a suspect its
own); when it reaches most members again it drops the suspicions it holds, which are
what the cut produced (a member that really died meanwhile is suspected again by
those that probe it), and its next refutation is published on the liveness topic.
Until the caller's sample was all taken after a member was suspected
(``reach_taken_since``) the node does not know whether that suspicion is its own cut: it
neither confirms it nor signs its eviction, so that the verdict comes before the grace
runs out, not after.
Under the brake alone, the ~90 nodes of a region cut off from 1,000 kept evicting live
members of the other 910, each eviction signed by two of them: LEFT on every replica at
the heal, and a rejoin for each.
A peer that rejoins under a new session after an eviction starts afresh, past the
incarnation of the news that evicted it (``new_session``, ``_retire``).
Updates (``suspect P@i``, ``alive P@i``) ride on probe messages; each is retransmitted a
bounded number of times (SWIM's λ·log N), so dissemination costs nothing extra.
Pure: no I/O, no clock reads.
"""

from __future__ import annotations

import enum
import hashlib
import heapq
import math
from collections import OrderedDict
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

RETIRED_KEPT = 4096  # retired peers whose incarnation floor is remembered
# A suspicion held on others' word this many base timeouts is probed first-hand
# (``LivenessTable.stale_hearsay``).
HEARSAY_CHECK_TIMEOUTS = 2.0
VERIFIER_PICKS_KEPT = 4096  # suspects whose verifier pick is remembered (``should_verify``)


def _rank(suspecter: str, suspect: str) -> bytes:
    """A suspecter's place in the order of signing ``suspect``'s eviction."""
    return hashlib.sha256(f"{suspecter}|{suspect}".encode()).digest()


class Status(enum.Enum):
    ALIVE = "alive"
    SUSPECT = "suspect"
    CONFIRMED = "confirmed"


@dataclass(slots=True)
class Member:
    peer_id: str
    incarnation: int = 0
    status: Status = Status.ALIVE
    suspected_at: float | None = None  # when suspected, then when confirmed
    unhealthy_at: float | None = None  # when suspected (not ALIVE since then)
    last_heard: float = 0.0
    suspecters: set[str] = field(default_factory=set)  # who suspected this incarnation
    # Their signed statements (``otela.registry.evidence``, packed): what an eviction of
    # this member must carry.
    evidence: dict[str, bytes] = field(default_factory=dict)
    evict_at: float | None = None  # CONFIRMED: when this node signs the eviction itself
    hearsay_checked: bool = False  # probed first-hand for a suspicion held on others' word


@dataclass(frozen=True)
class Update:
    """One piece of liveness news. ``proof``: for ``alive``, the peer's signature of its
    incarnation (required); for ``suspect``, the suspecter's signed statement
    (``otela.registry.evidence``, packed; required of news about others)."""

    peer_id: str
    status: Status
    incarnation: int
    proof: bytes | None = None
    by: str | None = None  # for ``suspect``: the member that suspected it (first hand)


@dataclass
class LivenessTable:
    self_id: str
    suspicion_timeout: float
    retransmit_multiplier: float = 3.0
    max_multiplier: float = 4.0
    expected_confirmations: int = 3
    eviction_stagger: float = 1.0
    dissemination_delay: float = 0.0  # how late gossip arrives here (set by the caller)
    brake_fraction: float = 0.1
    brake_floor: int = 3
    # Signs our statement that we suspect a peer at an incarnation (packed evidence), or
    # None when it cannot (the peer has no live session here).
    sign_suspicion: Callable[[str, int], bytes | None] = lambda peer_id, incarnation: None
    incarnation: int = 0
    members: dict[str, Member] = field(default_factory=dict)
    _outbox: dict[str, tuple[Update, int]] = field(default_factory=dict)
    # Suspicions (peer, incarnation) already published to every node, by us or others.
    published: set[tuple[str, int]] = field(default_factory=set)
    # Our suspicions published again because their eviction lacked a second signer.
    corroborated: set[tuple[str, int]] = field(default_factory=set)
    refute_needed: bool = False
    _alive: Update | None = None  # our latest refutation (``announce_alive``)
    _last_confirmation_at: float | None = None  # ours or one we heard of
    _braked_at: float | None = None  # when the brake was last seen on
    cut_off: bool = False  # most members out of reach (``observe_reach``)
    # Since when the caller's whole reach sample was taken (``ReachSample.taken_since``):
    # a member suspected later is neither confirmed nor evicted yet, as while cut off.
    reach_taken_since: float = math.inf
    # A cut-off ended: the next refutation goes on the liveness topic (``observe_reach``).
    refute_loudly: bool = False
    _member_list: tuple[int, tuple[str, ...]] = (-1, ())  # (membership version, members)
    # Per retired peer: the lowest incarnation whose news is new (see ``_retire``).
    _floors: OrderedDict[str, int] = field(default_factory=OrderedDict)
    base_suspicion_timeout: float = field(init=False)  # before local-health scaling
    # Members not ALIVE, kept as statuses change: every period asks who is suspected, whether
    # the brake is on and when the next grace runs out, and scanning every member for it
    # cost O(N) per period per node (at 10,000 members, four scans a second).
    _unhealthy: set[str] = field(default_factory=set)
    _admitted: list[str] = field(default_factory=list)  # added since ``take_admitted``
    _membership_version: int = 0  # bumped whenever a member is added or removed
    # suspect -> (membership version, whether we are one of its verifiers)
    _verifier_picks: dict[str, tuple[int, bool]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.base_suspicion_timeout = self.suspicion_timeout

    # -- the caller's measurements -----------------------------------------------------

    def scale_timeouts(self, multiplier: float) -> None:
        """Our local health (``health.py``): an unhealthy node waits ``multiplier`` times
        longer before confirming anyone."""
        self.suspicion_timeout = self.base_suspicion_timeout * multiplier

    def observe_dissemination_delay(self, delay: float) -> None:
        """How late gossip arrives here now (the replicator measures it)."""
        self.dissemination_delay = delay

    # -- membership ------------------------------------------------------------------

    def sync_members(self, peer_ids: set[str], now: float) -> None:
        """Track exactly the peers the registry lists as not LEFT (ourselves excluded)."""
        for peer_id in peer_ids - self.members.keys() - {self.self_id}:
            self.add_member(peer_id, now)
        for peer_id in self.members.keys() - peer_ids:
            self.remove_member(peer_id)

    def add_member(self, peer_id: str, now: float) -> None:
        """A peer the registry now lists as not LEFT (no-op for ourselves or a member)."""
        if peer_id != self.self_id and peer_id not in self.members:
            self.members[peer_id] = Member(peer_id, self._floors.pop(peer_id, 0), last_heard=now)
            self._admitted.append(peer_id)
            self._membership_version += 1

    def remove_member(self, peer_id: str) -> None:
        """A member the registry no longer lists as live (LEFT, or gone from its views)."""
        member = self.members.pop(peer_id, None)
        if member is None:
            return
        self._retire(member)
        self._membership_version += 1
        self._unhealthy.discard(peer_id)
        self.published = {key for key in self.published if key[0] != peer_id}
        self.corroborated = {key for key in self.corroborated if key[0] != peer_id}

    def new_session(self, peer_id: str, now: float) -> None:
        """``peer_id`` rejoined under a new session (it learned of its eviction while
        alive): start afresh, or the confirmation that evicted its old session would
        evict the new one too."""
        member = self.members.get(peer_id)
        if member is not None and member.status is not Status.ALIVE:
            self._retire(member)
            self.members[peer_id] = Member(peer_id, self._floors.pop(peer_id), last_heard=now)
            self._unhealthy.discard(peer_id)
            self.published = {key for key in self.published if key[0] != peer_id}
            self.corroborated = {key for key in self.corroborated if key[0] != peer_id}

    def _retire(self, member: Member) -> None:
        """Forget a member's news, but remember past which incarnation news of it is new:
        suspicions and confirmations of the old session still circulate on probes, and
        must not strike the peer when it comes back."""
        self._outbox.pop(member.peer_id, None)
        floor = member.incarnation + (0 if member.status is Status.ALIVE else 1)
        self._floors[member.peer_id] = floor
        self._floors.move_to_end(member.peer_id)
        while len(self._floors) > RETIRED_KEPT:
            self._floors.popitem(last=False)

    def suspected(self) -> frozenset[str]:
        return frozenset(self._unhealthy)

    @property
    def unhealthy(self) -> AbstractSet[str]:
        """Members suspected or confirmed (the table's own set: read, never change it)."""
        return self._unhealthy

    def take_admitted(self) -> list[str]:
        """The members added since the last call, in order (the unwatched check's new
        members: ``NeighbourWatch.admit``)."""
        admitted, self._admitted = self._admitted, []
        return admitted

    def braking(self) -> bool:
        """Whether the eviction brake is on (see the module docstring): more members are
        suspected or confirmed than ``brake_floor`` and ``brake_fraction`` of them."""
        unhealthy = len(self._unhealthy)
        return unhealthy > max(self.brake_floor, self.brake_fraction * len(self.members))

    def member_ids(self) -> tuple[str, ...]:
        """Every member's peer id (the tuple is rebuilt only when a member comes or goes:
        the reach sample picks from it every period while suspects are held)."""
        if self._member_list[0] != self._membership_version:
            self._member_list = (self._membership_version, tuple(self.members))
        return self._member_list[1]

    def newest_unhealthy_at(self) -> float | None:
        """When the newest suspicion held began (the reach sample must be taken after it
        before it may be confirmed: ``otela.liveness.reach``); None while all are ALIVE."""
        return max((m.unhealthy_at for p in self._unhealthy
                    if (m := self.members.get(p)) is not None and m.unhealthy_at is not None),
                   default=None)

    def _reach_known(self, member: Member) -> bool:
        """Whether the reach sample was all taken after ``member`` was suspected: only
        then does it tell whether the suspicion is this node's cut."""
        return member.unhealthy_at is None or member.unhealthy_at <= self.reach_taken_since

    def _mark_unhealthy(self, member: Member, now: float) -> None:
        member.unhealthy_at, member.hearsay_checked = now, False
        self._unhealthy.add(member.peer_id)

    def _mark_healthy(self, member: Member) -> None:
        member.unhealthy_at = None
        self._unhealthy.discard(member.peer_id)

    def observe_reach(self, cut_off: bool) -> int:
        """Whether this node is cut off now (``otela.liveness.reach``). Ending a cut-off
        drops every suspicion and confirmation held (see the module docstring); returns
        how many."""
        was, self.cut_off = self.cut_off, cut_off
        if cut_off and not was:  # stop spreading suspicions: they would outlive the cut
            self._outbox = {p: queued for p, queued in self._outbox.items()
                            if queued[0].status is Status.ALIVE}
        if not was or cut_off:
            return 0
        # The other side may hold suspicions of us whose news budget ran out during the
        # cut: one refutation answers them all (they are of our incarnation before it),
        # but told on probes alone it reached a suspecter too late to stop its eviction
        # (300 nodes, 84 cut off for 60 s: ~50 live nodes evicted in the 25 s after the
        # heal, each having refuted 0.2-2.6 s after it). Published, it reaches all at once
        # (``News.refute``: while cut off, and the first refutation after).
        self.refute_loudly = True
        dropped = [self.members[p] for p in self._unhealthy if p in self.members]
        for member in dropped:
            member.status, member.suspected_at, member.evict_at = Status.ALIVE, None, None
            member.unhealthy_at, member.suspecters, member.evidence = None, set(), {}
            self._outbox.pop(member.peer_id, None)
        self._unhealthy.clear()
        self.published.clear()
        self.corroborated.clear()
        return len(dropped)

    # -- observations ------------------------------------------------------------------

    def heard_from(self, peer_id: str, now: float) -> None:
        """Any authenticated message from the peer itself (probe, ack, gossip, sync)."""
        member = self.members.get(peer_id)
        if member is not None:
            member.last_heard = max(member.last_heard, now)

    def heard_recently(self, peer_id: str, now: float, window: float) -> bool:
        member = self.members.get(peer_id)
        return member is not None and now - member.last_heard <= window

    def probe_failed(self, peer_id: str, now: float) -> bool:
        """All three probe paths failed: suspect the peer, or add our independent voice to
        an existing suspicion. Returns whether it is new news to spread."""
        member = self.members.get(peer_id)
        if member is None or (member.status is not Status.ALIVE
                              and self.self_id in member.suspecters):
            return False
        # CONFIRMED on others' word alone: our voice is what its eviction may still lack.
        if member.status is Status.ALIVE:
            member.status, member.suspected_at = Status.SUSPECT, now
            member.suspecters, member.evidence = set(), {}
            self._mark_unhealthy(member, now)
        member.suspecters.add(self.self_id)
        proof = self.sign_suspicion(peer_id, member.incarnation)
        if proof is not None:
            member.evidence[self.self_id] = proof
        self._enqueue(Update(peer_id, Status.SUSPECT, member.incarnation, proof,
                             by=self.self_id))
        return True

    def evidence_of(self, peer_id: str) -> list[tuple[str, int, bytes]]:
        """The signed suspicions we hold of ``peer_id``'s current incarnation: (by,
        incarnation, proof)."""
        member = self.members.get(peer_id)
        if member is None:
            return []
        return [(by, member.incarnation, proof) for by, proof in member.evidence.items()]

    def suspicion_to_publish(self, peer_id: str, connection_lost: bool,
                             corroborate: bool = False) -> Update | None:
        """Our suspicion of ``peer_id``, if it should now be published to every node (once
        per incarnation): only when the evidence is strong, i.e. its connection to us
        dropped without our closing it (what a crash looks like), or another member
        suspects it independently. A lone suspicion of a peer still connected to us
        (typically a slow one) spreads on probes only, and so does its refutation: on 2
        cores with 128 daemons, publishing every such false alarm and its refutation cost
        every node two GossipSub messages each, and that load made the next false alarm
        more likely.

        ``corroborate``: our suspicion has run its course but the eviction it calls for
        lacks the second independent signer every replica requires
        (``otela.registry.evidence``): it is published so that the members chosen to
        verify (``should_verify``) probe the peer first-hand and, if it fails them too,
        sign their own. Without this, a peer that only we watch (bounded watch sets; a
        partition leaving two members on our side) stayed in routing for good. A
        suspicion published before goes out once more (the topic may not have delivered
        it to the verifiers: py-libp2p B2), and rides on our probes again each time."""
        member = self.members.get(peer_id)
        if member is None or member.status not in (
                (Status.SUSPECT, Status.CONFIRMED) if corroborate else (Status.SUSPECT,)):
            return None
        key = (peer_id, member.incarnation)
        strong = connection_lost or len(member.suspecters) > 1 or corroborate
        if (self.self_id not in member.suspecters or not strong or self.braking()
                or self.cut_off):
            return None
        ours = Update(peer_id, Status.SUSPECT, member.incarnation,
                      member.evidence.get(self.self_id), by=self.self_id)
        if corroborate:
            # It rides on our probes again too (marked published: ``News.published_among``)
            # whether or not it goes on the topic: a member that missed the topic's one
            # delivery hears it from the next probe.
            self._enqueue(ours)
            if key in self.corroborated:
                return None
            self.corroborated.add(key)  # once more on the topic per incarnation, no more
        elif key in self.published:
            return None
        self.published.add(key)
        return ours

    def should_verify(self, peer_id: str) -> bool:
        """Whether this node should probe a suspect it heard of first-hand (see the module
        docstring): it is one of the ``expected_confirmations + 1`` members that every node
        picks alike for this suspect, and has not suspected it itself yet."""
        member = self.members.get(peer_id)
        if (member is None or member.status is Status.ALIVE
                or self.self_id in member.suspecters):
            return False
        # The pick hashes every member: kept per suspect until the membership changes,
        # since every piece of news about the suspect asks again (a partition's ~90
        # suspects, each heard of many times, made this most of a 1,000-node simulation's
        # CPU, and a real node pays it alike).
        known = self._verifier_picks.get(peer_id)
        if known is not None and known[0] == self._membership_version:
            return known[1]
        voters = [p for p in self.members if p != peer_id]
        voters.append(self.self_id)
        chosen = heapq.nsmallest(self.expected_confirmations + 1, voters,
                                 key=lambda p: _rank(p, f"verify|{peer_id}"))
        if len(self._verifier_picks) >= VERIFIER_PICKS_KEPT:
            self._verifier_picks.clear()
        self._verifier_picks[peer_id] = (self._membership_version, self.self_id in chosen)
        return self.self_id in chosen

    def suspicion_of(self, peer_id: str) -> Update | None:
        """A signed suspicion we hold of ``peer_id``'s current incarnation (ours, if we
        suspect it first-hand), to show it so that it can refute (``News.piggyback``)."""
        member = self.members.get(peer_id)
        if member is None or member.status is Status.ALIVE or not member.evidence:
            return None
        by = self.self_id if self.self_id in member.evidence else min(member.evidence)
        return Update(peer_id, Status.SUSPECT, member.incarnation, member.evidence[by], by=by)

    def unvouched(self, peer_id: str) -> bool:
        """Whether ``peer_id`` is confirmed here on other members' word alone: we never
        suspected it first-hand, so an eviction we sign has one signer fewer than it could
        (``otela.registry.evidence`` requires two), and a first-hand probe can add ours."""
        member = self.members.get(peer_id)
        return (member is not None and member.status is Status.CONFIRMED
                and self.self_id not in member.suspecters)

    def published_elsewhere(self, peer_id: str, incarnation: int) -> None:
        """Another member published this suspicion to everyone: we need not. Only
        suspicions of members at their current incarnation or later are remembered (a
        member publishing suspicions of made-up peers or incarnations grew the set until
        the next registry change)."""
        member = self.members.get(peer_id)
        if member is None or incarnation < member.incarnation:
            return
        self.published.add((peer_id, incarnation))
        if len(self.published) > 4 * len(self.members) + 64:
            self.published = {(p, i) for p, i in self.published
                              if p in self.members and i >= self.members[p].incarnation}

    def required_confirmations(self, member: Member) -> int:
        """How many confirmations (suspecters beyond the first) cut ``member``'s grace to
        the minimum: ``expected_confirmations``, or as many as could ever come, if fewer.
        Those come from the members other than the suspect that are alive or already
        suspect it, and ourselves, less the first suspecter. In a 3-node federation only
        the two survivors can suspect a crashed third: waiting for 3 confirmations had it
        evicted after 15 s (2.5 x the timeout) instead of 6 s."""
        alive = len(self.members) - len(self._unhealthy)
        if member.peer_id in self.members and member.peer_id not in self._unhealthy:
            alive -= 1
        voters = alive + sum(1 for p in member.suspecters
                             if p != member.peer_id and p in self._unhealthy)
        return min(self.expected_confirmations, voters)

    def timeout_for(self, member: Member) -> float:
        """Lifeguard: the more members independently suspect it, the sooner it is confirmed.

        A lone suspicion waits ``max_multiplier`` x the timeout, grown with log10 of the
        federation's size as in SWIM and memberlist (x1 up to 10 members, x1.5 at 32, x2.1
        at 128): news riding on probes needs O(log N) rounds to reach the suspect, and its
        refutation as long to come back. With ``required_confirmations`` it waits the
        minimum, which for a *published* suspicion does not grow with size: the suspect
        heard of it on the liveness topic in one delivery, and its refutation goes out
        the same way, so it waits ``suspicion_timeout`` plus twice the measured gossip lag
        (the suspicion's delivery and the refutation's), which stretches it where gossip
        runs late. An unpublished suspicion's minimum (the eviction brake is on) keeps
        the log10 N growth. Confirmations scale it log-wise in between."""
        spread = max(1.0, math.log10(len(self.members) + 1))
        maximum = self.max_multiplier * self.suspicion_timeout * spread
        if (member.peer_id, member.incarnation) in self.published:
            minimum = self.suspicion_timeout + 2 * self.dissemination_delay
        else:
            minimum = self.suspicion_timeout * spread
        required = self.required_confirmations(member)
        confirmations = max(0, len(member.suspecters) - 1)
        if confirmations >= required:
            return minimum
        scale = math.log(confirmations + 1) / math.log(required + 1)
        return max(minimum, maximum - (maximum - minimum) * scale)

    def apply(self, update: Update, now: float, proof_valid: bool = False) -> bool:
        """Merge news from another member; return whether it changed our view."""
        if update.peer_id == self.self_id:
            if update.status is Status.ALIVE:
                return False
            if update.incarnation >= self.incarnation:
                self.incarnation = update.incarnation + 1  # refute: outbid the suspicion
                self.refute_needed = True
            elif self._alive is not None and self.self_id not in self._outbox:
                # A suspicion we refuted already, from a member our refutation missed (its
                # news budget ran out): it rides on our messages again, this answer first.
                self._enqueue(self._alive)
            return False
        member = self.members.get(update.peer_id)
        if member is None:
            return False
        if update.status is Status.ALIVE:
            # A refutation lifts a confirmation too: an eviction needs independent
            # suspicions (``otela.registry.evidence``), so a confirmed member that proves it
            # is alive may never be evicted, and must not stay out of routing for good.
            if not proof_valid or update.incarnation <= member.incarnation:
                return False
            member.incarnation, member.status, member.suspected_at = (
                update.incarnation, Status.ALIVE, None
            )
            self._mark_healthy(member)
            member.evict_at, member.evidence = None, {}
            member.last_heard = max(member.last_heard, now)
            self._enqueue(update)
            return True
        if member.status is Status.CONFIRMED and not (
                update.status is Status.SUSPECT and update.incarnation == member.incarnation):
            return False
        if update.status is Status.SUSPECT:
            if update.incarnation < member.incarnation:
                return False
            # A further signer of a suspicion we hold, confirmed or not: its evidence is
            # what an eviction of it may still lack.
            if member.status is not Status.ALIVE and update.incarnation == member.incarnation:
                if update.by is None or update.by in member.suspecters:
                    return False  # nothing new
                member.suspecters.add(update.by)  # an independent confirmation
                self._keep_evidence(member, update)
                self._enqueue(update)
                return True
            member.incarnation, member.status, member.suspected_at = (
                update.incarnation, Status.SUSPECT, now
            )
            self._mark_unhealthy(member, now)
            member.suspecters = {update.by} if update.by else set()
            member.evidence = {}
            self._keep_evidence(member, update)
            self._enqueue(update)
            return True
        # CONFIRMED by another member: taken only for a suspicion we hold ourselves (its
        # evidence reached us too). Unsigned, it could otherwise come from anyone, and an
        # ALIVE member marked confirmed would leave routing with no eviction to follow.
        if member.status is Status.SUSPECT and update.incarnation >= member.incarnation:
            member.status, member.suspected_at = Status.CONFIRMED, now
            # Theirs should land first, unless we are a first-hand suspecter ranked to sign
            # early: a member that only heard of the suspicion may confirm a moment before
            # we do, and its news must not hold our signature back by the backup delay.
            member.evict_at = now + self.eviction_delay(member)
            self._last_confirmation_at = now
            self._enqueue(update)
            return True
        return False

    @staticmethod
    def _keep_evidence(member: Member, update: Update) -> None:
        if update.by is not None and isinstance(update.proof, bytes):
            member.evidence[update.by] = update.proof

    def stale_hearsay(self, now: float) -> list[str]:
        """Suspicions held on others' word alone for ``HEARSAY_CHECK_TIMEOUTS`` base
        timeouts, not yet probed first-hand for it: return them (each once per suspicion)
        so that the caller probes them. Our probe carries the suspicion (the buddy system),
        so a live suspect refutes in its answer.

        A suspicion whose suspecter dropped it (its cut ended), and whose news budget ran
        out, is otherwise shown to its suspect only when one of its few holders happens to
        probe it, or when its grace runs out and an eviction is refused for want of a
        second signer: after a 60 s cut of 84 of 300 nodes, one holder kept such a
        suspicion of a live member for 37 s after the heal. A crashed member is evicted
        well within this age (its suspicion is published and corroborated), so this costs
        no probes then. None while the brake is on or while cut off: there a failed probe
        of ours would add the second signature an eviction across a cut lacks."""
        if self.cut_off or self.braking():
            return []
        age = HEARSAY_CHECK_TIMEOUTS * self.base_suspicion_timeout
        due = []
        for member in self._unhealthy_members():
            if (member.hearsay_checked or self.self_id in member.suspecters
                    or member.unhealthy_at is None or now - member.unhealthy_at < age):
                continue
            member.hearsay_checked = True
            due.append(member.peer_id)
        return due

    def expired_suspicions(self, now: float) -> list[str]:
        """Suspects whose grace period ran out: mark them confirmed and return them. While
        the brake is on, and for a ``suspicion_timeout`` after it lifts (the refutations
        that lift it arrive together, and the last may be a moment behind), only one at a
        time, the one every node picks alike (see below): if each picked its own, say its
        oldest, the federation as a whole would still evict one per node per timeout."""
        if self.braking():
            self._braked_at = now
        if self.cut_off:
            return []
        expired = [m for m in self._unhealthy_members()
                   if m.status is Status.SUSPECT and m.suspected_at is not None
                   and self._reach_known(m)
                   and now - m.suspected_at >= self.timeout_for(m)]
        recently = self._braked_at is not None and now - self._braked_at < self.suspicion_timeout
        if expired and recently:
            expired = self._one_at_a_time(expired, now)
        if expired:
            self._last_confirmation_at = now
        for member in expired:
            member.status, member.suspected_at = Status.CONFIRMED, now
            member.evict_at = now + self.eviction_delay(member)
            self._enqueue(Update(member.peer_id, Status.CONFIRMED, member.incarnation))
        return [m.peer_id for m in expired]

    def next_deadline(self, now: float) -> float | None:
        """The first moment after ``now`` at which a suspicion's grace runs out or an
        eviction this node signs falls due, if any: the caller acts then instead of at the
        end of its probe period, up to a period later. Moments already past are left to
        the next period (the brake, or our lagging loop, may be holding them back)."""
        unhealthy = self._unhealthy_members()
        times = [m.suspected_at + self.timeout_for(m) for m in unhealthy
                 if m.status is Status.SUSPECT and m.suspected_at is not None]
        times += [m.evict_at for m in unhealthy
                  if m.status is Status.CONFIRMED and m.evict_at is not None]
        return min((t for t in times if t > now), default=None)

    def _one_at_a_time(self, expired: list[Member], now: float) -> list[Member]:
        """Of the expired suspects, the one to confirm now while braking, if any."""
        # One eviction in flight at a time, federation-wide: nothing new while a confirmed
        # member awaits its eviction or within a timeout of the last confirmation, ours or
        # one we heard of.
        last = self._last_confirmation_at
        if (any(m.status is Status.CONFIRMED for m in self._unhealthy_members())
                or (last is not None and now - last < self.suspicion_timeout)):
            return []
        # The head of one queue that every node orders alike (by a hash of peer and
        # incarnation) over all suspects, not only the expired ones: expiry times differ
        # from node to node, suspect lists much less.
        head = min((m for m in self._unhealthy_members() if m.status is Status.SUSPECT),
                   key=lambda m: _rank("brake", f"{m.peer_id}@{m.incarnation}"))
        return [head] if head in expired else []

    def _unhealthy_members(self) -> list[Member]:
        """The members not ALIVE, in a stable order (by peer id)."""
        return [self.members[p] for p in sorted(self._unhealthy)]

    def eviction_delay(self, member: Member) -> float:
        """How long after confirming ``member`` this node waits before signing its eviction
        (see the module docstring): rank x stagger for a first-hand suspecter, the backup
        delay for everyone else."""
        if self.self_id not in member.suspecters:
            return self.backup_delay()
        ranked = sorted(member.suspecters, key=lambda p: _rank(p, member.peer_id))
        stagger = self.eviction_stagger + 2 * self.dissemination_delay
        return ranked.index(self.self_id) * stagger

    def backup_delay(self) -> float:
        """How long a member waits for someone else's eviction before signing its own."""
        return 2 * self.suspicion_timeout + 4 * self.dissemination_delay

    def due_evictions(self, now: float) -> list[str]:
        """Confirmed peers whose eviction this node should sign now. Each is due again
        after the backup delay in case no eviction (ours or another's) lands. None while
        cut off, or not yet known not to be (``reach_taken_since``): confirmations heard
        from others wait too."""
        if self.cut_off:
            return []
        due = []
        for member in self._unhealthy_members():
            if (member.status is Status.CONFIRMED and member.evict_at is not None
                    and now >= member.evict_at and self._reach_known(member)):
                member.evict_at = now + self.backup_delay()
                due.append(member.peer_id)
        return due

    # -- dissemination -------------------------------------------------------------------

    def current_refutation(self) -> Update | None:
        """Our refutation of our current incarnation, once announced (None before our
        first, or while a newer one is still to be signed: ``refute_needed``)."""
        alive = self._alive
        if alive is None or self.refute_needed or alive.incarnation != self.incarnation:
            return None
        return alive

    def announce_alive(self, proof: bytes) -> Update:
        update = self._alive = Update(self.self_id, Status.ALIVE, self.incarnation, proof)
        self._enqueue(update)
        self.refute_needed = False
        return update

    def piggyback(self, limit: int = 8) -> list[Update]:
        """Updates to attach to the next outgoing message, newest news first."""
        budget = max(1, math.ceil(self.retransmit_multiplier * math.log2(len(self.members) + 2)))
        chosen = sorted(self._outbox.items(), key=lambda kv: kv[1][1])[:limit]
        out = []
        for key, (update, sent) in chosen:
            out.append(update)
            if sent + 1 >= budget:
                del self._outbox[key]
            else:
                self._outbox[key] = (update, sent + 1)
        return out

    def _enqueue(self, update: Update) -> None:
        if self.cut_off and update.status is not Status.ALIVE:
            return  # what a cut-off node suspects is the cut's doing: it must not spread
        self._outbox[update.peer_id] = (update, 0)

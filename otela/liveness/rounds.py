"""The probe loop's decisions, sans I/O: what a period does and what a probe round concludes.

``prober.py`` runs these over libp2p under trio; the mesh simulator (``simulator/mesh``)
runs the very same methods under its discrete-event clock. Nothing here awaits, sleeps or
reads a clock: callers pass ``now`` and the results of the network operations they made
(a direct probe's ack, the helpers' answers, a TCP connect's answer), and act on what the
methods return (whom to probe, which helpers to ask, when to look again, whom to evict).

One period (``begin_period``, then a round, then ``unwatched_check``, ``watch_brake`` and
``due_evictions``) and one round (``helpers_for`` after a failed direct probe, then
``after_helpers``, possibly ``still_quiet`` at the moment it names, then ``conclude``) are
described in ``prober.py`` and docs/failure-detection.md.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from otela.liveness.events import EventLog
from otela.liveness.health import LocalHealth
from otela.liveness.members import MemberList
from otela.liveness.news import News
from otela.liveness.reach import ReachSample
from otela.liveness.rtt import RoundTrips
from otela.liveness.table import LivenessTable, Status
from otela.liveness.watch import NeighbourWatch
from otela.registry.records import NodeRecord

if TYPE_CHECKING:
    from otela.liveness.prober import DetectorConfig

log = logging.getLogger("otela.liveness")

# One member we are not connected to is checked every this many periods (10 s by default).
# The check is a TCP connect that the member's kernel accepts and its listener drops
# before any handshake (~5 ms of its CPU): a 128-node federation on one host makes ~13 a
# second. After a partition, a member whose neighbours are all on the other side is found
# by the first node on ours to check it: with N / 2 nodes checking, within about 2 x this
# period on average (the 4-node partition test: within one period).
UNWATCHED_CHECK_PERIODS = 10


@dataclass(frozen=True)
class QuietCheck:
    """A round that must look again at ``at``: the target was heard from too recently to
    suspect, and that contact goes stale before the next round (``ProbeCore.still_quiet``)."""

    at: float
    window: float


class ProbeCore:
    """The failure detector's probe loop without its I/O (see the module docstring)."""

    def __init__(self, self_id: str, config: DetectorConfig, table: LivenessTable,
                 watch: NeighbourWatch, health: LocalHealth, news: News, events: EventLog,
                 members: MemberList, round_trips: RoundTrips, stats: dict[str, int],
                 rng: random.Random | None = None) -> None:
        self.self_id = self_id
        self.config = config
        self.table = table
        self.watch = watch
        self.health = health
        self.news = news
        self.events = events
        self.members = members
        self.round_trips = round_trips
        self.stats = stats
        self.rng = rng or random.Random()
        self.appeared: set[str] = set()  # peers that connected since the last round
        self.refusing: set[str] = set()  # peers whose last ping found nothing listening
        self.braking = False  # mirrors ``table.braking()`` to log its changes
        self.reach = ReachSample()  # connects to random members (``reach_targets``)
        self.periods_unchecked = 0  # periods since we last checked an unwatched member

    # -- a period ------------------------------------------------------------------------

    def begin_period(self, records: Iterable[NodeRecord], generation: int,
                     connected: set[str], now: float
                     ) -> tuple[dict[str, tuple[str, ...]] | None, str | None]:
        """Sync the member list (if the registry changed), take the current connections,
        and pick this period's target. Returns (members' addresses when they were
        re-read, else None; the peer to probe, if any)."""
        peers = self.members.sync(records, generation, now)  # reads them only if changed
        self.observe_connections(connected, now)
        return peers, self.watch.next_target(now)

    def observe_connections(self, connected: set[str], now: float) -> None:
        """Take the current connections: neighbours that dropped become lost neighbours.
        O(degree): the watch only ever asks whether a neighbour, a connected, appeared or
        lost peer is watchable, so only those are looked up (building the set over every
        member, and the set of every known peer, cost O(N) per period)."""
        appeared, self.appeared = frozenset(self.appeared), set()
        members = self.table.members
        # Suspects stay watched while connected: our probes carry the news they must refute.
        # So are members confirmed on others' word alone (``table.unvouched``): probing
        # them adds the voice their eviction may lack.
        watchable = members.keys() & (
            self.watch.neighbours | connected | appeared | self.watch.lost.keys())
        for p in watchable & self.table.unhealthy:  # only these can be confirmed
            if members[p].status is Status.CONFIRMED and not self.table.unvouched(p):
                watchable.discard(p)
        known = self.members.known
        for peer_id in self.watch.observe(connected, watchable, known, now, appeared):
            self.events.record(peer_id, "connection lost", "probing it first")

    def unwatched_target(self, now: float) -> str | None:
        """Every ``UNWATCHED_CHECK_PERIODS`` periods, the live member we are not connected
        to that was checked longest ago (``watch.next_unwatched``), to connect to; none
        while our own loop lags."""
        self.periods_unchecked += 1
        if self.periods_unchecked < UNWATCHED_CHECK_PERIODS or self.health.lagging(now):
            return None
        self.watch.admit(self.table.take_admitted())
        target = self.watch.next_unwatched(self.table.members, self.table.unhealthy, now)
        if target is None:
            return None
        self.periods_unchecked = 0
        self.stats["unwatched_checks"] += 1
        return target

    def unwatched_answer(self, target: str, answer: str, now: float) -> None:
        """How ``target``'s addresses answered the connect: one that did not accept is
        probed from the next period on as a lost neighbour (the full round decides, so a
        member that is only slow to accept is not suspected for it). The answer is also
        one more sample of how much of the federation we reach."""
        self.reach.note(target, answer, now)
        if answer in ("accepted", "none"):  # none: behind a NAT, its relays' members watch it
            return
        self.stats["unwatched_unreachable"] += 1
        detail = ("every address refused a connection" if answer == "refused"
                  else "no address accepted a connection in time")
        self.events.record(target, "unreachable", f"not a neighbour, and {detail}: probing it")
        log.info("probing %s, which we do not watch: %s", target, detail)
        self.watch.verify(target, now)

    def watch_brake(self) -> None:
        """Record when the eviction brake goes on or off: an operator asking why a dead
        node is still listed, or why live ones were not evicted, finds it in the events."""
        braking = self.table.braking()
        if braking == self.braking:
            return
        self.braking = braking
        unhealthy = len(self.table.suspected())
        members = len(self.table.members)
        if braking:
            self.stats["brake_engaged"] += 1
            detail = (f"{unhealthy} of {members} members suspected at once: evicting one "
                      "at a time")
            log.warning("eviction brake on: %s", detail)
            self.events.record(self.self_id, "eviction brake on", detail)
        else:
            self.events.record(self.self_id, "eviction brake off",
                               f"{unhealthy} of {members} members suspected")
            log.warning("eviction brake off")

    def reach_targets(self, now: float) -> list[str]:
        """While this node holds suspects (a decision may come) or is cut off, members
        picked at random, any status, to connect to this period, all at once
        (``otela.liveness.reach``): all the sample lacks since the newest suspicion began,
        or a whole sample while cut off; none while our own loop lags."""
        if not (self.table.unhealthy or self.table.cut_off) or self.health.lagging(now):
            return []
        # Cut off, a whole sample every period: the heal is noticed in one period (on the
        # cut-off side a period takes seconds, and one answer a period took four of them).
        since = now if self.table.cut_off else self.table.newest_unhealthy_at()
        return self.reach.targets(self.table.member_ids(), self.rng, now, since)

    def reach_answer(self, target: str, answer: str, now: float) -> None:
        """How a member ``reach_targets`` picked answered the connect."""
        self.reach.note(target, answer, now)

    def _observe_reach(self, now: float) -> None:
        """Tell the table whether we are cut off, and record when that changes: an
        operator asking why nothing was evicted finds it in the events."""
        self.table.reach_taken_since = self.reach.taken_since(now, len(self.table.members))
        was, verdict = self.table.cut_off, self.reach.cut_off(now)
        if verdict is None:
            return  # too few recent answers: as we were
        dropped = self.table.observe_reach(verdict)
        if self.table.cut_off == was:
            return
        if self.table.cut_off:
            self.stats["cut_off_entered"] += 1
            detail = ("most members picked at random did not answer a connect: this node is "
                      "more likely the one cut off; confirming and evicting no one")
            log.warning("cut off: %s", detail)
            self.events.record(self.self_id, "cut off", detail)
        else:
            detail = f"most members answer again; dropped {dropped} suspicions raised while cut off"
            log.warning("no longer cut off: %s", detail)
            self.events.record(self.self_id, "reachable again", detail)

    def due_evictions(self, now: float, gossip_lag: float) -> list[str]:
        """Confirm the suspicions whose grace ran out; return the peers whose eviction we
        should sign now. Irreversible steps wait while our own loop lags."""
        self.table.observe_dissemination_delay(gossip_lag)
        self._observe_reach(now)
        if self.health.lagging(now):
            return []
        for peer_id in self.table.stale_hearsay(now):
            if self.watch.verify(peer_id, now):
                self.events.record(peer_id, "verifying",
                                   "suspected on others' word for long; probing it first-hand")
        for peer_id in self.table.expired_suspicions(now):
            self.events.record(peer_id, "confirmed", "did not refute within the suspicion timeout")
        return self.table.due_evictions(now)

    def evicted(self, peer_id: str, sessions: list[str], now: float) -> None:
        """The evictions we signed for ``peer_id`` (sessions whose eviction was new).

        None at all means the registry refused ours for want of a second independent
        signer (``otela.registry.evidence``). Confirmed on others' word alone
        (``table.unvouched``), we probe the peer first-hand, and our failed probe adds the
        missing signature; holding our own suspicion, we publish it with ``corroborate``
        so that the members chosen to verify probe it and sign theirs. Without either, a
        peer only one member on our side watched stayed in routing for good (a partition
        leaving two members per half)."""
        reason = self.eviction_reason()
        for session_id in sessions:
            self.stats["evicted"] += 1
            self.events.record(peer_id, "evicted", f"session {session_id}: {reason}")
            log.warning("evicted session %s of %s", session_id, peer_id)
        if sessions:
            return
        if self.table.unvouched(peer_id):
            if self.watch.verify(peer_id, now):
                self.events.record(peer_id, "verifying",
                                   "eviction needs a second suspicion; probing it first-hand")
        elif self.news.publish_suspicion(peer_id, peer_id in self.watch.lost, corroborate=True):
            self.events.record(peer_id, "corroborating",
                               "eviction needs a second suspicion; published ours")

    def eviction_reason(self) -> str:
        return (f"unresponsive for {self.config.suspicion_timeout:.0f}s after suspicion "
                "(direct, indirect and recent-contact probes failed)")

    def period_length(self) -> float:
        """How long this period lasts: the probe interval times our health multiplier."""
        return self.config.probe_interval * self.health.multiplier

    # -- a round -------------------------------------------------------------------------

    def ping_timeout(self, target: str) -> float:
        """How long a direct probe of ``target`` waits: its measured round trips, times
        our health multiplier."""
        return self.round_trips.timeout(target) * self.health.multiplier

    def via_timeout(self, helper: str, target: str) -> float:
        """How long an indirect probe through ``helper`` waits: both legs."""
        wait = self.round_trips.timeout(helper) + self.round_trips.timeout(target)
        return wait * self.health.multiplier

    def ping_result(self, target: str, refused: bool, round_trip: float | None) -> bool:
        """Record a direct probe: ``refused`` (every address refused a TCP connection, so
        no probe was sent), else acked after ``round_trip`` seconds, or not (None)."""
        if refused:
            self.refusing.add(target)
            return False
        self.refusing.discard(target)
        if round_trip is None:
            return False
        self.round_trips.observe(target, round_trip)
        return True

    def start_round(self) -> None:
        self.stats["probes"] += 1

    def direct_acked(self) -> str:
        self.health.better()
        return "acked"

    def helpers_for(self, target: str) -> list[str]:
        """Up to ``indirect_probes`` alive neighbours other than ``target``, at random."""
        helpers = [p for p in self.watch.neighbours if p != target and p in self.table.members
                   and self.table.members[p].status is Status.ALIVE]
        helpers.sort()  # set order is not stable across runs; the choice is the rng's
        self.rng.shuffle(helpers)
        return helpers[: self.config.indirect_probes]

    def after_helpers(self, target: str, helpers: list[str], results: list[bool | None],
                      now: float) -> str | QuietCheck:
        """The helpers answered (True reached it, False could not, None no answer):
        "acked", "silent" (heard from recently), a ``QuietCheck`` to make at its moment,
        or "undecided" (go on to ``conclude``)."""
        if helpers and all(r is None for r in results):
            self.health.worse()  # nobody answered us at all: we are likely the slow one
        window = self.config.stale_window * self.health.multiplier
        if any(r is True for r in results):
            return "acked"
        # A lost neighbour that refuses connections has no process listening: it crashed.
        # The recent-contact window is there for peers that are slow, and a slow peer never
        # refuses, so it is not waited out (it had added up to 3 s to every crash's
        # detection).
        if not self._gone(target) and self.table.heard_recently(target, now, window):
            quiet_at = self._quiet_at(target, window, now)
            return "silent" if quiet_at is None else QuietCheck(quiet_at, window)
        return "undecided"

    def still_quiet(self, target: str, check: QuietCheck, now: float) -> bool:
        """At ``check.at``: whether nothing was heard from ``target`` meanwhile."""
        return not self.table.heard_recently(target, now, check.window)

    def _gone(self, target: str) -> bool:
        return target in self.watch.lost and target in self.refusing

    def _quiet_at(self, target: str, window: float, now: float) -> float | None:
        """A lost neighbour (its connection dropped without our closing it) whose direct
        and indirect probes just failed, and that was heard from too recently to suspect:
        if its recent-contact window runs out before the next round, the moment to check
        again, instead of probing it again a period later. Checking only once per period
        had added up to a period to the detection of a crash (a SIGKILLed node of three
        suspected 4.3 s after the kill, LEFT after 10.3 s)."""
        member = self.table.members.get(target)
        if target not in self.watch.lost or member is None:
            return None
        quiet_at = member.last_heard + window
        if quiet_at - now > self.period_length():
            return None
        return max(quiet_at, now) + 0.001

    def conclude(self, target: str, helpers: int, now: float,
                 pressure: float | None) -> tuple[str, bool]:
        """All paths failed: suspect ``target``, unless our loop lags or nobody could give
        a second opinion (see ``_others_can_judge``). Returns ("silent" or "suspected",
        whether the suspicion is to be published on the liveness topic now)."""
        gone = self._gone(target)
        if self.health.lagging(now):
            self.stats["withheld"] += 1
            return "silent", False
        if not helpers and not gone and self._others_can_judge(target):
            self.stats["withheld"] += 1
            return "silent", False
        published = False
        if self.table.probe_failed(target, now):
            self.stats["suspected"] += 1
            detail = (f"its connection dropped and every address refused a new one; "
                      f"{helpers} indirect checks failed" if gone else
                      f"direct, {helpers} indirect and recent-contact checks failed")
            published = self.news.publish_suspicion(target, target in self.watch.lost)
            if published:
                detail += "; published"
            if pressure is not None:  # a saturated host sees every peer as slow
                detail += f"; host CPU pressure {pressure:.0f} %"
            self.events.record(target, "suspected", detail)
            log.warning("suspecting %s: %s", target, detail)
        return "suspected", published

    def _others_can_judge(self, target: str) -> bool:
        """Whether a member other than us and ``target`` is alive: then a round that asked
        no helper (we have no other neighbour, as a node that just joined through its
        bootstrap peer) is left to the members around ``target``, who watch it anyway and
        can ask each other. A lone node that cannot get a second opinion cannot tell a peer
        that is slow (a bootstrap peer busy with a join wave) from a dead one, and its
        suspicion, heard by nobody else, would run into an eviction of a healthy node (one
        in an idle 64-node federation on 2 cores). A peer that refuses connections is still
        suspected at once, and in a federation of two nobody else can judge."""
        return any(peer != target and member.status is Status.ALIVE
                   for peer, member in self.table.members.items())

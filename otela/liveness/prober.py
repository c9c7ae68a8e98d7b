"""The probe loop: each period, probe one watched peer and act on what the table decides.

Per period a node probes one watched peer (``watch.py``: lost neighbours first, then round
robin over its connected ones). The peer is suspected only if all three paths fail:
1. a direct probe gets no ack within its adaptive timeout (``rtt.py``);
2. none of ``indirect_probes`` other members gets an ack when asked to probe it;
3. nothing was heard from it within ``stale_window``: no probe or ack, no anti-entropy, no
   gossip it published *or forwarded* to us (a busy peer on an overloaded machine answers
   probes late but keeps forwarding gossip: it is slow, not dead). Skipped for a lost
   neighbour whose every address refuses a TCP connection: nothing listens, it crashed.
Every ``UNWATCHED_CHECK_PERIODS`` periods it also checks one member it is not connected to
with a plain TCP connect (``watch.next_unwatched``), and probes one that does not accept
like a lost neighbour: the member's own neighbours watch it, unless a partition put them
all on the other side. After the round, and whenever a grace period runs out or an
eviction falls due between rounds, the loop confirms expired suspicions and signs the
evictions that are due (``table.py``), unless our own event loop lags (``health.py``);
the eviction brake's turning on and off is logged as an event.

The loop talks to the network only through ``ProbeTransport`` (probe, indirect probe) and
to the node through ``Membership`` (its registry, its connections, evicting), so a fake of
each drives it in unit tests on a fake clock.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import trio

from otela.config import default_of
from otela.hostload import cpu_pressure
from otela.liveness.events import EventLog
from otela.liveness.health import LocalHealth
from otela.liveness.members import MemberList
from otela.liveness.news import News
from otela.liveness.rtt import RoundTrips
from otela.liveness.table import LivenessTable, Status
from otela.liveness.watch import NeighbourWatch
from otela.mesh.listening import ConnectAnswer
from otela.registry.records import NodeRecord

log = logging.getLogger("otela.liveness")

# One member we are not connected to is checked every this many periods (10 s by default).
# The check is a TCP connect that the member's kernel accepts and its listener drops
# before any handshake (~5 ms of its CPU): a 128-node federation on one host makes ~13 a
# second. After a partition, a member whose neighbours are all on the other side is found
# by the first node on ours to check it: with N / 2 nodes checking, within about 2 x this
# period on average (the 4-node partition test: within one period).
UNWATCHED_CHECK_PERIODS = 10


@dataclass(frozen=True)
class DetectorConfig:
    """Timings; defaults and their reasons are in docs/failure-detection.md. The two an
    operator sets are node settings (``otela.config``); the rest follow from them."""

    probe_interval: float = default_of("probe_interval")
    probe_timeout: float = default_of("probe_interval")
    indirect_probes: int = 3
    stale_window: float = 3 * default_of("probe_interval")
    suspicion_timeout: float = default_of("suspicion_timeout")
    max_local_health: int = 8

    @classmethod
    def from_settings(cls, probe_interval: float, suspicion_timeout: float) -> DetectorConfig:
        """A probe times out after one period; no contact for three periods is stale."""
        return cls(probe_interval=probe_interval, probe_timeout=probe_interval,
                   stale_window=3 * probe_interval, suspicion_timeout=suspicion_timeout)


class ProbeTransport(Protocol):
    """How probes reach peers (over libp2p in a node, a fake in unit tests)."""

    async def probe(self, peer: str, timeout: float) -> bool:
        """Whether ``peer`` acked a direct probe within ``timeout``."""
        ...

    async def probe_via(self, helper: str, target: str, timeout: float) -> bool | None:
        """Ask ``helper`` to probe ``target``: True (it reached it), False (it answered
        that it could not), None (the helper did not answer)."""
        ...

    async def turned_away(self, peer: str) -> bool:
        """Whether every direct address of ``peer`` refuses a TCP connection: its host is
        up and nothing listens there (``otela.mesh.listening``)."""
        ...

    async def reachability(self, peer: str) -> ConnectAnswer:
        """How ``peer``'s direct addresses answer a TCP connect: ``accepted``, ``refused``,
        ``unknown`` or ``none`` (``otela.mesh.listening.answer_at``)."""
        ...


class Membership(Protocol):
    """What the loop reads of, and does to, the node around it."""

    def records(self) -> Iterable[NodeRecord]: ...

    def generation(self) -> int:
        """Bumped on every registry change."""
        ...

    def connected(self) -> set[str]: ...

    def gossip_lag(self) -> float:
        """How late registry gossip arrives here now, in seconds."""
        ...

    def learn_addresses(self, peers: dict[str, tuple[str, ...]]) -> None:
        """Members' addresses, to reach those we hold no connection to."""
        ...

    async def evict(self, peer_id: str, reason: str) -> list[str]:
        """Drop our connection to ``peer_id`` and sign evictions of its live sessions;
        the session ids whose eviction was new."""
        ...


class Prober:
    def __init__(self, self_id: str, config: DetectorConfig, table: LivenessTable,
                 watch: NeighbourWatch, health: LocalHealth, news: News, events: EventLog,
                 members: MemberList, round_trips: RoundTrips, transport: ProbeTransport,
                 node: Membership, clock: Callable[[], float],
                 stats: dict[str, int],
                 host_pressure: Callable[[], float | None] = cpu_pressure) -> None:
        self.self_id = self_id
        self.config = config
        self.table = table
        self.watch = watch
        self.health = health
        self.news = news
        self.events = events
        self.members = members
        self.round_trips = round_trips
        self.transport = transport
        self.node = node
        self.clock = clock
        self.stats = stats
        # Our host's CPU pressure: read each period into our local health (a saturated
        # host makes every peer look slow), and reported with each suspicion we raise.
        self.host_pressure = host_pressure
        self.appeared: set[str] = set()  # peers that connected since the last round
        self.refusing: set[str] = set()  # peers whose last ping found nothing listening
        self.braking = False  # mirrors ``table.braking()`` to log its changes
        self.periods_unchecked = 0  # periods since we last checked an unwatched member

    async def run(self) -> None:
        while True:
            self.health.observe_host(self.host_pressure())
            end = self.clock() + self.config.probe_interval * self.health.multiplier
            try:
                await self.period()
            except Exception:
                # A bug in one period (a library raising where it did not before) must not
                # stop the node's failure detection, let alone the node: logged with its
                # traceback, counted (``period_errors`` in /v1/health), and the next
                # period runs as usual.
                self.stats["period_errors"] = self.stats.get("period_errors", 0) + 1
                log.exception("failure detector: a probe period failed; going on")
            # Sleep out the period, waking when a grace period runs out or an eviction
            # falls due (``LivenessTable.next_deadline``): acting only at the end of a
            # period added up to a period to every eviction.
            while True:
                now = self.clock()
                deadline = self.table.next_deadline(now)
                wake = deadline if deadline is not None and deadline < end else end
                asked = max(0.0, wake - now)
                await trio.sleep(asked)
                self.health.slept(asked, self.clock() - now, self.clock())
                if wake >= end:
                    break
                await self.settle()

    async def period(self) -> None:
        """One probe period's work, without the sleep."""
        peers = self.members.sync(self.node.records(), self.node.generation(), self.clock())
        if peers is not None:
            self.node.learn_addresses(peers)
        self._watch_neighbours()
        target = self.watch.next_target(self.clock())
        if target is not None and await self.round(target) != "silent":
            self.watch.decided(target)
        await self._check_unwatched()
        self._watch_brake()
        await self.settle()

    async def _check_unwatched(self) -> None:
        """Every ``UNWATCHED_CHECK_PERIODS`` periods, connect to the live member we are not
        connected to that was checked longest ago (``watch.next_unwatched``). If it does
        not accept, probe it from the next period on as a lost neighbour: the full round
        (direct, indirect, recent contact) decides, so a member that is only slow to
        accept is not suspected for it. Skipped while our own loop lags."""
        self.periods_unchecked += 1
        if (self.periods_unchecked < UNWATCHED_CHECK_PERIODS
                or self.health.lagging(self.clock())):
            return
        alive = {p for p, m in self.table.members.items() if m.status is Status.ALIVE}
        target = self.watch.next_unwatched(alive, self.clock())
        if target is None:
            return
        self.periods_unchecked = 0
        self.stats["unwatched_checks"] += 1
        answer = await self.transport.reachability(target)
        if answer in ("accepted", "none"):  # none: behind a NAT, its relays' members watch it
            return
        self.stats["unwatched_unreachable"] += 1
        detail = ("every address refused a connection" if answer == "refused"
                  else "no address accepted a connection in time")
        self.events.record(target, "unreachable", f"not a neighbour, and {detail}: probing it")
        log.info("probing %s, which we do not watch: %s", target, detail)
        self.watch.verify(target, self.clock())

    async def settle(self) -> None:
        """Confirm the suspicions whose grace ran out and sign the evictions now due."""
        now = self.clock()
        self.table.observe_dissemination_delay(self.node.gossip_lag())
        if not self.health.lagging(now):  # irreversible steps wait until we trust our view
            for peer_id in self.table.expired_suspicions(now):
                self.events.record(peer_id, "confirmed",
                                   "did not refute within the suspicion timeout")
            for peer_id in self.table.due_evictions(now):
                await self._evict(peer_id)

    def _watch_neighbours(self) -> None:
        # Suspects stay watched while connected: our probes carry the news they must refute.
        # So are members confirmed on others' word alone (``table.unvouched``): probing
        # them adds the voice their eviction may lack.
        watchable = {p for p, m in self.table.members.items()
                     if m.status is not Status.CONFIRMED or self.table.unvouched(p)}
        known = {r.peer_id for r in self.node.records()}
        appeared, self.appeared = frozenset(self.appeared), set()
        for peer_id in self.watch.observe(self.node.connected(), watchable, known,
                                          self.clock(), appeared):
            self.events.record(peer_id, "connection lost", "probing it first")

    def _watch_brake(self) -> None:
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

    # -- one probe round ---------------------------------------------------------------

    async def round(self, target: str) -> str:
        """Probe ``target`` over all three paths: "acked" (directly or through a helper),
        "suspected" (all failed, now a suspect) or "silent" (no ack, but heard recently)."""
        self.stats["probes"] += 1
        if await self.ping(target):
            self.health.better()
            return "acked"
        helpers = [p for p in self.watch.neighbours if p != target and p in self.table.members
                   and self.table.members[p].status is Status.ALIVE]
        random.shuffle(helpers)
        helpers = helpers[: self.config.indirect_probes]
        results: list[bool | None] = []
        if helpers:
            async with trio.open_nursery() as nursery:

                async def ask(helper: str) -> None:
                    results.append(await self._ping_via(helper, target))

                for helper in helpers:
                    nursery.start_soon(ask, helper)
        acked = any(r is True for r in results)
        if helpers and all(r is None for r in results):
            self.health.worse()  # nobody answered us at all: we are likely the slow one
        window = self.config.stale_window * self.health.multiplier
        if acked:
            return "acked"
        # A lost neighbour that refuses connections has no process listening: it crashed.
        # The recent-contact window is there for peers that are slow, and a slow peer never
        # refuses, so it is not waited out (it had added up to 3 s to every crash's
        # detection).
        gone = target in self.watch.lost and target in self.refusing
        if not gone and self.table.heard_recently(target, self.clock(), window) and not (
                await self._quiet_by_next_round(target, window)):
            return "silent"
        if self.health.lagging(self.clock()):
            self.stats["withheld"] += 1
            return "silent"
        if not helpers and not gone and self._others_can_judge(target):
            self.stats["withheld"] += 1
            return "silent"
        if self.table.probe_failed(target, self.clock()):
            self.stats["suspected"] += 1
            detail = (f"its connection dropped and every address refused a new one; "
                      f"{len(helpers)} indirect checks failed" if gone else
                      f"direct, {len(helpers)} indirect and recent-contact checks failed")
            if self.news.publish_suspicion(target, target in self.watch.lost):
                detail += "; published"
            pressure = self.host_pressure()
            if pressure is not None:  # a saturated host sees every peer as slow
                detail += f"; host CPU pressure {pressure:.0f} %"
            self.events.record(target, "suspected", detail)
            log.warning("suspecting %s: %s", target, detail)
        return "suspected"

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

    async def _quiet_by_next_round(self, target: str, window: float) -> bool:
        """A lost neighbour (its connection dropped without our closing it) whose direct
        and indirect probes just failed, and that was heard from too recently to suspect:
        if its recent-contact window runs out before the next round, wait for that moment
        and check again, instead of probing it again a period later. Same three checks,
        evaluated when the window runs out: anything heard from it meanwhile still counts.
        Checking only once per period had added up to a period to the detection of a
        crash (a SIGKILLed node of three suspected 4.3 s after the kill, LEFT after
        10.3 s)."""
        member = self.table.members.get(target)
        if target not in self.watch.lost or member is None:
            return False
        quiet_at = member.last_heard + window
        interval = self.config.probe_interval * self.health.multiplier
        if quiet_at - self.clock() > interval:
            return False
        await trio.sleep(max(0.0, quiet_at - self.clock()) + 0.001)
        return not self.table.heard_recently(target, self.clock(), window)

    async def ping(self, target: str) -> bool:
        """A direct probe, timed out by the peer's measured round trips and our health.
        A peer we hold no connection to is first checked for a listener: if every address
        refuses, the probe fails at once (a libp2p dial would retry for ~0.7 s first)."""
        if target not in self.node.connected() and await self.transport.turned_away(target):
            self.refusing.add(target)
            return False
        self.refusing.discard(target)
        started = self.clock()
        timeout = self.round_trips.timeout(target) * self.health.multiplier
        if not await self.transport.probe(target, timeout):
            return False
        self.round_trips.observe(target, self.clock() - started)
        return True

    async def _ping_via(self, helper: str, target: str) -> bool | None:
        wait = self.round_trips.timeout(helper) + self.round_trips.timeout(target)
        return await self.transport.probe_via(helper, target, wait * self.health.multiplier)

    async def _evict(self, peer_id: str) -> None:
        reason = (f"unresponsive for {self.config.suspicion_timeout:.0f}s after suspicion "
                  "(direct, indirect and recent-contact probes failed)")
        evicted = await self.node.evict(peer_id, reason)
        for session_id in evicted:
            self.stats["evicted"] += 1
            self.events.record(peer_id, "evicted", f"session {session_id}: {reason}")
            log.warning("evicted session %s of %s", session_id, peer_id)
        if evicted:
            return
        # Refused for want of a second signer. Confirmed on others' word alone, we look
        # ourselves; holding our own suspicion, we ask the chosen verifiers to look.
        if self.table.unvouched(peer_id):
            if self.watch.verify(peer_id, self.clock()):
                self.events.record(peer_id, "verifying",
                                   "eviction needs a second suspicion; probing it first-hand")
        elif self.news.publish_suspicion(peer_id, peer_id in self.watch.lost,
                                         corroborate=True):
            self.events.record(peer_id, "corroborating",
                               "eviction needs a second suspicion; published ours")

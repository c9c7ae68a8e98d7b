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
all on the other side. While it holds suspects it also connects to members picked at
random (all its sample lacks at once, then one a period: ``reach.py``): a
node that most members do not answer is cut off (the smaller side of a partition) and
evicts no one. After the round, and whenever a grace period runs out or an eviction
falls due between rounds, the loop confirms expired suspicions and signs the evictions
that are due (``table.py``), unless our own event loop lags (``health.py``); the eviction
brake's turning on and off is logged as an event.

Every decision is made by ``rounds.ProbeCore`` (sans I/O, shared with the mesh simulator);
this loop adds the awaiting. It talks to the network only through ``ProbeTransport``
(probe, indirect probe) and to the node through ``Membership`` (its registry, its
connections, evicting), so a fake of each drives it in unit tests on a fake clock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Protocol

import trio

from otela.config import default_of
from otela.hostload import cpu_pressure
from otela.liveness.events import EventLog
from otela.liveness.health import LocalHealth
from otela.liveness.members import MemberList
from otela.liveness.news import News
from otela.liveness.rounds import ProbeCore, QuietCheck
from otela.liveness.rtt import RoundTrips
from otela.liveness.table import LivenessTable
from otela.liveness.watch import NeighbourWatch
from otela.mesh.listening import ConnectAnswer
from otela.registry.records import NodeRecord

log = logging.getLogger("otela.liveness")



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

    def learn_addresses(self, peers: dict[str, tuple[str, ...]],
                        touched: Collection[str] | None = None) -> None:
        """Members' addresses, to reach those we hold no connection to; ``touched``: the
        members whose addresses may have changed since the last call (None: any)."""
        ...

    async def evict(self, peer_id: str, reason: str) -> list[str]:
        """Drop our connection to ``peer_id`` and sign evictions of its live sessions;
        the session ids whose eviction was new."""
        ...


class Prober(ProbeCore):
    def __init__(self, self_id: str, config: DetectorConfig, table: LivenessTable,
                 watch: NeighbourWatch, health: LocalHealth, news: News, events: EventLog,
                 members: MemberList, round_trips: RoundTrips, transport: ProbeTransport,
                 node: Membership, clock: Callable[[], float],
                 stats: dict[str, int],
                 host_pressure: Callable[[], float | None] = cpu_pressure) -> None:
        super().__init__(self_id, config, table, watch, health, news, events, members,
                         round_trips, stats)
        self.transport = transport
        self.node = node
        self.clock = clock
        # Our host's CPU pressure: read each period into our local health (a saturated
        # host makes every peer look slow), and reported with each suspicion we raise.
        self.host_pressure = host_pressure

    async def run(self) -> None:
        while True:
            self.health.observe_host(self.host_pressure())
            end = self.clock() + self.period_length()
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
        peers, target = self.begin_period(self.node.records(), self.node.generation(),
                                          self.node.connected(), self.clock())
        if peers is not None:
            self.node.learn_addresses(peers, self.members.touched)
        if target is not None and await self.round(target) != "silent":
            self.watch.decided(target)
        await self._check_unwatched()
        await self._check_reach()
        self.watch_brake()
        await self.settle()

    async def _check_unwatched(self) -> None:
        """Connect to an unwatched member now and then (``ProbeCore.unwatched_target``)."""
        target = self.unwatched_target(self.clock())
        if target is not None:
            answer = await self.transport.reachability(target)
            self.unwatched_answer(target, answer, self.clock())

    async def _check_reach(self) -> None:
        """While suspects are held, connect to random members, all at once
        (``ProbeCore.reach_targets``): whether most answer tells a cut-off node from one
        that is not."""

        async def connect(target: str) -> None:
            self.reach_answer(target, await self.transport.reachability(target), self.clock())

        async with trio.open_nursery() as nursery:
            for target in self.reach_targets(self.clock()):
                nursery.start_soon(connect, target)

    async def settle(self) -> None:
        """Confirm the suspicions whose grace ran out and sign the evictions now due."""
        for peer_id in self.due_evictions(self.clock(), self.node.gossip_lag()):
            await self._evict(peer_id)

    # -- one probe round ---------------------------------------------------------------

    async def round(self, target: str) -> str:
        """Probe ``target`` over all three paths: "acked" (directly or through a helper),
        "suspected" (all failed, now a suspect) or "silent" (no ack, but heard recently)."""
        self.start_round()
        if await self.ping(target):
            return self.direct_acked()
        helpers = self.helpers_for(target)
        results: list[bool | None] = []
        if helpers:
            async with trio.open_nursery() as nursery:

                async def ask(helper: str) -> None:
                    results.append(await self._ping_via(helper, target))

                for helper in helpers:
                    nursery.start_soon(ask, helper)
        step = self.after_helpers(target, helpers, results, self.clock())
        if isinstance(step, QuietCheck):
            await trio.sleep(max(0.0, step.at - self.clock()))
            if not self.still_quiet(target, step, self.clock()):
                return "silent"
        elif step != "undecided":
            return step
        verdict, _ = self.conclude(target, len(helpers), self.clock(), self.host_pressure())
        return verdict

    async def ping(self, target: str) -> bool:
        """A direct probe, timed out by the peer's measured round trips and our health.
        A peer we hold no connection to is first checked for a listener: if every address
        refuses, the probe fails at once (a libp2p dial would retry for ~0.7 s first)."""
        if target not in self.node.connected() and await self.transport.turned_away(target):
            return self.ping_result(target, True, None)
        self.refusing.discard(target)
        started = self.clock()
        acked = await self.transport.probe(target, self.ping_timeout(target))
        return self.ping_result(target, False, self.clock() - started if acked else None)

    async def _ping_via(self, helper: str, target: str) -> bool | None:
        return await self.transport.probe_via(helper, target, self.via_timeout(helper, target))

    async def _evict(self, peer_id: str) -> None:
        self.evicted(peer_id, await self.node.evict(peer_id, self.eviction_reason()),
                     self.clock())

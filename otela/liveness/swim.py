"""The failure detector's protocol: probe one neighbour per period over libp2p streams.

Whom to probe: each node watches its neighbours and the neighbours it lost, not every
member (why: ``watch.py``). News does not depend on who watches whom: it rides on probe
messages (SWIM's piggybacking), and first-hand suspicions backed by strong evidence (the
connection dropped, or a second member suspects it too) are also published on the
``otela/liveness/1`` GossipSub topic, so that every node (and every ingress) stops routing
to a crashed node within milliseconds, not after an epidemic of probe rounds; a refutation
is published when the suspicion was. A few members picked alike everywhere then probe a
published suspect first-hand, whether they watch it or not, so that a crash one neighbour
saw gets the independent confirmations that shorten its timeout (``table.py``). Probe
timeouts follow each peer's measured round trips (``rtt.py``).

Per period a node probes one watched peer: lost neighbours first, then round robin over a
shuffled list of connected ones. The peer is suspected only if all three paths fail:
1. a direct ping (``/otela/swim/2.0.0``, on a long-lived stream: ``channels.py``) gets
   no ack within ``probe_timeout``;
2. none of ``indirect_probes`` other members gets an ack when asked to ping it;
3. nothing was heard from it within ``stale_window``: no probe or ack, no anti-entropy,
   no gossip it published *or forwarded* to us (a busy peer on an overloaded machine
   answers probes late but keeps forwarding gossip: it is slow, not dead).
News rides on the probe messages themselves (see ``table.py``), so the detector sends
O(1) messages per node per period whatever the federation's size. A suspect that hears
of its suspicion raises its incarnation and spreads a *signed* ``alive`` (no one else
can refute on its behalf); a suspicion not refuted within ``suspicion_timeout`` is
confirmed and this node signs an eviction of the peer's sessions (registry LEFT).

Local health (Lifeguard's "local health multiplier"): a node starved of CPU or network
makes *other* nodes look dead. So each node scores its own health: being told it is
suspected, its event loop waking up late, and probe rounds in which not even the
indirect helpers answered all raise the score (helpers' "could not reach it either"
nacks clear us: then the target is down, not our network); successful probes lower it.
Probe timeouts, the recent-contact window and the suspicion timeout are multiplied by
``1 + score`` (at most 1 + ``max_local_health``), so an overloaded node waits longer
before accusing anyone, instead of setting off a cascade of false evictions. Beyond
that, a node whose event loop woke up late within the stale window accuses nobody at all
(``lagging``): its failed probes say more about itself than about its peers. And when
many members are suspected at once, the eviction brake (``table.py``) slows evictions to
one at a time: a federation overloaded as a whole would otherwise evict live nodes, whose
rejoins add yet more load.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import multiaddr
import trio
from libp2p.abc import INotifee
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from otela.config import default_of
from otela.identity import Identity
from otela.liveness.channels import Channels
from otela.liveness.rtt import RoundTrips
from otela.liveness.table import LivenessTable, Status, Update
from otela.liveness.watch import NeighbourWatch
from otela.registry.records import Lifecycle
from otela.replication import LocalReplica

log = logging.getLogger("otela.liveness")

SWIM_PROTOCOL = TProtocol("/otela/swim/2.0.0")
LIVENESS_TOPIC = "otela/liveness/1"
ALIVE_DOMAIN = b"otela/liveness/alive/v1\0"
ADDR_TTL_S = 3600  # peerstore TTL of members' addresses
EVENT_HISTORY = 200  # liveness events kept for /v1/network and `otela doctor`


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


class _ConnectionNotifee(INotifee):
    """Tells the detector of every new connection, even one gone before the next round."""

    def __init__(self, on_connected: Callable[[str], None]) -> None:
        self.on_connected = on_connected

    async def connected(self, network: Any, conn: Any) -> None:
        self.on_connected(conn.muxed_conn.peer_id.to_base58())

    async def disconnected(self, network: Any, conn: Any) -> None:
        pass

    async def opened_stream(self, network: Any, stream: Any) -> None:
        pass

    async def closed_stream(self, network: Any, stream: Any) -> None:
        pass

    async def listen(self, network: Any, multiaddr: Any) -> None:
        pass

    async def listen_close(self, network: Any, multiaddr: Any) -> None:
        pass


def _alive_payload(peer_id: str, incarnation: int) -> bytes:
    return ALIVE_DOMAIN + f"{peer_id}|{incarnation}".encode()


def _encode_updates(updates: list[Update]) -> list[list[Any]]:
    return [[u.peer_id, u.status.value, u.incarnation, u.proof, u.by] for u in updates]


class FailureDetector:
    def __init__(
        self,
        identity: Identity,
        host: Any,
        replica: LocalReplica,
        config: DetectorConfig,
        clock: Callable[[], float] = time.monotonic,
        pubsub: Any = None,
    ) -> None:
        self.identity = identity
        self.host = host
        self.pubsub = pubsub  # None: news spreads by piggybacking only
        self.replica = replica
        self.config = config
        self.clock = clock
        self.self_id = identity.peer_id.to_base58()
        self.table = LivenessTable(self.self_id, config.suspicion_timeout,
                                   eviction_stagger=config.probe_interval)
        self.watch = NeighbourWatch()
        self._appeared: set[str] = set()  # peers that connected since the last round
        self._stored_addrs: dict[str, tuple[tuple[str, ...], float]] = {}
        self.channels = Channels(host, SWIM_PROTOCOL, self._pack, self._unpack)
        self._news_pending = trio.Event()  # set when a suspicion or refutation must go out
        self._synced_generation = -1
        self._sessions: dict[str, set[str]] = {}  # live session ids per member
        self._broadcasts: list[list[Any]] = []  # first-hand news waiting to be published
        self.stats: dict[str, int] = {
            "probes": 0, "suspected": 0, "withheld": 0, "evicted": 0, "refuted": 0,
            "brake_engaged": 0}
        self._late_at: float | None = None  # when our event loop last woke up late
        self.round_trips = RoundTrips(floor=config.probe_timeout, ceiling=config.stale_window)
        # Whether a suspicion of us came on the liveness topic (then so must our refutation).
        self._refute_loudly = False
        self.local_health = 0  # 0 = healthy; see the module docstring
        # What happened to whom and when (wall clock), newest last: operators ask "why did
        # my node stop getting traffic?", and the SIGKILL benchmark reads detection times.
        self.events: deque[dict[str, Any]] = deque(maxlen=EVENT_HISTORY)
        self._suspected_since: dict[str, float] = {}
        self._braking = False

    def _event(self, peer_id: str, event: str, detail: str) -> None:
        now = time.time()
        if event == "suspected":
            self._suspected_since.setdefault(peer_id, now)
        elif event == "refuted":
            self._suspected_since.pop(peer_id, None)
        self.events.append({"at": now, "peer_id": peer_id, "event": event, "detail": detail})

    def report(self) -> dict[str, Any]:
        """What the detector knows, for /v1/network: whom it watches, whom it suspects
        (since when), its own health, and the recent liveness events."""
        suspected = self.table.suspected()
        return {
            "watching": sorted(self.watched()),
            "lost": sorted(self.watch.lost),
            "suspected": {p: self._suspected_since.get(p) for p in sorted(suspected)},
            "incarnation": self.table.incarnation,
            "local_health": self.local_health,
            "eviction_brake": self._braking,
            "gossip_lag_s": round(self.replica.replicator.current_gossip_lag(), 3),
            "members": len(self.table.members),
            "stats": dict(self.stats),
            "events": list(self.events),
        }

    @property
    def multiplier(self) -> int:
        return 1 + self.local_health

    def _health(self, delta: int) -> None:
        self.local_health = max(0, min(self.config.max_local_health, self.local_health + delta))
        self.table.suspicion_timeout = self.config.suspicion_timeout * self.multiplier

    def install(self) -> None:
        self.host.set_stream_handler(SWIM_PROTOCOL, self._handle)
        self.host.get_network().register_notifee(
            _ConnectionNotifee(lambda peer_id: self._appeared.add(peer_id)))
        self.replica.replicator.on_heard = lambda peer: self.table.heard_from(peer, self.clock())
        if self.pubsub is not None:
            self.pubsub.set_topic_validator(LIVENESS_TOPIC, self._validate_news, False)

    def suspected(self) -> frozenset[str]:
        return self.table.suspected()

    async def part(self, peer_id: str) -> None:
        """We are about to close our connection to ``peer_id`` on purpose (peering trims
        extra connections): stop watching it, and tell it to stop watching us, or it would
        take the closed connection for a crash and redial us to probe."""
        self.watch.forget(peer_id)
        await self.channels.request(peer_id, {"k": "bye"}, self.config.probe_timeout)
        self.channels.forget(peer_id)

    def watched(self) -> set[str]:
        return self.watch.watched()

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.channels.run)
            if self.pubsub is not None:
                subscription = await self.pubsub.subscribe(LIVENESS_TOPIC)
                nursery.start_soon(self._receive_news, subscription)
            nursery.start_soon(self._news_loop)
            await self._probe_loop()

    async def _probe_loop(self) -> None:
        while True:
            started = self.clock()
            interval = self.config.probe_interval * self.multiplier
            self._sync_members()
            self._watch_neighbours()
            target = self.watch.next_target(self.clock())
            if target is not None and await self._probe_round(target) != "silent":
                self.watch.decided(target)
            now = self.clock()
            self._watch_brake()
            self.table.dissemination_delay = self.replica.replicator.current_gossip_lag()
            if not self.lagging(now):  # irreversible steps wait until we can trust our view
                for peer_id in self.table.expired_suspicions(now):
                    self._event(peer_id, "confirmed",
                                "did not refute within the suspicion timeout")
                for peer_id in self.table.due_evictions(now):
                    await self._evict(peer_id)
            asked = max(0.0, interval - (self.clock() - started))
            before = self.clock()
            await trio.sleep(asked)
            if self.clock() - before - asked > self.config.probe_interval / 2:
                self._late_at = self.clock()  # our own event loop is late: we are the slow one
                self._health(+1)

    def _watch_brake(self) -> None:
        """Record when the eviction brake goes on or off: an operator asking why a dead
        node is still listed, or why live ones were not evicted, finds it in the events."""
        braking = self.table.braking()
        if braking == self._braking:
            return
        self._braking = braking
        unhealthy = len(self.table.suspected())
        members = len(self.table.members)
        if braking:
            self.stats["brake_engaged"] += 1
            detail = (f"{unhealthy} of {members} members suspected at once: evicting one "
                      "at a time")
            log.warning("eviction brake on: %s", detail)
            self._event(self.self_id, "eviction brake on", detail)
        else:
            self._event(self.self_id, "eviction brake off",
                        f"{unhealthy} of {members} members suspected")
            log.warning("eviction brake off")

    def lagging(self, now: float) -> bool:
        """Whether our own event loop woke late within the last stale window. A starved
        loop sees every peer as slow, and the refutation that would clear a suspect may
        sit unread in our socket buffers; so while lagging we neither raise suspicions
        nor confirm or evict anyone: a load spike on our side must not become evictions,
        rejoins and yet more load. (It does not catch a machine where every loop is on
        time but every peer answers late; adaptive timeouts, ``rtt.py``, are for that.)"""
        return self._late_at is not None and now - self._late_at < self.config.stale_window

    # -- one probe round ---------------------------------------------------------------

    async def _probe_round(self, target: str) -> str:
        """Probe ``target`` over all three paths: "acked" (directly or through a helper),
        "suspected" (all failed, now a suspect) or "silent" (no ack, but heard recently)."""
        self.stats["probes"] += 1
        if await self._ping(target):
            self._health(-1)
            return "acked"
        helpers = [p for p in self.watch.neighbours if p != target and p in self.table.members
                   and self.table.members[p].status is Status.ALIVE]
        random.shuffle(helpers)
        helpers = helpers[: self.config.indirect_probes]
        results: list[bool | None] = []
        if helpers:
            async with trio.open_nursery() as nursery:

                async def ask(helper: str) -> None:
                    results.append(await self._ping_req(helper, target))

                for helper in helpers:
                    nursery.start_soon(ask, helper)
        acked = any(r is True for r in results)
        if helpers and all(r is None for r in results):
            self._health(+1)  # nobody answered us at all: we are likely the slow one
        window = self.config.stale_window * self.multiplier
        if acked:
            return "acked"
        if self.table.heard_recently(target, self.clock(), window):
            return "silent"
        if self.lagging(self.clock()):
            self.stats["withheld"] += 1
            return "silent"
        if self.table.probe_failed(target, self.clock()):
            self.stats["suspected"] += 1
            detail = (f"direct, {len(helpers)} indirect and recent-contact checks failed")
            if self._publish_suspicion(target):
                detail += "; published"
            self._event(target, "suspected", detail)
            log.warning("suspecting %s: %s", target, detail)
        return "suspected"

    def _publish_suspicion(self, target: str) -> bool:
        """Publish our suspicion of ``target`` if the evidence is now strong enough
        (``LivenessTable.suspicion_to_publish``); return whether it was."""
        update = self.table.suspicion_to_publish(target, target in self.watch.lost)
        if update is None:
            return False
        self._broadcasts.append(_encode_updates([update])[0])
        self._news_pending.set()
        return True

    async def _ping(self, target: str) -> bool:
        started = self.clock()
        timeout = self.round_trips.timeout(target) * self.multiplier
        reply = await self.channels.request(target, {"k": "ping"}, timeout)
        if reply is None or reply.get("k") != "ack":
            return False
        self.round_trips.observe(target, self.clock() - started)
        return True

    async def _ping_req(self, helper: str, target: str) -> bool | None:
        """True: the helper reached the target; False: it answered that it could not (a
        nack); None: the helper did not answer either."""
        wait = self.round_trips.timeout(helper) + self.round_trips.timeout(target)
        reply = await self.channels.request(
            helper, {"k": "req", "target": target}, wait * self.multiplier)
        return None if reply is None else bool(reply.get("ok"))

    async def _handle(self, stream: Any) -> None:
        await self.channels.serve(stream, self.replica.admission.is_admitted, self._answer)

    async def _answer(self, peer: str, message: dict[str, Any]) -> dict[str, Any] | None:
        if message.get("k") == "ping":
            return {"k": "ack"}
        if message.get("k") == "req":
            return {"k": "req-ack", "ok": await self._ping(str(message.get("target")))}
        if message.get("k") == "bye":  # the peer is closing its connection to us on purpose
            self.watch.forget(peer)
            return {"k": "bye-ack"}
        return None

    # -- messages ------------------------------------------------------------------------

    def _pack(self, message: dict[str, Any]) -> bytes:
        if self.table.refute_needed:
            self._refute()
        message["u"] = _encode_updates(self.table.piggyback())
        return msgpack.packb(message, use_bin_type=True)

    def _unpack(self, sender: str, data: bytes) -> dict[str, Any]:
        message = msgpack.unpackb(data, raw=False)
        if not isinstance(message, dict):
            raise ValueError("swim message is not a map")
        now = self.clock()
        self.table.heard_from(sender, now)
        for item in message.get("u") or []:
            self._apply(item, now, sender)
        if self.table.refute_needed:
            self._news_pending.set()
        return message

    def _apply(self, item: Any, now: float, source: str, published: bool = False) -> None:
        """Merge one piece of news; ``published``: it came on the liveness topic."""
        try:
            peer_id, status, incarnation, proof, by = item
            update = Update(str(peer_id), Status(status), int(incarnation), proof,
                            str(by) if by else None)
        except (TypeError, ValueError):
            return
        if published and update.status is Status.SUSPECT:
            self.table.published_elsewhere(update.peer_id, update.incarnation)
            if update.peer_id == self.self_id:
                self._refute_loudly = True  # everyone heard it: everyone must hear us
        member = self.table.members.get(update.peer_id)
        # Verify a signature only when the news would change our view (it usually is old).
        valid = (update.status is Status.ALIVE and isinstance(update.proof, bytes)
                 and member is not None and update.incarnation > member.incarnation
                 and self._verify_alive(update))
        was_suspect = update.peer_id in self.table.suspected()
        changed = self.table.apply(update, now, proof_valid=valid)
        if (published and update.status is Status.SUSPECT
                and self.table.should_verify(update.peer_id)
                and self.watch.verify(update.peer_id, now)):
            self._event(update.peer_id, "verifying",
                        f"{source} published a suspicion; probing it first-hand")
        if not changed:
            return
        if update.status is Status.SUSPECT:
            self._event(update.peer_id, "suspected", f"reported by {source}")
            self._publish_suspicion(update.peer_id)  # our own suspicion, now corroborated
        elif update.status is Status.CONFIRMED:
            self._event(update.peer_id, "confirmed", f"reported by {source}")
        elif was_suspect:
            self.stats["refuted"] += 1
            self._event(update.peer_id, "refuted", f"incarnation {update.incarnation}")
            log.info("%s refuted its suspicion (incarnation %d)", update.peer_id,
                     update.incarnation)

    def _verify_alive(self, update: Update) -> bool:
        try:
            key = ID.from_base58(update.peer_id).extract_public_key()
        except Exception:
            return False
        assert update.proof is not None
        return key is not None and key.verify(
            _alive_payload(update.peer_id, update.incarnation), update.proof
        )

    def _refute(self) -> None:
        self._health(+1)  # others could not reach us in time: we are probably slow
        incarnation = self.table.incarnation
        proof = self.identity.key_pair.private_key.sign(_alive_payload(self.self_id, incarnation))
        self.table.announce_alive(proof)  # rides on our probes and acks in any case
        if self._refute_loudly:
            self._refute_loudly = False
            self._broadcasts.append([self.self_id, Status.ALIVE.value, incarnation, proof, None])
            self._news_pending.set()
        log.warning("refuting a suspicion of this node (incarnation %d)", incarnation)

    # -- broadcast of first-hand news ---------------------------------------------------

    async def _news_loop(self) -> None:
        """Publish our own suspicions and refutations as soon as they arise (rare events,
        never periodic). Its own task: a refutation must not wait for a probe round, which
        under load can take several seconds."""
        while True:
            await self._news_pending.wait()
            self._news_pending = trio.Event()
            if self.table.refute_needed:
                self._refute()
            news, self._broadcasts = self._broadcasts, []
            if not news or self.pubsub is None:
                continue
            try:
                await self.pubsub.publish(LIVENESS_TOPIC, msgpack.packb({"u": news}))
            except Exception as exc:  # publishing with no peers yet is not an error
                log.debug("liveness publish failed: %s", exc)

    def _validate_news(self, forwarder: ID, message: Any) -> bool:
        if not self.replica.admission.is_admitted(forwarder):
            return False
        self.table.heard_from(forwarder.to_base58(), self.clock())  # it is running
        return True

    async def _receive_news(self, subscription: Any) -> None:
        while True:
            message = await subscription.get()
            if ID(message.from_id).to_base58() == self.self_id:
                continue
            try:
                news = msgpack.unpackb(message.data, raw=False)
                items = news.get("u") if isinstance(news, dict) else None
            except Exception:
                continue  # malformed news is dropped, never raised
            now = self.clock()
            origin = ID(message.from_id).to_base58()
            for item in items or []:
                self._apply(item, now, origin, published=True)
            if self.table.refute_needed:
                self._news_pending.set()

    # -- members ---------------------------------------------------------------------------

    def _sync_members(self) -> None:
        """Track the registry's non-LEFT peers; only when the registry changed (O(N) work
        per change, not per probe period)."""
        if self.replica.registry.generation == self._synced_generation:
            return
        self._synced_generation = self.replica.registry.generation
        peers: dict[str, tuple[str, ...]] = {}
        sessions: dict[str, set[str]] = {}
        for record in self.replica.registry:
            if record.state is not Lifecycle.LEFT and record.peer_id != self.self_id:
                peers[record.peer_id] = record.addrs
                sessions.setdefault(record.peer_id, set()).add(record.session_id)
        now = self.clock()
        for peer_id, ids in sessions.items():
            if ids - self._sessions.get(peer_id, ids):
                self.table.new_session(peer_id, now)  # it rejoined after an eviction
        self._sessions = sessions
        self.table.sync_members(set(peers), now)
        self.round_trips.forget_except(set(peers))
        self._suspected_since = {p: t for p, t in self._suspected_since.items()
                                 if p in self.table.members}
        # Peerstore addresses (for probing lost peers and helpers): parsing multiaddrs for
        # every member on every registry change cost O(N) per change on every node, which
        # mattered under churn; only new or changed addresses are stored, refreshed well
        # within their TTL.
        store = self.host.get_peerstore()
        self._stored_addrs = {p: v for p, v in self._stored_addrs.items() if p in peers}
        for peer_id, addrs in peers.items():
            stored = self._stored_addrs.get(peer_id)
            if stored is not None and stored[0] == addrs and now - stored[1] < ADDR_TTL_S / 2:
                continue
            try:
                store.add_addrs(ID.from_base58(peer_id),
                                [multiaddr.Multiaddr(a) for a in addrs], ADDR_TTL_S)
                self._stored_addrs[peer_id] = (addrs, now)
            except Exception:
                log.debug("bad addresses for %s", peer_id, exc_info=True)

    def _watch_neighbours(self) -> None:
        connected = {p.to_base58() for p in self.host.get_connected_peers()}
        # Suspects stay watched while connected: our probes carry the news they must refute.
        watchable = {p for p, m in self.table.members.items() if m.status is not Status.CONFIRMED}
        known = {r.peer_id for r in self.replica.registry}
        appeared, self._appeared = frozenset(self._appeared), set()
        for peer_id in self.watch.observe(connected, watchable, known, self.clock(), appeared):
            self._event(peer_id, "connection lost", "probing it first")

    async def _evict(self, peer_id: str) -> None:
        # Drop the connection too: behind a silent partition (packets dropped, no RST) it
        # would otherwise look established for minutes and block a fresh dial after healing.
        try:
            await self.host.disconnect(ID.from_base58(peer_id))
        except Exception:
            log.debug("disconnecting %s failed", peer_id, exc_info=True)
        sessions = [r.session_id for r in self.replica.registry
                    if r.peer_id == peer_id and r.state is not Lifecycle.LEFT]
        for session_id in sessions:
            reason = (f"unresponsive for {self.config.suspicion_timeout:.0f}s after suspicion "
                      "(direct, indirect and recent-contact probes failed)")
            if await self.replica.evict(session_id, reason):
                self.stats["evicted"] += 1
                self._event(peer_id, "evicted", f"session {session_id}: {reason}")
                log.warning("evicted session %s of %s", session_id, peer_id)

"""The failure detector of a node: its parts, wired to libp2p and to the node's replica.

The parts, each a unit of its own (as memberlist splits them): the liveness table
(``table.py``: suspicion, confirmation, who signs evictions, the eviction brake), local
health (``health.py``), the news merged and published (``news.py``), the member list
(``members.py``), whom to probe (``watch.py``), adaptive probe timeouts (``rtt.py``) and
the probe loop (``prober.py``). This module supplies what they need from the outside:

- probes over ``/otela/swim/2.0.0`` on one long-lived stream per peer (``channels.py``),
  every message carrying piggybacked news and a summary of the sender's registry (a
  replica that drifted gets anti-entropy, ``otela/replication/drift.py``), and the
  serving side that acks probes, probes
  a third peer on request, and lets a peer that closes its connection to us on purpose
  say so (``bye``);
- the ``otela/liveness/1`` GossipSub topic for published news;
- the registry (members, their addresses, evictions) through ``LocalReplica``, and every
  contact the replicator reports (gossip a peer published *or forwarded*, anti-entropy)
  as recent contact.
Design and defaults: docs/failure-detection.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable
from typing import Any

import msgpack
import multiaddr
import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.peer.peerstore import PeerStoreError

from otela.identity import Identity
from otela.liveness.channels import Channels
from otela.liveness.events import EventLog
from otela.liveness.health import LocalHealth
from otela.liveness.members import MemberList
from otela.liveness.news import News, well_formed
from otela.liveness.prober import DetectorConfig, Prober
from otela.liveness.rtt import RoundTrips
from otela.liveness.table import LivenessTable
from otela.liveness.watch import NeighbourWatch
from otela.mesh.connections import OnConnected
from otela.mesh.listening import ConnectAnswer, answer_at, nothing_listens_at
from otela.mesh.quota import SWIM_STREAMS, set_capped_handler
from otela.registry import evidence
from otela.registry.records import Lifecycle, NodeRecord
from otela.registry.store import Registry
from otela.replication import LocalReplica
from otela.replication.replicator import ReplicaCore

log = logging.getLogger("otela.liveness")

SWIM_PROTOCOL = TProtocol("/otela/swim/2.0.0")
LIVENESS_TOPIC = "otela/liveness/1"
ADDR_TTL_S = 3600  # peerstore TTL of members' addresses

__all__ = ["LIVENESS_TOPIC", "SWIM_PROTOCOL", "DetectorConfig", "FailureDetector"]


def stamp(message: dict[str, Any], news: News, replica: ReplicaCore,
          to: str | None = None) -> dict[str, Any]:
    """What rides on every SWIM message we send (probe, ack, indirect probe) to peer
    ``to``: our news (our suspicion of ``to`` itself first, if we hold one: the buddy
    system, ``News.piggyback``), and our registry's summary and age, so a replica that
    drifted from ours gets anti-entropy without a timer (``otela/replication/drift.py``).
    Shared with the mesh simulator, which sizes its probes by this very message."""
    message["u"] = items = news.piggyback(to)
    marks = news.published_among(items)
    if marks:  # absent in almost every message: it costs nothing then
        message["pu"] = marks
    message["r"], age = replica.summary()
    message["ra"] = round(age, 1)
    return message


def take(message: dict[str, Any], sender: str, now: float, table: LivenessTable,
         news: News, replica: ReplicaCore) -> bool:
    """Take what rides on a SWIM message from ``sender``: it is contact, its news is
    merged, its summary compared. Returns whether anti-entropy with it is due (drift)."""
    table.heard_from(sender, now)
    news.receive(message.get("u"), now, sender, marks=message.get("pu"))
    return replica.drifted(sender, message.get("r"), message.get("ra"))


def live_session(registry: Registry, peer_id: str) -> str | None:
    """``peer_id``'s session, if it is live here (the registry keeps one per peer)."""
    session = registry.map.session_of(peer_id)
    record = None if session is None else registry.get(session)
    return None if record is None or record.state is Lifecycle.LEFT else session


def suspicion_signer(sign: Callable[[bytes], bytes], self_id: str, registry: Registry,
                     clock: Callable[[], float]) -> Callable[[str, int], bytes | None]:
    """The table's ``sign_suspicion``: our signed suspicion of a peer's live session at an
    incarnation (``otela.registry.evidence``), or None when it has no live session here.
    Shared with the mesh simulator's nodes."""

    def sign_suspicion(peer_id: str, incarnation: int) -> bytes | None:
        session = live_session(registry, peer_id)
        if session is None:
            return None
        return evidence.sign(sign, self_id, peer_id, session, incarnation,
                             clock()).pack_proof()

    return sign_suspicion


def held_statements(held: Iterable[tuple[str, int, bytes]],
                    peer_id: str) -> list[evidence.Suspicion]:
    """The signed suspicions of ``peer_id`` we hold (``LivenessTable.evidence_of``), as the
    statements an eviction carries (those that no longer decode are left out)."""
    statements = []
    for by, incarnation, proof in held:
        try:
            statements.append(evidence.from_proof(by, peer_id, incarnation, proof))
        except evidence.EvidenceError:
            continue
    return statements


class _SwimTransport:
    """Probes over SWIM channels. A probed peer we hold no connection to is dialled from
    the peerstore, where its addresses expire: ``host.connect`` stores a dialled peer's
    with a 120 s TTL, replacing the registry's hour, and nothing renews them while the
    registry is quiet. So before each probe, and for the refused-connection check, the
    peer's addresses come back from the registry (``addresses_of``) when they expired;
    the expired peerstore raised out of that check and stopped a node of a 128-node
    federation."""

    def __init__(self, channels: Channels, host: Any,
                 addresses_of: Callable[[str], list[multiaddr.Multiaddr]] = lambda p: []
                 ) -> None:
        self.channels = channels
        self.host = host
        self.addresses_of = addresses_of

    async def probe(self, peer: str, timeout: float) -> bool:
        self.known_addresses(peer)
        reply = await self.channels.request(peer, {"k": "ping"}, timeout)
        return reply is not None and reply.get("k") == "ack"

    async def probe_via(self, helper: str, target: str, timeout: float) -> bool | None:
        self.known_addresses(helper)
        reply = await self.channels.request(helper, {"k": "req", "target": target}, timeout)
        return None if reply is None else bool(reply.get("ok"))

    async def turned_away(self, peer: str) -> bool:
        return await nothing_listens_at(self.known_addresses(peer))

    async def reachability(self, peer: str) -> ConnectAnswer:
        return await answer_at(self.known_addresses(peer))

    def known_addresses(self, peer: str) -> list[multiaddr.Multiaddr]:
        """The peer's addresses in the peerstore, put back from the registry if they
        expired (or were never there)."""
        store = self.host.get_peerstore()
        peer_id = ID.from_base58(peer)
        try:
            return list(store.addrs(peer_id))
        except PeerStoreError:
            addrs = self.addresses_of(peer)
            if addrs:
                store.add_addrs(peer_id, addrs, ADDR_TTL_S)
            return addrs


class _NodeMembership:
    """The node around the detector (``prober.Membership``): its registry replica, its
    libp2p host's connections and peerstore."""

    def __init__(self, host: Any, replica: LocalReplica,
                 evidence_of: Callable[[str], list[tuple[str, int, bytes]]]) -> None:
        self.host = host
        self.replica = replica
        self.evidence_of = evidence_of  # the signed suspicions we hold of a member
        # Per member: the registry's addresses as stored in the peerstore, parsed, and when.
        self._stored_addrs: dict[str, tuple[tuple[str, ...], list[multiaddr.Multiaddr],
                                            float]] = {}
        self._addrs_swept_at = float("-inf")  # the last look at every member's addresses

    def records(self) -> Iterable[NodeRecord]:
        return self.replica.registry

    def generation(self) -> int:
        return self.replica.registry.generation

    def connected(self) -> set[str]:
        return {p.to_base58() for p in self.host.get_connected_peers()}

    def gossip_lag(self) -> float:
        return self.replica.replicator.current_gossip_lag()

    def learn_addresses(self, peers: dict[str, tuple[str, ...]],
                        touched: Collection[str] | None = None) -> None:
        # Parsing multiaddrs for every member on every registry change cost O(N) per change
        # on every node, which mattered under churn; only new or changed addresses are
        # stored, refreshed well within their TTL. Looking at every member to find them
        # (~3 ms at 10,000) is kept to a pass every quarter of the TTL; between passes
        # only the members the member list says changed (``touched``) are looked at.
        now = time.monotonic()
        store = self.host.get_peerstore()
        if touched is None or now - self._addrs_swept_at > ADDR_TTL_S / 4:
            self._addrs_swept_at = now
            self._stored_addrs = {p: v for p, v in self._stored_addrs.items() if p in peers}
            touched = peers.keys()
        for peer_id in touched:
            addrs = peers.get(peer_id)
            if addrs is None:
                self._stored_addrs.pop(peer_id, None)
                continue
            stored = self._stored_addrs.get(peer_id)
            if stored is not None and stored[0] == addrs and now - stored[2] < ADDR_TTL_S / 2:
                continue
            try:
                parsed = [multiaddr.Multiaddr(a) for a in addrs]
                store.add_addrs(ID.from_base58(peer_id), parsed, ADDR_TTL_S)
                self._stored_addrs[peer_id] = (addrs, parsed, now)
            except Exception:
                log.debug("bad addresses for %s", peer_id, exc_info=True)

    def addresses_of(self, peer_id: str) -> list[multiaddr.Multiaddr]:
        """The addresses the registry lists for ``peer_id`` (as last learnt)."""
        stored = self._stored_addrs.get(peer_id)
        return [] if stored is None else list(stored[1])

    async def evict(self, peer_id: str, reason: str) -> list[str]:
        # Drop the connection too: behind a silent partition (packets dropped, no RST) it
        # would otherwise look established for minutes and block a fresh dial after healing.
        try:
            await self.host.disconnect(ID.from_base58(peer_id))
        except Exception:
            log.debug("disconnecting %s failed", peer_id, exc_info=True)
        session = live_session(self.replica.registry, peer_id)
        if session is None:
            return []
        statements = held_statements(self.evidence_of(peer_id), peer_id)
        return [session] if await self.replica.evict(session, reason, statements) else []


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
        self.host = host
        self.pubsub = pubsub  # None: news spreads by piggybacking only
        self.replica = replica
        self.config = config
        self.clock = clock
        self.self_id = identity.peer_id.to_base58()
        self.stats: dict[str, int] = {
            "probes": 0, "suspected": 0, "withheld": 0, "evicted": 0, "refuted": 0,
            "brake_engaged": 0, "cut_off_entered": 0, "malformed_news": 0, "unwatched_checks": 0,
            "unwatched_unreachable": 0, "refutations_republished": 0, "unsigned_suspicions": 0}
        self.table = LivenessTable(self.self_id, config.suspicion_timeout,
                                   eviction_stagger=config.probe_interval)
        self.watch = NeighbourWatch()
        self.events = EventLog()
        self.health = LocalHealth(config.max_local_health, config.stale_window,
                                  config.probe_interval, on_change=self.table.scale_timeouts)
        self.round_trips = RoundTrips(floor=config.probe_timeout, ceiling=config.stale_window)
        sign = identity.key_pair.private_key.sign
        registry = replica.registry
        self.table.sign_suspicion = suspicion_signer(sign, self.self_id, registry,
                                                     replica.clock)
        self.news = News(self.self_id, self.table, self.watch, self.health, self.events,
                         sign, self.stats, lambda peer_id: live_session(registry, peer_id),
                         replica.clock)
        self.members = MemberList(self.self_id, self.table, self.round_trips, self.events)
        self.channels = Channels(host, SWIM_PROTOCOL, self._pack, self._unpack)
        membership = _NodeMembership(host, replica, self.table.evidence_of)
        self.prober = Prober(
            self.self_id, config, self.table, self.watch, self.health, self.news, self.events,
            self.members, self.round_trips,
            _SwimTransport(self.channels, host, membership.addresses_of), membership, clock,
            self.stats)

    @property
    def local_health(self) -> int:
        return self.health.score

    def report(self) -> dict[str, Any]:
        """What the detector knows, for /v1/network: whom it watches, whom it suspects
        (since when), its own health, and the recent liveness events."""
        suspected = self.table.suspected()
        return {
            "watching": sorted(self.watched()),
            "lost": sorted(self.watch.lost),
            "suspected": {p: self.events.suspected_since(p) for p in sorted(suspected)},
            "incarnation": self.table.incarnation,
            "local_health": self.health.score,
            "health_multiplier": self.health.multiplier,
            "eviction_brake": self.prober.braking,
            "cut_off": self.table.cut_off,
            "gossip_lag_s": round(self.replica.replicator.current_gossip_lag(), 3),
            "members": len(self.table.members),
            "stats": dict(self.stats),
            "events": list(self.events.events),
        }

    def install(self) -> None:
        set_capped_handler(self.host, SWIM_PROTOCOL, self._handle, SWIM_STREAMS)
        self.host.get_network().register_notifee(
            OnConnected(lambda peer_id: self.prober.appeared.add(peer_id)))
        self.replica.replicator.on_contact(lambda peer: self.table.heard_from(peer, self.clock()))
        if self.pubsub is not None:
            self.pubsub.set_topic_validator(LIVENESS_TOPIC, self._validate_news, False)

    def suspected(self) -> frozenset[str]:
        return self.table.suspected()

    def lagging(self, now: float) -> bool:
        return self.health.lagging(now)

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
            await self.prober.run()

    # -- the serving side of probes ------------------------------------------------------

    async def _handle(self, stream: Any) -> None:
        await self.channels.serve(stream, self.replica.admission.is_admitted, self._answer)

    async def _answer(self, peer: str, message: dict[str, Any]) -> dict[str, Any] | None:
        if message.get("k") == "ping":
            return {"k": "ack"}
        if message.get("k") == "req":
            return {"k": "req-ack", "ok": await self.prober.ping(str(message.get("target")))}
        if message.get("k") == "bye":  # the peer is closing its connection to us on purpose
            self.watch.forget(peer)
            return {"k": "bye-ack"}
        return None

    def _pack(self, peer: str, message: dict[str, Any]) -> bytes:
        return msgpack.packb(stamp(message, self.news, self.replica.replicator, to=peer),
                             use_bin_type=True)

    def _unpack(self, sender: str, data: bytes) -> dict[str, Any]:
        message = msgpack.unpackb(data, raw=False)
        if not isinstance(message, dict):
            raise ValueError("swim message is not a map")
        if take(message, sender, self.clock(), self.table, self.news,
                self.replica.replicator):
            self.replica.replicator.sync_soon(sender, "drift")
        return message

    # -- published news ------------------------------------------------------------------

    async def _news_loop(self) -> None:
        """Publish our own suspicions and refutations as soon as they arise (rare events,
        never periodic). Its own task: a refutation must not wait for a probe round, which
        under load can take several seconds."""
        while True:
            await self.news.pending.wait()
            news = self.news.take_broadcasts()
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
        try:  # malformed news is neither applied nor forwarded to everyone else
            news = msgpack.unpackb(message.data, raw=False)
        except Exception:
            news = None
        if not isinstance(news, dict) or not well_formed(news.get("u")):
            self.stats["malformed_news"] += 1
            return False
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
            self.news.receive(items, self.clock(), ID(message.from_id).to_base58(),
                              published=True)

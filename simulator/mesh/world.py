"""The simulated federation: nodes, their connections, gossip, and what happens to them.

``World`` owns the clock, the network model, GossipSub's model and the nodes, and offers
the events scenarios need: join, leave, kill, pause, partition and heal, announce a
change. It records what the measurements need as it happens (when each replica applied
a watched change, evictions, false suspicions, a joiner's progress).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from libp2p.crypto.keys import KeyPair
from libp2p.peer.id import ID

from otela.liveness.prober import DetectorConfig
from otela.load.reports import ReportSchedule, interval_for
from otela.load.reports import encode as encode_report
from otela.registry.crdt import Entry
from otela.registry.records import Lifecycle
from otela.registry.wire import verify as wire_verify
from otela.routing.load import NodeLoad
from simulator.mesh.gossip import D_HI, D_LAZY, D_LO, D, Gossip, Message, Wire
from simulator.mesh.loop import Loop
from simulator.mesh.network import HANDSHAKE_BYTES, NetConfig, Network
from simulator.mesh.node import LIVENESS_TOPIC, REGISTRY_TOPIC, WALL_EPOCH, SimNode
from simulator.mesh.tasks import Sleep, Task

DIAL_TIMEOUT_S = 5.0  # otela/mesh/peering.py
CONNECT_TIMEOUT_S = 1.0  # a plain TCP connect's answer (otela/mesh/listening.py)
REPORT_BYTES = 300  # a load report's HTTP request and 204 answer, beyond its body


@dataclass
class Watched:
    """A change whose arrival at every replica is timed."""

    key: str
    version: int
    state: Lifecycle | None
    at: float
    applied: dict[int, float] = field(default_factory=dict)
    population: int = 0  # nodes that existed when it was made (later joiners sync it)


class World:
    def __init__(self, size: int, seed: int = 1, net: NetConfig | None = None,
                 detector: DetectorConfig | None = None, kill_refuses: bool = True,
                 ingresses: int = 0, wire: Wire | None = None,
                 degree: tuple[int, int, int, int] | None = None, push: str = "mesh") -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.loop = Loop()
        self.net = Network(self.loop, net or NetConfig(), size, random.Random(seed + 7))
        self.detector = detector or DetectorConfig()
        self.kill_refuses = kill_refuses  # a crashed process: its host refuses connects
        self.nodes: list[SimNode] = []
        self.index_of: dict[str, int] = {}
        self.conns: list[set[int]] = []
        self.conn_names: list[set[str]] = []  # the same connections, by peer id
        self._dialing: dict[tuple[int, int], list[Callable[[bool], None]]] = {}
        self._verified: dict[int, tuple[Any, Any]] = {}
        self.gossip = Gossip(self.net, random.Random(seed + 11), lambda i: self.conns[i],
                             lambda i: self.nodes[i].alive, self._validate, self._deliver,
                             wire, degree or (D, D_LO, D_HI, D_LAZY), push)
        self.watched: list[Watched] = []
        self.evictions: list[tuple[float, int, str]] = []
        self.false_suspicions = 0
        self.false_evictions = 0
        self.killed: set[int] = set()
        self.report_bytes: dict[int, int] = {}
        self.seeding = False  # seed_state's announcements are not gossiped
        for index in range(size):
            self._make(index, ingress=index < ingresses)

    # -- clocks and identities -----------------------------------------------------------

    def mono(self) -> float:
        return self.loop.now

    def wall(self) -> float:
        return WALL_EPOCH + self.loop.now

    @staticmethod
    def peer_id_of(key: KeyPair) -> str:
        return ID.from_pubkey(key.public_key).to_base58()

    def verify(self, envelope: Any, trust: Any, now: float) -> Any:
        """``wire.verify``, with a node's signed record checked once for every replica
        (a pure function of its bytes within the minutes a run lasts): the receiving
        node's CPU is still charged for it. Evictions and revocations depend on the
        replica, and are checked for real every time."""
        if isinstance(envelope, dict) and envelope.get("t") == "rec":
            hit = self._verified.get(id(envelope))
            if hit is not None and hit[0] is envelope:
                if isinstance(hit[1], Exception):
                    raise hit[1]
                return hit[1]
            try:
                result = wire_verify(envelope, trust, now)
            except Exception as exc:
                self._verified[id(envelope)] = (envelope, exc)
                raise
            self._verified[id(envelope)] = (envelope, result)
            return result
        return wire_verify(envelope, trust, now)

    # -- nodes ---------------------------------------------------------------------------

    def _make(self, index: int, ingress: bool = False) -> SimNode:
        node = SimNode(self, index, self.seed * 1_000_003 + index, ingress=ingress)
        self.nodes.append(node)
        self.conns.append(set())
        self.conn_names.append(set())
        self.index_of[node.peer_id] = index
        return node

    def seed_state(self, models: tuple[str, ...] = ("model-a",)) -> None:
        """Start every node as a converged, connected federation (what a finished join
        leaves): each signs JOIN and SERVING, every replica holds every entry, and each
        node has dialled peers as peering does. Measurements start from here."""
        self.seeding = True
        for node in self.nodes:
            node.start(models)
        self.seeding = False
        envelopes = [e.proof for n in self.nodes for e in n.registry.map]
        for node in self.nodes:
            node.replica.ingest(envelopes, "ae")
        self._seed_links()
        self.net.stats.reset()
        for node in self.nodes:
            self.run_loops(node)

    def _seed_links(self) -> None:
        """Each node dials ~6 peers of its own as it joins (peering's target) and is
        dialled by later joiners, so connections settle near a mean degree of 12
        (docs/mesh.md), each end capped at 16."""
        order = list(range(len(self.nodes)))
        for index in order:
            others = [j for j in self.rng.sample(order, min(len(order), 24)) if j != index]
            dialled = 0
            for peer in others:
                if dialled >= 6 or len(self.conns[index]) >= 16:
                    break
                if peer not in self.conns[index] and len(self.conns[peer]) < 16:
                    self._link(index, peer, quiet=True)
                    dialled += 1

    def seed_thin(self, full: int = 1, models: tuple[str, ...] = ("model-a",)) -> None:
        """A federation too large for every node to hold a full replica in one process
        (10,000 nodes: 10^8 entries): every node signs its record and is connected as
        peering leaves it, only the first ``full`` nodes hold every entry and nobody runs
        its loops. Enough for what depends on one replica (a joiner's transfer from one
        peer, a replica's memory) and for a change's spread through GossipSub without the
        probes' background load (``thin_change``), not for federation-wide liveness."""
        self.seeding = True
        for node in self.nodes:
            node.start(models)
        self.seeding = False
        envelopes = [e.proof for n in self.nodes for e in n.registry.map]
        for node in self.nodes[:full]:
            node.replica.ingest(envelopes, "ae")
        self._seed_links()
        self.net.stats.reset()

    def run_loops(self, node: SimNode) -> None:
        node.spawn(node.probe_loop())
        node.spawn(node.peering_loop())
        node.spawn(node.reconcile_loop())
        node.spawn(node.ae_backstop())

    def join(self, bootstrap: int, models: tuple[str, ...] = ("model-a",),
             serve_after: float | None = None) -> SimNode:
        """A new node joins through ``bootstrap``: announces JOIN (to nobody yet, as the
        daemon does), connects, syncs; SERVING at once or ``serve_after`` seconds later
        (an engine loading), by then over its gossip mesh."""
        index = len(self.nodes)
        self.net.add_node(index)
        node = self._make(index)
        node.start(models, serve=serve_after is None)
        if serve_after is not None:
            self.loop.after(serve_after, node.serve_now, models)

        def connected(ok: bool) -> None:
            if ok:
                node.sync_with(bootstrap)
        self.ensure_connection(index, bootstrap, connected)
        self.run_loops(node)
        return node

    def leave(self, index: int) -> None:
        """A clean stop: DOWN, LEFT, anti-entropy with every neighbour, then gone."""
        node = self.nodes[index]
        node.announce(state=Lifecycle.DOWN)
        node.announce(state=Lifecycle.LEFT)
        for peer in sorted(self.conns[index]):
            node.sync_with(peer)
        self.loop.after(2.0, self.kill, index, False)

    def kill(self, index: int, counted: bool = True) -> None:
        node = self.nodes[index]
        if not node.alive:
            return
        node.stop()
        if counted:
            self.killed.add(index)
        for peer in sorted(self.conns[index]):
            self.disconnect(index, peer)
        self.gossip.forget(index)

    def pause(self, index: int, seconds: float) -> None:
        self.net.paused_until[index] = max(self.net.paused_until[index],
                                           self.loop.now + seconds)

    def partition(self, cut: set[int]) -> None:
        self.net.cut = set(cut)
        self.net.partitioned = True

    def heal(self) -> None:
        self.net.partitioned = False
        self.net.cut = set()

    # -- connections ---------------------------------------------------------------------

    def connected(self, a: int, b: int) -> bool:
        return b in self.conns[a]

    def ensure_connection(self, a: int, b: int, done: Callable[[bool], None]) -> None:
        if b in self.conns[a]:
            done(True)
            return
        key = (a, b)
        waiting = self._dialing.get(key)
        if waiting is not None:
            waiting.append(done)
            return
        self._dialing[key] = [done]
        target = self.nodes[b]
        rtt = self.net.one_way(a, b) + self.net.one_way(b, a)
        if self.net.blocked(a, b) or (not target.alive and not self.kill_refuses):
            self.loop.after(DIAL_TIMEOUT_S, self._dialed, a, b, False)
        elif not target.alive:
            self.loop.after(rtt, self._dialed, a, b, False)
        else:
            # TCP, Noise XX and Yamux: about three round trips; a paused peer answers late.
            ready = max(self.loop.now + 3 * rtt, self.net.paused_until[b] + rtt)
            ok = ready - self.loop.now <= DIAL_TIMEOUT_S
            self.loop.at(ready if ok else self.loop.now + DIAL_TIMEOUT_S, self._dialed, a, b, ok)

    def _dialed(self, a: int, b: int, ok: bool) -> None:
        callbacks = self._dialing.pop((a, b), [])
        ok = ok and self.nodes[a].alive and self.nodes[b].alive and not self.net.blocked(a, b)
        if ok and b not in self.conns[a]:
            self._link(a, b)
        for callback in callbacks:
            callback(ok)

    def _link(self, a: int, b: int, quiet: bool = False) -> None:
        self.conns[a].add(b)
        self.conns[b].add(a)
        self.conn_names[a].add(self.nodes[b].peer_id)
        self.conn_names[b].add(self.nodes[a].peer_id)
        self.gossip.connected(a, b)
        if not quiet:
            stats = self.net.stats
            stats.by_kind["connect"] += 2 * HANDSHAKE_BYTES
            for x in (a, b):
                stats.sent[x] += HANDSHAKE_BYTES
                stats.received[x] += HANDSHAKE_BYTES
                self.net.charge(x, self.net.config.cpu_connect_s)
            self.nodes[a].on_connected(b)
            self.nodes[b].on_connected(a)

    def disconnect(self, a: int, b: int) -> None:
        if b not in self.conns[a]:
            return
        self.conns[a].discard(b)
        self.conns[b].discard(a)
        self.conn_names[a].discard(self.nodes[b].peer_id)
        self.conn_names[b].discard(self.nodes[a].peer_id)
        self.gossip.disconnected(a, b)

    def tcp_connect(self, a: int, b: int, answer: Callable[[str], None]) -> None:
        """A plain TCP connect from ``a`` to ``b``'s address: ``accepted``, ``refused``,
        ``unknown`` (no answer in time) or ``none`` (no direct address: behind NAT)."""
        if self.net.nat[b]:
            self.loop.after(0.0, answer, "none")
            return
        rtt = self.net.one_way(a, b) + self.net.one_way(b, a)
        if self.net.blocked(a, b):
            self.loop.after(CONNECT_TIMEOUT_S, answer, "unknown")
        elif self.nodes[b].alive:
            self.loop.after(rtt, answer, "accepted")  # its kernel accepts, even paused
        elif self.kill_refuses:
            self.loop.after(rtt, answer, "refused")
        else:
            self.loop.after(CONNECT_TIMEOUT_S, answer, "unknown")

    # -- gossip --------------------------------------------------------------------------

    def publish(self, index: int, topic: str, data: bytes) -> None:
        if not self.seeding:
            self.gossip.publish(index, topic, data)

    def _validate(self, index: int, forwarder: int, message: Message) -> bool:
        node = self.nodes[index]
        if message.topic == LIVENESS_TOPIC:
            node.table.heard_from(self.nodes[forwarder].peer_id, self.mono())
            return True
        return node.replica.accept_gossip(self.nodes[forwarder].peer_id, True, message.data,
                                          self.nodes[message.origin].peer_id)

    def _deliver(self, index: int, message: Message) -> None:
        node = self.nodes[index]
        if message.topic == REGISTRY_TOPIC:
            node.replica.take_gossip(message.data, self.nodes[message.origin].peer_id)
        else:
            node.on_news(message.origin, message.data)

    # -- measurements --------------------------------------------------------------------

    def watch_change(self, index: int) -> Watched:
        """Time the arrival of ``index``'s latest record version at every replica."""
        record = self.nodes[index].record
        assert record is not None
        watched = Watched(record.session_id, record.version, None, self.loop.now,
                          population=len(self.nodes))
        watched.applied[index] = self.loop.now
        self.watched.append(watched)
        return watched

    def watch_left(self, index: int) -> Watched:
        """Time when every replica holds ``index``'s session LEFT."""
        record = self.nodes[index].record
        assert record is not None
        watched = Watched(record.session_id, -1, Lifecycle.LEFT, self.loop.now)
        self.watched.append(watched)
        return watched

    def applied(self, index: int, entry: Entry) -> None:
        for watched in self.watched:
            if watched.key != entry.key or index in watched.applied:
                continue
            if (watched.state is not None and entry.state is watched.state) or (
                    watched.state is None and entry.version >= watched.version):
                watched.applied[index] = self.loop.now
        if entry.evicted_by is not None and entry.state is Lifecycle.LEFT:
            owner = self.index_of.get(entry.record.peer_id)
            if (owner is not None and owner == index and self.nodes[owner].alive):
                self.false_evictions += 1

    def evictions_signed(self, index: int, peer_id: str) -> None:
        self.evictions.append((self.loop.now, index, peer_id))

    def suspected(self, target: int) -> None:
        if self.nodes[target].alive:
            self.false_suspicions += 1

    def alive_nodes(self) -> list[int]:
        return [n.index for n in self.nodes if n.alive]

    # -- load reports (otela/load/reports.py) --------------------------------------------

    def report_loads(self, load: Callable[[int, float], NodeLoad]) -> None:
        """Every serving node reports its load to every ingress on ``ReportSchedule``."""
        for node in self.nodes:
            if node.alive and not node.ingress:
                node.spawn(self._reporter(node, load))

    def _reporter(self, node: SimNode, load: Callable[[int, float], NodeLoad]) -> Task:
        schedule = ReportSchedule()
        # Nodes started at different times report at random phases of their interval
        # (members x 0.5 s: 500 s at 1,000 nodes), not all at once as a shared start would.
        interval = interval_for(len(node.registry), schedule.min_interval,
                                schedule.per_member_s)
        schedule.last_at = self.mono() - node.rng.uniform(0, interval)
        yield Sleep(node.rng.uniform(0, schedule.min_interval))
        while node.alive:
            yield Sleep(schedule.min_interval)
            due = schedule.due(self.mono(), len(node.registry), True,
                               lambda: load(node.index, self.mono()))
            if due is None or node.record is None:
                continue
            body = encode_report(node.record.session_id, *due)
            for ingress in self.nodes:
                if ingress.ingress and ingress.alive:
                    size = len(body) + REPORT_BYTES
                    self.net.stats.sent[node.index] += size
                    self.net.stats.received[ingress.index] += size
                    self.report_bytes[ingress.index] = self.report_bytes.get(
                        ingress.index, 0) + size

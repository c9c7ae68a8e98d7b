"""One simulated node: otela's protocol cores, wired as the daemon wires them.

The cores are the daemon's own objects: ``Registry`` and ``ReplicaCore`` (ingest, gossip
judgement, drift, anti-entropy steps), ``LivenessTable``, ``News``, ``NeighbourWatch``,
``LocalHealth``, ``RoundTrips``, ``MemberList`` and ``ProbeCore`` (the probe loop's
decisions), ``detector.stamp``/``take`` (what rides on SWIM messages), ``plan_step``
(peering), ``eviction_envelope``, real Ed25519 keys and signed envelopes. This module
only carries out their I/O on the simulated network, in the order
``otela/liveness/prober.py``, ``detector.py``, ``replicator.py`` and ``peering.py`` do.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgpack
from libp2p.crypto.ed25519 import create_new_key_pair

from otela.liveness.detector import (
    held_statements,
    live_session,
    stamp,
    suspicion_signer,
    take,
)
from otela.liveness.events import EventLog
from otela.liveness.health import LocalHealth
from otela.liveness.members import MemberList
from otela.liveness.news import News
from otela.liveness.prober import DetectorConfig
from otela.liveness.rounds import ProbeCore, QuietCheck
from otela.liveness.rtt import RoundTrips
from otela.liveness.table import LivenessTable
from otela.liveness.watch import NeighbourWatch
from otela.membership.admission import Admission
from otela.mesh.peering import dialable, plan_step, reconcile_choice
from otela.registry.crdt import Entry
from otela.registry.records import Lifecycle, ModelInfo, NodeRecord
from otela.registry.session import session_id_for
from otela.registry.store import Registry
from otela.registry.wire import encode, sign_record
from otela.replication.local import eviction_envelope
from otela.replication.replicator import Ingest, ReplicaCore, Send
from simulator.mesh.tasks import Connect, Gather, Request, Runner, Sleep, Task

if TYPE_CHECKING:
    from simulator.mesh.world import World

REGISTRY_TOPIC = "otela/registry/1"
LIVENESS_TOPIC = "otela/liveness/1"
WALL_EPOCH = 1_800_000_000.0  # the simulation's wall clock at t = 0
STREAM_OPEN_BYTES = 120  # multistream-select and Yamux for a new stream, both ways
AE_BACKSTOP_S = 30.0
AE_MAX_ROUNDS = 20  # Replicator.sync_with's max_rounds
PEERING_S = 2.0


class SimNode:
    def __init__(self, world: World, index: int, seed: int, ingress: bool = False) -> None:
        self.world = world
        self.index = index
        self.alive = True
        self.rng = random.Random(seed)
        self.key = create_new_key_pair(seed.to_bytes(32, "big"))
        self.peer_id = world.peer_id_of(self.key)
        self.ingress = ingress
        clock = world.wall
        self.registry = Registry()
        self.replica = ReplicaCore(self.peer_id, self.registry, Admission(None, None, clock),
                                   clock, verifier=world.verify)
        config: DetectorConfig = world.detector
        self.config = config
        self.stats: dict[str, int] = {
            "probes": 0, "suspected": 0, "withheld": 0, "evicted": 0, "refuted": 0,
            "brake_engaged": 0, "cut_off_entered": 0, "malformed_news": 0, "unwatched_checks": 0,
            "unwatched_unreachable": 0}
        self.table = LivenessTable(self.peer_id, config.suspicion_timeout,
                                   eviction_stagger=config.probe_interval)
        self.watch = NeighbourWatch(rng=random.Random(seed + 1))
        self.events = EventLog(clock=world.mono)
        self.health = LocalHealth(config.max_local_health, config.stale_window,
                                  config.probe_interval, on_change=self.table.scale_timeouts)
        self.round_trips = RoundTrips(floor=config.probe_timeout, ceiling=config.stale_window)
        sign = self.key.private_key.sign
        registry = self.registry
        self.table.sign_suspicion = suspicion_signer(sign, self.peer_id, registry, clock)
        self.news = News(self.peer_id, self.table, self.watch, self.health, self.events, sign,
                         self.stats, lambda peer_id: live_session(registry, peer_id), clock)
        self.members = MemberList(self.peer_id, self.table, self.round_trips, self.events)
        self.probe = ProbeCore(self.peer_id, config, self.table, self.watch, self.health,
                               self.news, self.events, self.members, self.round_trips,
                               self.stats, rng=random.Random(seed + 2))
        self.replica.on_contact(lambda peer: self.table.heard_from(peer, world.mono()))
        self.replica.on_applied(self._applied)
        self.record: NodeRecord | None = None
        self.epoch = 0
        self._rid = 0
        self._pending: dict[int, Callable[[Any], None]] = {}
        self.tasks: list[Runner] = []
        self._evicted_cache: tuple[int, list[str]] = (-1, [])
        self.rejoins = 0
        self._ae_rounds: dict[int, int] = {}  # exchanges left with a peer we sync with

    # -- identity and our own entry --------------------------------------------------------

    def start(self, models: tuple[str, ...] = ("model-a",), serve: bool = True) -> None:
        """Join: announce JOIN then (``serve``) SERVING; ``serve`` later for a node whose
        engine is still loading (``serve_now``)."""
        self.epoch = max(self.epoch + 1, int(self.world.wall() * 1000))
        session = session_id_for(self.peer_id, f"{self.epoch:011x}{self.index % 2**20:05x}")
        self.record = NodeRecord(
            session_id=session, peer_id=self.peer_id, provider_id="sim", state=Lifecycle.JOIN,
            version=0, http_url=f"http://10.{self.index >> 16 & 255}.{self.index >> 8 & 255}."
            f"{self.index & 255}:8092", addrs=(f"/ip4/10.0.0.1/tcp/{4000 + self.index}",),
            ingress=self.ingress, reachability="public")
        self.announce()
        if serve:
            self.serve_now(models)

    def serve_now(self, models: tuple[str, ...]) -> None:
        """Our engine is ready: announce SERVING with its models."""
        if self.alive:
            self.announce(state=Lifecycle.SERVING, models=tuple(ModelInfo(m) for m in models))

    def announce(self, **changes: Any) -> None:
        assert self.record is not None
        self.record = self.record.evolve(now=self.world.wall(), **changes)
        envelope = sign_record(self.record, self.key.private_key)
        self.replica.ingest([envelope], "local")
        self.world.publish(self.index, REGISTRY_TOPIC,
                           encode({"kind": "delta", "entries": [envelope]}))

    def _applied(self, entry: Entry) -> None:
        self.world.applied(self.index, entry)
        record = self.record
        if (record is not None and entry.key == record.session_id
                and entry.state is Lifecycle.LEFT and entry.evicted_by is not None
                and self.alive):
            # Evicted while alive (a false suspicion, a partition): rejoin under a new
            # session, as LocalReplica does.
            self.rejoins += 1
            self.world.loop.after(0.0, self._rejoin)

    def _rejoin(self) -> None:
        if self.alive and self.record is not None:
            models = tuple(m.id for m in self.record.models)
            self.start(models or ("model-a",))

    # -- tasks -----------------------------------------------------------------------------

    def spawn(self, task: Task) -> Runner:
        runner = Runner(task, self._wait)
        self.tasks.append(runner)
        runner.start()
        return runner

    def _wait(self, op: Any, resume: Callable[[Any], None]) -> None:
        net = self.world.net
        if isinstance(op, Sleep):
            # A timer's wake-up queues for a core like any other work: on a saturated
            # host the task wakes late, as a trio task's sleep does (LocalHealth sees it).
            net.loop.after(op.seconds, net.handle, self.index, net.config.cpu_wake_s,
                           self._resume, (resume, None))
        elif isinstance(op, Request):
            self.request(op.peer, op.message, op.timeout, resume)
        elif isinstance(op, Gather):
            results: list[Any] = [None] * len(op.requests)
            left = [len(op.requests)]

            def one(i: int) -> Callable[[Any], None]:
                def got(value: Any) -> None:
                    results[i] = value
                    left[0] -= 1
                    if left[0] == 0:
                        resume(results)
                return got

            for i, request in enumerate(op.requests):
                if isinstance(request, Connect):
                    self.world.tcp_connect(self.index, request.peer, one(i))
                else:
                    self.request(request.peer, request.message, request.timeout, one(i))
        elif isinstance(op, Connect):
            self.world.tcp_connect(self.index, op.peer, resume)
        else:
            raise TypeError(f"unknown wait {op!r}")

    def _resume(self, resume: Callable[[Any], None], value: Any) -> None:
        if self.alive:
            resume(value)

    # -- SWIM messages (otela/liveness/detector.py) ----------------------------------------

    def request(self, peer: int, message: dict[str, Any], timeout: float,
                reply: Callable[[Any], None]) -> None:
        """Send ``message`` on our probe channel to ``peer`` (dialling it first if we hold
        no connection); ``reply`` gets its answer, or None after ``timeout``."""
        self._rid += 1
        rid = self._rid
        self._pending[rid] = reply
        net = self.world.net
        net.loop.after(timeout, net.handle, self.index, 0.0, self._timed_out, (rid,))
        def connected(ok: bool) -> None:
            if ok:
                self._send_swim(peer, message, rid)

        self.world.ensure_connection(self.index, peer, connected)

    def _send_swim(self, peer: int, message: dict[str, Any], rid: int) -> None:
        if rid not in self._pending or not self.alive:
            return
        body = stamp({**message, "i": rid}, self.news, self.replica,
                     to=self.world.nodes[peer].peer_id)
        data = msgpack.packb(body, use_bin_type=True)
        self.world.net.send(self.index, peer, len(data) + 4, "swim",
                            self.world.nodes[peer].on_swim, self.index, body)

    def _timed_out(self, rid: int) -> None:
        reply = self._pending.pop(rid, None)
        if reply is not None and self.alive:
            reply(None)

    def on_swim(self, sender: int, message: dict[str, Any]) -> None:
        if not self.alive:
            return
        sender_id = self.world.nodes[sender].peer_id
        if take(message, sender_id, self.world.mono(), self.table, self.news, self.replica):
            self.sync_with(sender)
        if self.news.broadcasts or self.table.refute_needed:
            self.publish_news()
        kind = message.get("k")
        if kind in ("ack", "req-ack", "bye-ack"):
            reply = self._pending.pop(message.get("i", -1), None)
            if reply is not None:
                reply(message)
            return
        if kind == "ping":
            self._answer(sender, {"k": "ack"}, message.get("i"))
        elif kind == "req":
            target = self.world.index_of.get(str(message.get("target")))
            if target is None:
                self._answer(sender, {"k": "req-ack", "ok": False}, message.get("i"))
                return
            rid = message.get("i")
            self.spawn(self._ping_for(sender, target, rid))
        elif kind == "bye":
            self.watch.forget(sender_id)
            self._answer(sender, {"k": "bye-ack"}, message.get("i"))

    def _ping_for(self, asker: int, target: int, rid: Any) -> Task:
        ok = yield from self.ping(target)
        self._answer(asker, {"k": "req-ack", "ok": ok}, rid)

    def _answer(self, peer: int, message: dict[str, Any], rid: Any) -> None:
        if not self.world.connected(self.index, peer):
            return
        body = stamp({**message, "i": rid}, self.news, self.replica,
                     to=self.world.nodes[peer].peer_id)
        data = msgpack.packb(body, use_bin_type=True)
        self.world.net.send(self.index, peer, len(data) + 4, "swim",
                            self.world.nodes[peer].on_swim, self.index, body)

    def publish_news(self) -> None:
        """The detector's news task: publish first-hand suspicions and refutations."""
        news = self.news.take_broadcasts()
        if news:
            self.world.publish(self.index, LIVENESS_TOPIC, msgpack.packb({"u": news}))

    def on_news(self, origin: int, data: bytes) -> None:
        items = msgpack.unpackb(data, raw=False).get("u")
        self.news.receive(items, self.world.mono(), self.world.nodes[origin].peer_id,
                          published=True)
        if self.news.broadcasts or self.table.refute_needed:
            self.publish_news()

    # -- the probe loop (otela/liveness/prober.py) -----------------------------------------

    def names(self, indices: set[int]) -> set[str]:
        nodes = self.world.nodes
        return {nodes[i].peer_id for i in indices}

    def probe_loop(self) -> Task:
        world = self.world
        yield Sleep(self.rng.random() * self.config.probe_interval)
        while self.alive:
            self.health.observe_host(None)
            end = world.mono() + self.probe.period_length()
            world.net.charge(self.index, world.net.config.cpu_background_s
                             * self.probe.period_length())
            _, target = self.probe.begin_period(self.registry, self.registry.generation,
                                                set(world.conn_names[self.index]),
                                                world.mono())
            if target is not None:
                verdict = yield from self.round(world.index_of[target])
                if verdict != "silent":
                    self.watch.decided(target)
            unwatched = self.probe.unwatched_target(world.mono())
            if unwatched is not None:
                answer = yield Connect(world.index_of[unwatched])
                self.probe.unwatched_answer(unwatched, answer, world.mono())
            reach = self.probe.reach_targets(world.mono())
            if reach:
                answers = yield Gather([Connect(world.index_of[p]) for p in reach])
                for peer_id, answer in zip(reach, answers, strict=True):
                    self.probe.reach_answer(peer_id, answer, world.mono())
            self.probe.watch_brake()
            self.settle()
            while True:
                now = world.mono()
                deadline = self.table.next_deadline(now)
                wake = deadline if deadline is not None and deadline < end else end
                asked = max(0.0, wake - now)
                yield Sleep(asked)
                self.health.slept(asked, world.mono() - now, world.mono())
                if wake >= end:
                    break
                self.settle()

    def round(self, target: int) -> Task:
        probe = self.probe
        name = self.world.nodes[target].peer_id
        probe.start_round()
        if (yield from self.ping(target)):
            return probe.direct_acked()
        helpers = probe.helpers_for(name)
        results: list[Any] = []
        if helpers:
            index_of = self.world.index_of
            replies = yield Gather([
                Request(index_of[h], {"k": "req", "target": name}, probe.via_timeout(h, name))
                for h in helpers])
            results = [None if r is None else bool(r.get("ok")) for r in replies]
        step = probe.after_helpers(name, helpers, results, self.world.mono())
        if isinstance(step, QuietCheck):
            yield Sleep(max(0.0, step.at - self.world.mono()))
            if not probe.still_quiet(name, step, self.world.mono()):
                return "silent"
        elif step != "undecided":
            return step
        verdict, published = probe.conclude(name, len(helpers), self.world.mono(), None)
        if verdict == "suspected":
            self.world.suspected(target)
        if published:
            self.publish_news()
        return verdict

    def ping(self, target: int) -> Task:
        probe = self.probe
        name = self.world.nodes[target].peer_id
        if not self.world.connected(self.index, target):
            answer = yield Connect(target)
            if answer == "refused":
                return probe.ping_result(name, True, None)
        probe.refusing.discard(name)
        started = self.world.mono()
        reply = yield Request(target, {"k": "ping"}, probe.ping_timeout(name))
        acked = reply is not None and reply.get("k") == "ack"
        return probe.ping_result(name, False, self.world.mono() - started if acked else None)

    def settle(self) -> None:
        for peer_id in self.probe.due_evictions(self.world.mono(),
                                                self.replica.current_gossip_lag()):
            self.evict(peer_id)

    def evict(self, peer_id: str) -> None:
        world = self.world
        peer = world.index_of.get(peer_id)
        if peer is not None:
            world.disconnect(self.index, peer)
        session = live_session(self.registry, peer_id)
        sessions: list[str] = []
        if session is not None:
            statements = held_statements(self.table.evidence_of(peer_id), peer_id)
            envelope = eviction_envelope(
                self.registry, session, self.probe.eviction_reason(), statements,
                self.replica.admission.trust(self.registry), self.key.private_key,
                self.peer_id, world.wall())
            if envelope is not None:
                if self.replica.ingest([envelope], "local") > 0:
                    sessions = [session]
                world.publish(self.index, REGISTRY_TOPIC,
                              encode({"kind": "delta", "entries": [envelope]}))
                world.evictions_signed(self.index, peer_id)
        self.probe.evicted(peer_id, sessions, world.mono())
        if self.news.broadcasts:  # a refused eviction's corroboration (the news task's job)
            self.publish_news()

    # -- anti-entropy (otela/replication/replicator.py) ------------------------------------

    def sync_with(self, peer: int, rounds: int = AE_MAX_ROUNDS) -> None:
        """Anti-entropy with ``peer``: our ``initiate`` steps against its ``respond``
        steps, each message sized by its encoding, repeated while an exchange comes back
        full (``ReplicaCore.exchange_again``; ``Replicator.sync_with``), up to ``rounds``."""
        self._ae_rounds[peer] = rounds
        world = self.world
        if not world.connected(self.index, peer) or not world.nodes[peer].alive:
            return
        other = world.nodes[peer]
        world.net.stats.sent[self.index] += STREAM_OPEN_BYTES
        world.net.stats.received[peer] += STREAM_OPEN_BYTES
        world.net.stats.by_kind["stream"] += STREAM_OPEN_BYTES
        mine = self.replica.initiate()
        theirs = other.replica.respond(self.peer_id)
        next(theirs)  # primed: it waits for our opening
        self._ae_step(mine, next(mine), other, theirs)

    def _ae_step(self, mine: Any, step: Any, other: SimNode, theirs: Any) -> None:
        """Carry out ``step`` of the side ``mine`` (the other side is ``theirs``)."""
        world = self.world
        while True:
            if isinstance(step, Ingest):
                # Verifying and merging a batch takes its CPU before the exchange goes on
                # (a joiner's 10,000 records: seconds).
                ready = world.net.charge(self.index,
                                         world.net.config.cpu_verify_s * len(step.envelopes))
                if ready > world.loop.now:
                    world.loop.at(ready, self._ae_ingest, mine, step, other, theirs)
                    return
                self.replica.ingest(step.envelopes, "ae")
                try:
                    step = mine.send(None)
                except StopIteration as done:
                    self._ae_done(other.index, done.value)
                    return
                continue
            assert isinstance(step, Send)
            if step.message is not None:
                data = encode(step.message)
                world.net.send(self.index, other.index, len(data) + 4, "ae",
                               other._ae_receive, theirs, step.message, self, mine, step.reply)
                if step.reply:
                    return  # the other side's answer resumes us
                try:  # our last message: the exchange ends here on our side
                    step = mine.send(None)
                except StopIteration as done:
                    self._ae_done(other.index, done.value)
                    return
                continue
            return  # waiting for the other side's message

    def _ae_ingest(self, mine: Any, step: Ingest, other: SimNode, theirs: Any) -> None:
        """An anti-entropy batch whose CPU is spent: apply it and go on."""
        if not self.alive:
            return
        self.replica.ingest(step.envelopes, "ae")
        try:
            following = mine.send(None)
        except StopIteration as done:
            self._ae_done(other.index, done.value)
            return
        self._ae_step(mine, following, other, theirs)

    def _ae_receive(self, mine: Any, message: dict[str, Any], other: SimNode, theirs: Any,
                    they_wait: bool) -> None:
        if not self.alive:
            return
        try:
            step = mine.send(message)
        except StopIteration as done:
            self._ae_done(other.index, done.value)
            return
        self._ae_step(mine, step, other, theirs)

    def _ae_done(self, peer: int, received: Any) -> None:
        """Our side of an exchange with ``peer`` ended having received ``received``
        entries (None on the responder's side): another round if it came back full."""
        if not isinstance(received, int):
            return
        left = self._ae_rounds.pop(peer, 0) - 1
        if left > 0 and self.replica.exchange_again(received):
            self.sync_with(peer, left)

    def ae_backstop(self) -> Task:
        while self.alive:
            yield Sleep(AE_BACKSTOP_S * self.rng.uniform(0.7, 1.3))
            peers = sorted(self.world.conns[self.index])
            if peers:
                self.sync_with(self.rng.choice(peers))

    # -- peering (otela/mesh/peering.py) ---------------------------------------------------

    def peering_loop(self) -> Task:
        world = self.world
        while self.alive:
            connected = world.conns[self.index]
            candidates: list[str] = []
            if len(connected) < 4:
                suspected = self.table.suspected()
                candidates = [r.peer_id for r in self.registry
                              if dialable(r, self.peer_id) and r.peer_id not in suspected]
            dials, trims = plan_step(self.names(connected), candidates, set(), 4, 6, 16,
                                     self.rng)
            for name in dials:
                world.ensure_connection(self.index, world.index_of[name], lambda ok: None)
            for name in trims:
                peer = world.index_of[name]
                self.watch.forget(name)
                self.request(peer, {"k": "bye"}, self.config.probe_timeout, lambda r: None)
                world.loop.after(0.01, world.disconnect, self.index, peer)
            yield Sleep(PEERING_S * self.rng.uniform(0.8, 1.2))

    def reconcile_loop(self) -> Task:
        """Healing partitions: dial one peer whose sessions were all evicted, every 2 s."""
        world = self.world
        while self.alive:
            yield Sleep(PEERING_S * self.rng.uniform(0.8, 1.2))
            generation, evicted = self._evicted_cache
            if generation != self.registry.generation:
                live = {r.peer_id for r in self.registry if r.state is not Lifecycle.LEFT}
                evicted = sorted(
                    r.peer_id for r in self.registry
                    if r.peer_id not in live and (e := self.registry.entry(r.session_id))
                    is not None and e.evicted_by is not None)
                self._evicted_cache = (self.registry.generation, evicted)
            chosen = reconcile_choice(evicted, self.rng)
            if chosen is None:
                continue
            peer = world.index_of[chosen]
            answer = yield Connect(peer)
            if answer == "refused":
                continue
            world.ensure_connection(self.index, peer, self._sync_if(peer))

    def _sync_if(self, peer: int) -> Callable[[bool], None]:
        def connected(ok: bool) -> None:
            if ok:
                self.sync_with(peer)
        return connected

    def on_connected(self, peer: int) -> None:
        name = self.world.nodes[peer].peer_id
        self.probe.appeared.add(name)
        if self.replica.returning(name):
            self.sync_with(peer)

    def stop(self) -> None:
        self.alive = False
        for runner in self.tasks:
            runner.stop()
        self.tasks = []
        self._pending.clear()

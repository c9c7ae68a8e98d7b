"""Registry replication: delta gossip for changes, anti-entropy for joins and repair.

- Gossip: a node publishes each of its own changes as a small delta (one signed
  envelope); the topic validator accepts an envelope only from its signer (the owner
  for a record, the evictor for an eviction; revocations are authority-signed and may
  come from anyone) and only when forwarded by an admitted peer.
- Anti-entropy (``/otela/registry/ae/1.0.0``): the digest exchange of
  ``otela.registry.antientropy``, run when we connect to a bootstrap peer (so a joiner
  gets the whole state in one exchange), with a peer whose replica has drifted from ours
  (``drift.py``: both replicas unchanged for a few seconds and still different, as the
  summaries riding on liveness messages show), periodically with a random peer as a
  backstop (every 30 s by default), with every peer when we announce DOWN or LEFT before
  exiting, and at
  once with a peer that connects while its only sessions here are LEFT (one we evicted,
  coming back after a partition healed: each side holds news the other missed, such as
  its own eviction, which gossip sent while they were cut off and will not send again;
  waiting for the periodic exchange to pick that peer took 5 s and more).
Every envelope is verified (signature, certificate, revocation, GC horizon) before it
touches the registry; bad input is dropped and counted in ``stats``, never raised.

What one member may write about itself and others is metered too (docs/security.md#a-
member-that-lies-about-itself): a record for an older session of a peer than the one held
is refused (one session per peer, ``otela.registry.crdt``) and not forwarded; a signer's
records beyond ``GOSSIP_BURST`` at once and ``GOSSIP_PER_S`` after are not forwarded (the
latest still arrives by anti-entropy); a fresh eviction needs its evidence
(``otela.registry.evidence``) and is refused beyond ``EVICTION_BURST`` at once and one per
``1 / EVICTION_PER_S`` seconds per evictor. Members that break these rules are reported
(``misconduct.py``: ``/v1/health``, a warning, out of routing for a while).
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from otela.logbudget import LogBudget
from otela.membership.admission import Admission
from otela.mesh.connections import OnConnected
from otela.mesh.framing import read_frame, write_frame
from otela.mesh.host import MeshHost
from otela.mesh.quota import AE_STREAMS, set_capped_handler
from otela.registry import antientropy
from otela.registry.crdt import Entry, NotOwner, Rejected, Superseded
from otela.registry.store import Registry
from otela.registry.wire import (
    FORGED,
    ForgedRecord,
    Trust,
    UnjustifiedEviction,
    WireError,
    decode,
    encode,
    eviction_time,
    gossip_facts,
    gossip_refusal,
    verify,
)
from otela.replication.drift import SUMMARY_BYTES, DriftWatch, summary
from otela.replication.misconduct import (
    EVICTION_RATE,
    GOSSIP_RATE,
    UNJUSTIFIED_EVICTION,
    Misconduct,
    PeerRates,
)

log = logging.getLogger("otela.mesh")

REGISTRY_TOPIC = "otela/registry/1"
AE_PROTOCOL = TProtocol("/otela/registry/ae/1.0.0")
AE_TIMEOUT_S = 10.0
FORGERY_LOG_INTERVAL_S = 60.0  # one warning per forging peer per minute; every one counted
# Records one signer may have forwarded by gossip: honest nodes announce a few changes a
# minute (state, reachability, relays), a restarting or rejoining one a few in a second.
GOSSIP_BURST, GOSSIP_PER_S = 30.0, 2.0
FLOOD_REPORTED_AFTER = 10  # refusals of a signer's gossip before it is reported
# Evictions one member may sign: after a mass failure the rank order spreads them over the
# survivors (a handful each); a member evicting faster than any failure explains is not
# detecting failures.
EVICTION_BURST, EVICTION_PER_S = 10.0, 1 / 6
INGEST_BATCH = 32  # envelopes verified between checkpoints (~3 ms)
# An eviction signed this recently is news (it arrived by gossip, or history is being
# made): it is metered, and one without evidence is reported. Older ones are history an
# anti-entropy exchange carries, refused without blame when a replica's view differs.
FRESH_EVICTION_S = 120.0


def _fresh(envelope: Any, now: float) -> bool:
    """Whether an eviction envelope was signed within ``FRESH_EVICTION_S`` of ``now``."""
    facts = eviction_time(envelope)
    return facts is not None and abs(now - facts) <= FRESH_EVICTION_S


@dataclass(frozen=True)
class Send:
    """An anti-entropy step: send ``message`` (None: nothing), then, if ``reply``, hand
    the peer's next message back to the exchange."""

    message: dict[str, Any] | None
    reply: bool = True


@dataclass(frozen=True)
class Ingest:
    """An anti-entropy step: verify and apply ``envelopes`` (in batches, between event-loop
    checkpoints where there is an event loop)."""

    envelopes: list[Any]


class GossipLag:
    """How late gossip arrives here: a moving average of (applied - signed) over the deltas
    that changed the registry, fading by half every ``HALF_LIFE_S`` without news. Near
    zero in a healthy federation (tens of ms); seconds to minutes when gossip queues back
    up on an overloaded one, which the failure detector must allow for (``table.py``)."""

    WEIGHT = 0.25
    CAP_S = 120.0  # a wildly skewed clock must not stall evictions for longer
    HALF_LIFE_S = 30.0

    def __init__(self) -> None:
        self._value = 0.0
        self._at: float | None = None

    def observe(self, lag: float, now: float) -> None:
        sample = min(self.CAP_S, max(0.0, lag))
        current = self.value(now)
        self._value = current + self.WEIGHT * (sample - current)
        self._at = now

    def value(self, now: float) -> float:
        if self._at is None:
            return 0.0
        return self._value * 0.5 ** (max(0.0, now - self._at) / self.HALF_LIFE_S)


class ReplicaCore:
    """Replication's decisions, sans I/O: verifying and applying envelopes, metering what
    each member may write, judging gossip before it is forwarded, and telling from the
    summaries on liveness messages when a peer's replica has drifted. ``Replicator`` runs
    it over libp2p; the mesh simulator (``simulator/mesh``) runs the same object under its
    own clock. ``verifier`` is ``wire.verify``; the simulator may wrap it with a cache
    (one envelope checked once for all the replicas it simulates)."""
    def __init__(
        self,
        self_id: str,
        registry: Registry,
        admission: Admission,
        clock: Callable[[], float] = time.time,
        verifier: Callable[[Any, Trust, float], Any] = verify,
    ) -> None:
        self.self_id = self_id
        self.registry = registry
        self.admission = admission
        self.clock = clock
        self.verifier = verifier
        self.stats: Counter[str] = Counter()
        self._contact_listeners: list[Callable[[str], None]] = []
        self._applied_listeners: list[Callable[[Entry], None]] = []
        self.gossip_lag = GossipLag()
        self._forgery_logged: dict[str, float] = {}
        self.misconduct = Misconduct()
        self._misconduct_log = LogBudget(burst=10, window=60.0)
        self._gossip_rates = PeerRates(GOSSIP_BURST, GOSSIP_PER_S)
        self._over_rate: Counter[str] = Counter()  # gossip refused per signer, for reports
        self._eviction_rates = PeerRates(EVICTION_BURST, EVICTION_PER_S)
        self.drift = DriftWatch()
        self._summary = b""
        self._summary_since = 0.0
        self._summary_of: tuple[bytes | None, int] = (None, 0)  # (root, revocations) hashed

    def on_contact(self, listener: Callable[[str], None]) -> None:
        """Call ``listener`` with a peer id whenever that peer itself sent us something,
        gossip it only forwarded included (the failure detector counts it as recent
        contact: a peer forwarding gossip is running, however slowly it answers probes)."""
        self._contact_listeners.append(listener)

    def on_applied(self, listener: Callable[[Entry], None]) -> None:
        """Call ``listener`` with every entry that changed the registry (it must be quick:
        it runs on the ingest path)."""
        self._applied_listeners.append(listener)

    def _heard(self, peer_id: str) -> None:
        for listener in self._contact_listeners:
            listener(peer_id)

    def current_gossip_lag(self) -> float:
        """How late gossip arrives here now, in seconds (``GossipLag``)."""
        return self.gossip_lag.value(self.clock())

    @property
    def trust(self) -> Trust:
        return self.admission.trust(self.registry)

    def ingest(self, envelopes: list[Any], source: str) -> int:
        """Verify and apply envelopes; return how many changed the registry."""
        now = self.clock()
        trust = self.trust
        changed = 0
        for envelope in envelopes:
            try:
                item = self.verifier(envelope, trust, now)
                if isinstance(item, Entry):
                    if item.evicted_by is not None and source != "local" and \
                            not self._eviction_allowed(item, now):
                        continue
                    applied = self.registry.apply(item, now)
                    if applied:
                        if source == "gossip":
                            self.gossip_lag.observe(now - item.updated_at, now)
                        for listener in self._applied_listeners:
                            listener(item)
                    changed += applied
                elif self.registry.add_revocation(item[0], item[1], now):
                    changed += 1
                    self.admission.on_revocation(item[0])
            except (ForgedRecord, NotOwner) as exc:
                self.stats[f"{source}_rejected"] += 1
                self._forgery(exc.signer, str(exc), source)
            except Superseded as exc:  # an older session of a peer: one session per peer
                self.stats[f"{source}_superseded"] += 1
                log.debug("refused %s envelope: %s", source, exc)
            except UnjustifiedEviction as exc:
                self.stats["evictions_unjustified"] += 1
                self.stats[f"{source}_rejected"] += 1
                if _fresh(envelope, now):
                    self.report(exc.evictor, UNJUSTIFIED_EVICTION, str(exc))
            except (WireError, Rejected) as exc:
                self.stats[f"{source}_rejected"] += 1
                log.debug("rejected %s envelope: %s", source, exc)
            except Exception as exc:  # a parsing case verify missed: drop it, never crash
                self.stats[f"{source}_rejected"] += 1
                self.stats["unexpected_rejections"] += 1
                log.debug("rejected %s envelope (unexpected %s): %s", source,
                          type(exc).__name__, exc)
        self.stats[f"{source}_applied"] += changed
        return changed

    def _eviction_allowed(self, entry: Entry, now: float) -> bool:
        """A fresh eviction that would change the registry takes one of its evictor's
        tokens; none left: refused, counted, and the evictor reported."""
        current = self.registry.entry(entry.key)
        if now - entry.updated_at > FRESH_EVICTION_S or (
                current is not None and current.state is entry.state):
            return True  # history, or a duplicate of what we hold: nothing happens
        evictor = entry.evicted_by
        assert evictor is not None
        if self._eviction_rates.take(evictor, now):
            return True
        self.stats["evictions_rate_limited"] += 1
        self.report(evictor, EVICTION_RATE, f"eviction of {entry.key}")
        return False

    def report(self, peer_id: str, kind: str, detail: str) -> None:
        """``peer_id`` misbehaved (``misconduct.py``); a warning within a budget."""
        if peer_id == self.self_id:
            return
        if self.misconduct.report(peer_id, kind, self.clock()):
            skipped = self._misconduct_log.take()
            if skipped is not None:
                log.warning("member %s misbehaves (%s): %s; keeping it out of routing%s",
                            peer_id, kind, detail[:300],
                            f" ({skipped} reports not logged)" if skipped else "")

    def excluded(self) -> frozenset[str]:
        """Members this node's routing avoids for misconduct (``misconduct.py``)."""
        return self.misconduct.excluded(self.clock())

    def _forgery(self, signer: str, what: str, via: str) -> None:
        """Count an attempt to write another node's entry; warn at most once a minute per
        signer (a forger repeating itself must not flood the log)."""
        self.stats["forged_rejected"] += 1
        now = self.clock()
        last = self._forgery_logged.get(signer)
        if last is None or now - last >= FORGERY_LOG_INTERVAL_S:
            if len(self._forgery_logged) > 1024:  # a forger minting keys cannot grow it
                self._forgery_logged.clear()
            self._forgery_logged[signer] = now
            log.warning("rejected a forged registry record (%s): %s", via, what)

    # -- gossip ------------------------------------------------------------------------

    def accept_gossip(self, forwarder: str, admitted: bool, data: bytes | None,
                      source: str) -> bool:
        """Whether gossip ``data`` published by ``source`` and forwarded by ``forwarder``
        (``admitted``: a member here) may be taken and forwarded on."""
        self.stats["gossip_bytes_received"] += len(data or b"")
        if not admitted:
            self.stats["gossip_unadmitted"] += 1
            return False
        # A peer that forwards us gossip is running, however slowly it answers probes: on
        # an overloaded machine this is what keeps busy peers from being suspected.
        self._heard(forwarder)
        try:
            delta = decode(data or b"")
            envelopes = delta["entries"]
            refusals = [gossip_refusal(e, source) for e in envelopes]
        except Exception:
            refusals = ["malformed"]
        if not any(refusals):
            return self._within_bounds(envelopes, source)
        if FORGED in refusals:
            self._forgery(source, f"{source} published a {FORGED}", "gossip")
        else:
            self.stats["gossip_invalid"] += 1
        return False

    def take_gossip(self, data: bytes, origin: str) -> int:
        """A gossip message ``origin`` published reached us: apply its envelopes."""
        self._heard(origin)
        try:
            return self.ingest(decode(data)["entries"], "gossip")
        except (WireError, KeyError, TypeError):
            self.stats["gossip_invalid"] += 1
            return 0

    def _within_bounds(self, envelopes: list[Any], source: str) -> bool:
        """Whether well-formed gossip from ``source`` may be taken and forwarded: not a
        record of an older session than its peer's (refused everywhere anyway), not beyond
        its signer's rate. Our own publishes pass (pubsub validates them too)."""
        if source == self.self_id:
            return True
        now = self.clock()
        for envelope in envelopes:
            facts = gossip_facts(envelope)
            if facts is None:
                continue
            kind, session_id = facts
            if kind == "rec" and self.registry.map.outranked(source, session_id):
                self.stats["gossip_superseded"] += 1
                return False
            if kind == "evict" and not self._eviction_rates.allows(source, now):
                self.stats["evictions_rate_limited"] += 1
                self.report(source, EVICTION_RATE, "evictions by gossip")
                return False
        if not self._gossip_rates.take(source, now):
            self.stats["gossip_rate_limited"] += 1
            # Reported once it is plainly a flood, not an honest node's busy moment.
            self._over_rate[source] += 1
            if self._over_rate[source] >= FLOOD_REPORTED_AFTER:
                self.report(source, GOSSIP_RATE, f"more than {GOSSIP_BURST:.0f} registry "
                            f"updates at once, then {GOSSIP_PER_S:g} a second")
            if len(self._over_rate) > 4096:
                self._over_rate.clear()
            return False
        return True

    def summary(self) -> tuple[bytes, float]:
        """Our replica's summary and for how many seconds it has not changed (counted from
        the first time it was asked after a change: an underestimate, which only delays)."""
        now = self.clock()
        # Every probe and ack carries it: hashed again only when the root (a new object
        # per change) or the grow-only revocations changed.
        root, revoked = self.registry.map.digest_root(), len(self.registry.revocations)
        if root is not self._summary_of[0] or revoked != self._summary_of[1]:
            self._summary_of = (root, revoked)
            current = summary(root, sorted(self.registry.revocations))
            if current != self._summary:
                self._summary, self._summary_since = current, now
        return self._summary, now - self._summary_since

    def drifted(self, peer_id: str, theirs: Any, their_age: Any) -> bool:
        """A peer's summary arrived (on a probe or an ack): whether to start anti-entropy
        with it now (``DriftWatch``: its replica has drifted from ours). Malformed values,
        or none (an older peer), are ignored."""
        if (not isinstance(theirs, bytes) or len(theirs) != SUMMARY_BYTES
                or not isinstance(their_age, int | float) or not 0 <= their_age < 1e9):
            return False
        ours, our_age = self.summary()
        return self.drift.compare(peer_id, theirs, float(their_age), ours, our_age,
                                  self.clock(), leader=self.self_id < peer_id)

    @staticmethod
    def exchange_again(received: int) -> bool:
        """Whether an exchange that brought ``received`` entries came back full, so more
        may be waiting (a joiner to a federation larger than one batch): run another."""
        return received >= antientropy.MAX_ENTRIES_PER_MESSAGE

    def returning(self, peer_id: str) -> bool:
        """Whether a peer that just connected is one whose sessions here are all LEFT (an
        evictee back after a partition healed): sync with it at once."""
        return not self.registry.is_member(peer_id) and self.registry.has_left(peer_id)

    # -- anti-entropy, as steps a driver carries out -------------------------------------

    def initiate(self) -> Generator[Send | Ingest, Any, int]:
        """The initiator's side of one exchange (``otela.registry.antientropy``): yields
        what to send (and whether a reply is awaited, which the driver sends back in) and
        what to ingest; returns how many entries it received."""
        registry = self.registry
        answer = yield Send(antientropy.opening(registry))
        self.ingest(list(answer.get("revocations") or []), "ae")
        request = antientropy.digests(registry, answer)
        if request is None:
            yield Send({"kind": "ae-done"}, reply=False)
            return 0
        reply = yield Send(request)
        received = list(reply.get("entries") or [])
        yield Ingest(received)
        yield Send(antientropy.entries(registry, list(reply.get("want") or [])), reply=False)
        return len(received)

    def respond(self, peer_id: str) -> Generator[Send | Ingest, Any, None]:
        """The responder's side of one exchange with ``peer_id``: first yields a receive
        (``Send(None)``), then like ``initiate``."""
        self._heard(peer_id)
        registry = self.registry
        opening = yield Send(None)
        request = yield Send(antientropy.answer_opening(registry, opening))
        if request.get("kind") == "ae-done":
            return
        self.ingest(list(request.get("revocations") or []), "ae")
        final = yield Send(antientropy.answer_digests(registry, request))
        yield Ingest(list(final.get("entries") or []))


class Replicator(ReplicaCore):
    """``ReplicaCore`` over libp2p: the gossip topic, the anti-entropy protocol, and the
    tasks that decide when to run it."""

    def __init__(
        self,
        mesh: MeshHost,
        registry: Registry,
        admission: Admission,
        anti_entropy_interval: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._self_id: ID = mesh.host.get_id()
        super().__init__(self._self_id.to_base58(), registry, admission, clock)
        self.mesh = mesh
        self.anti_entropy_interval = anti_entropy_interval
        # Peers to sync with at once, and why: "returning" (connected while their sessions
        # here were all LEFT) or "drift" (their replica stays different from ours).
        self._due_send, self._due = trio.open_memory_channel[tuple[str, str]](64)
    def install(self) -> None:
        """Register the stream handler and the gossip validator (before the host runs)."""
        set_capped_handler(self.mesh.host, AE_PROTOCOL, self._handle_anti_entropy,
                           AE_STREAMS)
        self.mesh.pubsub.set_topic_validator(REGISTRY_TOPIC, self.validate_gossip, False)
        self.mesh.host.get_network().register_notifee(OnConnected(self._connected))
    async def run(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        subscription = await self.mesh.pubsub.subscribe(REGISTRY_TOPIC)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._receive_gossip, subscription)
            nursery.start_soon(self._anti_entropy_loop)
            nursery.start_soon(self._sync_due)
            task_status.started()

    # -- ingest ------------------------------------------------------------------------
    async def ingest_batched(self, envelopes: list[Any], source: str) -> int:
        """``ingest``, ``INGEST_BATCH`` envelopes at a time with a checkpoint between: an
        anti-entropy batch of thousands (a joiner's whole state, or a member's flood) is
        ~84 us of signature checks each, and must not hold the event loop for a second."""
        changed = 0
        for start in range(0, len(envelopes), INGEST_BATCH):
            if start:
                await trio.lowlevel.checkpoint()
            changed += self.ingest(envelopes[start:start + INGEST_BATCH], source)
        return changed
    async def publish(self, envelope: dict[str, Any]) -> None:
        """Gossip one delta: an envelope we signed (our record, or our eviction verdict)."""
        data = encode({"kind": "delta", "entries": [envelope]})
        try:
            await self.mesh.pubsub.publish(REGISTRY_TOPIC, data)
            self.stats["gossip_published"] += 1
            self.stats["gossip_bytes_sent"] += len(data)
        except Exception as exc:  # publishing with no peers yet is not an error
            log.debug("gossip publish failed: %s", exc)
    async def _receive_gossip(self, subscription: Any) -> None:
        while True:
            message = await subscription.get()
            origin = ID(message.from_id)
            if origin == self._self_id:
                continue  # pubsub delivers our own publishes back to us
            self.take_gossip(message.data, origin.to_base58())

    # -- anti-entropy ------------------------------------------------------------------
    async def sync_with(self, peer_id: ID, max_rounds: int = 20) -> bool:
        """Anti-entropy with ``peer_id`` as initiator, repeated while batches come back full
        (a joiner to a federation larger than one batch); return whether it succeeded."""
        for _ in range(max_rounds):
            received = await self._sync_once(peer_id)
            if received is None:
                return False
            if not self.exchange_again(received):
                return True
        return True
    async def _sync_once(self, peer_id: ID) -> int | None:
        """One exchange; the number of entries received, or ``None`` if it failed."""
        if not self.admission.is_admitted(peer_id) and not await self.admission.handshake(
            self.mesh.host, peer_id
        ):
            self.stats["ae_unadmitted"] += 1
            return None
        with trio.move_on_after(AE_TIMEOUT_S):
            try:
                stream = await self.mesh.host.new_stream(peer_id, [AE_PROTOCOL])
                try:
                    received = await self._initiate(stream)
                finally:
                    await stream.close()
                self.stats["ae_completed"] += 1
                return received
            except Exception as exc:  # wire errors and every transport's network errors
                self.stats["ae_failed"] += 1
                log.debug("anti-entropy with %s failed: %s", peer_id, exc)
                return None
        self.stats["ae_failed"] += 1
        return None
    async def push_to_all(self, timeout: float) -> None:
        """Anti-entropy with every connected peer at once, for at most ``timeout`` seconds."""
        with trio.move_on_after(timeout):
            async with trio.open_nursery() as nursery:
                for peer_id in self.connected_peers():
                    nursery.start_soon(self.sync_with, peer_id)
    def connected_peers(self) -> list[ID]:
        return [p for p in self.mesh.host.get_connected_peers() if p != self._self_id]
    async def _send(self, stream: Any, message: dict[str, Any]) -> None:
        data = encode(message)
        self.stats["ae_bytes_sent"] += len(data)
        await write_frame(stream, data)
    async def _receive(self, stream: Any) -> dict[str, Any]:
        data = await read_frame(stream)
        self.stats["ae_bytes_received"] += len(data)
        return decode(data)
    async def _initiate(self, stream: Any) -> int:
        received: int = await self._drive(stream, self.initiate())
        return received

    async def _handle_anti_entropy(self, stream: Any) -> None:
        peer = stream.muxed_conn.peer_id
        with trio.move_on_after(AE_TIMEOUT_S):
            try:
                if not self.admission.is_admitted(peer):
                    self.stats["ae_unadmitted"] += 1
                    return
                await self._drive(stream, self.respond(peer.to_base58()))
                self.stats["ae_answered"] += 1
            except Exception as exc:  # a misbehaving peer must never take the handler down
                self.stats["ae_failed"] += 1
                log.debug("inbound anti-entropy from %s failed: %s", peer, exc)
            finally:
                try:
                    await stream.close()
                except Exception:
                    log.debug("closing anti-entropy stream failed", exc_info=True)

    def _connected(self, peer_id: str) -> None:
        if self.returning(peer_id):
            self.sync_soon(peer_id, "returning")

    def sync_soon(self, peer_id: str, reason: str) -> None:
        try:
            self._due_send.send_nowait((peer_id, reason))
        except trio.WouldBlock:  # a burst: the periodic exchange remains
            self.stats[f"ae_{reason}_dropped"] += 1
    async def _sync_due(self) -> None:
        async for peer_id, reason in self._due:
            self.stats[f"ae_{reason}"] += 1
            await self.sync_with(ID.from_base58(peer_id))

    # -- drift: summaries riding on liveness messages --------------------------------------
    def compare(self, peer_id: str, theirs: Any, their_age: Any) -> None:
        """A peer's summary arrived: anti-entropy with it if it drifted (``drifted``)."""
        if self.drifted(peer_id, theirs, their_age):
            self.sync_soon(peer_id, "drift")

    async def _anti_entropy_loop(self) -> None:
        while True:
            # A backstop (``drift.py`` starts the exchanges that repair something): a
            # replica nobody we talk to compares with, a summary collision.
            await trio.sleep(self.anti_entropy_interval * random.uniform(0.7, 1.3))
            peers = [p for p in self.connected_peers() if self.admission.is_admitted(p)]
            if peers:
                await self.sync_with(random.choice(peers))

    def validate_gossip(self, forwarder: ID, message: Any) -> bool:
        return self.accept_gossip(forwarder.to_base58(), self.admission.is_admitted(forwarder),
                                  message.data, ID(message.from_id).to_base58())

    async def _drive(self, stream: Any, steps: Generator[Send | Ingest, Any, Any]) -> Any:
        """Carry out an exchange's steps (``initiate``/``respond``) on ``stream``."""
        step = next(steps)
        while True:
            value = None
            if isinstance(step, Ingest):
                await self.ingest_batched(step.envelopes, "ae")
            else:
                if step.message is not None:
                    await self._send(stream, step.message)
                if step.reply:
                    value = await self._receive(stream)
            try:
                step = steps.send(value)
            except StopIteration as done:
                return done.value

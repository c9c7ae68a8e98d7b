"""The failure detector's protocol: probe one member per period over libp2p streams.

Per period a node probes one member, round robin over a shuffled list (every member is
probed within one list pass). The member is suspected only if all three paths fail:
1. a direct ping (``/otela/swim/1.0.0``) gets no ack within ``probe_timeout``;
2. none of ``indirect_probes`` other members gets an ack when asked to ping it;
3. nothing was heard from it (probe, gossip, anti-entropy) within ``stale_window``.
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
before accusing anyone, instead of setting off a cascade of false evictions.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import multiaddr
import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from otela.identity import Identity
from otela.liveness.table import LivenessTable, Status, Update
from otela.mesh.framing import read_frame, write_frame
from otela.registry.records import Lifecycle
from otela.replica import LocalReplica

log = logging.getLogger("otela.liveness")

SWIM_PROTOCOL = TProtocol("/otela/swim/1.0.0")
ALIVE_DOMAIN = b"otela/liveness/alive/v1\0"
MAX_MESSAGE_BYTES = 64 * 1024


@dataclass(frozen=True)
class DetectorConfig:
    """Timings; defaults and their reasons are in docs/failure-detection.md."""

    probe_interval: float = 1.0
    probe_timeout: float = 1.0
    indirect_probes: int = 3
    stale_window: float = 3.0
    suspicion_timeout: float = 6.0
    max_local_health: int = 8


def _alive_payload(peer_id: str, incarnation: int) -> bytes:
    return ALIVE_DOMAIN + f"{peer_id}|{incarnation}".encode()


def _encode_updates(updates: list[Update]) -> list[list[Any]]:
    return [[u.peer_id, u.status.value, u.incarnation, u.proof] for u in updates]


class FailureDetector:
    def __init__(
        self,
        identity: Identity,
        host: Any,
        replica: LocalReplica,
        config: DetectorConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.identity = identity
        self.host = host
        self.replica = replica
        self.config = config
        self.clock = clock
        self.self_id = identity.peer_id.to_base58()
        self.table = LivenessTable(self.self_id, config.suspicion_timeout)
        self._order: list[str] = []
        self._synced_generation = -1
        self.stats: dict[str, int] = {"probes": 0, "suspected": 0, "evicted": 0, "refuted": 0}
        self.local_health = 0  # 0 = healthy; see the module docstring

    @property
    def multiplier(self) -> int:
        return 1 + self.local_health

    def _health(self, delta: int) -> None:
        self.local_health = max(0, min(self.config.max_local_health, self.local_health + delta))
        self.table.suspicion_timeout = self.config.suspicion_timeout * self.multiplier

    def install(self) -> None:
        self.host.set_stream_handler(SWIM_PROTOCOL, self._handle)
        self.replica.replicator.on_heard = lambda peer: self.table.heard_from(peer, self.clock())

    def suspected(self) -> frozenset[str]:
        return self.table.suspected()

    async def run(self) -> None:
        while True:
            started = self.clock()
            interval = self.config.probe_interval * self.multiplier
            self._sync_members()
            target = self._next_target()
            if target is not None:
                await self._probe_round(target)
            now = self.clock()
            for peer_id in self.table.expired_suspicions(now) + self.table.overdue_confirmations(
                now
            ):
                await self._evict(peer_id)
            asked = max(0.0, interval - (self.clock() - started))
            before = self.clock()
            await trio.sleep(asked)
            if self.clock() - before > asked + self.config.probe_interval:
                self._health(+1)  # our own event loop is late: we are the slow one

    # -- one probe round ---------------------------------------------------------------

    async def _probe_round(self, target: str) -> None:
        self.stats["probes"] += 1
        if await self._ping(target):
            self._health(-1)
            return
        helpers = [p for p in self.table.members if p != target
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
        if acked or self.table.heard_recently(target, self.clock(), window):
            return
        if self.table.probe_failed(target, self.clock()):
            self.stats["suspected"] += 1
            log.warning("suspecting %s: direct, %d indirect and recent-contact checks failed",
                        target, len(helpers))

    async def _ping(self, target: str) -> bool:
        timeout = self.config.probe_timeout * self.multiplier
        reply = await self._exchange(target, {"k": "ping"}, timeout)
        return reply is not None and reply.get("k") == "ack"

    async def _ping_req(self, helper: str, target: str) -> bool | None:
        """True: the helper reached the target; False: it answered that it could not (a
        nack); None: the helper did not answer either."""
        reply = await self._exchange(
            helper, {"k": "req", "target": target}, 2 * self.config.probe_timeout * self.multiplier
        )
        return None if reply is None else bool(reply.get("ok"))

    async def _exchange(self, peer: str, message: dict[str, Any], timeout: float
                        ) -> dict[str, Any] | None:
        with trio.move_on_after(timeout):
            try:
                stream = await self.host.new_stream(ID.from_base58(peer), [SWIM_PROTOCOL])
                try:
                    await write_frame(stream, self._pack(message))
                    reply = self._unpack(peer, await read_frame(stream, MAX_MESSAGE_BYTES))
                finally:
                    await stream.close()
                return reply
            except Exception as exc:  # unreachable peers fail in many transport-specific ways
                log.debug("swim %s to %s failed: %s", message.get("k"), peer, exc)
                return None
        return None

    async def _handle(self, stream: Any) -> None:
        peer = stream.muxed_conn.peer_id.to_base58()
        with trio.move_on_after(3 * self.config.probe_timeout * self.multiplier):
            try:
                if not self.replica.admission.is_admitted(stream.muxed_conn.peer_id):
                    return
                message = self._unpack(peer, await read_frame(stream, MAX_MESSAGE_BYTES))
                if message.get("k") == "ping":
                    await write_frame(stream, self._pack({"k": "ack"}))
                elif message.get("k") == "req":
                    ok = await self._ping(str(message.get("target")))
                    await write_frame(stream, self._pack({"k": "req-ack", "ok": ok}))
            except Exception as exc:  # a misbehaving peer must never take the handler down
                log.debug("swim message from %s failed: %s", peer, exc)
            finally:
                try:
                    await stream.close()
                except Exception:
                    log.debug("closing swim stream failed", exc_info=True)

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
            self._apply(item, now)
        return message

    def _apply(self, item: Any, now: float) -> None:
        try:
            peer_id, status, incarnation, proof = item
            update = Update(str(peer_id), Status(status), int(incarnation), proof)
        except (TypeError, ValueError):
            return
        valid = update.status is Status.ALIVE and isinstance(update.proof, bytes) and \
            self._verify_alive(update)
        was_suspect = update.peer_id in self.table.suspected()
        if self.table.apply(update, now, proof_valid=valid) and valid and was_suspect:
            self.stats["refuted"] += 1
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
        self.table.announce_alive(proof)
        log.warning("refuting a suspicion of this node (incarnation %d)", incarnation)

    # -- members ---------------------------------------------------------------------------

    def _sync_members(self) -> None:
        """Track the registry's non-LEFT peers; only when the registry changed (O(N) work
        per change, not per probe period)."""
        if self.replica.registry.generation == self._synced_generation:
            return
        self._synced_generation = self.replica.registry.generation
        peers: dict[str, tuple[str, ...]] = {}
        for record in self.replica.registry:
            if record.state is not Lifecycle.LEFT and record.peer_id != self.self_id:
                peers[record.peer_id] = record.addrs
        self.table.sync_members(set(peers), self.clock())
        store = self.host.get_peerstore()
        for peer_id, addrs in peers.items():
            try:
                store.add_addrs(ID.from_base58(peer_id),
                                [multiaddr.Multiaddr(a) for a in addrs], 3600)
            except Exception:
                log.debug("bad addresses for %s", peer_id, exc_info=True)

    def _next_target(self) -> str | None:
        self._order = [p for p in self._order if p in self.table.members]
        if not self._order:
            self._order = [p for p, m in self.table.members.items()
                           if m.status is not Status.CONFIRMED]
            random.shuffle(self._order)
        return self._order.pop() if self._order else None

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
                log.warning("evicted session %s of %s", session_id, peer_id)

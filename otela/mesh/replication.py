"""Registry replication: gossip for changes, full-state exchange for joins and repair.

Two paths, because GossipSub alone loses messages while its mesh forms and never tells
a late joiner what happened before it arrived:
- gossip: an owner publishes its own signed record on every change (small, fast);
- sync: a request/response stream where both sides send their signed snapshot and
  merge the other's. It runs when we connect to a peer (so a joiner gets the full
  state at once), periodically with a random peer (anti-entropy repairs what gossip
  missed), and to every peer when we announce DOWN or LEFT (so the news is not lost
  when we exit right after).
Every record is verified against its owner's key before it is merged; bad input is
dropped and counted, never raised into the daemon.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections import Counter
from typing import Any

import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from otela.mesh.framing import read_frame, write_frame
from otela.mesh.host import MeshHost
from otela.registry.store import Registry
from otela.registry.wire import SignedRecord, WireError, decode_records, encode_records

log = logging.getLogger("otela.mesh")

REGISTRY_TOPIC = "otela/registry/1"
SYNC_PROTOCOL = TProtocol("/otela/registry/sync/1.0.0")
SYNC_TIMEOUT_S = 5.0


class Replicator:
    def __init__(self, mesh: MeshHost, registry: Registry, anti_entropy_interval: float) -> None:
        self.mesh = mesh
        self.registry = registry
        self.anti_entropy_interval = anti_entropy_interval
        self.stats: Counter[str] = Counter()
        self._self_id: ID = mesh.host.get_id()

    def install(self) -> None:
        """Register the sync handler and the gossip validator (before the host runs)."""
        self.mesh.host.set_stream_handler(SYNC_PROTOCOL, self._handle_sync)
        self.mesh.pubsub.set_topic_validator(REGISTRY_TOPIC, self._validate_gossip, False)

    async def run(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        subscription = await self.mesh.pubsub.subscribe(REGISTRY_TOPIC)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._receive_gossip, subscription)
            nursery.start_soon(self._anti_entropy)
            task_status.started()

    async def publish(self, signed: dict[str, Any]) -> None:
        """Gossip one of our own signed records."""
        try:
            await self.mesh.pubsub.publish(REGISTRY_TOPIC, encode_records("gossip", [signed]))
            self.stats["gossip_published"] += 1
        except Exception as exc:  # publishing with no peers yet is not an error
            log.debug("gossip publish failed: %s", exc)

    async def sync_with(self, peer_id: ID) -> bool:
        """Exchange full snapshots with ``peer_id``; return whether it completed."""
        with trio.move_on_after(SYNC_TIMEOUT_S):
            try:
                stream = await self.mesh.host.new_stream(peer_id, [SYNC_PROTOCOL])
                try:
                    await write_frame(stream, self._snapshot_message())
                    reply = await read_frame(stream)
                finally:
                    await stream.close()
                self._merge(reply, "sync")
                self.stats["sync_completed"] += 1
                return True
            except Exception as exc:  # frame/wire errors, and network errors of every transport
                self.stats["sync_failed"] += 1
                log.debug("sync with %s failed: %s", peer_id, exc)
                return False
        self.stats["sync_failed"] += 1
        return False

    async def push_to_all(self, timeout: float) -> None:
        """Sync with every connected peer at once, giving up after ``timeout`` seconds."""
        with trio.move_on_after(timeout):
            async with trio.open_nursery() as nursery:
                for peer_id in self.connected_peers():
                    nursery.start_soon(self.sync_with, peer_id)

    def connected_peers(self) -> list[ID]:
        return [p for p in self.mesh.host.get_connected_peers() if p != self._self_id]

    def _snapshot_message(self) -> bytes:
        return encode_records("snapshot", self.registry.signed_snapshot())

    def _merge(self, data: bytes, kind: str) -> None:
        expected = "gossip" if kind == "gossip" else "snapshot"
        records, dropped = decode_records(data, expected)
        self.stats[f"{kind}_dropped"] += dropped
        self.stats[f"{kind}_merged"] += self._merge_records(records)

    def _merge_records(self, records: list[SignedRecord]) -> int:
        return sum(1 for record, signed in records if self.registry.merge(record, signed))

    def _validate_gossip(self, forwarder: ID, message: Any) -> bool:
        """Accept gossip only when every record is signed by, and published by, its owner."""
        try:
            records, dropped = decode_records(message.data, "gossip")
            source = ID(message.from_id).to_base58()
        except (WireError, Exception):
            self.stats["gossip_rejected"] += 1
            return False
        if dropped or any(record.peer_id != source for record, _ in records):
            self.stats["gossip_rejected"] += 1
            return False
        return True

    async def _receive_gossip(self, subscription: Any) -> None:
        while True:
            message = await subscription.get()
            if ID(message.from_id) == self._self_id:
                continue  # pubsub delivers our own publishes back to us
            try:
                self._merge(message.data, "gossip")
            except WireError as exc:
                self.stats["gossip_dropped"] += 1
                log.debug("dropped gossip: %s", exc)

    async def _handle_sync(self, stream: Any) -> None:
        with trio.move_on_after(SYNC_TIMEOUT_S):
            try:
                request = await read_frame(stream)
                self._merge(request, "sync")
                await write_frame(stream, self._snapshot_message())
            except Exception as exc:  # a misbehaving peer must never take the handler down
                self.stats["sync_failed"] += 1
                log.debug("inbound sync failed: %s", exc)
            finally:
                with contextlib.suppress(Exception):
                    await stream.close()

    async def _anti_entropy(self) -> None:
        while True:
            await trio.sleep(self.anti_entropy_interval * random.uniform(0.7, 1.3))
            peers = self.connected_peers()
            if peers:
                await self.sync_with(random.choice(peers))

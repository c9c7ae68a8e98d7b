"""This node's part in the registry: its own entry, its membership, and replica upkeep.

``LocalReplica`` owns the registry replica, the admission policy and the replicator,
and is the only writer of this node's entry: ``announce`` signs the next version,
applies it locally and gossips it. Around that it runs the upkeep tasks:
- lease refresh: re-sign our entry every ``GCPolicy.refresh_interval`` so replicas never
  compact a live node (this is not liveness: a few writes a day, not heartbeats);
- maintenance: GC (retention and compaction) and loading revocation files dropped into
  ``<home>/revocations`` (they then gossip to every replica);
- eviction watch: if the federation evicted our session (a false suspicion), rejoin
  under a new session id, as the paper's lifecycle requires, without restarting the engine.
  Any LEFT for our live session that we did not sign ourselves is treated the same way.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import trio
from libp2p.crypto.keys import PublicKey

from otela.identity import Identity
from otela.membership.admission import Admission
from otela.membership.certificate import (
    Certificate,
    MembershipError,
    parse_authority,
    verify_certificate,
)
from otela.mesh.host import MeshHost
from otela.registry.crdt import Entry, GCPolicy
from otela.registry.records import Lifecycle, NodeRecord
from otela.registry.session import new_session_id
from otela.registry.store import Registry
from otela.registry.wire import (
    WireError,
    revocation_envelope,
    sign_eviction,
    sign_record,
    verify_record,
)
from otela.replication.replicator import Replicator

log = logging.getLogger("otela.registry")

CERTIFICATE_FILE = "certificate.cert"
REVOCATIONS_DIR = "revocations"
MAINTENANCE_INTERVAL_S = 2.0  # GC pass + revocation scan; O(registry) and cheap


class MembershipConfigError(ValueError):
    """The node's membership settings cannot work (missing or invalid certificate)."""


def load_authority(value: str | None) -> PublicKey | None:
    """The authority from its printable form, or from a file holding it."""
    if not value:
        return None
    path = Path(value).expanduser()
    text = path.read_text().strip() if path.is_file() else value.strip()
    try:
        return parse_authority(text)
    except MembershipError as exc:
        raise MembershipConfigError(f"bad --authority: {exc}") from exc


def load_own_certificate(
    identity: Identity, home: Path, path: Path | None, authority: PublicKey | None, now: float
) -> tuple[bytes | None, Certificate | None]:
    """Our certificate, verified, or a clear error explaining how to obtain one."""
    if authority is None:
        return None, None
    path = path or home / CERTIFICATE_FILE
    peer_id = identity.peer_id.to_base58()
    if not path.is_file():
        raise MembershipConfigError(
            f"this federation requires a membership certificate and {path} does not exist; "
            f"ask the authority to run `otela membership sign --peer-id {peer_id} "
            f"--provider <your provider> --expires 30d` and pass the file with --certificate"
        )
    data = path.read_bytes()
    try:
        cert = verify_certificate(data, authority, now=now)
    except MembershipError as exc:
        raise MembershipConfigError(f"certificate {path} is not valid: {exc}") from exc
    if cert.peer_id != peer_id:
        raise MembershipConfigError(
            f"certificate {path} is for peer {cert.peer_id}, but this node is {peer_id}"
        )
    return data, cert


class LocalReplica:
    def __init__(
        self,
        identity: Identity,
        mesh: MeshHost,
        home: Path,
        *,
        policy: GCPolicy,
        authority: PublicKey | None,
        certificate: bytes | None,
        anti_entropy_interval: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.identity = identity
        self.clock = clock
        self.registry = Registry(policy)
        self.admission = Admission(authority, certificate, clock,
                                   revoked=self.registry.revocations)
        self.replicator = Replicator(
            mesh, self.registry, self.admission, anti_entropy_interval, clock
        )
        self.certificate = certificate
        self.revocations_dir = home / REVOCATIONS_DIR
        self.record: NodeRecord | None = None
        self._loaded_revocations: set[Path] = set()
        # Rejoin the moment our session is evicted, not at the next maintenance pass: until
        # then this node routes around itself (after a partition heals, an ingress whose
        # whole view was just evicted by the other side answered 404 for a second).
        self._evicted_send, self._evicted = trio.open_memory_channel[None](1)
        self.replicator.on_applied(self._check_evicted)

    def install(self, host: Any) -> None:
        self.admission.install(host)
        self.replicator.install()

    async def run(self, host: Any, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.replicator.run)
            nursery.start_soon(self.admission.enforce, host)
            nursery.start_soon(self._refresh_lease)
            nursery.start_soon(self._maintain)
            nursery.start_soon(self._rejoin_when_evicted)
            task_status.started()

    async def announce(self, **changes: Any) -> NodeRecord:
        """Sign our next version with ``changes``, apply it locally, and gossip it."""
        assert self.record is not None, "start() first"
        self.record = self.record.evolve(now=self.clock(), **changes)
        envelope = sign_record(self.record, self.identity.key_pair.private_key, self.certificate)
        entry = verify_record(envelope, self.admission.trust(self.registry), self.clock())
        self.registry.apply(entry, self.clock())
        log.info("announced %s (version %d)", self.record.state.name, self.record.version)
        await self.replicator.publish(envelope)
        return self.record

    async def start(self, record: NodeRecord) -> None:
        self.record = replace(record, version=0)
        await self.announce()

    async def evict(self, session_id: str, reason: str) -> bool:
        """Publish our signed verdict that ``session_id`` is LEFT (the failure detector's)."""
        target = self.registry.entry(session_id)
        if target is None or target.state is Lifecycle.LEFT:
            return False
        envelope = sign_eviction(
            target, evictor_key=self.identity.key_pair.private_key,
            evictor_peer_id=self.identity.peer_id.to_base58(), reason=reason,
            now=self.clock(), cert=self.certificate,
        )
        applied = self.replicator.ingest([envelope], "local") > 0
        await self.replicator.publish(envelope)
        return applied

    def load_revocations(self) -> list[dict[str, Any]]:
        """Envelopes of revocation files not loaded before (``*.revocation`` in the dir)."""
        if not self.revocations_dir.is_dir():
            return []
        fresh = []
        for path in sorted(self.revocations_dir.glob("*.revocation")):
            if path not in self._loaded_revocations:
                self._loaded_revocations.add(path)
                fresh.append(revocation_envelope(path.read_bytes()))
        return fresh

    async def _refresh_lease(self) -> None:
        while True:
            await trio.sleep(self.registry.policy.refresh_interval)
            if self.record is not None and self.record.state is not Lifecycle.LEFT:
                await self.announce()

    async def _maintain(self) -> None:
        while True:
            for envelope in self.load_revocations():
                if self.replicator.ingest([envelope], "local"):
                    await self.replicator.publish(envelope)
            dropped = self.registry.maintain(self.clock())
            if dropped:
                log.info("compacted %d registry entries past the GC horizon", len(dropped))
            await self._rejoin_if_evicted()
            await self._retire_old_sessions()
            await trio.sleep(MAINTENANCE_INTERVAL_S)

    async def _retire_old_sessions(self) -> None:
        """Announce LEFT for earlier sessions of this node (same key) that never said so,
        e.g. after a crash: we are their owner, so nobody has to detect and evict them."""
        if self.record is None:
            return
        me, current = self.record.peer_id, self.record.session_id
        for entry in list(self.registry.map):
            old = entry.record
            if old.peer_id == me and entry.key != current and entry.state is not Lifecycle.LEFT:
                retired = old.evolve(now=self.clock(), state=Lifecycle.LEFT)
                envelope = sign_record(retired, self.identity.key_pair.private_key,
                                       self.certificate)
                if self.replicator.ingest([envelope], "local"):
                    log.info("retired earlier session %s of this node", entry.key)
                    await self.replicator.publish(envelope)

    def _check_evicted(self, entry: Entry) -> None:
        if (self.record is not None and entry.key == self.record.session_id
                and entry.state is Lifecycle.LEFT):
            with contextlib.suppress(trio.WouldBlock):  # a wake-up is pending already
                self._evicted_send.send_nowait(None)

    async def _rejoin_when_evicted(self) -> None:
        async for _ in self._evicted:
            await self._rejoin_if_evicted()

    async def _rejoin_if_evicted(self) -> None:
        record = self.record
        if record is None or record.state is Lifecycle.LEFT:
            return
        entry: Entry | None = self.registry.entry(record.session_id)
        if entry is None or entry.state is not Lifecycle.LEFT:
            return
        # Normally an eviction; a LEFT we did not sign cannot enter the map (records are
        # owner-signed), but if one ever did we would be out of routing for good: rejoin.
        by = entry.evicted_by or "a record this node did not sign"
        log.warning("the federation marked session %s LEFT (by %s); rejoining as a new "
                    "session", record.session_id, by)
        self.record = replace(
            record, session_id=new_session_id(record.peer_id), version=0
        )
        await self.announce()


__all__ = ["LocalReplica", "MembershipConfigError", "WireError", "load_authority",
           "load_own_certificate"]

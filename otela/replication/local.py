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
  Any LEFT for our live session that we did not sign ourselves is treated the same way,
  and so is a newer session of our own peer id (``_rejoin_if_superseded``: our clock went
  back past an earlier run's, or another process runs with this node's key).

Session ids carry an epoch (``otela.registry.session``) that orders a peer's sessions:
each new one is above the last this node used (kept in ``<home>/session-epoch``) and the
wall clock in milliseconds, so a restart supersedes the previous run's session on every
replica at once.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import trio
from libp2p.crypto.keys import PrivateKey, PublicKey

from otela.identity import Identity
from otela.membership.admission import Admission
from otela.mesh.host import MeshHost
from otela.registry.certificate import (
    Certificate,
    MembershipError,
    parse_authority,
    verify_certificate,
)
from otela.registry.crdt import Entry, GCPolicy
from otela.registry.evidence import EvidenceError, Suspicion, justified
from otela.registry.records import Lifecycle, NodeRecord
from otela.registry.session import MAX_EPOCH, epoch_of, new_session_id
from otela.registry.store import Registry
from otela.registry.wire import (
    Trust,
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
EPOCH_FILE = "session-epoch"
# A newer session of our own peer id that is not ours: we answer with a newer one, at most
# this often (two processes sharing a key would otherwise outbid each other at gossip
# speed).
OUTBID_INTERVAL_S = 10.0


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
        self._epoch_file = home / EPOCH_FILE
        self._last_epoch = _read_epoch(self._epoch_file)
        self._outbid_at: float | None = None
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
        record = self.record.evolve(now=self.clock(), **changes)
        other = self.registry.map.session_of(record.peer_id)
        if other is not None and self.registry.map.outranked(record.peer_id,
                                                            record.session_id):
            # A newer session of our own peer id is here (an earlier run's, from before
            # our clock went back, or another process with our key): ours would be
            # refused, so we take a newer one.
            log.warning("session %s of this node's peer id supersedes ours (%s): another "
                        "process may be running with this node's key, or the clock went "
                        "back; announcing a newer session", other, record.session_id)
            record = replace(record, session_id=self.new_session_id(epoch_of(other)),
                             version=1)
        self.record = record
        envelope = sign_record(self.record, self.identity.key_pair.private_key, self.certificate)
        entry = verify_record(envelope, self.admission.trust(self.registry), self.clock())
        self.registry.apply(entry, self.clock())
        log.info("announced %s (version %d)", self.record.state.name, self.record.version)
        await self.replicator.publish(envelope)
        return self.record

    async def start(self, record: NodeRecord) -> None:
        self.record = replace(record, version=0)
        await self.announce()

    def new_session_id(self, above: int = 0) -> str:
        """A session id for this node's next session: its epoch is above every epoch this
        node used before (and ``above``), so it supersedes them on every replica."""
        epoch = max(int(self.clock() * 1000), self._last_epoch + 1, above + 1)
        epoch = min(epoch, MAX_EPOCH)
        self._last_epoch = epoch
        try:
            self._epoch_file.write_text(f"{epoch}\n")
        except OSError as exc:  # the clock still orders sessions; only a jump back hurts
            log.warning("could not keep the session epoch in %s: %s", self._epoch_file, exc)
        return new_session_id(self.identity.peer_id.to_base58(), epoch)

    async def evict(self, session_id: str, reason: str,
                    statements: Sequence[Suspicion] = ()) -> bool:
        """Publish our signed verdict that ``session_id`` is LEFT (the failure detector's),
        with the signed suspicions that justify it. Without as many independent ones as
        every replica requires (``otela.registry.evidence``) nothing is signed: it would
        be refused everywhere, and count against us."""
        envelope = eviction_envelope(
            self.registry, session_id, reason, statements,
            self.admission.trust(self.registry), self.identity.key_pair.private_key,
            self.identity.peer_id.to_base58(), self.clock(), self.certificate)
        if envelope is None:
            return False
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
            await trio.sleep(MAINTENANCE_INTERVAL_S)

    def _check_evicted(self, entry: Entry) -> None:
        record = self.record
        if record is None:
            return
        ours = entry.key == record.session_id and entry.state is Lifecycle.LEFT
        outbid = entry.record.peer_id == record.peer_id and entry.key != record.session_id
        if ours or outbid:
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
        if entry is None:
            await self._rejoin_if_superseded(record)
            return
        if entry.state is not Lifecycle.LEFT:
            return
        # Normally an eviction; a LEFT we did not sign cannot enter the map (records are
        # owner-signed), but if one ever did we would be out of routing for good: rejoin.
        by = entry.evicted_by or "a record this node did not sign"
        log.warning("the federation marked session %s LEFT (by %s); rejoining as a new "
                    "session", record.session_id, by)
        await self._rejoin(record)

    async def _rejoin_if_superseded(self, record: NodeRecord) -> None:
        """Our session is gone from the registry because a newer session of our own peer
        id is there: announce again (``announce`` takes a newer session), at most every
        ``OUTBID_INTERVAL_S``: two processes sharing a key would otherwise outbid each
        other at gossip speed."""
        other = self.registry.map.session_of(record.peer_id)
        if other is None or other == record.session_id:
            return
        now = self.clock()
        if self._outbid_at is not None and now - self._outbid_at < OUTBID_INTERVAL_S:
            return
        self._outbid_at = now
        await self.announce()

    async def _rejoin(self, record: NodeRecord) -> None:
        self.record = replace(record, session_id=self.new_session_id(), version=0)
        await self.announce()


def eviction_envelope(registry: Registry, session_id: str, reason: str,
                      statements: Sequence[Suspicion], trust: Trust, key: PrivateKey,
                      evictor: str, now: float, cert: bytes | None = None
                      ) -> dict[str, Any] | None:
    """Our signed verdict that ``session_id`` is LEFT, embedding the signed suspicions
    every replica requires (``otela.registry.evidence``); None when the session is not
    live here or the statements do not justify it (it would be refused everywhere, and
    count against us). Sans I/O: ``LocalReplica.evict`` and the mesh simulator."""
    target = registry.entry(session_id)
    if target is None or target.state is Lifecycle.LEFT:
        return None
    evictee = target.record.peer_id
    try:
        chosen = justified(statements, evictee, session_id, now, trust.is_member,
                           trust.witnesses)
    except EvidenceError as exc:
        log.info("not evicting session %s of %s yet: %s", session_id, evictee, exc)
        return None
    return sign_eviction(target, evictor_key=key, evictor_peer_id=evictor, reason=reason,
                         now=now, evidence=chosen, cert=cert)


def _read_epoch(path: Path) -> int:
    """The last session epoch a node with this home used (0 if none, or unreadable)."""
    try:
        return min(max(0, int(path.read_text().strip())), MAX_EPOCH)
    except (OSError, ValueError):
        return 0


__all__ = ["LocalReplica", "MembershipConfigError", "WireError", "load_authority",
           "load_own_certificate"]

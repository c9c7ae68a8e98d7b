"""Wire format of registry entries: versioned msgpack envelopes, signed, size-limited.

Three kinds of envelope travel between replicas:
- ``rec``: a node's own record, signed by the node's Ed25519 identity key. An Ed25519
  peer id embeds the public key, so any replica verifies a record from the record alone,
  including records relayed by third parties; and the session id commits to the peer id
  that created it (``otela.registry.session``), so a record signed by anyone else is a
  forgery (``ForgedRecord``), however valid its signature and certificate. In a
  federation with a membership authority the envelope also carries the owner's
  certificate, which must bind the record's peer id to its provider id, be unexpired and
  unrevoked.
- ``evict``: a member's signed statement that another session is LEFT (the failure
  detector's verdict). It embeds the evictee's last signed record, so the tombstone is
  self-describing, and the signed suspicions of the members that suspected it
  (``otela.registry.evidence``); it is accepted only from an admitted member, and only
  with the signed suspicions of two distinct members.
- ``revoke``: the authority's signed revocation of a certificate.
Each signature covers a domain-separation prefix plus the exact body bytes, so no
signature can be replayed as another kind. Anything malformed, oversized, unsigned,
forged or unauthorised raises ``WireError``: callers drop it and count it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
from libp2p.crypto.keys import PrivateKey, PublicKey
from libp2p.peer.id import ID

from otela.registry.certificate import (
    Certificate,
    MembershipError,
    Revocation,
    verify_certificate,
    verify_revocation,
)
from otela.registry.crdt import Entry, tiebreak_of
from otela.registry.evidence import (
    MAX_WITNESSES,
    WITNESSES,
    EvidenceError,
    Suspicion,
    from_wire,
    justified,
)
from otela.registry.records import Lifecycle, NodeRecord, finite
from otela.registry.session import epoch_of, owns

WIRE_VERSION = 1
# One record, encoded (``records.py`` bounds its fields; this bounds the whole): every
# replica holds every member's record, so this times the member count is what a replica's
# registry may cost (docs/security.md#a-member-that-lies-about-itself).
MAX_RECORD_BYTES = 16 * 1024
# An eviction embeds the evictee's last signed envelope (record, signature, certificate)
# and the evidence of the suspicion.
MAX_EVICTION_BYTES = MAX_RECORD_BYTES + 8 * 1024
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
RECORD_DOMAIN = b"otela/registry/record/v1\0"
EVICTION_DOMAIN = b"otela/registry/eviction/v1\0"


class WireError(ValueError):
    """A message that must be dropped: malformed, oversized, or failing verification."""


class UnjustifiedEviction(WireError):
    """A validly signed eviction without the evidence every eviction needs: one member's
    word against another's session. The evictor is reported (``Misconduct``)."""

    def __init__(self, message: str, evictor: str) -> None:
        super().__init__(message)
        self.evictor = evictor


class ForgedRecord(WireError):
    """A validly signed record for a session its signer did not create: an attempt to
    write another node's entry (session hijack, forced LEFT). Counted and logged apart."""

    def __init__(self, message: str, signer: str) -> None:
        super().__init__(message)
        self.signer = signer


@dataclass
class Trust:
    """What a replica checks entries against; ``now`` and membership change over time."""

    authority: PublicKey | None = None  # None: an open federation (demos, tests)
    revoked_serials: Collection[str] = field(default_factory=set)
    is_member: Callable[[str], bool] = lambda peer_id: True  # evictors in open mode
    witnesses: int = WITNESSES  # distinct suspecters an eviction must carry (``evidence``)


def _public_key(peer_id: str) -> PublicKey:
    try:
        key = ID.from_base58(peer_id).extract_public_key()
    except Exception as exc:
        raise WireError(f"not an Ed25519 peer id: {peer_id!r}") from exc
    if key is None:
        raise WireError(f"peer id {peer_id!r} does not embed its public key")
    return key


def _check_certificate(
    cert: Any, peer_id: str, provider_id: str | None, trust: Trust, now: float
) -> Certificate | None:
    if trust.authority is None:
        return None
    if not isinstance(cert, bytes):
        raise WireError(f"{peer_id} presented no membership certificate")
    try:
        certificate = verify_certificate(
            cert, trust.authority, now=now, revoked_serials=trust.revoked_serials
        )
    except MembershipError as exc:
        raise WireError(f"certificate of {peer_id} rejected: {exc}") from exc
    if certificate.peer_id != peer_id:
        raise WireError(f"certificate is for {certificate.peer_id}, not {peer_id}")
    if provider_id is not None and certificate.provider_id != provider_id:
        raise WireError(
            f"{peer_id} claims provider {provider_id!r}, certified for {certificate.provider_id!r}"
        )
    return certificate


def sign_record(record: NodeRecord, key: PrivateKey, cert: bytes | None = None) -> dict[str, Any]:
    """The signed envelope of ``record``; ``key`` must be the owner's identity key."""
    body = msgpack.packb(record.to_dict(), use_bin_type=True)
    if len(body) > MAX_RECORD_BYTES:
        raise WireError(f"record of {len(body)} bytes exceeds {MAX_RECORD_BYTES}")
    return {"v": WIRE_VERSION, "t": "rec", "body": body, "sig": key.sign(RECORD_DOMAIN + body),
            "cert": cert}


def sign_eviction(
    target: Entry, *, evictor_key: PrivateKey, evictor_peer_id: str, reason: str, now: float,
    evidence: Sequence[Suspicion] = (), cert: bytes | None = None,
) -> dict[str, Any]:
    """A signed statement that ``target``'s session is LEFT, by member ``evictor_peer_id``,
    with the signed suspicions that justify it."""
    last = target.proof if target.proof is not None and target.evicted_by is None else None
    if last is None:
        raise WireError("can only evict a session whose own signed record we hold")
    body = msgpack.packb(
        {"session_id": target.key, "evictor": evictor_peer_id, "reason": reason[:200],
         "at": now, "last": last,
         "evidence": [s.to_wire() for s in evidence[:MAX_WITNESSES]]},
        use_bin_type=True,
    )
    return {"v": WIRE_VERSION, "t": "evict", "body": body,
            "sig": evictor_key.sign(EVICTION_DOMAIN + body), "cert": cert}


def verify(envelope: Any, trust: Trust, now: float) -> Entry | tuple[Revocation, dict[str, Any]]:
    """Verify one envelope of any kind; an ``Entry`` for the map, or a revocation."""
    if not isinstance(envelope, dict) or envelope.get("v") != WIRE_VERSION:
        raise WireError("not a version-1 envelope")
    kind = envelope.get("t")
    if kind == "rec":
        return verify_record(envelope, trust, now)
    if kind == "evict":
        return _verify_eviction(envelope, trust, now)
    if kind == "revoke":
        return _verify_revocation(envelope, trust), envelope
    raise WireError(f"unknown envelope kind {kind!r}")


def signer_of(envelope: dict[str, Any]) -> str | None:
    """Who must have published this envelope in gossip (the owner, or the evictor)."""
    try:
        body = msgpack.unpackb(envelope["body"], raw=False)
        return str(body["peer_id"] if envelope["t"] == "rec" else body["evictor"])
    except Exception:
        return None


def gossip_refusal(envelope: Any, source: str) -> str | None:
    """Why a gossip validator must drop ``envelope`` published by ``source`` (so it is not
    forwarded either), or ``None``. Cheap checks only: signatures are verified on ingest.
    A revocation may come from anyone (the authority signs it); a record only from the
    peer that created its session; an eviction only from its evictor."""
    if not isinstance(envelope, dict):
        return "not an envelope"
    if envelope.get("t") == "revoke":
        return None
    try:
        body = msgpack.unpackb(envelope["body"], raw=False)
        kind = envelope["t"]
        signer = str(body["peer_id"] if kind == "rec" else body["evictor"])
        if signer != source:
            return "not published by its signer"
        if kind == "rec" and not owns(signer, str(body["session_id"])):
            return FORGED
    except Exception:
        return "malformed"
    return None


FORGED = "record for a session its signer did not create"


def gossip_facts(envelope: Any) -> tuple[str, str] | None:
    """(kind, session id) of a record or eviction envelope, read without verifying it, or
    ``None``: what a gossip validator meters (``otela.replication.replicator``)."""
    try:
        kind = envelope["t"]
        if kind not in ("rec", "evict"):
            return None
        body = msgpack.unpackb(envelope["body"], raw=False)
        return kind, str(body["session_id"])
    except Exception:
        return None


def eviction_time(envelope: Any) -> float | None:
    """When an eviction envelope says it was signed, read without verifying it."""
    try:
        body = msgpack.unpackb(envelope["body"], raw=False)
        return finite(body["at"], "at")
    except Exception:
        return None


def _unpack_body(envelope: dict[str, Any], limit: int = MAX_RECORD_BYTES
                 ) -> tuple[bytes, bytes, dict[str, Any]]:
    if not isinstance(envelope, dict):
        raise WireError("envelope is not a map")
    body, sig = envelope.get("body"), envelope.get("sig")
    if not isinstance(body, bytes) or not isinstance(sig, bytes):
        raise WireError("envelope lacks body or signature bytes")
    if len(body) > limit:
        raise WireError(f"body of {len(body)} bytes exceeds {limit}")
    try:
        data = msgpack.unpackb(body, raw=False)
    except Exception as exc:
        raise WireError(f"undecodable body: {exc}") from exc
    if not isinstance(data, dict):
        raise WireError("body is not a map")
    return body, sig, data


def verify_record(
    envelope: dict[str, Any], trust: Trust, now: float, *, check_membership: bool = True
) -> Entry:
    body, sig, data = _unpack_body(envelope)
    try:
        record = NodeRecord.from_dict(data)
    except (KeyError, ValueError, TypeError) as exc:
        raise WireError(f"malformed record: {exc}") from exc
    if not _public_key(record.peer_id).verify(RECORD_DOMAIN + body, sig):
        raise WireError(f"bad signature on record of session {record.session_id}")
    if not owns(record.peer_id, record.session_id):
        raise ForgedRecord(
            f"{record.peer_id} signed a record for session {record.session_id}, "
            "which it did not create",
            record.peer_id,
        )
    certificate = (
        _check_certificate(envelope.get("cert"), record.peer_id, record.provider_id, trust, now)
        if check_membership else None
    )
    return Entry(
        key=record.session_id, state=record.state, version=record.version,
        updated_at=record.updated_at, tiebreak=tiebreak_of(sig), record=record, proof=envelope,
        cert_serial=certificate.serial if certificate else None,
        cert_expires_at=certificate.expires_at if certificate else None,
    )


def _verify_eviction(envelope: dict[str, Any], trust: Trust, now: float) -> Entry:
    body, sig, data = _unpack_body(envelope, MAX_EVICTION_BYTES)
    try:
        session_id, evictor = str(data["session_id"]), str(data["evictor"])
        at, last = finite(data["at"], "at"), data["last"]
        evidence = list(data.get("evidence") or [])[:MAX_WITNESSES]
    except (KeyError, ValueError, TypeError) as exc:
        raise WireError(f"malformed eviction: {exc}") from exc
    if not isinstance(last, dict):  # a member's eviction whose record is a list or a string
        raise WireError("eviction's last record is not a map")
    if not _public_key(evictor).verify(EVICTION_DOMAIN + body, sig):
        raise WireError(f"bad signature on eviction of {session_id}")
    if trust.authority is not None:
        _check_certificate(envelope.get("cert"), evictor, None, trust, now)
    elif not trust.is_member(evictor):
        raise WireError(f"eviction of {session_id} by {evictor}, who is not a member")
    previous = verify_record(last, trust, now, check_membership=False)
    if previous.key != session_id:
        raise WireError("eviction embeds a record of another session")
    evictee = previous.record.peer_id
    if evictor == evictee:
        raise WireError("a node leaves by announcing LEFT itself, not by evicting itself")
    try:
        if at * 1000 < epoch_of(session_id):
            raise EvidenceError("it is dated before the session began")
        statements = [from_wire(evictee, item) for item in evidence]
        justified(statements, evictee, session_id, at, trust.is_member, trust.witnesses)
    except EvidenceError as exc:
        raise UnjustifiedEviction(f"eviction of {session_id} by {evictor} without the "
                                  f"evidence it needs: {exc}", evictor) from None
    return Entry(
        key=session_id, state=Lifecycle.LEFT, version=previous.version, updated_at=at,
        tiebreak=tiebreak_of(sig),
        record=dataclasses.replace(previous.record, state=Lifecycle.LEFT),
        proof=envelope, evicted_by=evictor,
    )


def _verify_revocation(envelope: dict[str, Any], trust: Trust) -> Revocation:
    if trust.authority is None:
        raise WireError("revocation received, but this federation has no membership authority")
    data = envelope.get("data")
    if not isinstance(data, bytes):
        raise WireError("revocation envelope lacks data")
    try:
        return verify_revocation(data, trust.authority)
    except MembershipError as exc:
        raise WireError(f"revocation rejected: {exc}") from exc


def revocation_envelope(data: bytes) -> dict[str, Any]:
    return {"v": WIRE_VERSION, "t": "revoke", "data": data}


def encode(message: dict[str, Any]) -> bytes:
    return msgpack.packb({"v": WIRE_VERSION, **message}, use_bin_type=True)


def decode(data: bytes, *, limit: int = MAX_MESSAGE_BYTES) -> dict[str, Any]:
    """Decode a top-level message, enforcing the size limit before parsing."""
    if len(data) > limit:
        raise WireError(f"message of {len(data)} bytes exceeds {limit}")
    try:
        message = msgpack.unpackb(
            data, raw=False, max_bin_len=limit, max_str_len=limit, strict_map_key=False
        )
    except Exception as exc:
        raise WireError(f"undecodable message: {exc}") from exc
    if not isinstance(message, dict) or message.get("v") != WIRE_VERSION:
        raise WireError("not a version-1 message")
    return message

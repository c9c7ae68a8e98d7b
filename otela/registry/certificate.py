"""Membership certificates and revocations: pure signing and verification.

A federation's *membership authority* (an Ed25519 key) admits a node by signing a certificate
that binds the node's libp2p peer id to a provider id until an expiry time, and withdraws it by
signing a revocation naming the certificate's serial. This is the Python stand-in for the paper's
"only signed binaries join" (§3.3): what is attested is the node's key, not its code.

Nothing here reads files, clocks or the network: callers pass ``now`` and the bytes, so the
same functions serve the CLI, the daemon's join handshake and the tests.

Wire format (version 1)::

    envelope = msgpack {"v": 1, "kind": "cert" | "revocation", "body": bin, "sig": bin(64)}
    body     = msgpack map of exactly the fields of ``Certificate`` / ``Revocation``
    sig      = Ed25519(authority, DOMAIN[kind] + body)

``DOMAIN[kind]`` starts with ``0xc1``, a byte msgpack never uses, so a signed message can never
also be a valid msgpack document: a registry record signature (node key over raw msgpack body
bytes) can never be replayed as a certificate, a certificate signature never as a revocation,
and vice versa.
"""

from __future__ import annotations

import hashlib
import math
import re
import secrets
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import base58
import msgpack
from libp2p.crypto.ed25519 import Ed25519PublicKey
from libp2p.crypto.keys import KeyType, PrivateKey, PublicKey
from libp2p.peer.id import ID
from nacl.bindings import crypto_core_ed25519_is_valid_point

from otela import names
from otela.durations import parse_duration

WIRE_VERSION: Final = 1
MAX_MESSAGE_BYTES: Final = 4096
"""Largest certificate or revocation accepted; real ones are ~300 bytes."""
CLOCK_SKEW_S: Final = 300.0
"""How far ``issued_at`` may lie in a verifier's future: the authority's clock is not the node's."""
AUTHORITY_PREFIX: Final = names.AUTHORITY_PREFIX
MAX_PROVIDER_LEN: Final = names.MAX_PROVIDER_LEN
MAX_REASON_LEN: Final = 256

KIND_CERT: Final = "cert"
KIND_REVOCATION: Final = "revocation"
_DOMAIN: Final[Mapping[str, bytes]] = {
    KIND_CERT: b"\xc1otela/membership/cert/v1\x00",
    KIND_REVOCATION: b"\xc1otela/membership/revocation/v1\x00",
}
_ENVELOPE_KEYS: Final = frozenset({"v", "kind", "body", "sig"})
_SERIAL_RE: Final = re.compile(r"[0-9a-f]{8,64}")
_SIG_LEN: Final = 64


class MembershipError(ValueError):
    """Any rejected certificate, revocation, key or argument; the message says why."""


@dataclass(frozen=True)
class Certificate:
    """The authority's statement "peer ``peer_id`` belongs to provider ``provider_id``"."""

    peer_id: str
    provider_id: str
    serial: str
    issued_at: float
    expires_at: float
    authority_id: str

@dataclass(frozen=True)
class Revocation:
    """The authority's statement "certificate ``serial`` (of ``peer_id``) no longer admits"."""

    serial: str
    peer_id: str
    revoked_at: float
    reason: str
    authority_id: str


# --- keys and identifiers -------------------------------------------------------------------


def authority_id(public_key: PublicKey) -> str:
    """A short, stable fingerprint of an authority key (32 hex chars of SHA-256).

    Only a label for messages and for picking the right key; verification always uses the key.
    """
    return hashlib.sha256(public_key.to_bytes()).hexdigest()[:32]


def format_authority(public_key: PublicKey) -> str:
    """The printable authority string nodes are configured with (``--authority``)."""
    _require_ed25519(public_key)
    return AUTHORITY_PREFIX + base58.b58encode(public_key.to_bytes()).decode("ascii")


def parse_authority(text: str) -> PublicKey:
    """Parse ``otela-authority:<base58 Ed25519 public key>`` (surrounding whitespace ignored)."""
    if not isinstance(text, str):
        raise MembershipError("authority must be a string")
    text = text.strip()
    if not text.startswith(AUTHORITY_PREFIX):
        hint = " (that looks like a node's peer id)" if text.startswith("12D3KooW") else ""
        raise MembershipError(
            f"not an authority string{hint}: expected '{AUTHORITY_PREFIX}<key>', "
            "as printed by `otela membership init` and stored in authority.pub"
        )
    encoded = text[len(AUTHORITY_PREFIX) :]
    try:
        raw = base58.b58decode(encoded)
    except ValueError:
        raise MembershipError("authority key is not valid base58") from None
    if len(raw) != 32 or base58.b58encode(raw).decode("ascii") != encoded:
        raise MembershipError("authority key must be a 32-byte Ed25519 public key in base58")
    if not crypto_core_ed25519_is_valid_point(raw):
        raise MembershipError("authority key is not a valid Ed25519 public key")
    return Ed25519PublicKey.from_bytes(raw)


def peer_public_key(peer_id: str) -> PublicKey:
    """The Ed25519 public key embedded in a libp2p peer id (``12D3KooW...``).

    Certificates only bind Ed25519 peer ids in canonical base58, so that the binding is
    unambiguous and the node's key can be recovered from the certificate alone.
    """
    if not isinstance(peer_id, str) or not 1 <= len(peer_id) <= 128:
        raise MembershipError("peer id must be a non-empty string")
    try:
        pid = ID.from_base58(peer_id)
    except ValueError:
        raise MembershipError(f"not a libp2p peer id: {peer_id!r}") from None
    key = pid.extract_public_key()
    if key is None or key.get_type() != KeyType.Ed25519 or pid.to_base58() != peer_id:
        raise MembershipError(f"not an Ed25519 libp2p peer id (12D3KooW...): {peer_id!r}")
    return key


def new_serial() -> str:
    """A fresh certificate serial: 128 random bits in hex."""
    return secrets.token_hex(16)


# --- issuing ---------------------------------------------------------------------------------


def issue_certificate(
    authority_key: PrivateKey,
    *,
    peer_id: str,
    provider_id: str,
    expires_at: float,
    now: float,
    serial: str | None = None,
) -> bytes:
    """Sign a certificate admitting ``peer_id`` to the federation as a node of ``provider_id``
    until ``expires_at``; the serial is random unless given (it is what revocations name)."""
    _require_ed25519(authority_key.get_public_key())
    peer_public_key(peer_id)
    _check_provider(provider_id)
    serial = new_serial() if serial is None else serial
    _check_serial(serial)
    issued_at, expires_at = _check_time(now, "now"), _check_time(expires_at, "expires_at")
    if expires_at <= issued_at:
        raise MembershipError("expiry must lie in the future")
    body = {
        "peer_id": peer_id,
        "provider_id": provider_id,
        "serial": serial,
        "issued_at": issued_at,
        "expires_at": expires_at,
        "authority_id": authority_id(authority_key.get_public_key()),
    }
    return _seal(authority_key, KIND_CERT, body)


def issue_revocation(
    authority_key: PrivateKey, *, serial: str, peer_id: str, now: float, reason: str = ""
) -> bytes:
    """Sign a revocation of certificate ``serial``; revocations are permanent."""
    _require_ed25519(authority_key.get_public_key())
    _check_serial(serial)
    peer_public_key(peer_id)
    _check_reason(reason)
    body = {
        "serial": serial,
        "peer_id": peer_id,
        "revoked_at": _check_time(now, "now"),
        "reason": reason,
        "authority_id": authority_id(authority_key.get_public_key()),
    }
    return _seal(authority_key, KIND_REVOCATION, body)


# --- verifying -------------------------------------------------------------------------------


def verify_certificate(
    data: bytes,
    authority: PublicKey,
    *,
    now: float,
    revoked_serials: Collection[str] = (),
    peer_id: str | None = None,
    leeway: float = CLOCK_SKEW_S,
) -> Certificate:
    """Admission check: the certificate is well formed, signed by ``authority``, not revoked,
    and valid at ``now`` (``issued_at`` may be up to ``leeway`` seconds ahead of ``now``).

    Pass ``peer_id`` (the peer presenting the certificate, as authenticated by the transport) to
    also reject a certificate that belongs to someone else.
    """
    cert = decode_certificate(data, authority)
    if peer_id is not None and cert.peer_id != peer_id:
        raise MembershipError(
            f"certificate belongs to peer {cert.peer_id}, but was presented by {peer_id}"
        )
    if cert.serial in revoked_serials:
        raise MembershipError(f"certificate {cert.serial} has been revoked")
    if now >= cert.expires_at:
        raise MembershipError(
            f"certificate {cert.serial} expired at {format_time(cert.expires_at)}"
        )
    if now + leeway < cert.issued_at:
        raise MembershipError(
            f"certificate {cert.serial} is not valid before {format_time(cert.issued_at)}"
        )
    return cert


def decode_certificate(data: bytes, authority: PublicKey) -> Certificate:
    """Check a certificate's form and signature only, ignoring time and revocation.

    For tools (revoking a certificate that already expired); admission uses verify_certificate.
    """
    body, body_bytes, sig = _open(data, KIND_CERT)
    cert = _certificate_from(body)
    _check_signature(KIND_CERT, body_bytes, sig, cert.authority_id, authority)
    return cert


def verify_revocation(data: bytes, authority: PublicKey) -> Revocation:
    """Check a revocation's form and signature by ``authority``."""
    body, body_bytes, sig = _open(data, KIND_REVOCATION)
    revocation = _revocation_from(body)
    _check_signature(KIND_REVOCATION, body_bytes, sig, revocation.authority_id, authority)
    return revocation


def inspect_unverified(data: bytes) -> Certificate | Revocation:
    """Decode a certificate or revocation WITHOUT checking its signature.

    Only for display (``otela membership show`` without an authority); never trust the result.
    """
    kind = message_kind(data)
    body, _body_bytes, _sig = _open(data, kind)
    return _certificate_from(body) if kind == KIND_CERT else _revocation_from(body)


def message_kind(data: bytes) -> str:
    """``"cert"`` or ``"revocation"``: which verifier a file is meant for."""
    return _open_any(data)[0]


# --- expiry parsing (for the CLI) ------------------------------------------------------------

def parse_expiry(text: str, *, now: float) -> float:
    """Parse an expiry: a duration from ``now`` (``90m``, ``12h``, ``30d``, ``2w``) or an
    absolute UTC date/time (``2027-01-31`` = 00:00 UTC that day, ``2027-01-31T12:00:00Z``,
    or with an explicit offset; a time without a zone is taken as UTC).
    """
    value = text.strip()
    if value[-1:].lower() in "smhdw" and value[:1].isdigit():
        try:
            return now + parse_duration(value, unit_required=True)
        except ValueError as exc:
            raise MembershipError(f"bad expiry: {exc}") from None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise MembershipError(
            f"cannot parse expiry {text!r}: use a duration like 30d, 12h, 90m, 2w, "
            "or a UTC date/time like 2027-01-31 or 2027-01-31T12:00:00Z"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    expires_at = when.timestamp()
    if expires_at <= now:
        raise MembershipError(f"expiry {format_time(expires_at)} is in the past")
    return expires_at


def format_time(ts: float) -> str:
    """A unix time as ISO 8601 UTC, for messages."""
    try:
        return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):
        return f"{ts} (unix)"


# --- internals -------------------------------------------------------------------------------


def _seal(key: PrivateKey, kind: str, body: Mapping[str, Any]) -> bytes:
    body_bytes: bytes = msgpack.packb(body, use_bin_type=True)
    sig = key.sign(_DOMAIN[kind] + body_bytes)
    envelope = {"v": WIRE_VERSION, "kind": kind, "body": body_bytes, "sig": sig}
    data: bytes = msgpack.packb(envelope, use_bin_type=True)
    if len(data) > MAX_MESSAGE_BYTES:
        raise MembershipError(f"{kind} would be {len(data)} bytes (limit {MAX_MESSAGE_BYTES})")
    return data


def _unpack(data: bytes, what: str) -> Any:
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True)
    except Exception:  # msgpack raises a zoo of types on junk; all mean the same here
        raise MembershipError(f"malformed {what}: not valid msgpack") from None


def _open_any(data: bytes) -> tuple[str, bytes, bytes]:
    """Size, envelope and encoding checks shared by every reader; returns (kind, body, sig)."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise MembershipError("membership message must be bytes")
    data = bytes(data)
    if len(data) > MAX_MESSAGE_BYTES:
        raise MembershipError(f"message is {len(data)} bytes, over the {MAX_MESSAGE_BYTES} limit")
    envelope = _unpack(data, "membership message")
    if not isinstance(envelope, dict) or set(envelope) != _ENVELOPE_KEYS:
        raise MembershipError("malformed membership message: not a certificate or revocation")
    version, kind = envelope["v"], envelope["kind"]
    if type(version) is not int or version != WIRE_VERSION:
        raise MembershipError(f"unsupported membership wire version {version!r}")
    if kind not in _DOMAIN:
        raise MembershipError(f"unknown membership message kind {kind!r}")
    body, sig = envelope["body"], envelope["sig"]
    if not isinstance(body, bytes) or not isinstance(sig, bytes) or len(sig) != _SIG_LEN:
        raise MembershipError(f"malformed {kind}: bad body or signature field")
    return kind, body, sig


def _open(data: bytes, expected_kind: str) -> tuple[dict[str, Any], bytes, bytes]:
    """Returns (decoded body, the exact signed body bytes, signature)."""
    kind, body_bytes, sig = _open_any(data)
    if kind != expected_kind:
        raise MembershipError(f"expected a {expected_kind}, got a {kind}")
    body = _unpack(body_bytes, kind)
    if not isinstance(body, dict):
        raise MembershipError(f"malformed {kind}: body is not a map")
    # One encoding per value: re-encoding must reproduce the signed bytes exactly.
    if msgpack.packb(body, use_bin_type=True) != body_bytes:
        raise MembershipError(f"malformed {kind}: non-canonical encoding")
    return body, body_bytes, sig


def _fields(body: Mapping[str, Any], kind: str, spec: Mapping[str, type]) -> None:
    keys = set(body)
    if keys != set(spec):
        missing, extra = sorted(set(spec) - keys), sorted(keys - set(spec))
        raise MembershipError(f"malformed {kind}: missing fields {missing}, unexpected {extra}")
    for name, typ in spec.items():
        value = body[name]
        if typ is float:
            if type(value) not in (int, float) or not math.isfinite(value):
                raise MembershipError(f"malformed {kind}: {name} must be a finite number")
        elif type(value) is not typ:
            raise MembershipError(f"malformed {kind}: {name} must be a {typ.__name__}")


def _certificate_from(body: Mapping[str, Any]) -> Certificate:
    spec = {
        "peer_id": str,
        "provider_id": str,
        "serial": str,
        "issued_at": float,
        "expires_at": float,
        "authority_id": str,
    }
    _fields(body, KIND_CERT, spec)
    peer_public_key(body["peer_id"])
    _check_provider(body["provider_id"])
    _check_serial(body["serial"])
    _check_authority_id(body["authority_id"])
    if body["expires_at"] <= body["issued_at"]:
        raise MembershipError("malformed cert: expires before it is issued")
    return Certificate(
        peer_id=body["peer_id"],
        provider_id=body["provider_id"],
        serial=body["serial"],
        issued_at=float(body["issued_at"]),
        expires_at=float(body["expires_at"]),
        authority_id=body["authority_id"],
    )


def _revocation_from(body: Mapping[str, Any]) -> Revocation:
    spec = {"serial": str, "peer_id": str, "revoked_at": float, "reason": str, "authority_id": str}
    _fields(body, KIND_REVOCATION, spec)
    _check_serial(body["serial"])
    peer_public_key(body["peer_id"])
    _check_reason(body["reason"])
    _check_authority_id(body["authority_id"])
    return Revocation(
        serial=body["serial"],
        peer_id=body["peer_id"],
        revoked_at=float(body["revoked_at"]),
        reason=body["reason"],
        authority_id=body["authority_id"],
    )


def _check_signature(
    kind: str, body_bytes: bytes, sig: bytes, claimed_id: str, authority: PublicKey
) -> None:
    _require_ed25519(authority)
    expected_id = authority_id(authority)
    if claimed_id != expected_id:
        raise MembershipError(
            f"{kind} was issued by authority {claimed_id}, not by the expected {expected_id}"
        )
    if not authority.verify(_DOMAIN[kind] + body_bytes, sig):
        raise MembershipError(f"{kind} signature is invalid (tampered or forged)")


def _require_ed25519(key: PublicKey) -> None:
    if key.get_type() != KeyType.Ed25519:
        raise MembershipError("membership authority keys must be Ed25519")


def _check_time(value: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise MembershipError(f"{name} must be a finite unix time")
    return float(value)


def _check_provider(provider_id: str) -> None:
    if (
        not isinstance(provider_id, str)
        or not 1 <= len(provider_id) <= MAX_PROVIDER_LEN
        or not provider_id.isprintable()
        or any(ch.isspace() for ch in provider_id)
    ):
        raise MembershipError(
            f"provider id must be 1-{MAX_PROVIDER_LEN} printable characters without spaces"
        )


def _check_serial(serial: str) -> None:
    if not isinstance(serial, str) or not _SERIAL_RE.fullmatch(serial):
        raise MembershipError("serial must be 8-64 lowercase hex characters")


def _check_reason(reason: str) -> None:
    if not isinstance(reason, str) or len(reason) > MAX_REASON_LEN:
        raise MembershipError(f"revocation reason must be a string of at most {MAX_REASON_LEN}")


def _check_authority_id(value: str) -> None:
    if not re.fullmatch(r"[0-9a-f]{32}", value):
        raise MembershipError("malformed authority id")

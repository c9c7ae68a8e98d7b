"""Wire format for registry records: versioned msgpack, signed by the record's owner.

A signed record is ``{"v": 1, "body": <msgpack of the record dict>, "sig": <ed25519>}``.
The signature covers the exact body bytes, and the body names the owner's ``peer_id``;
for Ed25519 the peer id embeds the public key, so a receiver verifies with nothing but
the record itself. Anything malformed, oversized, unsigned or forged raises
``WireError``: callers drop it and count it, they never crash on it.
"""

from __future__ import annotations

from typing import Any

import msgpack
from libp2p.crypto.keys import PrivateKey
from libp2p.peer.id import ID

from otela.registry.records import NodeRecord

WIRE_VERSION = 1
MAX_RECORD_BYTES = 64 * 1024
MAX_BATCH_BYTES = 8 * 1024 * 1024


class WireError(ValueError):
    """A message that must be dropped: malformed, oversized, or failing verification."""


def sign_record(record: NodeRecord, key: PrivateKey) -> dict[str, Any]:
    """The signed envelope of ``record``; ``key`` must be the owner's identity key."""
    body = msgpack.packb(record.to_dict(), use_bin_type=True)
    if len(body) > MAX_RECORD_BYTES:
        raise WireError(f"record of {len(body)} bytes exceeds {MAX_RECORD_BYTES}")
    return {"v": WIRE_VERSION, "body": body, "sig": key.sign(body)}


def verify_record(envelope: Any) -> NodeRecord:
    """Parse and verify one envelope; the signer must be the peer the record names."""
    if not isinstance(envelope, dict) or envelope.get("v") != WIRE_VERSION:
        raise WireError("not a version-1 record envelope")
    body, sig = envelope.get("body"), envelope.get("sig")
    if not isinstance(body, bytes) or not isinstance(sig, bytes):
        raise WireError("envelope lacks body or signature bytes")
    if len(body) > MAX_RECORD_BYTES:
        raise WireError(f"record of {len(body)} bytes exceeds {MAX_RECORD_BYTES}")
    try:
        record = NodeRecord.from_dict(msgpack.unpackb(body, raw=False))
        public_key = ID.from_base58(record.peer_id).extract_public_key()
    except Exception as exc:  # any parse failure is the sender's fault, not ours
        raise WireError(f"malformed record: {exc}") from exc
    if public_key is None or not public_key.verify(body, sig):
        raise WireError(f"bad signature on record of session {record.session_id}")
    return record


def encode(message: dict[str, Any]) -> bytes:
    return msgpack.packb({"v": WIRE_VERSION, **message}, use_bin_type=True)


def decode(data: bytes, *, limit: int = MAX_BATCH_BYTES) -> dict[str, Any]:
    """Decode a top-level message, enforcing the size limit before parsing."""
    if len(data) > limit:
        raise WireError(f"message of {len(data)} bytes exceeds {limit}")
    try:
        message = msgpack.unpackb(data, raw=False, max_bin_len=limit, max_str_len=limit)
    except Exception as exc:
        raise WireError(f"undecodable message: {exc}") from exc
    if not isinstance(message, dict) or message.get("v") != WIRE_VERSION:
        raise WireError("not a version-1 message")
    return message


def encode_records(kind: str, envelopes: list[dict[str, Any]]) -> bytes:
    return encode({"kind": kind, "records": envelopes})


SignedRecord = tuple[NodeRecord, dict[str, Any]]


def decode_records(data: bytes, kind: str) -> tuple[list[SignedRecord], int]:
    """Verified (record, envelope) pairs of a ``kind`` message, and how many were dropped."""
    message = decode(data)
    if message.get("kind") != kind or not isinstance(message.get("records"), list):
        raise WireError(f"expected a {kind!r} message")
    records: list[SignedRecord] = []
    dropped = 0
    for envelope in message["records"]:
        try:
            records.append((verify_record(envelope), envelope))
        except WireError:
            dropped += 1
    return records, dropped

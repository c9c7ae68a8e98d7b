"""The assignment message: what to run, for whom, until when, signed by its issuer.

Wire format (version 1), in the style of membership certificates::

    envelope = msgpack {"v": 1, "kind": "assignment", "body": bin, "sig": bin(64)}
    body     = msgpack map of exactly the fields of ``Assignment``
    sig      = Ed25519(issuer key, DOMAIN + body)

``DOMAIN`` starts with ``0xc1`` (a byte msgpack never produces), so no other otela
signature (registry records, evictions, certificates, revocations) can be replayed as an
assignment or the reverse. ``issuer`` is either a node's peer id (its Ed25519 key is
embedded in the id) or ``otela-authority:<authority id>`` (the key comes from the
verifier's configuration). Over HTTP the envelope travels base64-encoded in a JSON body:
``POST /v1/assignments {"envelope": "<base64>"}``.

Pure: callers pass times, keys and bytes.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import secrets
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Final

import msgpack
from libp2p.crypto.keys import PrivateKey, PublicKey

from otela.registry.certificate import authority_id

WIRE_VERSION: Final = 1
KIND: Final = "assignment"
DOMAIN: Final = b"\xc1otela/assignment/v1\x00"
MAX_BYTES: Final = 8192
AUTHORITY_ISSUER: Final = "otela-authority:"
_ID_RE: Final = re.compile(r"[0-9a-f]{32}")
_PARAM_RE: Final = re.compile(r"[A-Za-z0-9_]{1,32}")
_SPEC: Final[Mapping[str, type]] = {
    "id": str, "issuer": str, "target": str, "issued_at": float, "expires_at": float,
    "engine": str, "model": str, "tp": int, "plan": str, "params": dict,
}


class AssignmentError(ValueError):
    """A message that is not a well-formed, correctly signed assignment."""


@dataclass(frozen=True)
class Assignment:
    """Start `engine` (a name in the node's allowlist) serving `model` with `tp` GPUs."""

    id: str  # 128 random bits, hex: the replay-protection nonce
    issuer: str  # a peer id, or "otela-authority:<authority id>"
    target: str  # peer id of the node that must run it
    issued_at: float
    expires_at: float
    engine: str
    model: str
    tp: int
    plan: str = ""  # free text for logs: which plan this replica belongs to
    params: Mapping[str, str] | None = None  # extra template values, names checked

    def body(self) -> dict[str, Any]:
        d = asdict(self)
        d["params"] = dict(self.params or {})
        return d


def new_id() -> str:
    return secrets.token_hex(16)


def issuer_for_peer(peer_id: str) -> str:
    return peer_id


def issuer_for_authority(public_key: PublicKey) -> str:
    return AUTHORITY_ISSUER + authority_id(public_key)


def sign(assignment: Assignment, key: PrivateKey) -> bytes:
    """The signed envelope of `assignment`; `key` must be the issuer's private key."""
    _check_fields(assignment.body())
    body: bytes = msgpack.packb(assignment.body(), use_bin_type=True)
    sig = key.sign(DOMAIN + body)
    data: bytes = msgpack.packb({"v": WIRE_VERSION, "kind": KIND, "body": body, "sig": sig},
                                use_bin_type=True)
    if len(data) > MAX_BYTES:
        raise AssignmentError(f"assignment would be {len(data)} bytes (limit {MAX_BYTES})")
    return data


def open_unverified(data: bytes) -> tuple[Assignment, bytes, bytes]:
    """Decode an envelope WITHOUT checking the signature: (assignment, signed bytes, sig).
    Only `decide.verify` may trust the result, after checking the signature."""
    if not isinstance(data, bytes | bytearray):
        raise AssignmentError("assignment must be bytes")
    if len(data) > MAX_BYTES:
        raise AssignmentError(f"assignment of {len(data)} bytes exceeds {MAX_BYTES}")
    env = _unpack(bytes(data))
    if not isinstance(env, dict) or set(env) != {"v", "kind", "body", "sig"}:
        raise AssignmentError("not an assignment envelope")
    if type(env["v"]) is not int or env["v"] != WIRE_VERSION:
        raise AssignmentError(f"unsupported assignment version {env['v']!r}")
    if env["kind"] != KIND:
        raise AssignmentError(f"not an assignment but a {env['kind']!r}")
    body, sig = env["body"], env["sig"]
    if not isinstance(body, bytes) or not isinstance(sig, bytes) or len(sig) != 64:
        raise AssignmentError("malformed assignment: bad body or signature field")
    fields = _unpack(body)
    if not isinstance(fields, dict):
        raise AssignmentError("malformed assignment: body is not a map")
    if msgpack.packb(fields, use_bin_type=True) != body:
        raise AssignmentError("malformed assignment: non-canonical encoding")
    _check_fields(fields)
    return Assignment(**{**fields, "issued_at": float(fields["issued_at"]),
                         "expires_at": float(fields["expires_at"])}), body, sig


def check_signature(body: bytes, sig: bytes, key: PublicKey) -> bool:
    try:
        return bool(key.verify(DOMAIN + body, sig))
    except Exception:  # a malformed key or signature is simply not valid
        return False


def to_http(data: bytes) -> dict[str, str]:
    """The JSON body of ``POST /v1/assignments``."""
    return {"envelope": base64.b64encode(data).decode("ascii")}


def from_http(payload: Any) -> bytes:
    """The envelope bytes from a ``POST /v1/assignments`` JSON body."""
    if not isinstance(payload, dict) or not isinstance(payload.get("envelope"), str):
        raise AssignmentError('expected a JSON object {"envelope": "<base64>"}')
    text = payload["envelope"]
    if len(text) > MAX_BYTES * 2:
        raise AssignmentError("envelope too large")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise AssignmentError("envelope is not valid base64") from None


def _unpack(data: bytes) -> Any:
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True)
    except Exception:  # msgpack raises many types on junk; all mean the same here
        raise AssignmentError("malformed assignment: not valid msgpack") from None


def _check_fields(fields: Mapping[str, Any]) -> None:
    if set(fields) != set(_SPEC):
        missing, extra = sorted(set(_SPEC) - set(fields)), sorted(set(fields) - set(_SPEC))
        raise AssignmentError(f"malformed assignment: missing {missing}, unexpected {extra}")
    for name, typ in _SPEC.items():
        value = fields[name]
        if typ is float:
            if type(value) not in (int, float) or not math.isfinite(value):
                raise AssignmentError(f"malformed assignment: {name} must be a finite number")
        elif type(value) is not typ:
            raise AssignmentError(f"malformed assignment: {name} must be a {typ.__name__}")
    if not _ID_RE.fullmatch(fields["id"]):
        raise AssignmentError("malformed assignment: id must be 32 lowercase hex characters")
    if not 1 <= fields["tp"] <= 64:
        raise AssignmentError("malformed assignment: tp must be between 1 and 64")
    for name in ("issuer", "target", "engine", "model", "plan"):
        if len(fields[name]) > 256:
            raise AssignmentError(f"malformed assignment: {name} longer than 256 characters")
    params = fields["params"]
    if len(params) > 16 or not all(
        isinstance(k, str) and _PARAM_RE.fullmatch(k) and isinstance(v, str) and len(v) <= 256
        for k, v in params.items()
    ):
        raise AssignmentError("malformed assignment: params must be up to 16 short "
                              "name=string pairs")
    if fields["expires_at"] <= fields["issued_at"]:
        raise AssignmentError("malformed assignment: expires before it is issued")

"""Builders for registry tests: entries without signatures (the CRDT is pure) and signed ones."""

from __future__ import annotations

import dataclasses
import hashlib

from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.keys import KeyPair
from libp2p.peer.id import ID

from otela.registry.crdt import Entry, tiebreak_of
from otela.registry.records import Lifecycle, ModelInfo, NodeRecord
from otela.registry.session import session_id_for


def sid(name: str, peer_id: str | None = None) -> str:
    """The session id a test calls ``name``: owned by ``peer_id`` (default ``peer-<name>``),
    as every session id in a registry must be (``otela.registry.session``)."""
    digest = hashlib.blake2b(name.encode(), digest_size=8).hexdigest()
    # An epoch (the nonce's first 11 hex digits) in 1970, distinct per name: sessions of one
    # peer are ordered by it, and no test time precedes it.
    return session_id_for(peer_id or f"peer-{name}", "000000" + digest[:10])


def record(session: str, version: int = 1, state: Lifecycle = Lifecycle.JOIN,
           models: tuple[str, ...] = ("m",), updated_at: float = 1000.0,
           peer_id: str | None = None, provider: str = "p") -> NodeRecord:
    """A record of the session the test calls ``session`` (its id is ``sid(session)``)."""
    return NodeRecord(
        session_id=sid(session, peer_id), peer_id=peer_id or f"peer-{session}",
        provider_id=provider, state=state, version=version, http_url=f"http://{session}",
        models=tuple(ModelInfo(m) for m in models), updated_at=updated_at,
    )


def entry(session: str, version: int = 1, state: Lifecycle = Lifecycle.JOIN,
          updated_at: float = 1000.0, salt: str = "", **kw: object) -> Entry:
    """An unsigned entry whose proof is itself, so pure tests can ship entries around."""
    rec = record(session, version, state, updated_at=updated_at, **kw)  # type: ignore[arg-type]
    e = Entry(key=rec.session_id, state=state, version=version, updated_at=updated_at,
              tiebreak=tiebreak_of(f"{session}|{version}|{state}|{salt}".encode()), record=rec)
    object.__setattr__(e, "proof", e)  # frozen: the entry ships itself as its own proof
    return e


@dataclasses.dataclass
class Node:
    keys: KeyPair
    peer_id: str


def new_node() -> Node:
    keys = create_new_key_pair()
    return Node(keys, ID.from_pubkey(keys.public_key).to_base58())

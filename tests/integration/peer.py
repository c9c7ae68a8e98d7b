"""An in-process otela peer for tests: real libp2p host, real admission and replication
protocols, but a registry the test may fill with anything, forged envelopes included."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import multiaddr
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.tools.anyio_service import background_trio_service

from otela.identity import Identity
from otela.mesh.host import build_host
from otela.registry.crdt import Entry, GCPolicy, tiebreak_of
from otela.registry.records import Lifecycle, NodeRecord
from otela.registry.session import new_session_id
from otela.replication import LocalReplica


def new_identity() -> Identity:
    keys = create_new_key_pair()
    return Identity(keys, ID.from_pubkey(keys.public_key))


@asynccontextmanager
async def running_peer(
    home: Path, identity: Identity | None = None, *, authority: Any = None,
    certificate: bytes | None = None,
) -> AsyncIterator[LocalReplica]:
    identity = identity or new_identity()
    mesh = build_host(identity, "127.0.0.1", 0)
    replica = LocalReplica(
        identity, mesh, home, policy=GCPolicy(), authority=authority, certificate=certificate,
        anti_entropy_interval=3600.0,
    )
    replica.install(mesh.host)
    async with (
        mesh.host.run(listen_addrs=[mesh.listen_addr]),
        background_trio_service(mesh.pubsub),
        background_trio_service(mesh.gossipsub),
    ):
        await mesh.pubsub.wait_until_ready()
        async with trio.open_nursery() as nursery:
            await nursery.start(replica.run, mesh.host)
            yield replica
            nursery.cancel_scope.cancel()


async def connect(replica: LocalReplica, addr: str) -> ID:
    info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
    with trio.fail_after(10):
        await replica.replicator.mesh.host.connect(info)
    return info.peer_id


def plant(replica: LocalReplica, envelope: dict[str, Any], now: float) -> None:
    """Put an unverified envelope into the peer's map (under a placeholder session of its
    own) so anti-entropy offers it to others, who must verify and refuse it."""
    placeholder = f"planted-{secrets.token_hex(6)}"  # a peer of its own: one session each
    session = new_session_id(placeholder, int(now * 1000))
    record = NodeRecord(session, placeholder, "x", Lifecycle.SERVING, 99, "http://x",
                        updated_at=now)
    replica.registry.map.merge(
        Entry(session, Lifecycle.SERVING, 99, now, tiebreak_of(envelope["sig"]), record,
              proof=envelope),
        now,
    )

"""Peering keeps a bounded random degree without churning (otela.mesh.peering)."""

from __future__ import annotations

import dataclasses
import random

import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from otela.mesh.peering import Peering
from otela.registry.store import Registry

from .registry_helpers import entry


class FakeNetwork:
    def unblock_peer(self, peer_id: ID) -> None:
        pass


class FakeHost:
    """Just the calls peering makes; dials always succeed."""

    def __init__(self, me: ID, connected: set[ID]) -> None:
        self.me, self.connected = me, set(connected)
        self.dialed: list[ID] = []
        self.closed: list[ID] = []

    def get_id(self) -> ID:
        return self.me

    def get_connected_peers(self) -> list[ID]:
        return list(self.connected)

    def get_network(self) -> FakeNetwork:
        return FakeNetwork()

    async def connect(self, info: object) -> None:
        peer_id = info.peer_id  # type: ignore[attr-defined]
        self.dialed.append(peer_id)
        self.connected.add(peer_id)

    async def disconnect(self, peer_id: ID) -> None:
        self.closed.append(peer_id)
        self.connected.discard(peer_id)


def federation(size: int) -> tuple[ID, list[ID], Registry]:
    ids = [ID.from_pubkey(create_new_key_pair().public_key) for _ in range(size + 1)]
    registry = Registry()
    for i, peer_id in enumerate(ids):
        e = entry(f"s{i}", peer_id=peer_id.to_base58())
        rec = dataclasses.replace(e.record, addrs=(f"/ip4/127.0.0.1/tcp/{4000 + i}",))
        e = dataclasses.replace(e, record=rec)
        object.__setattr__(e, "proof", e)
        registry.apply(e, now=1000.0)
    return ids[0], ids[1:], registry


def peering(host: FakeHost, registry: Registry, trimmed: list[str]) -> Peering:
    async def on_trim(peer_id: str) -> None:
        assert peer_id not in {p.to_base58() for p in host.closed}  # told before closing
        trimmed.append(peer_id)

    return Peering(host, registry, low=4, target=6, high=10, on_trim=on_trim,
                   rng=random.Random(3))


def test_below_low_dials_random_peers_up_to_target():
    me, others, registry = federation(20)
    host = FakeHost(me, set(others[:2]))
    trio.run(peering(host, registry, []).step)
    assert len(host.connected) == 6
    assert me not in host.dialed and not set(host.dialed) & set(others[:2])


def test_between_low_and_high_nothing_changes():
    """The wide band is what keeps an idle mesh still: no dial, no trim."""
    me, others, registry = federation(20)
    for degree in (4, 5, 7, 10):
        host = FakeHost(me, set(others[:degree]))
        trio.run(peering(host, registry, []).step)
        assert host.dialed == [] and host.closed == []


def test_above_high_trims_only_the_excess_and_says_so_first():
    me, others, registry = federation(20)
    trimmed: list[str] = []
    host = FakeHost(me, set(others[:13]))
    trio.run(peering(host, registry, trimmed).step)
    assert len(host.connected) == 10
    assert sorted(trimmed) == sorted(p.to_base58() for p in host.closed)
    assert len(trimmed) == 3


def test_kept_peers_are_never_trimmed():
    me, others, registry = federation(20)
    relays = {p.to_base58() for p in others[:10]}
    host = FakeHost(me, set(others[:12]))
    p = Peering(host, registry, low=4, target=6, high=10, keep=lambda: relays)
    trio.run(p.step)
    assert not {c.to_base58() for c in host.closed} & relays

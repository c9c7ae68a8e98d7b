"""Gossip forwarded by a peer counts as contact with it (the detector's third path)."""

from __future__ import annotations

from types import SimpleNamespace

from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from otela.mesh.replication import Replicator


def peer() -> ID:
    return ID.from_pubkey(create_new_key_pair().public_key)


class Admission:
    def __init__(self, admitted: set[ID]) -> None:
        self.admitted = admitted

    def is_admitted(self, peer_id: ID) -> bool:
        return peer_id in self.admitted


def replicator(admitted: set[ID]) -> tuple[Replicator, list[str]]:
    me = peer()
    mesh = SimpleNamespace(host=SimpleNamespace(get_id=lambda: me))
    rep = Replicator(mesh, registry=None, admission=Admission(admitted),  # type: ignore[arg-type]
                     anti_entropy_interval=10.0)
    heard: list[str] = []
    rep.on_heard = heard.append
    return rep, heard


def test_a_forwarder_is_heard_from_even_when_it_did_not_sign_the_message() -> None:
    forwarder, origin = peer(), peer()
    rep, heard = replicator({forwarder})
    message = SimpleNamespace(data=b"not msgpack", from_id=origin.to_bytes())
    assert not rep._validate_gossip(forwarder, message)  # bad content is still rejected
    assert heard == [forwarder.to_base58()]


def test_an_unadmitted_forwarder_is_not_contact() -> None:
    stranger = peer()
    rep, heard = replicator(set())
    assert not rep._validate_gossip(stranger, SimpleNamespace(data=b"", from_id=b""))
    assert heard == []

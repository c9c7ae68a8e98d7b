"""What replication tells the failure detector: contact with forwarders (its third probe
path) and how late gossip arrives (its eviction waits)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from otela.replication.replicator import GossipLag, Replicator


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


def test_gossip_lag_follows_late_deltas_and_fades_without_news() -> None:
    lag = GossipLag()
    assert lag.value(0.0) == 0.0
    for _ in range(20):
        lag.observe(40.0, now=100.0)  # deltas signed 40 s before we applied them
    assert lag.value(100.0) == pytest.approx(40.0, rel=0.01)
    assert lag.value(130.0) == pytest.approx(20.0, rel=0.01)  # half-life 30 s
    lag.observe(-5.0, now=130.0)  # a signer's clock ahead of ours counts as no delay
    assert lag.value(130.0) < 20.0
    wild = GossipLag()
    wild.observe(10_000.0, now=0.0)  # a badly skewed clock is capped
    assert wild.value(0.0) <= GossipLag.CAP_S

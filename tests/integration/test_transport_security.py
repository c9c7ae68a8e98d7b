"""Every libp2p connection to a node is Noise-encrypted: plaintext peers are refused."""

from __future__ import annotations

import multiaddr
import pytest
import trio
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.security.insecure.transport import PLAINTEXT_PROTOCOL_ID, InsecureTransport
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport

pytestmark = pytest.mark.slow


async def _dial(host, addr: str) -> None:
    async with host.run(listen_addrs=[multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
        with trio.fail_after(10):
            await host.connect(info_from_p2p_addr(multiaddr.Multiaddr(addr)))


def test_a_plaintext_only_peer_cannot_connect(federation):
    node = federation.start_node("node")
    key_pair = create_new_key_pair()
    plaintext_host = new_host(
        key_pair=key_pair,
        sec_opt={TProtocol(PLAINTEXT_PROTOCOL_ID): InsecureTransport(key_pair)},
    )
    with pytest.raises(Exception) as failure:
        trio.run(_dial, plaintext_host, node.multiaddr)
    assert not isinstance(failure.value, trio.TooSlowError)  # refused, not merely slow


def test_a_noise_peer_connects(federation):
    node = federation.start_node("node")
    key_pair = create_new_key_pair()
    noise = NoiseTransport(key_pair, noise_privkey=create_x25519_key_pair().private_key)
    noise_host = new_host(key_pair=key_pair, sec_opt={NOISE_PROTOCOL_ID: noise})
    trio.run(_dial, noise_host, node.multiaddr)  # the control: same dial, Noise offered

"""Build a py-libp2p host tuned for otela (see docs/mesh.md for why each setting).

Workarounds for py-libp2p 0.8.1, measured on these machines (../shared/reference); the
process-wide ones live in ``workarounds.py``:
- B3: spam protection silently dropped bursts over 10 msg/s per peer and topic.
- B4/B5: GossipSub v1.2's per-message IDONTWANT doubled gossip latency; speak 1.1/1.0.
- B7: the heartbeat defaulted to 120 s, so meshes formed slowly; use 1 s like go/js.
- B8: some libp2p loggers are noisy on normal stream closes.
- The swarm's AutoConnector (on by default) dials peers from the peerstore until it holds
  ~200 connections, every 30 s and after every disconnect. Our peerstore knows every
  member, so it fought peering's bounded random degree: peering trimmed, the connector
  redialed, ~5 new connections per second in an idle 16-node federation, each a Noise
  handshake plus identify and GossipSub hellos on both ends. Peering owns the degree, so
  the connector is switched off.
- Security: ``new_host`` also offers secio and *plaintext* when a peer asks for them;
  otela offers Noise only, and Yamux only, so every connection is encrypted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import multiaddr
from libp2p import new_host
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, GossipSub
from libp2p.pubsub.pubsub import Pubsub
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_PROTOCOL_ID
from libp2p.stream_muxer.yamux.yamux import Yamux

from otela.identity import Identity
from otela.mesh import workarounds

workarounds.apply()

GOSSIP_DEGREE = 6
GOSSIP_DEGREE_LOW = 4
GOSSIP_DEGREE_HIGH = 12
GOSSIP_HEARTBEAT_S = 1


def quiet_libp2p_logs(level: int = logging.ERROR) -> None:
    logging.getLogger("libp2p").setLevel(level)
    logging.getLogger("multiaddr").setLevel(level)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise


@dataclass
class MeshHost:
    host: Any  # libp2p IHost (untyped library)
    pubsub: Pubsub
    gossipsub: GossipSub
    listen_addr: multiaddr.Multiaddr


def build_host(identity: Identity, listen_host: str, port: int) -> MeshHost:
    """A TCP + Noise + Yamux host with GossipSub, not yet running."""
    listen = multiaddr.Multiaddr(f"/ip4/{listen_host}/tcp/{port}")
    noise = NoiseTransport(
        identity.key_pair, noise_privkey=create_x25519_key_pair().private_key
    )
    host = new_host(
        key_pair=identity.key_pair,
        listen_addrs=[listen],
        sec_opt={NOISE_PROTOCOL_ID: noise},
        muxer_opt={TProtocol(YAMUX_PROTOCOL_ID): Yamux},
    )
    gossipsub = GossipSub(
        [PROTOCOL_ID_V11, PROTOCOL_ID],
        degree=GOSSIP_DEGREE,
        degree_low=GOSSIP_DEGREE_LOW,
        degree_high=GOSSIP_DEGREE_HIGH,
        heartbeat_interval=GOSSIP_HEARTBEAT_S,
        spam_protection_enabled=False,
    )
    pubsub = Pubsub(host, gossipsub)
    _disable_auto_connector(host)
    return MeshHost(host=host, pubsub=pubsub, gossipsub=gossipsub, listen_addr=listen)


def _disable_auto_connector(host: Any) -> None:
    """Keep py-libp2p's AutoConnector from ever starting (see the module docstring)."""
    connector = host.get_network().auto_connector

    async def stay_stopped() -> None:
        connector._started = False

    connector.start = stay_stopped

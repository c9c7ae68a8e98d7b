"""Circuit relay v2 for one host: offer reservations (``--relay``), reserve, dial circuits.

Built on py-libp2p 0.8.1's ``CircuitV2Protocol``/``CircuitV2Transport`` with the workarounds
measured in docs/nat.md:
- every node runs the STOP side (it accepts relayed connections); only ``--relay`` nodes
  serve HOP;
- the transport gets ``RelayRole.STOP`` only: with CLIENT, every dial sends an extra
  RESERVE first, costing a round trip and a reservation slot on the relay;
- reservations are made explicitly (the library's auto-reserve scans every 300 s and misses
  relays connected after it started), and the circuit address is built here because the
  library never adds it to ``host.get_addrs()``;
- the swarm never dials ``/p2p-circuit`` addresses, so ``dial`` calls the transport;
- the relay's limits are raised: by default each circuit dies after 1 h or 1 GiB, which would
  cut long-lived data-path streams.
"""

from __future__ import annotations

from typing import Any

import multiaddr
import trio
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.resources import RelayLimits
from libp2p.relay.circuit_v2.transport import CircuitV2Transport

CIRCUIT = "/p2p-circuit"
RESERVE_TIMEOUT_S = 10.0
DIAL_TIMEOUT_S = 10.0

# A relay is infrastructure a federation runs on purpose, so it is generous: one circuit may
# carry an inference stream for a day, and 256 NAT'd nodes may hold a slot each.
LIMITS = RelayLimits(
    duration=24 * 3600,
    data=1 << 40,
    max_circuit_conns=256,
    max_reservations=256,
    reservation_ttl=3600,
)


class RelayError(Exception):
    """A reservation or a relayed dial failed; the message says which relay and why."""


def is_circuit(addr: str) -> bool:
    return CIRCUIT in addr


def circuit_addr(relay_addr: str, relay_id: str, own_id: str) -> str:
    """``<relay addr>/p2p/<relay>/p2p-circuit/p2p/<us>``, the address peers dial us at."""
    base = relay_addr if f"/p2p/{relay_id}" in relay_addr else f"{relay_addr}/p2p/{relay_id}"
    return f"{base}{CIRCUIT}/p2p/{own_id}"


class Relay:
    """The relay protocol pieces of one host. Run ``protocol`` as a background service."""

    def __init__(self, host: Any, *, offer: bool) -> None:
        self.host = host
        self.offer = offer
        self.protocol = CircuitV2Protocol(host, limits=LIMITS, allow_hop=offer)
        self.transport = CircuitV2Transport(
            host, self.protocol, RelayConfig(roles=RelayRole.STOP, limits=LIMITS)
        )

    async def reserve(self, relay: PeerInfo, nursery: trio.Nursery) -> list[str]:
        """Reserve a slot on ``relay``; returns our circuit addresses through it.

        ``nursery`` hosts the library's refresh worker (it re-reserves before expiry).
        """
        try:
            with trio.fail_after(RESERVE_TIMEOUT_S):
                if relay.peer_id not in self.host.get_connected_peers():
                    self.host.get_network().unblock_peer(relay.peer_id)
                    await self.host.connect(relay)
                stream = await self.host.new_stream(relay.peer_id, [HOP_PROTOCOL])
                try:
                    ok = await self.transport.reserve(stream, relay.peer_id, nursery)
                finally:
                    await stream.close()
        except trio.TooSlowError:
            raise RelayError(
                f"relay {relay.peer_id}: no answer in {RESERVE_TIMEOUT_S:.0f}s"
            ) from None
        except Exception as exc:  # the library raises many types for one failed exchange
            raise RelayError(f"relay {relay.peer_id}: {type(exc).__name__}: {exc}") from exc
        if not ok:
            raise RelayError(f"relay {relay.peer_id} refused the reservation (not a relay or full)")
        own = self.host.get_id().to_base58()
        rid = relay.peer_id.to_base58()
        return [circuit_addr(str(a), rid, own) for a in relay.addrs if not is_circuit(str(a))]

    def holds_reservation(self, relay_id: ID) -> bool:
        """Whether our reservation on ``relay_id`` is still usable (connected, not expired)."""
        return (
            relay_id in self.host.get_connected_peers()
            and relay_id in self.transport._reservations  # the library keeps no public view
        )

    async def dial(self, addr: str) -> None:
        """Open a relayed connection to the peer at circuit address ``addr``."""
        try:
            with trio.fail_after(DIAL_TIMEOUT_S):
                await self.transport.dial(multiaddr.Multiaddr(addr))
        except trio.TooSlowError:
            raise RelayError(f"{addr}: relayed dial timed out ({DIAL_TIMEOUT_S:.0f}s)") from None
        except Exception as exc:
            raise RelayError(f"{addr}: {type(exc).__name__}: {exc}") from exc

"""What kind of libp2p connection we hold to a peer: direct, or through a relay circuit.

One predicate for every place that asks (NAT traversal's connection log, the dial-back
check, which must ignore addresses observed over a relay, and the libp2p data path, which
moves new requests to a direct connection once hole punching made one).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from libp2p.abc import INotifee
from libp2p.peer.id import ID

from otela.mesh.circuit_relay import is_circuit


def _addresses(conn: Any) -> list[str] | None:
    try:
        return [str(a) for a in conn.get_transport_addresses()]
    except Exception:
        return None  # not a connection that can tell (closed, or another kind)


def is_relayed(conn: Any) -> bool:
    """Whether a (muxed) connection runs through a relay circuit: its transport addresses
    are ``/p2p-circuit`` ones. ``False`` when the connection cannot tell."""
    return any(is_circuit(a) for a in _addresses(conn) or ())


def connection_kinds(host: Any, peer_id: ID) -> set[str]:
    """``{"direct", "relayed"}`` subset describing our live connections to ``peer_id``."""
    conns = host.get_network().get_connections(peer_id)
    kinds = set()
    for conn in conns if isinstance(conns, list) else [conns]:
        addrs = _addresses(conn)
        if addrs is not None:
            kinds.add("relayed" if any(is_circuit(a) for a in addrs) else "direct")
    return kinds


def remote_ips(host: Any, peer_id: ID) -> set[str]:
    """The IPs our direct connections to ``peer_id`` run to (empty when it cannot tell):
    whether a peer is on this host (loopback), the same network, or elsewhere."""
    conns = host.get_network().get_connections(peer_id)
    ips = set()
    for conn in conns if isinstance(conns, list) else [conns]:
        for addr in _addresses(conn) or ():
            parts = addr.split("/")
            if not is_circuit(addr) and len(parts) > 2 and parts[1] in ("ip4", "ip6"):
                ips.add(parts[2])
    return ips


class OnConnected(INotifee):
    """Calls ``on_connected`` with the peer id (base58) of every new connection, even one
    gone before anyone could look (register with ``network.register_notifee``). The
    callback runs inside the network's own task: it must only note the peer down."""

    def __init__(self, on_connected: Callable[[str], None]) -> None:
        self.on_connected = on_connected

    async def connected(self, network: Any, conn: Any) -> None:
        self.on_connected(conn.muxed_conn.peer_id.to_base58())

    async def disconnected(self, network: Any, conn: Any) -> None:
        pass

    async def opened_stream(self, network: Any, stream: Any) -> None:
        pass

    async def closed_stream(self, network: Any, stream: Any) -> None:
        pass

    async def listen(self, network: Any, multiaddr: Any) -> None:
        pass

    async def listen_close(self, network: Any, multiaddr: Any) -> None:
        pass

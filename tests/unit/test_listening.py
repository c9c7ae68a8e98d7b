"""Is anything listening at a peer's addresses (otela.mesh.listening)? Real sockets."""

from __future__ import annotations

import socket

import multiaddr
import trio

from otela.mesh.listening import accepts_connections, direct_tcp_addresses, nothing_listens

PEER = "12D3KooWJE9nLNFixEDUrz7A8afy1fdg9NNjVEGigG9nEBFg9Yhr"


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_only_plain_tcp_addresses_are_checked() -> None:
    addrs = [multiaddr.Multiaddr(a) for a in (
        f"/ip4/10.1.2.3/tcp/4001/p2p/{PEER}",
        "/ip6/::1/tcp/4002",
        f"/ip4/10.9.9.9/tcp/4001/p2p/{PEER}/p2p-circuit/p2p/{PEER}",  # relayed
        "/ip4/10.1.2.3/udp/4001/quic-v1",
    )]
    assert direct_tcp_addresses(addrs) == [("10.1.2.3", 4001), ("::1", 4002)]


def test_every_address_refusing_means_nothing_listens() -> None:
    assert trio.run(nothing_listens, [("127.0.0.1", closed_port()),
                                      ("127.0.0.1", closed_port())])


def test_one_listener_or_no_address_means_it_may_be_there() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        live = ("127.0.0.1", int(listener.getsockname()[1]))
        assert not trio.run(nothing_listens, [("127.0.0.1", closed_port()), live])
    assert not trio.run(nothing_listens, [])



def test_accepts_connections_only_where_a_process_listens() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        assert trio.run(accepts_connections, "127.0.0.1", int(listener.getsockname()[1]))
    assert not trio.run(accepts_connections, "127.0.0.1", closed_port())

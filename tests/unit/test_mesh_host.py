"""The py-libp2p host otela builds (otela.mesh.host)."""

import trio

from otela.identity import load_or_create
from otela.mesh.host import build_host


def test_the_swarms_auto_connector_never_starts(tmp_path):
    """py-libp2p's AutoConnector dials every peer in the peerstore (all members, for us)
    towards ~200 connections and fights peering's bounded degree; it must stay off even
    when the swarm starts it."""
    mesh = build_host(load_or_create(tmp_path), "127.0.0.1", 0)
    connector = mesh.host.get_network().auto_connector
    trio.run(connector.start)
    assert connector._started is False
    trio.run(connector.maybe_connect)  # returns at once: nothing to dial, nothing raised

"""Joining and peering at scale: many nodes through one bootstrap, and bootstrap lists."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator

import pytest

from otela.testing.localfed import LocalNode, wait_for

from .helpers import CONVERGE_S

pytestmark = pytest.mark.slow


def test_twelve_nodes_converge_through_one_bootstrap_and_peer_randomly(federation):
    boot = federation.start_node("boot")
    nodes = [boot] + [federation.start_node(f"n{i:02d}", bootstrap=[boot], wait=False)
                      for i in range(11)]
    for node in nodes[1:]:
        federation.wait_started(node, node.home / "status.json", 60.0)
    everyone = {n.session_id for n in nodes}
    for node in nodes:
        wait_for(lambda node=node: set(node.states()) == everyone, 2 * CONVERGE_S,
                 f"{node.name} to list all 12 nodes")
    # Each node keeps several random connections, not only the one to the bootstrap node
    # (a hub-only topology makes GossipSub flap); trimming above the band's upper bound is
    # covered by tests/unit/test_peering.py, 12 nodes never reach it.
    boot_id = boot.status["peer_id"]

    def random_neighbours(node: LocalNode) -> int:
        watching = node.get("/v1/network")["liveness"]["watching"]
        return len(set(watching) - {boot_id})

    wait_for(lambda: all(n.get("/v1/health")["connected_peers"] >= 4 for n in nodes[1:]),
             CONVERGE_S, "every node to hold at least 4 connections")
    wait_for(lambda: all(random_neighbours(n) >= 3 for n in nodes[1:]), CONVERGE_S,
             "every node to be connected to at least 3 peers besides the bootstrap node")


@pytest.fixture
def bootstrap_list_server() -> Iterator[tuple[str, dict]]:
    """Serves ``state["body"]`` at /peers.json, or 503 while it is None."""
    state: dict = {"body": None, "hits": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state["hits"] += 1
            if state["body"] is None:
                self.send_response(503)
                self.end_headers()
                return
            data = state["body"].encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/peers.json", state
    finally:
        server.shutdown()
        thread.join()


def test_bootstrap_from_a_url_that_answers_late(federation, bootstrap_list_server):
    url, state = bootstrap_list_server
    boot = federation.start_node("boot")
    joiner = federation.start_node("joiner", extra_args=["--bootstrap", url])
    wait_for(lambda: state["hits"] >= 2, CONVERGE_S, "the joiner to retry the unavailable list")
    state["body"] = json.dumps({"peers": ["not a multiaddr", boot.multiaddr]})
    wait_for(lambda: set(joiner.states()) == {boot.session_id, joiner.session_id},
             2 * CONVERGE_S, "the joiner to join through the listed bootstrap peer")
    assert joiner.process.poll() is None

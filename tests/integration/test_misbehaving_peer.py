"""A member sending junk on every protocol crashes, blocks and corrupts nothing.

The misbehaving member (``tests/integration/misbehaving_peer.py``) is a real otela daemon in
its own OS process, admitted like any member, that sends malformed gossip, registry
records, anti-entropy, SWIM and ``/otela/http/2`` frames, junk load reports, and floods of
streams to an ingress and a serving node, and answers the requests routed to it with
malformed frames. Afterwards every honest node is up, its registry holds exactly what the
honest members wrote, the ingress still serves, no node logged a traceback, and what the
junk cost (open streams, memory) stayed bounded.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from otela.mesh.quota import AE_STREAMS, HTTP_STREAMS, SWIM_STREAMS
from otela.registry.records import MAX_INT
from otela.testing.http_fuzz import traceback_in
from otela.testing.localfed import (
    LocalFederation,
    LocalNode,
    echo_engine_command,
    free_port,
    wait_for,
)

from .helpers import CONVERGE_S, chat, serving_node, wait_state
from .misbehaving_peer import ROUND

pytestmark = pytest.mark.slow

MODEL = "echo-honest"
BAD_MODEL = "echo-misbehaving"
ROUNDS = 2
CAPS = {"/otela/swim/2.0.0": SWIM_STREAMS, "/otela/http/2": HTTP_STREAMS,
        "/otela/registry/ae/1.0.0": AE_STREAMS}
# What the junk may cost a node in resident memory (measured: about +4 MiB).
MAX_RSS_GROWTH = 32 * 1024 * 1024


def rss(node: LocalNode) -> int:
    for line in Path(f"/proc/{node.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {node.name}")


def observations(peer: LocalNode) -> list[dict[str, Any]]:
    lines = peer.log_path.read_text(errors="replace").splitlines()
    return [json.loads(line[len("abuse: "):]) for line in lines
            if line.startswith("abuse: {")]


def honest_view(node: LocalNode) -> dict[str, tuple[Any, ...]]:
    """What the honest members wrote, as ``node`` sees it (versions and times aside: the
    owners may re-sign their records meanwhile)."""
    return {n["session_id"]: (n["peer_id"], n["provider_id"], n["state"], n["http_url"],
                              [m["id"] for m in n["models"]], n["evicted_by"])
            for n in node.nodes()}


def test_a_misbehaving_member_crashes_blocks_and_corrupts_nothing(federation: LocalFederation):
    started = time.monotonic()
    boot = federation.start_node("boot", ingress=True)
    honest = serving_node(federation, "honest", boot, MODEL)
    wait_state(boot, honest, "SERVING")
    wait_for(lambda: boot.session_id in honest.states(), CONVERGE_S, "honest to see boot")
    honest_nodes = [boot, honest]
    before = {n.name: honest_view(n) for n in honest_nodes}
    memory = {n.name: rss(n) for n in honest_nodes}

    launcher = [sys.executable, "-m", "tests.integration.misbehaving_peer",
                "--rounds", str(ROUNDS), "--model", MODEL]
    peer = federation.start_node(
        "misbehaving", bootstrap=[boot], launcher=launcher, provider_id="prov-misbehaving",
        process=echo_engine_command(free_port(), [BAD_MODEL]))
    wait_for(lambda: peer.log_tail(3000).count(ROUND) >= ROUNDS
             or peer.process.poll() is not None, 40.0, "the misbehaving member's rounds")
    assert peer.process.poll() is None, peer.log_tail(60)
    seen = observations(peer)

    for node in honest_nodes:
        # Up, and its registry holds what the honest members wrote and the member's sane own.
        assert node.process.poll() is None, node.log_tail(60)
        health = node.get("/v1/health")
        assert health["status"] == "ok"
        view = honest_view(node)
        assert set(view) == {*before[node.name], peer.session_id}, view
        for session, entry in before[node.name].items():
            assert view[session] == entry, (node.name, session)
        records = {n["session_id"]: n for n in node.nodes()}
        assert 0 <= records[peer.session_id]["version"] <= MAX_INT
        assert records[peer.session_id]["state"] == "SERVING"
        # The junk arrived and was refused, not ignored for lack of delivery.
        replication = health["replication"]
        assert replication.get("gossip_invalid", 0) + replication.get("gossip_rejected", 0) \
            >= 10, replication
        assert replication.get("ae_rejected", 0) + replication.get("ae_failed", 0) >= 4
        assert health["liveness"]["malformed_news"] >= 1
        # Streams: floods were cut at each peer's cap, and nothing is left open past it.
        streams = health["inbound_streams"]
        for protocol in ("/otela/swim/2.0.0", "/otela/http/2", "/otela/registry/ae/1.0.0"):
            assert streams[protocol]["refused"] > 0, (node.name, streams)
        for protocol, cap in CAPS.items():
            if protocol in streams:
                assert streams[protocol]["open"] <= cap * 2, (node.name, protocol, streams)
        assert len(health["refused_peers"]) == 0  # an open federation refuses nobody
        memory[node.name] = rss(node) - memory[node.name]
        assert memory[node.name] < MAX_RSS_GROWTH, node.name
        for log in (node.log_path, node.home / "logs" / "engine.log"):
            assert not traceback_in(log), f"{log}:\n{traceback_in(log)}"

    # Malformed requests over /otela/http/2 were answered 400, never relayed.
    http = [o["answers"] for o in seen if o.get("protocol") == "http"]
    assert len(http) == ROUNDS * len(honest_nodes), seen
    for answers in http:
        assert answers and all(a == ["ERROR", 400] for a in answers.values()), answers
    # Floods of 20-60 streams at once: each peer keeps at most its cap open.
    floods = [o["kept_open"] for o in seen if "kept_open" in o]
    assert len(floods) == ROUNDS * len(honest_nodes), seen
    for flood in floods:
        assert set(flood) >= {"/otela/swim/2.0.0", "/otela/http/2"}, flood
        for protocol, kept in flood.items():
            if protocol in CAPS:  # ping is py-libp2p's own: served, not capped
                assert kept <= CAPS[protocol], flood

    # The ingress still serves the honest model, and the member's malformed answers to the
    # requests routed to it are upstream failures (502), never a 500.
    for i in range(10):
        response = chat(boot, MODEL, f"after {i}")
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["message"]["content"] == f"echo: after {i}"
    statuses = [chat(boot, BAD_MODEL, f"bad {i}").status_code for i in range(5)]
    assert 500 not in statuses and 502 in statuses, statuses
    # Its junk load reports (10 a round) were refused by the ingress with a 4xx, not taken.
    answers = [o["load_reports"] for o in seen if "load_reports" in o]
    assert len(answers) == ROUNDS, seen
    for statuses in answers:
        assert len(statuses) == 10 and all(s in (400, 401, 403) for s in statuses), statuses
    reports = boot.get("/v1/network")["routing"]["load_reports"]
    assert reports["refused"] >= 10 * ROUNDS, reports
    assert not traceback_in(boot.log_path), traceback_in(boot.log_path)
    wait_state(boot, honest, "SERVING")
    growth = ", ".join(f"{name} {delta / 2**20:+.1f} MiB" for name, delta in memory.items())
    print(f"misbehaving member scenario: {time.monotonic() - started:.1f} s; RSS {growth}")

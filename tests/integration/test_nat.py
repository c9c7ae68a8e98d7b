"""NAT traversal end to end: real otela processes in network namespaces behind real NATs.

Two nodes, each behind its own outbound-only NAT (iptables MASQUERADE, unsolicited inbound
dropped), and a public relay that is also the bootstrap node. Neither NAT'd node can be
dialed directly, so everything they learn about each other and every request between them
travels through the relay until hole punching (DCUtR) upgrades the connection.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from otela.engine.demo.echo import _answer
from otela.testing.localfed import (
    FederationError,
    LocalFederation,
    LocalNode,
    echo_engine_command,
    free_port,
    wait_for,
)
from otela.testing.nat_topology import PRIVATE, PUBLIC, Topology, missing_tools
from otela.testing.steady_load import is_stopped, machine_pids, signal_machine

pytestmark = pytest.mark.slow

P2P_PORT = 4001
JOIN_S = 40.0


@pytest.fixture(scope="module")
def topology() -> Iterator[Topology]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    missing = missing_tools()
    if missing:
        pytest.fail(f"missing tools {missing}: run scripts/bootstrap as root (installs iptables)")
    topo = Topology()
    topo.down()  # a previous run killed before its finalizer
    try:
        topo.up()
        yield topo
    finally:
        left = topo.down()
        assert not left, f"namespaces left behind: {left}"


def start(fed: LocalFederation, topo: Topology, name: str, ip: str, **kw: Any) -> LocalNode:
    return fed.start_node(name, netns=topo.ns(name), host=ip, p2p_port=P2P_PORT,
                          timeout=60, **kw)


def records(topo: Topology, where: str, node: LocalNode) -> dict[str, dict[str, Any]]:
    """peer id -> record, as ``node`` (in namespace ``where``) sees the registry."""
    nodes = topo.get_json(where, f"{node.http_url}/v1/registry/nodes")["nodes"]
    return {n["peer_id"]: n for n in nodes}


def network(topo: Topology, where: str, node: LocalNode, peer: str | None = None) -> Any:
    query = f"?peer={peer}" if peer else ""
    return topo.get_json(where, f"{node.http_url}/v1/network{query}")


def test_nated_nodes_reach_each_other_through_a_relay(
    topology: Topology, federation: LocalFederation, tmp_path: Path
) -> None:
    topo, fed = topology, federation
    relay = start(fed, topo, "R", PUBLIC["R"], extra_args=["--relay"])
    a = start(fed, topo, "A", PRIVATE["A"], bootstrap=[relay],
              process=echo_engine_command(free_port(), ["model-a"]), provider_id="site-a")
    b = start(fed, topo, "B", PRIVATE["B"], bootstrap=[relay],
              process=echo_engine_command(free_port(), ["model-b"]), provider_id="site-b")
    a_id, b_id, r_id = (n.status["peer_id"] for n in (a, b, relay))

    def sees_relayed(where: str, observer: LocalNode, peer: str) -> dict[str, Any] | None:
        record = records(topo, where, observer).get(peer)
        if record and record["state"] == "SERVING" and record["reachability"] == \
                "private-relayed" and record["circuit_addrs"]:
            return record
        return None

    # Each NAT'd node learns it is private, reserves on the relay, and the other sees it.
    rec_a = wait_for(lambda: sees_relayed("B", b, a_id), JOIN_S, "B to see A via the relay")
    wait_for(lambda: sees_relayed("A", a, b_id), JOIN_S, "A to see B via the relay")
    assert all(f"/p2p/{r_id}/p2p-circuit/p2p/{a_id}" in c for c in rec_a["circuit_addrs"])
    assert records(topo, "R", relay)[r_id]["reachability"] in ("public", "unknown")
    assert records(topo, "R", relay)[r_id]["relay"] is True

    # A request from B to A's engine, over the libp2p transport (no HTTP route exists).
    body = json.dumps({"model": "model-a", "messages": [{"role": "user", "content": "hi"}]})
    headers, payload = topo.post("B", f"{b.http_url}/v1/chat/completions", body)
    assert headers[":status"] == "200", payload
    assert headers["x-otela-peer-id"] == a_id
    assert headers["x-otela-path"] == "libp2p"
    assert json.loads(payload)["choices"][0]["message"]["content"], (headers, payload)

    # Streaming: SSE chunks relayed as they come, ending with [DONE].
    stream_body = json.dumps({"model": "model-a", "stream": True,
                              "messages": [{"role": "user", "content": "count to five"}]})
    headers, payload = topo.post("B", f"{b.http_url}/v1/chat/completions", stream_body)
    assert headers[":status"] == "200", payload
    assert headers["content-type"].startswith("text/event-stream")
    events = [line for line in payload.splitlines() if line.startswith("data: ")]
    assert len(events) >= 3 and events[-1] == "data: [DONE]"
    # And the other way round, A to B's engine.
    headers, payload = topo.post("A", f"{a.http_url}/v1/chat/completions",
                                 body.replace("model-a", "model-b"))
    assert headers[":status"] == "200" and headers["x-otela-peer-id"] == b_id, payload

    # Hole punching: both NATs keep the source port and drop (not reject) unsolicited
    # packets, so DCUtR may upgrade to a direct connection. Record whether it did.
    def upgraded() -> dict[str, Any] | None:
        log = network(topo, "B", b, a_id)["peer"]["log"] or {}
        punch = log.get("hole_punch") or {}
        return punch if punch.get("upgraded_to_direct") else None

    punch: dict[str, Any] | None = None
    with contextlib.suppress(FederationError):
        punch = wait_for(upgraded, 20.0, "a hole-punched connection")
    report = wait_for(lambda: (r := network(topo, "B", b, a_id))["peer"]["log"] and r, 5.0,
                      "B to log its connection to A")
    result = {"hole_punch_upgraded": punch is not None, "hole_punch": punch,
              "connection": report["peer"]["log"]["connection"],
              "verdict": report["peer"]["verdict"]}
    (tmp_path / "nat-result.json").write_text(json.dumps(result, indent=2))
    print("NAT result:", json.dumps(result))
    assert report["nat"]["reachability"] == "private-relayed"
    assert "behind NAT, reachable through relay" in report["verdict"]
    assert report["peer"]["log"]["connection"] in ("relayed", "direct")

    # Requests keep working after an upgrade (the stream moves to the direct connection).
    headers, payload = topo.post("B", f"{b.http_url}/v1/chat/completions", body)
    assert headers[":status"] == "200" and headers["x-otela-peer-id"] == a_id, payload


def test_doctor_names_a_nated_node_without_a_relay(
    topology: Topology, federation: LocalFederation
) -> None:
    topo, fed = topology, federation
    public = start(fed, topo, "R", PUBLIC["R"])  # no --relay: nobody offers reservations
    a = start(fed, topo, "A", PRIVATE["A"], bootstrap=[public])

    def unreachable() -> dict[str, Any] | None:
        report = network(topo, "A", a)
        return report if report["nat"]["reachability"] == "unreachable" else None

    report = wait_for(unreachable, JOIN_S, "A to learn it is behind NAT with no relay")
    verdict = report["verdict"]
    assert verdict.startswith("behind NAT, no relay reservation")
    assert f"{PUBLIC['R']}" not in verdict and "10.99.0.2:4001" in verdict
    assert "--relay" in verdict and "4001" in verdict
    # The public node explains the NAT'd peer the same way, from A's signed record.
    seen = wait_for(
        lambda: network(topo, "R", public, a.status["peer_id"])["peer"]["record"],
        JOIN_S, "the public node to have A's record with its reachability")
    assert seen is not None
    wait_for(lambda: "behind NAT with no relay reservation" in
             network(topo, "R", public, a.status["peer_id"])["peer"]["verdict"], JOIN_S,
             "the public node's verdict on A")


def test_a_stream_over_libp2p_whose_node_freezes_goes_on_from_another_node(
    topology: Topology, federation: LocalFederation
) -> None:
    """Request migration over the libp2p transport: a stream from B to A (behind NAT:
    libp2p streams through the relay, or hole-punched) is cut when B suspects the frozen
    A, and goes on from the relay node's engine, as one stream, while A is still frozen."""
    topo, fed = topology, federation
    model, prompt = "model-m", " ".join(f"word{i}" for i in range(40))
    relay = start(fed, topo, "R", PUBLIC["R"], extra_args=["--relay"], provider_id="site-r",
                  process=echo_engine_command(free_port(), [model], "--token-delay", "0.05"))
    a = start(fed, topo, "A", PRIVATE["A"], bootstrap=[relay], provider_id="site-a",
              process=echo_engine_command(free_port(), [model], "--token-delay", "0.05"))
    b = start(fed, topo, "B", PRIVATE["B"], bootstrap=[relay])
    a_id = a.status["peer_id"]
    wait_for(lambda: (records(topo, "B", b).get(a_id) or {}).get("reachability") ==
             "private-relayed" and records(topo, "B", b)[a_id]["state"] == "SERVING"
             and records(topo, "B", b).get(relay.status["peer_id"], {}).get("state") ==
             "SERVING", JOIN_S, "B to see A (relayed) and R serving")
    body = json.dumps({"model": model, "stream": True,
                       "messages": [{"role": "user", "content": prompt}]})
    frozen: list[int] = []

    def freeze_a_mid_answer(headers: dict[str, str], lines: list[str]) -> None:
        if not frozen and headers.get("x-otela-peer-id") == a_id and \
                sum('"content":' in line for line in lines) >= 6:
            frozen.extend(machine_pids(a))
            signal_machine(frozen, signal.SIGSTOP)  # mid-answer: silent, not gone

    try:
        for _ in range(20):  # until a stream is routed to A
            head, lines = _stream_from(topo, "B", f"{b.http_url}/v1/chat/completions", body,
                                       freeze_a_mid_answer)
            if frozen:
                break
        else:
            pytest.fail("no stream was routed to A")
        assert head["x-otela-path"] == "libp2p"
        assert all(is_stopped(pid) for pid in frozen)  # it went on while A was frozen
    finally:
        signal_machine(frozen or machine_pids(a), signal.SIGCONT)
    chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert not [c for c in chunks if "error" in c], lines
    assert "".join((c["choices"][0]["delta"].get("content") or "") for c in chunks
                   if c.get("choices")) == "".join(_answer(prompt, None)[0])
    assert len({c["id"] for c in chunks}) == 1


def _stream_from(topo: Topology, where: str, url: str, body: str,
                 on_line: Callable[[dict[str, str], list[str]], None]
                 ) -> tuple[dict[str, str], list[str]]:
    """POST ``body`` from inside namespace ``where``, reading the answer as it arrives:
    ``on_line(headers, lines so far)`` after each body line; the headers and the lines."""
    curl = subprocess.Popen(
        [*topo.exec_prefix(where), "curl", "-sN", "-D", "-", "--max-time", "120", "-H",
         "content-type: application/json", "-d", body, url],
        stdout=subprocess.PIPE, text=True)
    assert curl.stdout is not None
    headers: dict[str, str] = {}
    lines: list[str] = []
    in_head = True
    for raw in curl.stdout:
        line = raw.rstrip("\r\n")
        if in_head:
            key, colon, value = line.partition(":")
            if colon:
                headers[key.strip().lower()] = value.strip()
            in_head = bool(line)
            continue
        lines.append(line)
        on_line(headers, lines)
    assert curl.wait(timeout=30) == 0
    return headers, lines

"""A federation of real otela daemons (separate OS processes) on 127.0.0.1."""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import pytest

from otela.mesh.bootstrap import BACKOFF_MAX_S, DIAL_TIMEOUT_S
from otela.testing.localfed import echo_engine_command, free_port, wait_for

from .helpers import CONVERGE_S, chat, serving_node, wait_state

pytestmark = pytest.mark.slow


def test_three_daemons_mesh_through_one_bootstrap_and_a_late_joiner_learns_state(federation):
    boot = federation.start_node("boot", ingress=True)
    with federation.together():
        a = federation.start_node("a", bootstrap=[boot])
        b = federation.start_node("b", bootstrap=[boot])
    nodes = [boot, a, b]
    sessions = {n.session_id for n in nodes}
    for node in nodes:
        wait_for(lambda node=node: set(node.states()) == sessions, CONVERGE_S,
                 f"{node.name} to list all three nodes")

    late = federation.start_node("late", bootstrap=[boot])
    everyone = sessions | {late.session_id}
    wait_for(lambda: set(late.states()) == everyone, CONVERGE_S, "the late node to learn state")
    for node in nodes:  # and the others learn about it
        wait_for(lambda node=node: set(node.states()) == everyone, CONVERGE_S,
                 f"{node.name} to learn about the late node")

    listed = {n["session_id"]: n for n in boot.nodes()}
    for node in [*nodes, late]:
        entry = listed[node.session_id]
        assert entry["peer_id"] == node.status["peer_id"]
        assert entry["provider_id"] == node.status["provider_id"]
        assert entry["http_url"] == node.http_url
        assert entry["state"] == "JOIN" and entry["version"] >= 1
        assert entry["hardware"]["cpus"] >= 1
        assert entry["models"] == []
        alone = b.entry(node.session_id)  # one entry alone, as b's replica holds it
        assert alone is not None
        assert {**alone, "received_at": 0} == {**entry, "received_at": 0}
    unknown = httpx.get(f"{boot.http_url}/v1/registry/nodes/no-such-session", timeout=5,
                        trust_env=False)
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "session_not_found"
    health = a.get("/v1/health")
    assert health["peer_id"] == a.status["peer_id"]
    pressure = health["liveness"]["host_cpu_pressure"]  # None where the kernel has no PSI
    assert pressure is None or 0.0 <= pressure <= 100.0
    liveness = health["liveness"]
    assert 1 + liveness["local_health"] <= liveness["health_multiplier"] <= 9
    assert health["session_id"] == a.session_id
    assert any(addr.endswith(f"/p2p/{a.status['peer_id']}") for addr in health["addrs"])


def live_peers(node) -> set[str]:
    return {n["peer_id"] for n in node.nodes()
            if n["state"] != "LEFT"}


def test_a_restarted_bootstrap_node_finds_the_federation_again(federation):
    # The bootstrap node has no bootstrap of its own: after a restart (new session, a new
    # port here) only the peers it remembered can bring it back.
    boot = federation.start_node("boot")
    with federation.together():
        a = federation.start_node("a", bootstrap=[boot])
        b = federation.start_node("b", bootstrap=[boot])
    everyone = {n.status["peer_id"] for n in (boot, a, b)}
    wait_for(lambda: live_peers(boot) == everyone, CONVERGE_S, "boot to list a and b")
    assert federation.stop_node(boot) == 0
    assert (boot.home / "peers.json").exists()

    boot = federation.start_node("boot")
    wait_for(lambda: live_peers(boot) == everyone, CONVERGE_S,
             "the restarted bootstrap node to find a and b again")
    for node in (a, b):
        wait_for(lambda node=node: node.states().get(boot.session_id) == "JOIN", CONVERGE_S,
                 f"{node.name} to learn the bootstrap node's new session")


def test_a_node_killed_and_restarted_replaces_its_old_session_everywhere(federation):
    """A registry keeps one session per peer: the restarted node's new session supersedes
    the killed run's (no stale SERVING entry waits for an eviction), even when the new run
    has no epoch file and its clock is behind the old session's epoch: it outbids that."""
    boot = federation.start_node("boot", ingress=True)
    home = federation.root / "server"
    home.mkdir()
    ahead = int((time.time() + 3600) * 1000)  # the killed run's clock was an hour ahead
    (home / "session-epoch").write_text(f"{ahead}\n")
    server = federation.start_node("server", bootstrap=[boot],
                                   process=echo_engine_command(free_port(), ["m"]))
    wait_state(boot, server, "SERVING")
    old_session, peer = server.session_id, server.status["peer_id"]
    server.process.kill()
    server.process.wait()
    (home / "session-epoch").unlink()  # and the new run lost the file
    server = federation.start_node("server", bootstrap=[boot],
                                   process=echo_engine_command(free_port(), ["m"]))
    wait_for(lambda: {n["session_id"]: n["state"] for n in boot.nodes()
                      if n["peer_id"] == peer} == {
                          server.get("/v1/health")["session_id"]: "SERVING"},
             CONVERGE_S, "the restarted node's one session to serve")
    assert old_session not in boot.states()
    assert "supersedes ours" in server.log_tail(200)
    assert boot.get("/v1/health")["replication"]["sessions_superseded"] >= 1
    assert chat(boot, "m").headers["x-otela-peer-id"] == peer


def test_chat_completion_and_stream_through_the_ingress(federation):
    ingress = federation.start_node("ingress", ingress=True)
    server = serving_node(federation, "server", ingress, "echo-1", "--token-delay", "0.1")
    wait_state(ingress, server, "SERVING")

    response = chat(ingress, "echo-1", "route me please")
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "echo: route me please"
    assert response.headers["x-otela-session-id"] == server.session_id

    models = ingress.get("/v1/models")["data"]
    assert [(m["id"], m["serving_nodes"]) for m in models] == [("echo-1", 1)]
    registry_models = ingress.get("/v1/registry/models")["models"]
    assert registry_models[0]["id"] == "echo-1"
    assert [s["session_id"] for s in registry_models[0]["sessions"]] == [server.session_id]

    body = {"model": "echo-1", "stream": True,
            "messages": [{"role": "user", "content": "one two three four five six"}]}
    arrivals: list[float] = []
    events: list[str] = []
    with httpx.stream("POST", f"{ingress.http_url}/v1/chat/completions", json=body,
                      timeout=30, trust_env=False) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        for line in stream.iter_lines():
            if line.startswith("data: "):
                arrivals.append(time.monotonic())
                events.append(line[6:])
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == "echo: one two three four five six"
    assert len(events) >= 8
    # 7 tokens at 0.1 s each: relayed chunk by chunk, they arrive spread over time, not as one
    # blob at the end.
    assert arrivals[-1] - arrivals[0] >= 0.4


def test_engine_death_marks_the_node_down_and_traffic_moves_to_the_other(federation):
    ingress = federation.start_node("ingress", ingress=True)
    with federation.together():
        doomed = serving_node(federation, "doomed", ingress, "shared")
        survivor = serving_node(federation, "survivor", ingress, "shared")
    wait_state(ingress, doomed, "SERVING")
    wait_state(ingress, survivor, "SERVING")

    served = {chat(ingress, "shared").headers["x-otela-session-id"] for _ in range(30)}
    assert served == {doomed.session_id, survivor.session_id}

    kill_engine(doomed)
    wait_state(ingress, doomed, "DOWN")
    assert doomed.process.wait(timeout=20) == 3  # fail-stop: non-zero exit

    for _ in range(20):
        response = chat(ingress, "shared")
        assert response.status_code == 200
        assert response.headers["x-otela-session-id"] == survivor.session_id


def test_bad_requests_get_openai_errors_and_the_daemon_keeps_running(federation):
    ingress = federation.start_node("ingress", ingress=True)
    server = serving_node(federation, "server", ingress, "known")
    wait_state(ingress, server, "SERVING")
    url = f"{ingress.http_url}/v1/chat/completions"

    unknown = chat(ingress, "no-such-model")
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "model_not_found"

    for payload in (b"{not json", b"[1, 2]", b'{"messages": []}', b'{"model": 5}'):
        response = httpx.post(url, content=payload, trust_env=False,
                              headers={"content-type": "application/json"})
        assert response.status_code == 400, payload
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["message"]

    # The registry is read-only from outside.
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        response = httpx.request(method, f"{ingress.http_url}/v1/registry/nodes", json={},
                                 trust_env=False)
        assert response.status_code == 405
        assert "error" in response.json()

    assert ingress.process.poll() is None
    assert chat(ingress, "known").status_code == 200


def test_known_model_with_no_serving_node_is_503(federation):
    ingress = federation.start_node("ingress", ingress=True)
    server = serving_node(federation, "server", ingress, "fragile")
    wait_state(ingress, server, "SERVING")
    kill_engine(server)
    wait_state(ingress, server, "DOWN")
    response = chat(ingress, "fragile")
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "no_serving_node"


def test_sigterm_announces_left_stops_the_engine_and_exits_zero(federation):
    ingress = federation.start_node("ingress", ingress=True)
    server = serving_node(federation, "server", ingress, "m")
    wait_state(ingress, server, "SERVING")
    (engine_pid,) = server.engine_pids()

    assert federation.stop_node(server) == 0
    wait_state(ingress, server, "LEFT")
    assert not _alive(engine_pid)
    assert chat(ingress, "m").status_code == 404  # a LEFT node no longer offers its model


def test_engine_that_never_becomes_ready_fails_the_node(federation):
    node = federation.start_node(
        "broken", process="python3 -c 'import sys; sys.exit(4)' --port 1",
    )
    assert node.process.wait(timeout=20) == 3
    assert "before becoming ready" in node.log_tail()


def test_node_retries_until_its_bootstrap_peer_appears(federation):
    first = federation.start_node("first")
    bootstrap_addr = first.multiaddr
    home = first.home
    assert federation.stop_node(first) == 0
    # Same home => same identity and address family; the joiner starts before it is back.
    joiner = federation.start_node("joiner", extra_args=["--bootstrap", bootstrap_addr])
    port = bootstrap_addr.split("/tcp/")[1].split("/")[0]
    revived = federation.start_node("first", extra_args=["--p2p-port", port])
    assert revived.home == home and revived.status["peer_id"] == first.status["peer_id"]
    assert revived.session_id != first.session_id  # a restart is a new session
    # The joiner redials on its backoff schedule, so allow one full backoff period plus a dial.
    wait_for(lambda: revived.session_id in joiner.states(), BACKOFF_MAX_S + DIAL_TIMEOUT_S,
             "the joiner to reach the revived bootstrap peer")


def kill_engine(node) -> None:
    pids = node.engine_pids()
    assert pids, f"{node.name} has no engine process"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "State:\tZ" not in f.read()
    except FileNotFoundError:
        return False

"""Two-stage failure detection between real daemons: suspicion, refutation, eviction."""

from __future__ import annotations

import os
import signal
import time

import pytest

from otela.testing.localfed import LocalFederation, LocalNode, wait_for

from .helpers import CONVERGE_S, chat, serving_node, wait_state

pytestmark = pytest.mark.slow

FAST = ["--probe-interval", "0.5s", "--suspicion-timeout", "3s"]


def mesh(fed: LocalFederation, n: int, extra: list[str]) -> list[LocalNode]:
    boot = fed.start_node("boot", extra_args=extra)
    with fed.together():
        nodes = [boot] + [
            fed.start_node(f"n{i}", bootstrap=[boot], extra_args=extra) for i in range(n - 1)
        ]
    everyone = {x.session_id for x in nodes}
    for node in nodes:
        wait_for(
            lambda node=node: set(node.states()) == everyone,
            CONVERGE_S,
            f"{node.name} to see all {n} nodes",
        )
    return nodes


def excluded(observer: LocalNode, victim: LocalNode) -> bool:
    health = observer.get("/v1/health")
    return (
        victim.status["peer_id"] in health["suspected_peers"]
        or observer.states().get(victim.session_id) == "LEFT"
    )


def test_a_killed_node_is_suspected_everywhere_then_evicted(federation):
    nodes = mesh(federation, 5, FAST)
    victim, observers = nodes[-1], nodes[:-1]
    os.kill(victim.process.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    seen_suspected: set[str] = set()

    def all_excluded() -> bool:
        for o in observers:
            if o.status["peer_id"] not in seen_suspected and excluded(o, victim):
                seen_suspected.add(o.status["peer_id"])
        return len(seen_suspected) == len(observers)

    wait_for(all_excluded, 15.0, "every node to stop routing to the killed node")
    suspected_after = time.monotonic() - killed_at
    for o in observers:
        wait_state(o, victim, "LEFT")
    left_after = time.monotonic() - killed_at
    # Bounds: detection needs a probe round (0.5 s period, 0.5 s timeout, indirect probes,
    # 1.5 s without contact); eviction adds the 3 s suspicion timeout plus dissemination
    # (measured 4.6-6.2 s; with two suspecters known, a node waits 7.5 s). The victim
    # joined last and may be connected to the bootstrap node only: then the members
    # picked to verify the published suspicion supply the independent confirmations,
    # without which a lone suspicion waits 4 x 3 s, past this bound.
    # A node that finds itself overloaded stretches its timeouts by 1 + its local health.
    stretch = 1 + max(o.get("/v1/health")["liveness"]["local_health"] for o in observers)
    assert suspected_after < 10.0 * stretch
    assert left_after < 12.0 * stretch
    evicted = [
        n
        for n in observers[0].nodes()
        if n["session_id"] == victim.session_id
    ]
    assert evicted[0]["evicted_by"] in {o.status["peer_id"] for o in observers}
    # Two stages at every node: its own record shows it suspected the victim (dropped it
    # from routing) before the eviction reached it.
    for o in observers:
        peer = o.get(f"/v1/network?peer={victim.status['peer_id']}")["peer"]
        suspected_at = [e["at"] for e in peer["liveness_events"]
                        if e["event"] in ("suspected", "confirmed")]
        assert suspected_at, f"{o.name} never suspected the killed node"
        assert min(suspected_at) <= peer["left_at"] + 0.01


def test_a_killed_node_of_three_is_left_within_seconds_with_the_default_timeouts(federation):
    """Issue 19: LEFT within 10 s of a SIGKILL at every size, with the default timeouts
    (probe 1 s, suspicion 6 s). At 3 nodes only the two survivors can suspect the third:
    waiting for three independent confirmations had held it 15 s, LEFT after 17.5 s."""
    nodes = mesh(federation, 3, [])
    victim, survivors = nodes[-1], nodes[:-1]
    killed_at = time.time()
    os.kill(victim.process.pid, signal.SIGKILL)
    for s in survivors:
        wait_for(lambda s=s: s.states().get(victim.session_id) == "LEFT", 30.0,
                 f"{s.name} to mark the killed node LEFT")
    # A node that finds itself overloaded stretches its timeouts by 1 + its local health,
    # and the grace grows by twice the gossip lag it measures (tens of ms when healthy):
    # on a saturated machine the detector waits longer on purpose.
    health = [s.get("/v1/health")["liveness"]["local_health"] for s in survivors]
    stretch = 1 + max(health)
    lag = max(s.get("/v1/network")["liveness"]["gossip_lag_s"] for s in survivors)
    first_hand: list[str] = []
    for s in survivors:
        # Each survivor's own records (no polling delay): when the eviction reached it,
        # and how long it held the suspicion before confirming it.
        entry = next(e for e in s.nodes()
                     if e["session_id"] == victim.session_id)
        left_after = entry["received_at"] - killed_at
        events = s.get(f"/v1/network?peer={victim.status['peer_id']}")["peer"][
            "liveness_events"]
        suspected = min(e["at"] for e in events if e["event"] == "suspected")
        seen = (s.name, f"suspected {suspected - killed_at:.1f} s", f"LEFT {left_after:.1f} s",
                health, lag, [(round(e["at"] - killed_at, 2), e["event"], e["detail"])
                              for e in events])
        # The goal: 10 s. benchmarks/failure_detection.py: 6.4-6.8 s at 3 nodes, since a
        # lost neighbour that refuses connections is suspected without waiting out its
        # contact window (before: 8.2-8.7 s, and the first suspicion alone had taken up to
        # 4.8 s in a whole test run on 2 cores).
        assert left_after <= 10.0 * stretch + 2 * lag, seen
        first_hand.extend(e["detail"] for e in events if e["event"] == "suspected"
                          and not e["detail"].startswith("reported by"))
        confirmed = [e["at"] for e in events if e["event"] == "confirmed"]
        if confirmed:  # a node may get the other's eviction before its own timer runs out
            # The 6 s grace, not 2.5 x it (a grace that runs out during a probe round is
            # acted on when the round ends, and rounds run long on a loaded machine).
            held = confirmed[0] - suspected
            assert held <= (6.0 + 2.0) * stretch + 2 * lag, (*seen, f"held {held:.1f} s")
    # Both were connected to it: the refused reconnection is what suspected it, not the
    # window of silence meant for slow peers.
    assert any("refused" in detail for detail in first_hand), first_hand


def test_a_briefly_paused_node_refutes_and_is_not_evicted(federation):
    nodes = mesh(federation, 4, ["--probe-interval", "0.5s", "--suspicion-timeout", "6s"])
    paused, observers = nodes[-1], nodes[:-1]
    os.kill(paused.process.pid, signal.SIGSTOP)
    try:
        wait_for(
            lambda: any(
                paused.status["peer_id"] in o.get("/v1/health")["suspected_peers"]
                for o in observers
            ),
            15.0,  # resumed as soon as one node suspects it: well inside the 6 s grace
            "someone to suspect the paused node",
        )
    finally:
        os.kill(paused.process.pid, signal.SIGCONT)
    for o in observers:
        wait_for(
            lambda o=o: paused.status["peer_id"] not in o.get("/v1/health")["suspected_peers"],
            10.0,
            f"{o.name} to accept the refutation",
        )
    time.sleep(6.5)  # past the suspicion timeout: a wrongly kept suspicion would evict now
    for o in [*observers, paused]:
        assert o.states()[paused.session_id] == "JOIN"
    assert paused.get("/v1/health")["liveness"]["probes"] > 0


def test_routing_skips_a_suspected_node_before_it_is_evicted(federation):
    ingress = federation.start_node("ingress", extra_args=[*FAST[:2], "--suspicion-timeout", "30s"])
    with federation.together():
        doomed = serving_node(federation, "doomed", ingress, "m")
        survivor = serving_node(federation, "survivor", ingress, "m")
    for node in (doomed, survivor):
        wait_state(ingress, node, "SERVING")
    os.kill(doomed.process.pid, signal.SIGKILL)  # the daemon; its engine dies with it
    wait_for(
        lambda: doomed.status["peer_id"] in ingress.get("/v1/health")["suspected_peers"],
        15.0,
        "the ingress to suspect the killed node",
    )
    assert ingress.states()[doomed.session_id] == "SERVING"  # not evicted yet (30 s grace)
    for _ in range(10):
        response = chat(ingress, "m")
        assert response.status_code == 200
        assert response.headers["x-otela-session-id"] == survivor.session_id


def test_many_paused_nodes_are_evicted_one_at_a_time_and_the_rest_refute(federation):
    """Half the federation stops answering at once (an overloaded machine, a stalled
    file system): the eviction brake confirms one suspect per suspicion timeout instead of
    evicting them all, so those that come back in time refute and keep their sessions."""
    nodes = mesh(federation, 10, ["--probe-interval", "0.5s", "--suspicion-timeout", "6s"])
    survivors, paused = nodes[:5], nodes[5:]
    for node in paused:
        os.kill(node.process.pid, signal.SIGSTOP)
    sessions = {node.session_id for node in paused}

    def evicted() -> set[str]:
        return {s for s, state in survivors[0].states().items()
                if s in sessions and state == "LEFT"}

    try:
        wait_for(lambda: evicted(), 60.0, "a first paused node to be evicted")
    finally:
        for node in paused:
            os.kill(node.process.pid, signal.SIGCONT)
    paused_ids = {node.status["peer_id"] for node in paused}
    for observer in survivors:
        # Each paused node either refuted or was evicted (then it leaves the table).
        wait_for(lambda o=observer: not paused_ids & set(o.get("/v1/health")["suspected_peers"]),
                 30.0, f"{observer.name} to clear its suspicions")
        events = observer.get("/v1/network")["liveness"]["events"]
        assert any(e["event"] == "eviction brake on" for e in events), observer.name
    # Without the brake every paused node would have been confirmed within the same
    # period; with it, at most the one (or, where survivors' views differed, two) chosen
    # before the others came back. An evicted node rejoins under a new session, which
    # supersedes its LEFT one: its first session is gone from the registry.
    states = survivors[0].states()
    gone = {s for s in sessions if states.get(s) in (None, "LEFT")}
    assert 1 <= len(gone) <= 2
    for node in paused:
        if node.session_id not in gone:
            assert survivors[0].states()[node.session_id] == "JOIN"

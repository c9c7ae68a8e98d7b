"""A partition between two halves of a federation, in network namespaces, under load."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator

import pytest
import trio

from otela.testing.localfed import LocalFederation, LocalNode, echo_engine_command, wait_for
from otela.testing.netns import Lan, ensure_iptables
from otela.testing.steady_load import SteadyLoad

from .helpers import CONVERGE_S, chat

# netns.Lan uses fixed names (bridge otpbr0, its namespaces) in the root namespace: one
# worker at a time (scripts/test runs several).
pytestmark = [pytest.mark.slow, pytest.mark.chaos, pytest.mark.xdist_group("root-netns")]

# Eviction takes ~10 s here, but a node that finds itself overloaded (a loaded CI machine)
# stretches its timeouts by up to 9x before accusing anyone: this deadline allows for that.
EVICT_S = 180.0


@pytest.fixture
def lan() -> Iterator[Lan]:
    ensure_iptables()
    with Lan(4) as network:
        yield network


def start_serving(lan: Lan, federation: LocalFederation) -> list[LocalNode]:
    """A node on each of the LAN's hosts (fast liveness timeouts, an echo engine serving
    "shared"), all bootstrapped from the first; returns once every one sees all SERVING."""
    fast = ["--probe-interval", "0.5s", "--suspicion-timeout", "3s"]

    def start(i: int, bootstrap: list[LocalNode]) -> LocalNode:
        ns, ip = lan.hosts[i]
        return federation.start_node(
            f"h{i}", bootstrap=bootstrap, netns=ns, host=ip, extra_args=fast,
            process=echo_engine_command(8000, ["shared"]), provider_id=f"lab-{i}",
        )

    nodes = [start(0, [])]
    with federation.together():
        nodes += [start(i, [nodes[0]]) for i in range(1, len(lan.hosts))]
    everyone = {n.session_id for n in nodes}
    for node in nodes:
        wait_for(lambda node=node: set(node.states()) == everyone
                 and all(s == "SERVING" for s in node.states().values()),
                 2 * CONVERGE_S, f"{node.name} to see all {len(nodes)} SERVING")
    return nodes


def live_view(node: LocalNode) -> dict[str, str]:
    return node.states()


def test_each_half_keeps_routing_and_registries_converge_after_healing(
    lan: Lan, federation: LocalFederation
) -> None:
    # (``lan`` first: fixtures tear down in reverse, so the nodes stop before the network goes)
    nodes = start_serving(lan, federation)

    # A steady load through h0 the whole time: none of it may fail, since h0's half
    # always serves the model (requests caught on the far side wait for the heal).
    load = SteadyLoad(nodes[0].http_url, "shared", rate=8.0, stream_share=0.25,
                      timeout=EVICT_S + 120)

    window: list[tuple[float, float]] = []  # (cut, healed), time.monotonic()

    async def under_load() -> None:
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(load.run, stop)
            window.append(await trio.to_thread.run_sync(partition_and_heal, lan, nodes))
            stop.set()

    trio.run(under_load)
    failures = [o for o in load.outcomes if o.result != "ok"]
    cut, healed = window[0]
    during = [o for o in load.outcomes if cut <= o.sent_at <= healed]
    assert len(during) >= 0.5 * load.rate * (healed - cut), "the load ran through the cut"
    offset = time.time() - time.monotonic()  # failures by wall-clock time, as in the logs
    when = [time.strftime("%H:%M:%S", time.localtime(o.sent_at + offset))
            + f".{int((o.sent_at + offset) % 1 * 1000):03d}" for o in failures]
    assert not failures, f"{Counter(o.result for o in failures)} at {when}: " \
        f"{dict(load.messages)}"


def partition_and_heal(lan: Lan, nodes: list[LocalNode]) -> tuple[float, float]:
    """Cut h0 h1 | h2 h3 until each half has evicted the other, then heal and wait for
    every registry to agree again; when it cut and healed (time.monotonic())."""
    left, right = [0, 1], [2, 3]
    lan.partition(left, right)
    cut = time.monotonic()
    halves = ((left, right), (right, left))
    # Each half excludes the other (suspected, then evicted) and keeps serving on its own.
    for mine, theirs in halves:
        for i in mine:
            wait_for(lambda i=i, theirs=theirs: all(
                nodes[i].states().get(nodes[j].session_id) == "LEFT" for j in theirs),
                EVICT_S, f"h{i} to evict the other half")
            for _ in range(6):
                response = chat(nodes[i], "shared")
                assert response.status_code == 200
                assert response.headers["x-otela-session-id"] in {nodes[k].session_id
                                                                  for k in mine}
    lan.heal()
    healed = time.monotonic()
    # After healing, evicted nodes rejoin under new sessions and every replica converges.
    def converged() -> bool:
        views = [live_view(n) for n in nodes]
        serving = [s for s, state in views[0].items() if state == "SERVING"]
        return all(v == views[0] for v in views) and len(serving) == 4

    wait_for(converged, 60.0, "all four registries to converge after healing")
    serving = {chat(nodes[0], "shared").headers["x-otela-session-id"] for _ in range(30)}
    assert len(serving) >= 3  # traffic spans both former halves again
    return cut, healed


@pytest.fixture
def lan7() -> Iterator[Lan]:
    ensure_iptables()
    with Lan(7) as network:
        yield network


def test_a_small_side_cut_off_from_most_of_the_federation_evicts_no_one(
    lan7: Lan, federation: LocalFederation
) -> None:
    """Two nodes cut off from five: the five evict the two, as they would crashed nodes;
    the two find most members out of reach (cut off) and evict none of the five, however
    long the cut lasts, although they are two signers, as every eviction needs. Before,
    they evicted the five one at a time (the eviction brake), each a live node made LEFT
    on every replica at the heal."""
    nodes = start_serving(lan7, federation)
    large, small = nodes[:5], nodes[5:]
    lan7.partition(range(5), range(5, 7))

    def left_seen_by(node: LocalNode) -> set[str]:
        return {s for s, state in node.states().items() if state == "LEFT"}

    cut_ids = {n.session_id for n in small}
    for node in large:
        wait_for(lambda node=node: left_seen_by(node) == cut_ids, EVICT_S,
                 f"{node.name} to evict the two cut-off nodes")
    for node in small:
        wait_for(lambda node=node: node.get("/v1/network")["liveness"]["cut_off"], EVICT_S,
                 f"{node.name} to find itself cut off")
    # The large side took its grace and evicted; the small side has had as long, and gets
    # as long again (a lone suspicion's longest grace here is 4 x 3 s): it evicts no one.
    deadline = time.monotonic() + 15.0
    while time.monotonic() < deadline:
        for node in small:
            assert not left_seen_by(node) & {n.session_id for n in large}, \
                f"{node.name} evicted a member of the larger side"
        time.sleep(1.0)
    events = [e["event"] for e in small[0].get("/v1/network")["liveness"]["events"]]
    assert "cut off" in events
    lan7.heal()
    # The two learn they were evicted and rejoin; the five keep their sessions.
    large_ids = {n.session_id for n in large}

    def converged() -> bool:
        views = [n.states() for n in nodes]
        serving = {s for s, state in views[0].items() if state == "SERVING"}
        return all(v == views[0] for v in views) and len(serving) == 7

    wait_for(converged, 90.0, "all seven registries to converge after healing")
    for node in nodes:
        assert not left_seen_by(node) & large_ids, f"{node.name} holds a large-side LEFT"

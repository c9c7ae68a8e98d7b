"""The mesh simulator: deterministic, driving otela's own cores, and right on small cases."""

from __future__ import annotations

import logging

import pytest

from otela.liveness.table import LivenessTable
from otela.registry import antientropy
from otela.registry.records import Lifecycle, ModelInfo
from simulator.mesh import scenarios
from simulator.mesh.network import NetConfig
from simulator.mesh.world import World


@pytest.fixture(autouse=True)
def _quiet() -> None:
    logging.getLogger("otela").setLevel(logging.ERROR)


def _world(n: int = 16, seed: int = 3, **net: float) -> World:
    world = World(n, seed=seed, net=NetConfig(**net))  # type: ignore[arg-type]
    world.seed_state()
    return world


def test_a_seed_gives_the_same_run_and_another_seed_another():
    def run(seed: int) -> tuple[float, float, int]:
        world = _world(seed=seed)
        figures = scenarios.change(world, count=1)
        return figures["p50_s"], figures["max_s"], world.loop.handled

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_the_nodes_run_otelas_own_cores():
    world = _world(8)
    node = world.nodes[0]
    assert isinstance(node.table, LivenessTable)
    assert node.probe.table is node.table and node.replica.registry is node.registry
    assert all(len(n.registry.map) == 8 for n in world.nodes)  # a full replica each


def test_a_change_reaches_every_replica_through_gossip():
    world = _world(24)
    node = world.nodes[5]
    node.announce(models=(ModelInfo("new-model"),))
    watched = world.watch_change(5)
    world.loop.run_until(world.loop.now + 5)
    assert set(watched.applied) == set(range(24))
    assert all(n.registry.model("new-model") is not None for n in world.nodes)
    assert max(watched.applied.values()) - watched.at < 1.0


def test_a_killed_node_is_left_everywhere_and_nobody_else_is_suspected():
    world = _world(16)
    figures = scenarios.kill(world)
    assert figures["reached"] == 1.0
    assert 5.0 < figures["left_max_s"] < 12.0  # the 6 s grace plus detection
    assert world.false_suspicions == 0 and world.false_evictions == 0


def test_an_idle_federation_costs_hundreds_of_bytes_a_second_per_node():
    figures = scenarios.idle(_world(16), window=20.0)
    assert 100 < figures["median_Bps"] < 1000


def test_a_partitioned_region_is_evicted_and_everyone_agrees_after_the_heal():
    world = _world(20)
    figures = scenarios.partition(world, share=0.3, cut_for=40.0)
    assert figures["cut"] > 0 and figures["evictions_signed"] > 0
    assert figures["agree_after_heal_s"] is not None and figures["agree_after_heal_s"] < 30
    alive = world.alive_nodes()
    states = {world.nodes[i].record.state for i in alive}  # type: ignore[union-attr]
    assert states == {Lifecycle.SERVING}  # evicted nodes rejoined


def test_a_joiner_gets_a_full_replica_from_one_peer():
    world = _world(30)
    figures = scenarios.joiner(world)
    assert figures["entries"] >= 31 and figures["full_replica_s"] < 2.0


def test_a_joiner_larger_than_one_batch_gets_it_in_successive_exchanges(monkeypatch):
    """As ``Replicator.sync_with`` does, an exchange that came back full is run again at
    once rather than waiting for the next periodic one (30 s)."""
    monkeypatch.setattr(antientropy, "MAX_ENTRIES_PER_MESSAGE", 8)
    world = _world(30)
    figures = scenarios.joiner(world)
    assert figures["entries"] >= 31 and figures["full_replica_s"] < 2.0


def test_loss_delays_messages_but_nobody_is_suspected_for_it():
    world = _world(16, loss=0.05)
    figures = scenarios.flaky(world, minutes=1.0, pause_s=0.2, pauses_per_node_min=2.0)
    assert figures["false_evictions_per_node_hour"] == 0


def test_an_eviction_refused_for_want_of_a_second_signer_publishes_our_suspicion():
    """The simulated nodes run the prober's core, so they too ask the chosen verifiers
    to look when their lone suspicion cannot evict (``ProbeCore.evicted``)."""
    world = _world(8)
    world.loop.run_until(world.loop.now + 10)
    node, target = world.nodes[0], world.nodes[7]
    world.kill(7)
    assert node.table.probe_failed(target.peer_id, world.mono())  # our suspicion alone
    node.evict(target.peer_id)
    assert node.stats["evicted"] == 0  # one signer of the two every replica requires
    assert "corroborating" in {e["event"] for e in node.events.events
                               if e["peer_id"] == target.peer_id}
    world.loop.run_until(world.loop.now + 1)
    heard = [i for i in world.alive_nodes() if i != 0 and any(
        e["peer_id"] == target.peer_id and e["event"] == "suspected"
        and "reported by" in e["detail"] for e in world.nodes[i].events.events)]
    assert len(heard) == len(world.alive_nodes()) - 1  # published to every node


def test_a_thin_federation_spreads_a_change_and_fills_a_joiner_from_its_one_full_peer():
    """Thin federations stand in for sizes whose full replicas do not fit: a change must
    still reach every node by gossip, and a joiner get every record from node 0."""
    world = World(40, seed=3)
    world.seed_thin()
    assert len(world.nodes[0].registry.map) == 40 and len(world.nodes[1].registry.map) == 1
    assert scenarios.thin_change(world)["reached"] == 1.0
    world = World(40, seed=3)
    world.seed_thin()
    figures = scenarios.thin_joiner(world)
    assert figures["entries"] == 41 and figures["full_replica_s"] < 2.0


def test_gossip_is_sized_as_py_libp2p_sends_it_and_the_peer_record_is_gone():
    """A delta costs its data plus the message's measured fields on every copy; the daemon
    before issue 38's churn fix also sent its signed peer record on every RPC."""
    from simulator.mesh.gossip import MESSAGE_SIGNED, SENDER_RECORD, WIRES

    def one_change(wire: str) -> tuple[World, int]:
        world = World(16, seed=3, wire=WIRES[wire])
        world.seed_state()
        world.loop.run_until(5.0)
        world.net.stats.reset()
        world.gossip.reset_counts()
        world.nodes[5].announce(models=(ModelInfo("new-model"),))
        world.loop.run_until(world.loop.now + 5)
        sends = world.gossip.firsts + world.gossip.duplicates
        return world, sends

    now, sends = one_change("signed")
    assert now.gossip.firsts == 15 and now.gossip.duplicates > 0
    assert now.gossip.envelope_bytes == MESSAGE_SIGNED * sends
    before, sends_before = one_change("peer-record")
    assert sends_before == sends  # the same copies, each larger
    assert before.gossip.envelope_bytes == (MESSAGE_SIGNED + SENDER_RECORD) * sends
    churn = scenarios.breakdown(now, 5.0)
    assert churn["gossip_copies_per_first"] > 1 and 0.5 < churn["gossip_payload_share"] < 1


@pytest.mark.parametrize("push", ["tree", "choke"])
def test_lazy_push_what_ifs_thin_a_busy_mesh_and_still_reach_everyone(push):
    """Under heavy re-signing, Plumtree's tree and choking cut the copies of a message a
    node receives (GossipSub's mesh: ~7) while every version still reaches every replica;
    on a quiet mesh choking changes nothing but IHAVE's bytes (it chokes on evidence
    only; ids are advertised once), so a change spreads as fast."""
    figures = {name: scenarios.rechurn(_built(24, name), churners=6, every=1.0, window=8.0)
               for name in ("mesh", push)}
    mesh, lazy = figures["mesh"], figures[push]
    assert mesh["gossip_copies_per_first"] > 4
    assert lazy["gossip_copies_per_first"] < 0.5 * mesh["gossip_copies_per_first"]
    assert lazy["change_reached"] == mesh["change_reached"] == 1.0
    assert lazy["median_Bps"] < 0.7 * mesh["median_Bps"]
    if push == "choke":
        quiet = {name: scenarios.change(_built(24, name), count=2, gap=5.0)
                 for name in ("mesh", push)}
        assert quiet["choke"]["reached"] == 1.0
        for figure in ("p50_s", "max_s"):
            assert quiet["choke"][figure] == pytest.approx(quiet["mesh"][figure], rel=0.05)


def _built(n: int, push: str) -> World:
    world = World(n, seed=3, push=push)
    world.seed_state()
    return world

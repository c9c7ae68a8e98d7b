"""Whom the failure detector probes (otela.liveness.watch)."""

import random

from otela.liveness.watch import NeighbourWatch


def watch(*neighbours: str) -> NeighbourWatch:
    w = NeighbourWatch(rng=random.Random(7))
    w.observe(set(neighbours), set(neighbours), now=0.0)
    return w


def test_probes_only_neighbours_each_once_per_pass():
    w = watch("a", "b", "c")
    first_pass = [w.next_target(now=1.0) for _ in range(3)]
    assert sorted(first_pass) == ["a", "b", "c"]
    second_pass = [w.next_target(now=2.0) for _ in range(3)]
    assert sorted(second_pass) == ["a", "b", "c"]


def test_no_neighbours_no_probe():
    assert NeighbourWatch().next_target(now=0.0) is None


def test_a_dropped_connection_is_probed_first_until_decided():
    w = watch("a", "b", "c")
    assert w.observe({"a", "c"}, {"a", "b", "c"}, now=5.0) == ["b"]
    assert w.watched() == {"a", "b", "c"}
    assert w.next_target(now=6.0) == "b"
    assert w.next_target(now=7.0) == "b"  # still lost: probed again next round
    w.decided("b")
    assert w.next_target(now=8.0) in {"a", "c"}
    assert w.watched() == {"a", "c"}


def test_several_lost_neighbours_take_turns():
    w = watch("a", "b", "c")
    w.observe({"c"}, {"a", "b", "c"}, now=5.0)
    assert {w.next_target(now=6.0), w.next_target(now=7.0)} == {"a", "b"}


def test_our_own_trims_are_not_losses():
    w = watch("a", "b")
    w.forget("a")
    assert w.observe({"b"}, {"a", "b"}, now=1.0) == []
    assert w.watched() == {"b"}


def test_reconnected_or_departed_peers_are_no_longer_lost():
    w = watch("a", "b")
    w.observe(set(), {"a", "b"}, now=1.0)
    assert set(w.lost) == {"a", "b"}
    w.observe({"a"}, {"a"}, now=2.0)  # a is back; b left the registry (or was confirmed)
    assert w.lost == {}
    assert w.neighbours == {"a"}


def test_connections_to_non_members_are_ignored():
    w = watch()
    w.observe({"stranger"}, {"a"}, now=0.0)
    assert w.next_target(now=1.0) is None

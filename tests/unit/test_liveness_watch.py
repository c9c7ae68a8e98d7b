"""Whom the failure detector probes (otela.liveness.watch)."""

import random

from otela.liveness.watch import PENDING_S, NeighbourWatch

MEMBERS = {"a", "b", "c"}


def watch(*neighbours: str) -> NeighbourWatch:
    w = NeighbourWatch(rng=random.Random(7))
    w.observe(set(neighbours), MEMBERS, MEMBERS, now=0.0)
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
    assert w.observe({"a", "c"}, MEMBERS, MEMBERS, now=5.0) == ["b"]
    assert w.watched() == {"a", "b", "c"}
    assert w.next_target(now=6.0) == "b"
    assert w.next_target(now=7.0) == "b"  # still lost: probed again next round
    w.decided("b")
    assert w.next_target(now=8.0) in {"a", "c"}
    assert w.watched() == {"a", "c"}


def test_several_lost_neighbours_take_turns():
    w = watch("a", "b", "c")
    w.observe({"c"}, MEMBERS, MEMBERS, now=5.0)
    assert {w.next_target(now=6.0), w.next_target(now=7.0)} == {"a", "b"}


def test_our_own_trims_are_not_losses():
    w = watch("a", "b")
    w.forget("a")
    assert w.observe({"b"}, MEMBERS, MEMBERS, now=1.0) == []
    assert w.watched() == {"b"}


def test_reconnected_or_departed_peers_are_no_longer_lost():
    w = watch("a", "b")
    w.observe(set(), MEMBERS, MEMBERS, now=1.0)
    assert set(w.lost) == {"a", "b"}
    w.observe({"a"}, {"a"}, MEMBERS, now=2.0)  # a is back; b left (or was confirmed dead)
    assert w.lost == {}
    assert w.neighbours == {"a"}


def test_a_connection_that_came_and_went_between_rounds_is_lost():
    """A node that joins and crashes within one probe period is still detected."""
    w = watch("a")
    assert w.observe({"a"}, MEMBERS, MEMBERS, now=1.0, appeared=frozenset({"b"})) == ["b"]
    assert w.next_target(now=2.0) == "b"


def test_a_peer_lost_before_its_record_arrived_is_probed_once_it_does():
    w = NeighbourWatch()
    w.observe({"x"}, set(), set(), now=0.0)  # connected, but no registry record yet
    assert w.observe(set(), set(), set(), now=1.0) == []  # gone: nothing to probe yet
    assert w.next_target(now=1.5) is None
    w.observe(set(), {"x"}, {"x"}, now=2.0)  # its record arrives
    assert w.next_target(now=3.0) == "x"


def test_an_unknown_lost_peer_is_dropped_after_a_while():
    w = NeighbourWatch()
    w.observe({"x"}, set(), set(), now=0.0)
    w.observe(set(), set(), set(), now=1.0)
    w.observe(set(), set(), set(), now=1.0 + PENDING_S)
    assert w.lost == {}


def test_connections_to_non_members_are_never_probed():
    w = watch()
    w.observe({"stranger"}, MEMBERS, MEMBERS | {"stranger"}, now=0.0)
    assert w.next_target(now=1.0) is None


def test_a_suspect_to_verify_is_probed_next_connected_or_not():
    w = watch("a", "b")
    w.observe({"a", "b"}, MEMBERS, MEMBERS, now=1.0)
    assert w.verify("c", now=1.0)  # not connected: probed like a lost one, until decided
    assert not w.verify("c", now=1.5)  # already first in line
    assert w.next_target(now=2.0) == "c"
    assert w.next_target(now=3.0) == "c"
    w.decided("c")
    probed = w.next_target(now=4.0)  # one of a, b; the other is still due this pass
    w.verify(probed, now=4.0)  # connected: jumps to the front of the round
    assert w.next_target(now=5.0) == probed


def test_unwatched_members_are_checked_in_turn_never_checked_first():
    w = watch("a")
    members = {"a", "b", "c", "d"}
    w.admit(members)
    first = [w.next_unwatched(members, set(), now=t) for t in (1.0, 2.0, 3.0)]
    assert sorted(first) == ["b", "c", "d"]  # neighbour a is watched anyway
    assert w.next_unwatched(members, set(), now=4.0) == first[0]  # checked longest ago
    w.observe({"a", "c"}, MEMBERS, MEMBERS, now=5.0)  # c is a neighbour now
    assert "c" not in [w.next_unwatched(members, set(), now=t) for t in (6.0, 7.0, 8.0)]


def test_new_members_come_first_suspects_wait_and_leavers_drop_out():
    w = watch("a")
    members = {"a", "b", "c"}
    w.admit(members)
    assert {w.next_unwatched(members, set(), now=t) for t in (1.0, 2.0)} == {"b", "c"}
    members |= {"d"}
    w.admit({"d", "b"})  # b is known: it keeps its place
    assert w.next_unwatched(members, set(), now=3.0) == "d"  # never checked: first
    due = w.next_unwatched(members, set(), now=4.0)
    assert w.next_unwatched(members, {due}, now=5.0) != due  # suspected: passed over
    members -= {"b", "c"}  # both left
    assert [w.next_unwatched(members, set(), now=t) for t in (6.0, 7.0)] == ["d", "d"]
    assert w.next_unwatched(members, {"d"}, now=8.0) is None


def test_lost_neighbours_are_not_unwatched():
    w = watch("a", "b")
    w.observe({"a"}, MEMBERS, MEMBERS, now=1.0)  # b lost: probed every round already
    w.admit({"a", "b"})
    assert w.next_unwatched({"a", "b"}, set(), now=2.0) is None

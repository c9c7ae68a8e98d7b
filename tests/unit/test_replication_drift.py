"""When a peer's replica has drifted from ours (``otela/replication/drift.py``)."""

import itertools

from otela.replication.drift import FIRST_GAP_S, MAX_GAP_S, SETTLE_S, DriftWatch, summary

OURS = summary(b"\x01" * 16, [])
THEIRS = summary(b"\x02" * 16, [])


def test_the_summary_covers_the_map_and_the_revocations():
    assert summary(b"\x01" * 16, []) == OURS
    assert summary(b"\x01" * 16, ["serial-1"]) != OURS
    assert summary(b"\x02" * 16, []) != OURS
    assert len(OURS) == 8


def test_equal_replicas_never_sync():
    watch = DriftWatch()
    assert not watch.compare("p", OURS, 100.0, OURS, 100.0, 0.0, leader=True)


def test_a_difference_in_flight_is_left_to_gossip():
    watch = DriftWatch()
    # Either replica changed within the settle time: a delta is still on its way.
    assert not watch.compare("p", THEIRS, SETTLE_S - 0.1, OURS, 100.0, 0.0, leader=True)
    assert not watch.compare("p", THEIRS, 100.0, OURS, SETTLE_S - 0.1, 0.0, leader=True)
    assert watch.compare("p", THEIRS, SETTLE_S, OURS, SETTLE_S, 0.0, leader=True)


def test_the_leader_goes_first_and_the_other_side_only_if_the_difference_stays():
    watch = DriftWatch()
    assert not watch.compare("p", THEIRS, SETTLE_S, OURS, SETTLE_S, 0.0, leader=False)
    late = SETTLE_S + FIRST_GAP_S
    assert watch.compare("p", THEIRS, late, OURS, late, 0.0, leader=False)


def test_a_difference_that_outlives_its_repairs_is_asked_less_and_less_often():
    watch = DriftWatch()
    times = [t / 2 for t in range(2 * 2000)]  # a probe every half second for 2000 s
    synced = [t for t in times if watch.compare("p", THEIRS, 1e6, OURS, 1e6, t, leader=True)]
    gaps = [b - a for a, b in itertools.pairwise(synced)]
    assert synced[0] == 0.0
    assert gaps[:5] == [FIRST_GAP_S, 2 * FIRST_GAP_S, 4 * FIRST_GAP_S, 8 * FIRST_GAP_S,
                        16 * FIRST_GAP_S]
    assert max(gaps) == MAX_GAP_S


def test_agreement_resets_the_back_off_and_peers_are_separate():
    watch = DriftWatch()
    assert watch.compare("p", THEIRS, 1e6, OURS, 1e6, 0.0, leader=True)
    assert not watch.compare("p", THEIRS, 1e6, OURS, 1e6, 1.0, leader=True)  # within the gap
    assert watch.compare("q", THEIRS, 1e6, OURS, 1e6, 1.0, leader=True)  # another peer
    assert not watch.compare("p", OURS, 1e6, OURS, 1e6, 2.0, leader=True)  # repaired
    assert watch.compare("p", THEIRS, 1e6, OURS, 1e6, 3.0, leader=True)  # a new drift

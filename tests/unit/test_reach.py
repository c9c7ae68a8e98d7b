"""The reach sample: whether a node reaches most of the federation (otela/liveness/reach.py)."""

from otela.liveness.reach import BATCH, MIN_ANSWERS, SAMPLE, WINDOW_S, ReachSample


def test_most_members_unanswered_means_cut_off():
    sample = ReachSample()
    for i in range(5):
        sample.note(f"p{i}", "unknown", now=float(i))
    sample.note("p9", "accepted", now=5.0)
    assert sample.cut_off(now=5.0)  # 5 of 6 found nobody


def test_one_host_down_picked_again_and_again_is_not_a_partition():
    """In a small federation a random pick finds the same dead host often."""
    sample = ReachSample()
    for i in range(SAMPLE):
        sample.note("dead" if i % 4 else "p1", "unknown" if i % 4 else "accepted", now=i)
    assert sample.cut_off(now=float(SAMPLE)) is None  # mostly silent, but one member
    for i, peer in enumerate(("dead", "p2", "p3", "p4", "p5", "p6")):
        sample.note(peer, "unknown", now=10.0 + i)
    assert sample.cut_off(now=16.0)


def test_a_refused_connect_reached_the_host():
    """A crashed daemon on a live host refuses: the network is there, we are not cut off."""
    sample = ReachSample()
    for i in range(6):
        sample.note(f"p{i}", "refused" if i % 2 else "unknown", now=float(i))
    assert sample.cut_off(now=6.0) is False  # 3 of 6: not more than half


def test_too_few_recent_answers_say_nothing():
    """A cut-off node whose loop stalled must not take the silence for the heal."""
    sample = ReachSample()
    for i in range(MIN_ANSWERS - 1):
        sample.note(f"p{i}", "unknown", now=float(i))
    sample.note("nat", "none", now=3.5)  # behind NAT: no sample
    assert sample.cut_off(now=4.0) is None  # no verdict either way
    sample.note("p8", "unknown", now=4.0)
    assert sample.cut_off(now=4.0) is True
    assert sample.cut_off(now=WINDOW_S + 1.0) is None  # the early ones aged out: no verdict


def test_only_the_most_recent_answers_count():
    sample = ReachSample()
    for i in range(SAMPLE):
        sample.note(f"p{i}", "unknown", now=float(i))
    for i in range(SAMPLE // 2 + 1):
        sample.note(f"q{i}", "accepted", now=10.0 + i)
    assert sample.cut_off(now=20.0) is False  # the heal: most of the last answers reached


def test_while_the_sample_is_short_several_members_are_asked_at_once():
    sample = ReachSample()
    assert sample.wanted(now=0.0) == BATCH
    for i in range(SAMPLE - 2):
        sample.note(f"p{i}", "accepted", now=0.0)
    assert sample.wanted(now=1.0) == 2
    sample.note("p7", "accepted", now=1.0)
    sample.note("p8", "accepted", now=1.0)
    assert sample.wanted(now=2.0) == 1  # full: one a period keeps it fresh
    assert sample.wanted(now=WINDOW_S + 2.0) == BATCH  # all aged out

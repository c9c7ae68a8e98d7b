"""The reach sample: whether a node reaches most of the federation (otela/liveness/reach.py)."""

import math
import random

from otela.liveness.reach import MIN_ANSWERS, SAMPLE, WINDOW_S, ReachSample


def test_most_members_unanswered_means_cut_off():
    sample = ReachSample()
    for i in range(5):
        sample.note(f"p{i}", "unknown", now=float(i))
    sample.note("p9", "accepted", now=5.0)
    assert sample.cut_off(now=5.0)  # 5 of 6 found nobody


def test_one_host_down_asked_again_and_again_counts_once():
    """In a small federation the same dead host comes up again and again: its latest
    answer is what counts, once."""
    sample = ReachSample()
    for i in range(SAMPLE):
        sample.note("dead", "unknown", now=float(i))
    for i in range(3):
        sample.note(f"p{i}", "accepted", now=10.0 + i)
    assert sample.cut_off(now=13.0) is False  # one of four members silent
    for i, peer in enumerate(("p2", "p3", "p4", "p5", "p6")):
        sample.note(peer, "unknown", now=20.0 + i)
    assert sample.cut_off(now=25.0)  # six of eight members silent


def test_two_silent_members_of_three_are_too_few_to_call_a_partition():
    sample = ReachSample()
    for i, answer in enumerate(("unknown", "unknown", "unknown", "accepted", "accepted")):
        sample.note(f"p{i}", answer, now=float(i))
    assert sample.cut_off(now=5.0) is None  # three of five silent: a host or three down


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


def test_only_the_most_recent_members_count():
    sample = ReachSample()
    for i in range(SAMPLE):
        sample.note(f"p{i}", "unknown", now=float(i))
    for i in range(SAMPLE // 2 + 1):
        sample.note(f"q{i}", "accepted", now=10.0 + i)
    assert sample.cut_off(now=20.0) is False  # the heal: most of the last answers reached


def test_the_sample_is_taken_since_its_oldest_answer_once_full():
    sample = ReachSample()
    assert sample.taken_since(now=0.0, members=0) == 0.0  # nobody to ask
    for i in range(SAMPLE - 1):
        sample.note(f"p{i}", "unknown", now=float(i))
    assert sample.taken_since(now=8.0, members=100) == -math.inf  # short
    assert sample.taken_since(now=8.0, members=5) == 2.0  # all five of a small one: p2..p6
    sample.note("nat", "none", now=9.0)  # asked, though it has no address to try
    assert sample.taken_since(now=9.0, members=100) == 0.0
    sample.note("p0", "accepted", now=10.0)  # asked again: its older answer is gone
    assert sample.taken_since(now=10.0, members=100) == 1.0
    assert sample.taken_since(now=WINDOW_S + 1.5, members=100) == -math.inf  # aged out


def test_while_the_sample_is_short_all_it_lacks_are_asked_at_once():
    sample = ReachSample()
    assert sample.wanted(now=0.0, members=100) == SAMPLE
    for i in range(SAMPLE - 2):
        sample.note(f"p{i}", "accepted", now=0.0)
    assert sample.wanted(now=1.0, members=100) == 2
    assert sample.wanted(now=1.0, members=5) == 1  # a small federation's all asked
    sample.note("p7", "accepted", now=1.0)
    sample.note("p8", "accepted", now=1.0)
    assert sample.wanted(now=2.0, members=100) == 1  # full: one a period keeps it fresh
    assert sample.wanted(now=2.0, members=100, since=0.5) == SAMPLE - 2  # since a suspicion
    assert sample.wanted(now=WINDOW_S + 2.0, members=100) == SAMPLE  # all aged out


def test_a_small_federation_is_asked_in_full_then_least_recently_asked_first():
    """Six members: one period asks them all, so no unlucky pick can leave the one member
    a cut-off node still reaches counted twice and the rest unheard."""
    members = [f"m{i}" for i in range(6)]
    for seed in range(5):
        sample, rng = ReachSample(), random.Random(seed)
        assert sample.targets(members, rng, now=0.0) == members
        for i, peer in enumerate(members):
            sample.note(peer, "unknown", now=float(i))
        assert sample.targets(members, rng, now=10.0) == ["m0"]  # then the oldest again
        assert sample.cut_off(now=10.0)


def test_a_large_federation_is_sampled_among_members_not_asked_since():
    members = [f"m{i}" for i in range(1000)]
    sample, rng = ReachSample(), random.Random(7)
    asked: set[str] = set()
    for period in range(2):
        picks = sample.targets(members, rng, now=float(period))
        assert len(picks) == (SAMPLE if period == 0 else 1) and not asked & set(picks)
        asked |= set(picks)
        for peer in picks:
            sample.note(peer, "accepted", now=float(period))
    assert len(sample.targets(members, rng, now=2.0, since=1.5)) == SAMPLE  # a new suspicion

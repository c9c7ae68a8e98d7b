"""Members caught misbehaving: reported, kept out of routing for a while, memory bounded;
and the per-peer buckets that meter their writes."""

from otela.replication.misconduct import (
    MAX_OFFENDERS,
    UNJUSTIFIED_EVICTION,
    Misconduct,
    PeerRates,
)


def test_an_offender_is_excluded_until_it_has_been_quiet_for_the_exclusion_time():
    misconduct = Misconduct(exclude_s=600.0)
    assert misconduct.report("rogue", UNJUSTIFIED_EVICTION, now=100.0)  # news: warn
    assert not misconduct.report("rogue", UNJUSTIFIED_EVICTION, now=101.0)  # not again
    assert misconduct.excluded(now=101.0) == {"rogue"}
    assert misconduct.excluded(now=700.9) == {"rogue"}  # 600 s after the *last* offence
    assert misconduct.excluded(now=701.0) == frozenset()
    assert misconduct.report("rogue", UNJUSTIFIED_EVICTION, now=800.0)  # news again
    (entry,) = misconduct.snapshot(now=800.0)
    assert entry["peer_id"] == "rogue" and entry["offences"] == {UNJUSTIFIED_EVICTION: 3}
    assert entry["excluded_from_routing"]


def test_what_is_remembered_is_bounded():
    misconduct = Misconduct()
    for i in range(MAX_OFFENDERS + 100):
        misconduct.report(f"p{i}", UNJUSTIFIED_EVICTION, now=float(i))
    assert len(misconduct.snapshot(now=2000.0)) == MAX_OFFENDERS
    assert "p0" not in misconduct.excluded(now=2000.0)  # the oldest forgotten first


def test_peer_rates_allow_a_burst_then_the_rate():
    rates = PeerRates(burst=3, per_second=1.0)
    assert [rates.take("a", 0.0) for _ in range(4)] == [True, True, True, False]
    assert not rates.allows("a", 0.5) and rates.allows("a", 1.0)
    assert rates.take("b", 0.0)  # per peer
    small = PeerRates(burst=1, per_second=1.0, max_peers=10)
    for i in range(100):
        small.take(f"p{i}", float(i))
    assert len(small._buckets) <= 11  # peers quiet long enough are dropped

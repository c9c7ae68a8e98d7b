"""The registry replica: lattice merge, views, routing lookups, and garbage collection."""

import pytest

from otela.registry.crdt import GCPolicy, GMap, Rejected, join
from otela.registry.records import Lifecycle
from otela.registry.store import Registry

from .registry_helpers import entry, sid

NOW = 1000.0
J, S, D, L = Lifecycle.JOIN, Lifecycle.SERVING, Lifecycle.DOWN, Lifecycle.LEFT


def test_higher_state_wins_even_with_a_lower_version():
    assert join(entry("a", 9, S), entry("a", 1, D)).state is D
    assert join(entry("a", 1, D), entry("a", 9, S)).state is D


def test_within_a_state_the_higher_version_wins_and_ties_break_deterministically():
    assert join(entry("a", 2, S), entry("a", 3, S)).version == 3
    x, y = entry("a", 2, S, salt="x"), entry("a", 2, S, salt="y")
    assert join(x, y) is join(y, x)


def test_left_is_final():
    reg = Registry()
    reg.apply(entry("a", 5, L), NOW)
    for newer in (entry("a", 99, S), entry("a", 99, D), entry("a", 6, J)):
        assert not reg.apply(newer, NOW)
    assert reg.entry(sid("a")).state is L and reg.entry(sid("a")).version == 5


def test_views_follow_state_and_routing_sees_only_serving():
    reg = Registry()
    reg.apply(entry("a", 2, S, models=("m1", "m2")), NOW)
    reg.apply(entry("b", 2, D, models=("m1",)), NOW)
    reg.apply(entry("c", 1, J, models=()), NOW)
    assert [m.model_id for m in reg.models()] == ["m1", "m2"]
    assert {r.session_id for r in reg.model("m1").sessions} == {sid("a"), sid("b")}
    assert [r.session_id for r in reg.serving_candidates("m1")] == [sid("a")]
    reg.apply(entry("a", 3, D, models=("m1", "m2")), NOW)
    assert reg.serving_candidates("m1") == ()
    assert reg.serving_candidates("nope") == ()


def test_candidate_lookup_is_cached_until_the_model_changes():
    reg = Registry()
    reg.apply(entry("a", 1, S), NOW)
    first = reg.serving_candidates("m")
    assert reg.serving_candidates("m") is first  # no allocation on the hot path
    reg.apply(entry("b", 1, S), NOW)
    assert {r.session_id for r in reg.serving_candidates("m")} == {sid("a"), sid("b")}


def test_left_entries_leave_model_views_at_once_and_node_views_after_retention():
    reg = Registry(GCPolicy(retention=100, horizon=200))
    reg.apply(entry("a", 2, S), NOW)
    reg.apply(entry("a", 3, L, updated_at=NOW), NOW)
    assert reg.model("m") is None
    assert reg.get(sid("a")).state is L
    reg.maintain(NOW + 99)
    assert reg.get(sid("a")) is not None
    reg.maintain(NOW + 101)
    assert reg.get(sid("a")) is None and reg.entry(sid("a")) is not None  # tombstone kept
    reg.maintain(NOW + 201)
    assert reg.entry(sid("a")) is None  # compacted


def test_compacted_sessions_cannot_be_resurrected_by_replayed_gossip():
    reg = Registry(GCPolicy(retention=100, horizon=200))
    old = entry("a", 2, S, updated_at=NOW)
    reg.apply(old, NOW)
    reg.apply(entry("a", 3, L, updated_at=NOW + 10), NOW + 10)
    reg.maintain(NOW + 300)
    assert reg.entry(sid("a")) is None
    for replay in (old, entry("a", 3, L, updated_at=NOW + 10)):
        with pytest.raises(Rejected):
            reg.apply(replay, NOW + 300)
    assert reg.entry(sid("a")) is None and reg.get(sid("a")) is None


def test_entries_signed_in_the_future_are_refused():
    with pytest.raises(Rejected, match="future"):
        Registry().apply(entry("a", 1, S, updated_at=NOW + 3600), NOW)


def test_bucket_digests_track_the_content_incrementally():
    a, b = GMap(), GMap()
    for e in (entry("x", 1, S), entry("y", 1, J), entry("x", 2, S)):
        a.merge(e, NOW)
    for e in (entry("x", 2, S), entry("y", 1, J)):
        b.merge(e, NOW)
    assert a.digest_root() == b.digest_root()
    b.merge(entry("y", 2, S), NOW)
    assert a.digest_root() != b.digest_root()
    assert sum(x != y for x, y in zip(a.bucket_hashes(), b.bucket_hashes(), strict=True)) == 1
    a.compact(NOW + GCPolicy().horizon + 1)
    assert a.digest_root() == GMap().digest_root()


def test_policy_rejects_retention_longer_than_horizon():
    with pytest.raises(ValueError):
        GCPolicy(retention=10, horizon=5)


def test_ten_thousand_sessions_over_simulated_days_stay_bounded():
    """Sessions join, serve and leave for 7 simulated days: the map holds the live set plus
    what changed within the horizon, never the whole history."""
    policy = GCPolicy(retention=6 * 3600, horizon=12 * 3600)
    reg = Registry(policy)
    live: dict[str, int] = {}  # session -> version; about 300 sessions alive at any time
    t, peak = 0.0, 0
    step = 7 * 86400 / 10_000  # 10,000 sessions start over 7 days (one every ~60 s)
    left_within_horizon = policy.horizon / step  # at most one session leaves per step
    for i in range(10_000):
        t += step
        reg.apply(entry(f"s{i}", 1, S, updated_at=t), t)
        live[f"s{i}"] = 1
        if len(live) > 300:  # the oldest job hits its wall time
            leaving, version = next(iter(live.items()))
            del live[leaving]
            reg.apply(entry(leaving, version + 1, L, updated_at=t), t)
        if i % 50 == 0:  # live owners refresh their lease; replicas run maintenance
            for key in live:
                live[key] += 1
                reg.apply(entry(key, live[key], S, updated_at=t), t)
            reg.maintain(t)
            assert len(reg.map) <= len(live) + left_within_horizon + 50
            assert len(reg) <= len(live) + policy.retention / step + 50  # the views
            peak = max(peak, len(reg.map))
    assert peak < 1_200  # the live set plus ~12 h of departures, not 10,000 sessions

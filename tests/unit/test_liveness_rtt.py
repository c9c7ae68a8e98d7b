"""Per-peer probe timeouts from measured round trips."""

from otela.liveness.rtt import RoundTrips


def test_unknown_peers_get_the_configured_timeout():
    assert RoundTrips(floor=1.0, ceiling=3.0).timeout("a") == 1.0


def test_fast_peers_never_get_less_than_the_configured_timeout():
    rtt = RoundTrips(floor=1.0, ceiling=3.0)
    for _ in range(20):
        rtt.observe("a", 0.002)
    assert rtt.timeout("a") == 1.0


def test_a_slow_and_jittery_peer_gets_a_longer_wait_up_to_the_ceiling():
    rtt = RoundTrips(floor=1.0, ceiling=3.0)
    for sample in [0.6, 0.9, 0.5, 1.1, 0.7]:
        rtt.observe("busy", sample)
    smoothed = rtt.smoothed("busy")
    assert smoothed is not None and 0.6 < smoothed < 0.9
    assert 1.0 < rtt.timeout("busy") < 3.0  # srtt + 4 x variation, above the floor
    for _ in range(3):
        rtt.observe("busy", 10.0)
    assert rtt.timeout("busy") == 3.0
    assert rtt.timeout("other") == 1.0  # per peer


def test_history_of_departed_members_is_dropped():
    rtt = RoundTrips(floor=1.0, ceiling=3.0)
    rtt.observe("a", 2.0)
    rtt.observe("b", 2.0)
    rtt.forget_except({"b"})
    assert rtt.smoothed("a") is None and rtt.smoothed("b") == 2.0

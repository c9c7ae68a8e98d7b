"""Who goes next when a model's nodes are full (``otela.routing.fairshare``): classes in
order, weighted token shares between teams and between a team's keys, no credit banked
while idle, corrections by what requests used, and a starving class still advancing."""

from __future__ import annotations

from collections import Counter

import pytest

from otela.routing.fairshare import STARVATION_TURN, FairShare, Waiter


def waiter(team: str, key: str | None = None, *, klass: int = 1, cost: float = 100,
           team_weight: float = 1, key_weight: float = 1, arrived: float = 0) -> Waiter:
    return Waiter(klass, team, team_weight, key or team, key_weight, cost, arrived)


def drain(share: FairShare, count: int, refill: dict[str, Waiter] | None = None,
          now: float = 0) -> Counter[str]:
    """Dispatch ``count`` requests; each dispatched flow is refilled (flooding clients)."""
    served: Counter[str] = Counter()
    for _ in range(count):
        got = share.take(now)
        assert got is not None
        served[got.key] += got.cost
        if refill is not None and got.key in refill:
            template = refill[got.key]
            share.push(waiter(template.team, template.key, klass=template.klass,
                              cost=template.cost, team_weight=template.team_weight,
                              key_weight=template.key_weight, arrived=now))
    return served


def flooding(share: FairShare, *flows: Waiter, depth: int = 5) -> dict[str, Waiter]:
    for flow in flows:
        for _ in range(depth):
            share.push(waiter(flow.team, flow.key, klass=flow.klass, cost=flow.cost,
                              team_weight=flow.team_weight, key_weight=flow.key_weight))
    return {f.key: f for f in flows}


def test_equal_teams_get_equal_tokens_even_with_different_request_sizes() -> None:
    share = FairShare(3, starvation_s=10)
    refill = flooding(share, waiter("a", cost=100), waiter("b", cost=400))
    served = drain(share, 500, refill)
    assert served["a"] == pytest.approx(served["b"], rel=0.02)


def test_three_to_one_weights_give_three_to_one_tokens() -> None:
    share = FairShare(3, starvation_s=10)
    refill = flooding(share, waiter("a", team_weight=3), waiter("b", team_weight=1))
    served = drain(share, 400, refill)
    assert served["a"] / served["b"] == pytest.approx(3, rel=0.02)


def test_keys_share_their_teams_share_by_their_own_weights() -> None:
    share = FairShare(3, starvation_s=10)
    refill = flooding(share, waiter("t1", "k1", key_weight=1), waiter("t1", "k2", key_weight=1),
                      waiter("t1", "k3", key_weight=2), waiter("t2", "solo"))
    served = drain(share, 800, refill)
    team1 = served["k1"] + served["k2"] + served["k3"]
    assert team1 == pytest.approx(served["solo"], rel=0.02)  # teams equal, not keys
    assert served["k3"] == pytest.approx(2 * served["k1"], rel=0.05)
    assert served["k1"] == pytest.approx(served["k2"], rel=0.05)


def test_a_better_class_goes_first_and_a_class_is_fifo_per_key() -> None:
    share = FairShare(3, starvation_s=10)
    batch = [waiter("a", klass=2, arrived=i) for i in range(3)]
    for w in batch:
        share.push(w)
    urgent = waiter("b", klass=0, arrived=5)
    share.push(urgent)
    assert share.take(6) is urgent
    assert [share.take(6) for _ in range(3)] == batch
    assert share.take(6) is None and len(share) == 0


def test_a_starving_class_gets_one_dispatch_in_ten_and_no_more() -> None:
    share = FairShare(3, starvation_s=10)
    refill = flooding(share, waiter("urgent", klass=0))
    for i in range(50):
        share.push(waiter("bulk", klass=2, arrived=i * 0.01))
    assert drain(share, 20, refill, now=5)["bulk"] == 0  # not starving yet: strict order
    served = drain(share, 100, refill, now=20)  # bulk's oldest has waited 20 s > 10 s
    assert served["bulk"] == 100 * 100 // STARVATION_TURN


def test_an_idle_team_banks_no_credit() -> None:
    share = FairShare(3, starvation_s=10)
    refill = flooding(share, waiter("busy"))
    drain(share, 1000, refill)  # alone for a long time: its virtual time grows
    refill.update(flooding(share, waiter("late")))
    served = drain(share, 200, refill)
    # the newcomer starts at the busy team's virtual time: equal shares from now on,
    # not 1,000 requests in a row to catch up
    assert served["late"] == pytest.approx(served["busy"], rel=0.05)


def test_a_request_that_used_more_than_its_estimate_costs_its_team_the_difference() -> None:
    share = FairShare(3, starvation_s=10)
    refill = flooding(share, waiter("a"), waiter("b"))
    first = share.take(0)
    assert first is not None
    share.settle(first, 1000)  # estimated 100, used 1,000
    served = drain(share, 40, refill)
    loser = first.key
    other = "b" if loser == "a" else "a"
    assert served[other] - served[loser] == pytest.approx(900, abs=100)


def test_waiters_that_do_not_fit_are_skipped_not_blocking_others() -> None:
    share = FairShare(3, starvation_s=10)
    blocked = waiter("a")
    blocked.fits = lambda: False
    share.push(blocked)
    free = waiter("b", arrived=1)
    share.push(free)
    assert share.take(2) is free
    assert share.take(2) is None and len(share) == 1
    share.remove(blocked)
    share.remove(blocked)  # leaving twice (timeout racing a dispatch) is harmless
    assert len(share) == 0


def test_memory_stays_bounded_by_the_flows_that_wait() -> None:
    share = FairShare(3, starvation_s=10)
    for i in range(1000):
        w = waiter(f"team{i}")
        share.push(w)
        assert share.take(0) is w
        share.forget_idle()
    assert share.classes[1].teams == {}

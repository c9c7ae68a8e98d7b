"""A plan judged in the event simulator: unserved models are reported, not averaged away,
and every model's utilisation (offered rate over its replicas' capacity) is stated."""

from __future__ import annotations

import math

from simulator.placer.demand import Demand, Lengths, Service
from simulator.placer.evaluate import Group, evaluate
from simulator.placer.pool import Variant


def _demand(rate_a: float, rate_b: float) -> Demand:
    def svc(name: str, model: str, rate: float) -> Service:
        return Service(name, model, rate, Lengths.parse("fixed:500"), Lengths.parse("fixed:100"))

    return Demand((svc("a/small", "llama-3.1-8b", rate_a), svc("b/other", "qwen2.5-7b", rate_b)))


def test_a_model_without_gpus_is_unserved_not_averaged_away() -> None:
    groups = [Group("a/small", Variant("h100"), 1, 1, 1.0)]  # nothing for b/other
    ev = evaluate(_demand(2.0, 3.0), groups, duration_s=30.0)
    assert ev.unserved == ("b/other",)
    assert ev.unserved_rps == ev.services[1].requests / 30.0 > 2.0
    served, unserved = ev.services
    assert served.served and not unserved.served
    assert unserved.completed == 0 and unserved.goodput_rps == 0.0
    assert math.isnan(unserved.mean_e2e)
    assert ev.mean_e2e == served.mean_e2e  # the mean is over served requests only...
    d = ev.to_dict()
    assert d["unserved"] == ["b/other"] and d["models"][1]["utilization"] is None  # ...and says so


def test_utilisation_is_offered_over_capacity() -> None:
    groups = [Group("a/small", Variant("h100"), 1, 1, 1.0),
              Group("b/other", Variant("h100"), 1, 2, 1.0)]
    light = evaluate(_demand(2.0, 2.0), groups, duration_s=30.0)
    heavy = evaluate(_demand(60.0, 2.0), groups, duration_s=30.0)
    a_light, b_light = light.services
    assert 0 < a_light.utilization < 0.5 and 0 < b_light.utilization < 0.25
    assert b_light.capacity_rps > a_light.capacity_rps  # two replicas against one
    assert heavy.services[0].utilization > 10 * a_light.utilization
    assert heavy.max_utilization == heavy.services[0].utilization
    assert not light.unserved

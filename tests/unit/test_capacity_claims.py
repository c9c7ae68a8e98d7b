"""What a node claims about its capacity is checked: against its hardware, and against how
fast it answers (``otela.routing.speed``); idle ties are not won by claiming."""

import random
from collections import Counter

from otela.registry.records import GPU, Hardware, Lifecycle
from otela.routing.load import NodeLoad
from otela.routing.policies import Candidate, Pick, PowerOfTwo
from otela.routing.router import Router, routing_settings
from otela.routing.speed import FLOOR, MIN_SAMPLES, Speeds

from .registry_helpers import record


def test_a_node_keeps_its_weight_until_measured_then_loses_it_if_slower():
    speeds = Speeds()
    for _ in range(MIN_SAMPLES - 1):
        speeds.observe("slow", "m", False, 2.0)
        speeds.observe("fast", "m", False, 0.5)
    assert speeds.factor("slow", "m", False) == 1.0  # not enough answers yet
    for _ in range(40):
        speeds.observe("slow", "m", False, 2.0)
        for _ in range(3):
            speeds.observe("fast", "m", False, 0.5)
    for _ in range(40):
        speeds.observe("typical", "m", False, 0.6)
    # The reference is the median node (0.6 s): the slow one, 3.3 x slower, keeps
    # 2 x 0.6 / 2 of its weight; one within twice the median keeps all of it.
    assert abs(speeds.factor("slow", "m", False) - 0.6) < 0.03
    for _ in range(40):
        speeds.observe("a bit slow", "m", False, 1.1)
    assert speeds.factor("a bit slow", "m", False) == 1.0
    assert speeds.factor("fast", "m", False) == 1.0  # faster gains nothing it did not claim
    assert speeds.factor("slow", "m", True) == 1.0  # streams are measured apart
    for _ in range(100):
        speeds.observe("frozen", "m", False, 1000.0)
    assert speeds.factor("frozen", "m", False) == FLOOR  # it cannot drag the reference


def test_an_idle_tie_is_not_won_by_claiming_capacity():
    """Two idle nodes, one claiming 1,000x the other's capacity: each gets about half (a
    tie used to go to the larger claim, so an idle federation sent it everything)."""
    candidates = [Candidate(record(f"n{i}", 1, Lifecycle.SERVING), 0.0, cap)
                  for i, cap in enumerate((1.0, 1000.0))]
    rng = random.Random(3)
    counts = Counter(PowerOfTwo().pick(candidates, Pick("m"), rng).session
                     for _ in range(4000))
    assert 1700 < counts[candidates[1].session] < 2300


class _Upstreams:
    def self_session(self) -> str:
        return "me"


def test_routing_caps_a_claim_at_what_the_hardware_serves_and_scales_it_by_speed():
    def plausible(rec):
        return 2.0 if rec.hardware.gpus else 1.0

    router = Router(None, _Upstreams(), routing_settings(),  # type: ignore[arg-type]
                    clock=lambda: 0.0, plausible=plausible)
    cpu = record("cpu", 1, Lifecycle.SERVING)
    gpu = record("gpu", 1, Lifecycle.SERVING)
    gpu = gpu.__class__(**{**{f: getattr(gpu, f) for f in gpu.__slots__},
                           "hardware": Hardware(gpus=(GPU("h100", 80),))})
    for node in (cpu, gpu):
        router.loads.report(node.session_id, NodeLoad(capacity=1000.0), 0.0)
    pick = Pick("m")
    assert router.capacity(cpu, 0.0, pick) == 1.0
    assert router.capacity(gpu, 0.0, pick) == 2.0
    router.loads.report(cpu.session_id, NodeLoad(capacity=0.5), 0.0)  # a modest claim holds
    assert router.capacity(cpu, 0.0, pick) == 0.5
    for node, seconds in ((gpu, 4.0), (cpu, 1.0), (record("other", 1, Lifecycle.SERVING), 1.0)):
        for _ in range(50):
            router.speeds.observe(node.session_id, "m", False, seconds)
    assert router.capacity(gpu, 0.0, pick) == 1.0  # claims 2 units, answers 4x slower


def test_balancing_providers_gives_each_an_equal_share_whatever_its_node_count():
    from otela.routing.policies import provider_share

    many = [Candidate(record(f"big{i}", 1, Lifecycle.SERVING, provider="big"), 0.0, 1.0)
            for i in range(10)]
    one = [Candidate(record("small", 1, Lifecycle.SERVING, provider="small"), 0.0, 1.0)]
    rng = random.Random(5)
    counts = Counter(PowerOfTwo().pick(provider_share(many + one, rng), Pick("m"), rng)
                     .record.provider_id for _ in range(4000))
    assert 1800 < counts["small"] < 2200  # half, not one in eleven
    busy = [Candidate(c.record, 5.0, 1.0) for c in one]
    counts = Counter(PowerOfTwo().pick(provider_share(many + busy, rng), Pick("m"), rng)
                     .record.provider_id for _ in range(1000))
    assert counts["small"] == 0  # the less loaded provider wins the pair

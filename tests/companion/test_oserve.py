"""OSERVE's cores on hand-checkable cases: the assignment LP, the layout search against the
exhaustive optimum, request types, the switch plan and the rate forecaster."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from simulator.policies.interfaces import Shape
from simulator.policies.oserve.assignment import AssignmentError, assign
from simulator.policies.oserve.predict import TypeRateForecaster, holt
from simulator.policies.oserve.search import (
    Scored,
    best_homogeneous,
    choose_served,
    exhaustive,
    flow_guided_search,
    homogeneous_candidates,
    layouts,
    pack,
    score,
)
from simulator.policies.oserve.switching import greedy_plan, holdings, transfer_seconds
from simulator.policies.oserve.types import fit_types


def test_lp_two_replicas_hand_checked() -> None:
    # A serves 10 type-1 or 5 type-2 req/s, B 5 or 3; demand 100 and 50 (the paper's App. C
    # numbers). A is relatively better at type 1 (10/5 > 5/3), so it takes all of type 1 and
    # y of type 2: 100/10 + y/5 = (50 - y)/3  =>  y = 12.5, U = 12.5.
    a = assign([[10, 5], [5, 3]], [100, 50])
    assert a.load == pytest.approx(12.5)
    assert a.flow == pytest.approx(np.array([[100, 12.5], [0, 37.5]]))
    assert a.utilization == pytest.approx([12.5, 12.5])
    assert a.throughput == pytest.approx(150 / 12.5)
    assert a.fractions()[:, 1] == pytest.approx([0.25, 0.75])


def test_lp_identical_replicas_split_the_work() -> None:
    a = assign([[10, 5], [10, 5]], [100, 50])
    # total work 100/10 + 50/5 = 20 replica-seconds over 2 replicas
    assert a.load == pytest.approx(10.0)
    assert a.flow.sum(axis=0) == pytest.approx([100, 50])


def test_spreading_gives_each_type_to_both_identical_replicas() -> None:
    # Two identical replicas, two types: U = (100/10 + 50/5) / 2 = 10 whatever the split, and
    # the plain LP returns a vertex that gives each type to one replica (the segregation that
    # made per-type routing lose to least-loaded). Spreading keeps U = 10 and moves to the
    # capacity-proportional split: half of each type on each replica.
    plain = assign([[10, 5], [10, 5]], [100, 50])
    spread = assign([[10, 5], [10, 5]], [100, 50], spread=0.0)
    assert plain.load == spread.load == pytest.approx(10.0)
    assert spread.flow == pytest.approx(np.array([[50, 25], [50, 25]]))
    assert spread.utilization == pytest.approx([10, 10])
    assert spread.fractions() == pytest.approx(np.full((2, 2), 0.5))


def test_spreading_keeps_the_specialisation_the_optimum_needs() -> None:
    # The App. C case has one optimal flow (A takes all of type 1): spreading at tolerance 0
    # leaves it. With 2 % slack (loads <= 12.75) it moves towards the proportional split
    # (type 1: 66.7 on A, type 2: 31.25 on A) until both replicas are at 12.75:
    # x/10 + y/5 = 12.75 and (100 - x)/5 + (50 - y)/3 = 12.75  =>  x = 80, y = 23.75.
    exact = assign([[10, 5], [5, 3]], [100, 50], spread=0.0)
    assert exact.flow == pytest.approx(np.array([[100, 12.5], [0, 37.5]]), abs=1e-4)
    loose = assign([[10, 5], [5, 3]], [100, 50], spread=0.02)
    assert loose.load == pytest.approx(12.5)  # the reported optimum is the first stage's
    assert loose.flow == pytest.approx(np.array([[80, 23.75], [20, 26.25]]), abs=1e-4)
    assert loose.utilization == pytest.approx([12.75, 12.75])
    with pytest.raises(AssignmentError):
        assign([[10, 5], [5, 3]], [100, 50], spread=-0.1)


def test_lp_respects_edges_a_replica_cannot_serve() -> None:
    a = assign([[10, 0], [5, 3]], [10, 3])  # replica 0 cannot hold type 1 (too long)
    assert a.flow[0, 1] == 0.0
    assert a.flow[1, 1] == pytest.approx(3.0)
    with pytest.raises(AssignmentError):
        assign([[10, 0], [5, 0]], [1, 1])


def _caps() -> dict[Shape, np.ndarray]:
    # per replica: small replicas are good at type 0, big ones at type 1 (per GPU)
    return {
        Shape("x", 2): np.array([10.0, 1.0]),
        Shape("x", 4): np.array([14.0, 6.0]),
    }


def test_search_finds_the_exhaustive_optimum_and_beats_homogeneous() -> None:
    caps = _caps()
    shapes = list(caps)
    demand = np.array([6.0, 1.0])
    ex = exhaustive(shapes, caps, demand, [8])
    hom = best_homogeneous(shapes, caps, demand, [8])
    for seed in range(3):
        found, trace = flow_guided_search(shapes, caps, demand, [8], seed=seed)
        assert found.throughput == pytest.approx(ex.throughput)
        assert trace.evaluations > 0
    assert len(set(ex.layout)) == 2  # the optimum mixes both shapes
    assert ex.throughput > hom.throughput * 1.05


def test_search_mixes_shapes_of_one_size() -> None:
    # One 8-GPU host, two 4-GPU shapes: A is good at type 0, B at type 1 (req/s alone). No
    # merge, split or swap of sizes applies (no 8-GPU or 2-GPU shape), so only re-picking the
    # starting layout's shapes can reach A + B. Demand (5, 5): A x2 has U = (5/10 + 5/2)/2 =
    # 1.5 (the best homogeneous, 6.7 req/s); A + B gives each type to its replica, U = 0.5
    # (20 req/s), the exhaustive optimum.
    a, b = Shape("x", 4), Shape("x", 2, 2)
    caps = {a: np.array([10.0, 2.0]), b: np.array([1.0, 10.0])}
    demand = np.array([5.0, 5.0])
    hom = best_homogeneous([a, b], caps, demand, [8])
    assert hom.layout == (a, a) and hom.throughput == pytest.approx(10 / 1.5)
    found, _ = flow_guided_search([a, b], caps, demand, [8])
    assert sorted(found.layout, key=str) == sorted((a, b), key=str)
    assert found.throughput == pytest.approx(20.0)
    assert exhaustive([a, b], caps, demand, [8]).throughput == pytest.approx(20.0)


def test_layouts_and_packing() -> None:
    s2, s4 = Shape("x", 2), Shape("x", 4)
    got = {tuple(sorted(x.label for x in lay)) for lay in layouts([s2, s4], 8)}
    assert got == {("TP2",) * 4, ("TP2", "TP2", "TP4"), ("TP4", "TP4")}
    assert pack([s4, s4, s4], [8, 4]) == (0, 0, 1)
    assert pack([Shape("x", 8)], [4, 4]) is None  # a replica never spans hosts


def test_types_recover_four_clusters() -> None:
    rng = np.random.default_rng(0)
    centres = [(200, 50), (200, 1000), (2000, 50), (2000, 1000)]
    inp = np.concatenate([rng.lognormal(np.log(i), 0.2, 500) for i, _ in centres])
    out = np.concatenate([rng.lognormal(np.log(o), 0.2, 500) for _, o in centres])
    t = fit_types(inp, out, k=4)
    assert sorted(t.names) == ["LILO", "LISO", "SILO", "SISO"]
    lab = t.classify(inp, out)
    for k in range(4):  # each generated cluster lands in one type
        assert len(set(lab[k * 500:(k + 1) * 500].tolist())) == 1
    means = dict(zip(t.names, t.mean_lengths(), strict=True))
    assert means["SILO"][0] == pytest.approx(200, rel=0.1)
    assert means["SILO"][1] == pytest.approx(1000, rel=0.1)


def test_switch_plan_prefers_local_sources_and_copies_only_what_is_missing() -> None:
    # before: two TP2 replicas on GPUs 0-1 and 2-3 (host 0); after: one TP4 on GPUs 0-3
    before = holdings([Shape("x", 2), Shape("x", 2)], [[0, 1], [2, 3]], layers=2, slices=4)
    after = holdings([Shape("x", 4)], [[0, 1, 2, 3]], layers=2, slices=4)
    hosts = {g: 0 for g in range(4)}
    plan = greedy_plan(before, after, hosts)
    # TP4 rank t needs slice t. GPU 0 (had 0-1) and GPU 3 (had 2-3) keep theirs; GPU 1 (had
    # 2-3) lacks slice 1, held by GPUs 0 and 2; GPU 2 (had 0-1) lacks slice 2, held by GPUs 1
    # and 3. Per layer: 2 transfers, and the greedy spreads each target's two layers over
    # its two possible sources (least data sent to that target so far).
    got = {(x.layer, x.slice, x.dst) for x in plan}
    assert got == {(lay, 1, 1) for lay in (0, 1)} | {(lay, 2, 2) for lay in (0, 1)}
    assert {x.src for x in plan if x.dst == 1} == {0, 2}
    assert {x.src for x in plan if x.dst == 2} == {1, 3}
    # the reverse (TP4 -> 2 x TP2): each GPU needs its pair's other half: 1+2+2+1 per layer
    back = greedy_plan(after, before, hosts)
    assert len(back) == 6 * 2
    assert all(x.src != x.dst for x in back)
    # units of 1 GB over NVLink at 400 GB/s: each target receives 2 units, each source sends 1
    assert transfer_seconds(plan, 1e9, hosts) == pytest.approx(2 * 1e9 / 400e9)
    # a source on another host is used only when no GPU on the target's host has the unit
    remote = greedy_plan(before, after, {0: 0, 1: 0, 2: 1, 3: 1})
    assert {x.src for x in remote if x.dst == 1} == {0}


def test_forecaster_follows_a_trend() -> None:
    assert holt(np.arange(1.0, 11.0)) == pytest.approx(11.0, rel=0.05)
    f = TypeRateForecaster(2)
    for span in range(5):
        for _ in range(10 * (span + 1)):
            f.observe(0)
        f.close_span(10.0)
    p = f.predict()
    assert p[0] == pytest.approx(6.0, rel=0.15)  # rates 1..5 req/s -> about 6 next
    assert p[1] == 0.0


def test_backlog_routing_weighs_queues_by_profiled_capacity() -> None:
    # A serves 10 type-0 or 2 type-1 req/s, B the reverse: a request costs 0.1 s of its
    # good replica's time and 0.5 s of the other's. A holds two type-0 requests (0.2 s), B
    # one type-1 (0.1 s). A type 0 goes to A (0.2 + 0.1 < 0.1 + 0.5) although A holds more
    # requests; a type 1 to B (0.1 + 0.1 < 0.2 + 0.5). With six type-0 requests on A
    # (0.6 s), a type 0 goes to B (0.1 + 0.5 < 0.6 + 0.1).
    from types import SimpleNamespace

    from simulator.policies.oserve.policy import OservePolicy

    a_shape, b_shape = Shape("x", 4), Shape("x", 2, 2)
    pol = OservePolicy("m")
    pol._caps = {a_shape: np.array([10.0, 2.0]), b_shape: np.array([2.0, 10.0])}
    pol.type_of = np.array([0, 0, 1, 0, 0, 0, 0])
    a = SimpleNamespace(id=0, shape=a_shape,
                        replica=SimpleNamespace(waiting=[1], running=[0], finished=[]))
    b = SimpleNamespace(id=1, shape=b_shape,
                        replica=SimpleNamespace(waiting=[], running=[2], finished=[]))
    pol.replicas = [a, b]  # type: ignore[list-item]
    assert pol._least_backlog(0) is a  # A's backlog is now 0.3 s
    assert pol._least_backlog(1) is b  # B's 0.2 s
    a.replica.finished = [0, 1]  # A finished both: 0.1 s left (the one just routed)
    assert pol._least_backlog(0) is a
    assert pol._backlog[0][0] == pytest.approx(0.2)
    pol._backlog.clear()  # looked at afresh: six type-0 requests on A
    a.replica.waiting, a.replica.running = [1, 3, 4, 5, 6], [0]
    assert pol._least_backlog(0) is b


def test_serving_check_keeps_homogeneous_unless_the_plan_serves_more() -> None:
    # The _caps case: on demand (6, 1) the LP plans TP2 x2 + TP4 (mixed), 1.05x+ above the
    # best homogeneous layout. Whatever the LP says, what is launched is what serves most of
    # one sample: a heterogeneous plan that serves less, or less than 1 % more, than the
    # best-serving homogeneous candidate loses to it.
    caps = _caps()
    shapes = list(caps)
    demand = np.array([6.0, 1.0])
    plan = exhaustive(shapes, caps, demand, [8])
    homs = homogeneous_candidates(shapes, caps, demand, [8], keep=0.0)
    assert [h.describe() for h in homs] == ["TP4x2", "TP2x4"]  # best LP first
    assert len(set(plan.layout)) == 2 and plan.throughput > homs[0].throughput * 1.05
    assert [h.describe() for h in homogeneous_candidates(shapes, caps, demand, [8], 0.99)] \
        == ["TP4x2"]
    asked: list[str] = []

    def served(rates: dict[str, float]) -> Callable[[Scored], float]:
        def f(sc: Scored) -> float:
            asked.append(sc.describe())
            return rates[sc.describe()]
        return f

    p = plan.describe()
    got, rates = choose_served(plan, homs, served({"TP4x2": 10.0, "TP2x4": 9.0, p: 9.7}))
    assert got is homs[0] and rates == {"TP4x2": 10.0, "TP2x4": 9.0, p: 9.7}
    got, _ = choose_served(plan, homs, served({"TP4x2": 10.0, "TP2x4": 9.0, p: 10.05}))
    assert got is homs[0]  # within 1 %: the simpler layout
    got, _ = choose_served(plan, homs, served({"TP4x2": 10.0, "TP2x4": 9.0, p: 10.2}))
    assert got is plan
    # the LP's second homogeneous layout serves best: it is the bar, and the pick
    got, _ = choose_served(plan, homs, served({"TP4x2": 10.0, "TP2x4": 10.5, p: 10.2}))
    assert got is homs[1]
    got, _ = choose_served(None, homs, served({"TP4x2": 10.0, "TP2x4": 10.5}))
    assert got is homs[1]  # the homogeneous baseline: the best-serving candidate
    # a plan that is one of the candidates (in any order) is not simulated again
    asked.clear()
    same = score(tuple(reversed(homs[1].layout)), caps, demand, [8])
    assert same is not None
    got, rates = choose_served(same, homs, served({"TP4x2": 10.0, "TP2x4": 9.0}))
    assert got is homs[0] and sorted(asked) == ["TP2x4", "TP4x2"]


def test_policy_launches_homogeneous_when_the_searched_layout_serves_less(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Llama2-70B on 16 H100, S3's mix: the search plans TP2PP4 + TP4PP2 (+1.6 % on the
    # profiles) but it served 0.98 of TP2PP4 x2 in the simulator (docs/companion-oserve.md);
    # the policy asks the simulator (here a stand-in) and launches what serves more.
    from simulator.policies.cluster import Cluster, Pool
    from simulator.policies.oserve import scenario
    from simulator.policies.oserve.policy import OservePolicy

    wl = scenario.workload(scenario.TABLE1["S3"][1], 10.0, 120.0, seed=11)
    pool = Pool.uniform(scenario.GPU, 16)
    het = "TP2PP4x1, TP4PP2x1"
    for het_rps, want in ((29.2, "TP2PP4x2"), (31.0, het)):
        rates = {"TP2PP4x2": 29.9, het: het_rps}
        monkeypatch.setattr(OservePolicy, "_served",
                            lambda self, cluster, sc, caps, demand, r=rates: r[sc.describe()])
        pol = OservePolicy(scenario.MODEL)
        pol.start(Cluster(wl, pool), 0.0)
        assert pol.plan is not None and pol.plan.describe() == want
        c = pol.notes()["check"]
        assert c["searched"] == het and c["homogeneous"] == "TP2PP4x2"
        assert c["searched_planned_rps"] > c["planned_rps"]["TP2PP4x2"]  # the LP's promise
        assert c["chosen"] == want and set(c["served_rps"]) == {"TP2PP4x2", het}


def test_served_rate_is_the_offered_rate_below_capacity() -> None:
    # The check's measure (output done per second after the first third of the sample, a
    # request counting the fraction of its output generated) equals the arrival rate when
    # every layout keeps up: offered at half the best homogeneous LP capacity, each candidate
    # serves the sample's rate.
    from simulator.policies.cluster import Cluster, Pool
    from simulator.policies.oserve import scenario
    from simulator.policies.oserve.policy import OservePolicy

    wl = scenario.workload(scenario.TABLE1["S3"][1], 10.0, 120.0, seed=11)
    pol = OservePolicy(scenario.MODEL, check_load=0.5)
    pol.start(Cluster(wl, Pool.uniform(scenario.GPU, 16)), 0.0)
    c = pol.check
    assert c["sample_rps"] == pytest.approx(0.5 * c["planned_rps"][c["homogeneous"]])
    assert len(c["served_rps"]) == 2
    for rate in c["served_rps"].values():
        assert rate == pytest.approx(c["sample_rps"], rel=0.05)  # measured within 1 %


def test_a_replan_switches_only_if_the_proposal_serves_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A re-plan the profiles rate well above the running layout is simulated against it on a
    # sample of the forecast mix before a switch (a restart) is paid for; a proposal that
    # serves less is declined, and not simulated again while the forecast mix stands.
    import dataclasses
    from types import SimpleNamespace

    from simulator.policies.cluster import Cluster, Pool
    from simulator.policies.oserve import scenario
    from simulator.policies.oserve.policy import OservePolicy
    from simulator.policies.oserve.search import homogeneous_layout

    wl = scenario.workload(scenario.TABLE1["S3"][1], 10.0, 240.0, seed=11)
    cluster = Cluster(wl, Pool.uniform(scenario.GPU, 16))
    pol = OservePolicy(scenario.MODEL, adapt_s=60.0, check_s=0.0, layout="homogeneous")
    pol.start(cluster, 0.0)
    assert pol.plan is not None and pol.types is not None
    cur = pol.plan
    demand = np.bincount(pol.type_of, minlength=pol.types.k) / 240.0
    other = next(s for s in pol._caps if not any(s == x for x in cur.layout)
                 and score(homogeneous_layout(s, [8, 8]), pol._caps, demand, [8, 8]))
    real = score(homogeneous_layout(other, [8, 8]), pol._caps, demand, [8, 8])
    assert real is not None
    proposed = dataclasses.replace(real, assignment=SimpleNamespace(
        throughput=2 * cur.throughput, fractions=real.assignment.fractions))
    served = {cur.describe(): 30.0, proposed.describe(): 29.0}
    asked: list[str] = []

    def fake_served(self: OservePolicy, cluster: Cluster, sc: Scored, caps: object,
                    demand: np.ndarray) -> float:
        asked.append(sc.describe())
        running = assign([self._caps[s] for s in cur.layout], demand, spread=self.spread)
        assert self._sample is not None and self._sample[1] == pytest.approx(
            1.05 * running.throughput)  # just above the running layout's capacity on the mix
        return served[sc.describe()]

    monkeypatch.setattr(OservePolicy, "_served", fake_served)
    monkeypatch.setattr(OservePolicy, "_solve", lambda self, c, d, start: proposed)
    pol.check_s = 120.0
    pol._forecast.predict = lambda: demand  # type: ignore[union-attr,method-assign]
    pol.on_tick(cluster, 120.0)
    assert pol.plan.describe() == cur.describe() and pol.switches == []
    assert sorted(asked) == sorted([cur.describe(), proposed.describe()])
    assert pol.notes()["switch_checks"][0]["switched"] is False
    pol.on_tick(cluster, 180.0)  # same proposal on the same mix: not simulated again
    assert len(asked) == 2 and len(pol.switch_checks) == 1
    served[proposed.describe()] = 33.0
    pol._forecast.predict = lambda: demand * 1.3  # type: ignore[union-attr,method-assign]
    pol.on_tick(cluster, 240.0)  # the mix moved: asked again, and it serves 10 % more
    assert len(asked) == 4 and pol.switch_checks[-1]["switched"] is True
    assert pol.plan.describe() == proposed.describe() and len(pol.switches) == 1


def test_the_replan_sample_follows_the_forecast_mix_with_lengths_seen_so_far() -> None:
    from simulator.policies.cluster import Cluster, Pool
    from simulator.policies.oserve import scenario
    from simulator.policies.oserve.policy import OservePolicy

    wl = scenario.workload(scenario.TABLE1["S3"][1], 10.0, 240.0, seed=11)
    cluster = Cluster(wl, Pool.uniform(scenario.GPU, 16))
    pol = OservePolicy(scenario.MODEL, adapt_s=60.0, check_s=0.0, layout="homogeneous")
    pol.start(cluster, 0.0)
    assert pol.types is not None
    pol.check_s = 120.0
    demand = np.array([4.0, 0.0, 0.0, 1.0])  # only types 0 and 3, 4:1
    sample = pol._mix_sample(cluster, demand, 10.0, now=100.0)
    assert sample is not None and sample[1] == 10.0
    b = sample[0].base
    assert len(b) == pytest.approx(1200, rel=0.15)  # 10 req/s for 120 s
    kinds = pol.types.classify(b.input_len, b.output_len)
    assert set(kinds.tolist()) <= {0, 3}
    assert (kinds == 0).mean() == pytest.approx(0.8, abs=0.05)
    seen = {(int(i), int(o)) for i, o, t in zip(wl.base.input_len, wl.base.output_len,
                                                 wl.base.arrival, strict=True) if t < 100.0}
    assert {(int(i), int(o)) for i, o in zip(b.input_len, b.output_len, strict=True)} <= seen
    assert pol._mix_sample(cluster, demand, 10.0, now=0.0) is None  # nothing seen yet

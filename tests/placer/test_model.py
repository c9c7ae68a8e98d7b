"""The constraint model on hand-checkable pools: pure problems whose optimum can be worked
out by hand, and small real pools whose curves come from the simulator."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from simulator.placer.cpsat import ClassSpec, Option, PlanError, Problem, solve
from simulator.placer.demand import SLO, Demand, Lengths, Objective, Service
from simulator.placer.exhaustive import fits_hosts
from simulator.placer.packing import assign_groups, host_patterns, pack
from simulator.placer.plan import make_plan
from simulator.placer.pool import Host, Pool, Variant
from simulator.placer.profile import Profiler
from simulator.roofline import Precision

FLAT = ((0.0, 1.0),)  # latency 1 s at any load


def opt(svc: str, var: str, tp: int, cap: float, pieces: tuple[tuple[float, float], ...] = FLAT,
        cost: float = 1.0, existing: int = 0) -> Option:
    return Option(svc, var, tp, pieces, cap, cost, existing)


# ---- pure problems ----------------------------------------------------------------------

def test_tp_groups_never_span_hosts() -> None:
    # 2 hosts x 3 GPUs = 6 GPUs, but only one TP2 group fits per host
    p = Problem({"m": 10.0}, (opt("m", "A", 2, 1.0),), (ClassSpec("A", 3, 2),),
                Objective.GOODPUT)
    sol = solve(p, time_limit_s=5)
    assert sol.replicas == (2,)
    assert sol.phases[0].objective == pytest.approx(2.0)
    assert fits_hosts(p, (2,)) and not fits_hosts(p, (3,))


def test_gpus_objective_finds_the_fewest_gpus() -> None:
    # 10 req/s: TP1 replicas serve 4 each, TP2 replicas 9 each -> 3 GPUs is the minimum
    p = Problem({"m": 10.0}, (opt("m", "A", 1, 4.0), opt("m", "A", 2, 9.0)),
                (ClassSpec("A", 4, 2),), Objective.GPUS)
    sol = solve(p, time_limit_s=5)
    assert sol.phases[0].objective == 3
    assert sum(o.tp * n for o, n in zip(p.options, sol.replicas, strict=True)) == 3


def test_cost_objective_prefers_the_cheaper_type() -> None:
    p = Problem({"m": 3.0}, (opt("m", "fast", 1, 4.0, cost=3.0), opt("m", "slow", 1, 1.0,
                                                                      cost=0.5)),
                (ClassSpec("fast", 1, 4), ClassSpec("slow", 1, 4)), Objective.COST)
    sol = solve(p, time_limit_s=5)
    assert sol.replicas == (0, 3)  # 3 x $0.5 < 1 x $3
    assert sol.phases[0].objective == pytest.approx(1.5)


def test_latency_objective_routes_to_the_faster_gpu_and_meets_demand() -> None:
    fast = ((0.0, 1.0), (-2.0, 3.0))  # 1 s up to 1 req/s per replica, then it degrades
    slow = ((0.0, 2.0),)
    p = Problem({"m": 2.0}, (opt("m", "F", 1, 10.0, fast), opt("m", "S", 1, 10.0, slow)),
                (ClassSpec("F", 1, 2), ClassSpec("S", 1, 2)), Objective.LATENCY)
    sol = solve(p, time_limit_s=5)
    assert sum(sol.flows) == pytest.approx(2.0)  # demand met exactly
    assert sol.replicas[0] == 2 and sol.flows[0] == pytest.approx(2.0)
    assert sol.phases[0].objective == pytest.approx(1.0, rel=1e-3)  # mean e2e 1 s


def test_existing_replicas_count_but_use_no_pool_gpus() -> None:
    p = Problem({"m": 8.0}, (opt("m", "A", 1, 4.0, existing=1),), (ClassSpec("A", 1, 1),),
                Objective.GPUS)
    sol = solve(p, time_limit_s=5)
    assert sol.replicas == (1,)  # one new + one running = 8 req/s


def test_infeasible_demand_says_which_model_falls_short() -> None:
    p = Problem({"big": 100.0}, (opt("big", "A", 1, 4.0),), (ClassSpec("A", 2, 1),),
                Objective.GPUS)
    with pytest.raises(PlanError, match="big needs 100 req/s"):
        solve(p, time_limit_s=5)


def test_host_patterns_and_packing() -> None:
    assert host_patterns(4, [1, 2, 4]) == [(4,), (2, 2), (2, 1, 1), (1, 1, 1, 1)]
    assert host_patterns(6, [4]) == [(4,)]
    assert host_patterns(3, [2]) == [(2,)]
    assert pack({4: 1, 2: 2}, [4, 4]) is not None
    assert pack({4: 2}, [6, 2]) is None  # 8 GPUs, but no host holds the second TP4
    placed = assign_groups([((2, 2), 1), ((4,), 1)], ["h1", "h2"], {"a": (2, 2), "b": (4, 1)})
    assert placed == {"a": ["h1", "h1"], "b": ["h2"]}


# ---- real curves ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def profiler(tmp_path_factory: pytest.TempPathFactory) -> Profiler:
    return Profiler(tmp_path_factory.mktemp("curves"), requests=150)


def _svc(model: str, rate: float, tp: tuple[int, ...], slo: SLO = SLO()) -> Service:
    return Service(model, model, rate, Lengths.parse("normal:512,128"),
                   Lengths.parse("normal:128,32"), slo, tp)


def _plan(profiler: Profiler, demand: Demand, pool: Pool):  # type: ignore[no-untyped-def]
    sizes = {h.variant.name: h.gpus for h in pool.hosts}
    cands, rejected = profiler.candidates(demand.services, pool.variants(),
                                          lambda v: sizes[v.name])
    return make_plan(demand, pool, cands, rejected, time_limit_s=10)


def test_memory_rule_excludes_a_gpu_type(profiler: Profiler) -> None:
    pool = Pool((Host("l4-0", Variant("l4"), 2), Host("a100-0", Variant("a100-80g-sxm"), 2)))
    demand = Demand((_svc("llama-3.3-70b", 1.0, (1, 2)),), Objective.LATENCY)
    plan = _plan(profiler, demand, pool)
    assert {r.gpu for r in plan.replicas} == {"a100-80g-sxm"}
    assert {(r.variant, r.tp) for r in plan.rejected} >= {("l4", 1), ("l4", 2),
                                                           ("a100-80g-sxm", 1)}
    assert all("exceed" in r.reason for r in plan.rejected)


def test_real_plan_meets_demand_and_places_groups_on_single_hosts(profiler: Profiler) -> None:
    pool = Pool(tuple(Host(f"h{i}", Variant("a100-80g-sxm"), 2) for i in range(3)))
    demand = Demand((_svc("llama-3.1-8b", 6.0, (1, 2, 4)), _svc("qwen2.5-32b", 1.0, (1, 2, 4))),
                    Objective.LATENCY)
    plan = _plan(profiler, demand, pool)
    assert all(r.tp <= 2 for r in plan.replicas)  # no host has 4 GPUs
    per_host: Counter[str | None] = Counter()
    for r in plan.replicas:
        per_host[r.host] += r.tp
    assert max(per_host.values()) <= 2 and sum(per_host.values()) <= 6
    for f in plan.forecasts:
        assert f.served == pytest.approx(f.rate)
    assert plan.solution.optimal


def test_goodput_serves_what_fits_within_the_slo(profiler: Profiler) -> None:
    pool = Pool((Host("h0", Variant("a100-80g-sxm"), 1),))
    slo = SLO(ttft_s=2.0)
    demand = Demand((_svc("llama-3.1-8b", 500.0, (1,), slo),), Objective.GOODPUT)
    plan = _plan(profiler, demand, pool)
    f = plan.forecasts[0]
    cap = plan.problem.options[0].cap
    assert 0 < f.served < 500 and f.served == pytest.approx(cap, rel=1e-3)


def test_a_quantized_checkpoint_fits_where_bf16_does_not_and_is_simulated_as_such(
        profiler: Profiler) -> None:
    """A 70B on one 80 GB GPU: 140 GB of BF16 weights do not fit, 70 GB of FP8 ones do,
    with room for the KV cache. Its curve is its own (the key names the precision), and a
    plan places it there."""
    pool = Pool((Host("h0", Variant("a100-80g-sxm"), 1),))
    fp8 = replace(_svc("llama-3.3-70b", 0.1, (1,)), name="fp8", precision=Precision(8, 8, 16))
    bf16 = _svc("llama-3.3-70b", 0.1, (1,))
    cands, rejected = profiler.candidates([bf16, fp8], pool.variants(), lambda v: 1)
    assert [(r.service, r.tp) for r in rejected] == [("llama-3.3-70b", 1)]
    assert [c.service for c in cands] == ["fp8"]
    assert cands[0].curve.key.precision == "fp8 w8a8"
    plan = _plan(profiler, Demand((fp8,), Objective.LATENCY), pool)
    assert [(r.service, r.tp) for r in plan.replicas] == [("fp8", 1)]


def test_a_configuration_is_simulated_once(tmp_path: Path) -> None:
    pool = Pool((Host("h0", Variant("a100-80g-sxm"), 1),))
    demand = Demand((_svc("llama-3.1-8b", 1.0, (1,)),))
    first = Profiler(tmp_path, requests=100)
    first.candidates(demand.services, pool.variants(), lambda v: 1)
    first.candidates(demand.services, pool.variants(), lambda v: 1)
    assert first.simulated == 1
    second = Profiler(tmp_path, requests=100)  # a new run reads the disk cache
    second.candidates(demand.services, pool.variants(), lambda v: 1)
    assert second.simulated == 0


def test_the_disk_cache_is_keyed_by_the_device_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Curves simulated under another calibration profile are not reused: a profile change
    in the catalog (or a re-fit) simulates the configuration again."""
    import simulator.placer.pool as pool_mod

    pool = Pool((Host("h0", Variant("a100-80g-sxm"), 1),))
    demand = Demand((_svc("llama-3.1-8b", 1.0, (1,)),))
    Profiler(tmp_path, requests=100).candidates(demand.services, pool.variants(), lambda v: 1)
    same = Profiler(tmp_path, requests=100)
    same.candidates(demand.services, pool.variants(), lambda v: 1)
    assert same.simulated == 0
    real = pool_mod.get_gpu
    monkeypatch.setattr(pool_mod, "get_gpu", lambda name: real(name).with_efficiency(compute=0.5))
    refit = Profiler(tmp_path, requests=100)
    refit.candidates(demand.services, pool.variants(), lambda v: 1)
    assert refit.simulated == 1

"""The cluster simulator the policies run on: it reproduces the fixed-replica simulator,
moves requests with their KV caches when replicas are reshaped, and accounts GPU-time."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from simulator.api import Deployment, run
from simulator.engine import DONE
from simulator.models import get_model
from simulator.policies.baselines import StaticPolicy
from simulator.policies.cluster import (
    BasePolicy,
    Cluster,
    ClusterRun,
    PolicyError,
    Pool,
    pending_tokens_of,
    run_cluster,
)
from simulator.policies.interfaces import EndpointView, Shape
from simulator.policies.metrics import Slo, summarize
from simulator.policies.workload import ClusterWorkload, Part
from simulator.workload import synthetic

GPU = "h100-sxm"


def test_static_policy_matches_the_fixed_replica_simulator() -> None:
    wl = synthetic(8.0, duration=120, input_dist="normal:700,300", output_dist="normal:200,100")
    cw = ClusterWorkload.single(wl, "llama-3.1-8b")
    dep = Deployment("llama-3.1-8b", GPU)
    # one replica: the same engine on the same requests, to the last digit
    ref1 = run(dep, wl, replicas=1)
    got1 = summarize(run_cluster(cw, StaticPolicy({"llama-3.1-8b": [Shape(GPU)]}),
                                 Pool.uniform(GPU, 1)))
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        assert got1[key]["p50"] == pytest.approx(ref1[key]["p50"], rel=1e-12)
        assert got1[key]["p99"] == pytest.approx(ref1[key]["p99"], rel=1e-12)
    # three replicas: the router decides when a request arrives, the fixed-replica
    # simulator after the 3 ms frontend delay; the distributions agree closely
    ref = run(dep, wl, replicas=3)
    got = run_cluster(cw, StaticPolicy({"llama-3.1-8b": [Shape(GPU)] * 3}), Pool.uniform(GPU, 3))
    s = summarize(got)
    assert s["completed"] == ref["completed"] == len(wl)
    assert s["ttft_s"]["p50"] == pytest.approx(ref["ttft_s"]["p50"], rel=0.05)
    assert s["e2e_s"]["p99"] == pytest.approx(ref["e2e_s"]["p99"], rel=0.05)
    assert s["gpu_hours"] == pytest.approx(3 * got.horizon / 3600)
    assert isinstance(got.cluster.instances[0], EndpointView)


class _MergeAt(BasePolicy):
    """Two TP1 replicas, merged into one TP2 at `t_merge`, split back at `t_split`."""

    name = "merge-test"
    tick_s = 1.0

    def __init__(self, t_merge: float, t_split: float) -> None:
        self.t_merge, self.t_split = t_merge, t_split
        self.done: list[str] = []

    def start(self, cluster: Cluster, now: float) -> None:
        for g in (0, 1):
            cluster.launch("llama-3.1-8b", Shape(GPU), now, host=0, gpu_ids=[g])

    def on_arrival(self, cluster: Cluster, r: int, now: float) -> None:
        eps = cluster.endpoints()
        cluster.dispatch(r, min(eps, key=lambda e: (e.outstanding, e.id)), now)

    def on_tick(self, cluster: Cluster, now: float) -> None:
        if now == self.t_merge:
            made = cluster.reshape(cluster.endpoints(), [(Shape(GPU, 2), [0, 1], None)], now, 0.5)
            assert made is not None
            self.done.append("merge")
        if now == self.t_split:
            made = cluster.reshape(cluster.endpoints(),
                                   [(Shape(GPU, 1), [0], None), (Shape(GPU, 1), [1], None)],
                                   now, 0.5)
            assert made is not None
            self.done.append("split")


def test_reshape_moves_running_requests_with_their_kv() -> None:
    wl = ClusterWorkload.single(
        synthetic(6.0, duration=60, input_dist="fixed:1000", output_dist="fixed:400"),
        "llama-3.1-8b")
    pol = _MergeAt(20.0, 40.0)
    res = run_cluster(wl, pol, Pool.uniform(GPU, 2))
    c = res.cluster
    assert pol.done == ["merge", "split"]
    assert (c.req.status == DONE).all()  # nothing lost in either move
    assert int(c.req.preemptions.sum()) == 0
    # requests running at the merge were not restarted: their KV came along, so no request
    # computed more prompt tokens than it has (a restart would re-prefill)
    shapes = [i.shape.tp for i in c.instances]
    assert shapes == [1, 1, 2, 1, 1]
    # the GPUs were held by exactly two GPUs' worth of instances at every moment
    assert c.gpu_seconds(res.horizon) == pytest.approx(2 * res.horizon, rel=1e-6)


def test_reshape_refuses_when_the_kv_does_not_fit() -> None:
    wl = ClusterWorkload.single(
        synthetic(2.0, duration=10, input_dist="fixed:1000", output_dist="fixed:500"), "m")
    c = Cluster(wl, Pool.uniform(GPU, 1), models={"m": Deployment("llama-3.1-8b", GPU).model_spec})
    inst = c.launch("m", Shape(GPU), 0.0)
    c.dispatch(0, inst, 0.0)
    c.advance(0.5)
    # a replica whose longest sequence is 10 tokens cannot take the 1500-token request
    assert c.reshape([inst], [(Shape(GPU), [0], 10)], 0.5) is None
    assert inst.live


def test_drained_instances_release_their_gpus() -> None:
    wl = ClusterWorkload.single(
        synthetic(1.0, duration=30, input_dist="fixed:100", output_dist="fixed:20"),
        "llama-3.1-8b")
    c = Cluster(wl, Pool.uniform(GPU, 2))
    a = c.launch("llama-3.1-8b", Shape(GPU), 0.0)
    b = c.launch("llama-3.1-8b", Shape(GPU), 0.0, delay_s=5.0)
    assert not b.ready(1.0) and b.ready(5.0)
    with pytest.raises(PolicyError):
        c.launch("llama-3.1-8b", Shape(GPU), 0.0)  # the pool is full
    c.dispatch(0, a, 0.0)
    c.drain(a, 0.1)
    assert a.live  # still serving its request
    c.advance(100.0)
    assert not a.live and a.retired_at is not None and a.retired_at < 5.0
    assert c.free_gpus(0) == [0]
    assert c.gpu_seconds(100.0) == pytest.approx(a.retired_at + 100.0)


def test_workload_round_trips_through_a_trace() -> None:
    wl = ClusterWorkload.from_parts([
        Part(np.array([0.0, 2.0]), np.array([10, 20]), np.array([5, 6]), "a", "IW@east"),
        Part(np.array([1.0]), np.array([30]), np.array([7]), "b"),
    ])
    assert list(wl.base.arrival) == [0.0, 1.0, 2.0]
    back = ClusterWorkload.from_trace(wl.to_trace())
    assert [back.model_name(i) for i in range(3)] == ["a", "b", "a"]
    assert [back.tier_name(i) for i in range(3)] == ["IW@east", "default", "IW@east"]
    assert list(back.base.input_len) == [10, 30, 20]
    assert len(wl.only_model("a")) == 2
    assert list(wl.window(0.5, 3.0).base.arrival) == [0.5, 1.5]


def test_slo_per_model_and_tier() -> None:
    wl = ClusterWorkload.single(
        synthetic(2.0, duration=30, input_dist="fixed:100", output_dist="fixed:20"), "m")
    res = run_cluster(wl, StaticPolicy({"m": [Shape(GPU)]}), Pool.uniform(GPU, 1),
                      models={"m": Deployment("llama-3.1-8b", GPU).model_spec})
    loose = summarize(res, Slo(ttft_s=10.0))
    tight = summarize(res, Slo(ttft_by_model={"m": 1e-6}))
    assert loose["slo_attainment"] == 1.0
    assert tight["slo_attainment"] == 0.0


class _CheckLoads(BasePolicy):
    """Runs another policy and, before each of its decisions, compares the memoised loads
    (`pending_tokens_of`) with a fresh reading of every live replica."""

    def __init__(self, inner: BasePolicy) -> None:
        self.inner = inner
        self.name = inner.name
        self.tick_s = inner.tick_s
        self.checks = 0
        self.reused = 0

    def _check(self, cluster: Cluster) -> None:
        live = list(cluster.live)
        memo = [i.replica.tokens_memo for i in live]
        self.reused += sum(1 for i, m in zip(live, memo, strict=True)
                           if m is not None and m[0] == i.replica.changes)
        assert pending_tokens_of(live) == [i.pending_tokens() for i in live]
        self.checks += 1

    def start(self, cluster: Cluster, now: float) -> None:
        self.inner.start(cluster, now)

    def on_arrival(self, cluster: Cluster, r: int, now: float) -> None:
        self._check(cluster)
        self.inner.on_arrival(cluster, r, now)

    def on_tick(self, cluster: Cluster, now: float) -> None:
        self._check(cluster)
        self.inner.on_tick(cluster, now)


def test_memoised_loads_equal_a_fresh_reading() -> None:
    """`pending_tokens_of` reuses a replica's load while its `changes` count stands still;
    through arrivals, macro-steps cut by arrivals, completions, preemptions and Gyges's
    merges and splits (requests moved between replicas) it equals recomputing it."""
    from simulator.policies.gyges import scenario
    from simulator.policies.gyges.core import PAPER_MAX_SEQ
    from simulator.policies.gyges.policy import GygesPolicy

    wl = scenario.workload(120.0, 6.0, seed=3, model="llama-3.1-8b")
    spec = dataclasses.replace(get_model("llama-3.1-8b"), max_context=131_072)
    pol = _CheckLoads(GygesPolicy("llama-3.1-8b", "gyges", PAPER_MAX_SEQ))
    res = run_cluster(wl, pol, Pool.uniform(GPU, 8), models={"llama-3.1-8b": spec})
    gy = pol.inner
    assert isinstance(gy, GygesPolicy)
    assert gy.merges >= 1 and gy.splits >= 1  # requests did move between replicas
    assert pol.checks > 700 and pol.reused > 0
    assert summarize(res)["completed"] > 600


def _fingerprint(res: ClusterRun) -> list[np.ndarray]:
    q = res.cluster.req
    return [q.finish, q.first_token, q.first_sched, q.status, q.replica, q.preemptions,
            q.max_itl, q.last_token, q.generated, q.kv_len, q.blocks,
            np.array([res.makespan, res.cluster.gpu_seconds(res.horizon)])]


@pytest.mark.parametrize("case", ["static", "prism", "gyges"])
def test_small_batch_path_equals_the_numpy_path(case: str, monkeypatch: pytest.MonkeyPatch
                                                ) -> None:
    """Decode runs of few requests are planned and committed with Python scalars
    (`engine.SMALL_BATCH`); every result equals the numpy path's to the last bit, on plain
    replicas, on Prism's engines sharing a GPU's KV pool and through Gyges's reshapes."""
    from simulator import engine

    def once(small: int) -> list[np.ndarray]:
        monkeypatch.setattr(engine, "SMALL_BATCH", small)
        if case == "static":
            wl = ClusterWorkload.single(
                synthetic(12.0, duration=120, input_dist="normal:700,300",
                          output_dist="normal:300,200"), "llama-3.1-8b")
            res = run_cluster(wl, StaticPolicy({"llama-3.1-8b": [Shape(GPU)] * 2}),
                              Pool.uniform(GPU, 2))
        elif case == "prism":
            from simulator.policies.prism import scenario as ps
            from simulator.policies.prism.policy import PrismPolicy

            wl = ps.workload(6.0, 120.0, seed=2)
            res = run_cluster(wl, PrismPolicy("prism"), Pool.uniform(ps.GPU, 2),
                              models=dict(ps.EXTRA_MODELS))
        else:
            from simulator.policies.gyges import scenario as gs
            from simulator.policies.gyges.core import PAPER_MAX_SEQ
            from simulator.policies.gyges.policy import GygesPolicy

            wl = gs.workload(120.0, 6.0, seed=3, model="llama-3.1-8b")
            spec = dataclasses.replace(get_model("llama-3.1-8b"), max_context=131_072)
            res = run_cluster(wl, GygesPolicy("llama-3.1-8b", "gyges", PAPER_MAX_SEQ),
                              Pool.uniform(GPU, 8), models={"llama-3.1-8b": spec})
        assert summarize(res)["completed"] > 300
        return _fingerprint(res)

    numpy_only, mixed, scalar_only = once(0), once(4), once(10**6)
    for a, b, c in zip(numpy_only, mixed, scalar_only, strict=True):
        assert np.array_equal(a, b, equal_nan=True)
        assert np.array_equal(a, c, equal_nan=True)

"""Policies by name, for `otela sim run --policy`, `otela sim compare` and benchmarks.

Each entry builds a `ClusterPolicy` from a `Context` (the workload, the pool, the SLOs and
`--opt KEY=VALUE` options) and says which pool it runs on: the given hosts, or an elastic
region (SageServe acquires VMs on demand; its GPU-hours are what it used).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from simulator.api import Deployment
from simulator.models import ModelSpec
from simulator.policies.baselines import StaticPolicy
from simulator.policies.cluster import ClusterPolicy, PolicyError, Pool
from simulator.policies.interfaces import Shape
from simulator.policies.workload import ClusterWorkload


@dataclass
class Context:
    """What a policy is built from."""

    wl: ClusterWorkload
    pool: Pool
    ttft_slo: Mapping[str, float] = field(default_factory=dict)  # per model
    options: Mapping[str, str] = field(default_factory=dict)
    models: Mapping[str, ModelSpec] = field(default_factory=dict)  # specs not in the catalog

    def spec(self, model: str) -> str | ModelSpec:
        return self.models.get(model, model)

    def opt(self, key: str, default: Any, kind: Callable[[str], Any] = str) -> Any:
        v = self.options.get(key)
        return default if v is None else kind(v)

    @property
    def model(self) -> str:
        """The one model of a single-model workload."""
        if len(self.wl.models) != 1:
            raise PolicyError(
                f"this policy serves one model; the trace has {len(self.wl.models)} "
                f"({', '.join(self.wl.models)}): pick one with --trace-model")
        return self.wl.models[0]


@dataclass(frozen=True)
class Entry:
    name: str
    system: str
    help: str
    build: Callable[[Context], ClusterPolicy]
    elastic: bool = False


def _min_tp(model: str | ModelSpec, gpu: str, per_host: int) -> int:
    for tp in (1, 2, 4, 8):
        if tp <= per_host and Deployment(model, gpu, tp=tp).memory().fits:
            return tp
    raise PolicyError(f"{model} fits on no TP group of one {gpu} host")


def _static(router: str) -> Callable[[Context], ClusterPolicy]:
    def build(ctx: Context) -> ClusterPolicy:
        layout: dict[str, list[Shape]] = {}
        hosts = ctx.pool.hosts
        if not hosts:
            raise PolicyError("static deployments need a pool of hosts")
        gpu = hosts[0].gpu
        per = max(h.gpus for h in hosts)
        models = ctx.wl.models
        tps = {m: _min_tp(ctx.spec(m), gpu, per) for m in models}
        share = ctx.pool.total_gpus // len(models)
        for m in models:
            n = max(1, share // tps[m])
            layout[m] = [Shape(gpu, tps[m])] * n
        return StaticPolicy(layout, router, name="static" if router == "least_loaded"
                            else f"static-{router}")
    return build


def _oserve(layout: str, routing: str = "backlog") -> Callable[[Context], ClusterPolicy]:
    def build(ctx: Context) -> ClusterPolicy:
        from simulator.policies.oserve.policy import OservePolicy

        adapt = ctx.opt("adapt_s", None, float)
        return OservePolicy(ctx.model, layout=layout, routing=routing,
                            types=ctx.opt("types", 4, int), adapt_s=adapt,
                            seed=ctx.opt("seed", 0, int))
    return build


def _sageserve(mode: str) -> Callable[[Context], ClusterPolicy]:
    def build(ctx: Context) -> ClusterPolicy:
        from simulator.policies.sageserve.policy import SageServePolicy
        from simulator.policies.sageserve.rules import Thresholds

        th = Thresholds(min_instances=ctx.opt("min_instances", 1, int),
                        max_instances=ctx.opt("max_instances", 16, int))
        gpu = ctx.opt("gpu", ctx.pool.hosts[0].gpu if ctx.pool.hosts else "a100-80g-sxm")
        return SageServePolicy(mode, gpu=gpu, tp=ctx.opt("tp", 4, int),
                               provision_s=ctx.opt("provision_s", 600.0, float), thresholds=th)
    return build


def _prism(mode: str) -> Callable[[Context], ClusterPolicy]:
    def build(ctx: Context) -> ClusterPolicy:
        from simulator.policies.prism.policy import PrismPolicy

        return PrismPolicy(mode, ttft_slo=ctx.ttft_slo,
                           default_slo_s=ctx.opt("slo_ttft", 1.0, float))
    return build


def _dedicated(ctx: Context) -> ClusterPolicy:
    if not ctx.pool.hosts:
        raise PolicyError("dedicated GPUs need a pool of hosts")
    gpu = ctx.pool.hosts[0].gpu
    per = max(h.gpus for h in ctx.pool.hosts)
    return StaticPolicy({m: [Shape(gpu, _min_tp(ctx.spec(m), gpu, per))] for m in ctx.wl.models},
                        "least_loaded", name="dedicated")


def _gyges(mode: str) -> Callable[[Context], ClusterPolicy]:
    def build(ctx: Context) -> ClusterPolicy:
        from simulator.policies.gyges.core import PAPER_MAX_SEQ
        from simulator.policies.gyges.policy import GygesPolicy

        limits = PAPER_MAX_SEQ if ctx.opt("paper_limits", "no") in ("1", "yes", "true") else None
        return GygesPolicy(ctx.model, mode, limits,
                           transform_s=ctx.opt("transform_s", 0.5, float))
    return build


POLICIES: dict[str, Entry] = {e.name: e for e in (
    Entry("static", "baseline", "replicas of the smallest TP that fits, least-loaded routing",
          _static("least_loaded")),
    Entry("static-rr", "baseline", "the same replicas, round-robin routing",
          _static("round_robin")),
    Entry("oserve", "OSERVE", "heterogeneous layout (flow-guided search) + per-type LP routing",
          _oserve("search")),
    Entry("oserve-exhaustive", "OSERVE", "the layout search's exhaustive reference",
          _oserve("exhaustive")),
    Entry("homogeneous", "OSERVE", "best homogeneous layout + least-loaded routing "
          "(vLLM static, OSERVE's baseline)", _oserve("homogeneous", "least_loaded")),
    Entry("sageserve", "SageServe", "forecast + ILP scaling, LT-UA pacing (elastic pool)",
          _sageserve("lt-ua"), elastic=True),
    Entry("sageserve-lt-i", "SageServe", "forecast + ILP, scale at once (elastic pool)",
          _sageserve("lt-i"), elastic=True),
    Entry("sageserve-lt-u", "SageServe", "forecast + ILP, paced by utilisation (elastic pool)",
          _sageserve("lt-u"), elastic=True),
    Entry("reactive", "SageServe", "reactive 70/30 % scaling with 15 s cooldown (elastic pool)",
          _sageserve("reactive"), elastic=True),
    Entry("prism", "Prism", "shared GPUs: KVPR placement, eviction, deadline admission",
          _prism("prism")),
    Entry("muxserve", "Prism", "shared KV memory, fixed placement (MuxServe++)",
          _prism("muxserve")),
    Entry("static-partition", "Prism", "fixed placement, fixed equal KV shares",
          _prism("static")),
    Entry("dedicated", "Prism", "one replica (smallest TP) per model", _dedicated),
    Entry("gyges", "Gyges", "TP1 instances merged/split on demand, transformation-aware routing",
          _gyges("gyges")),
    Entry("gyges-rr", "Gyges", "the same transformations, round-robin routing",
          _gyges("round_robin")),
    Entry("gyges-llf", "Gyges", "the same transformations, least-loaded routing",
          _gyges("least_loaded")),
)}


def get(name: str) -> Entry:
    key = name.strip().lower()
    if key not in POLICIES:
        raise PolicyError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    return POLICIES[key]

"""Python API of the simulator: the calls the placer (and the CLI) make.

Everything here composes the pure pieces (catalogs, roofline, memory, engine, report) and
returns plain dicts/dataclasses, so callers never touch engine internals.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from otela.hardware.catalog import GPU, get_gpu
from simulator.engine import EngineConfig, simulate
from simulator.memory import MemoryPlan, plan_memory
from simulator.models import ModelSpec, get_model
from simulator.report import SLO, requests_json, summarize, throughput
from simulator.roofline import Op, Parallelism, Precision, StepCost, operator_breakdown
from simulator.workload import Workload, synthetic

DEFAULT_STEP_OVERHEAD_S = 1.0e-3
"""Historical default of the per-iteration engine overhead. The value a deployment uses now
comes from its GPU's calibration profile (otela/hardware/catalog.toml); kept for old callers."""


@dataclass(frozen=True)
class Deployment:
    """One replica configuration: what runs where, and how the engine is set up.

    `step_overhead_s` / `tp_overhead_s` left as None take the GPU profile's calibrated values;
    `calibration` overrides any other profile field (e.g. ``{"memory": 0.8}``) for this
    deployment only. `ep=tp` shards MoE experts whole across the TP group (expert parallelism).
    `engine` left as None is set, at construction, to the defaults vLLM uses on that GPU
    (token budget and maximum sequences per iteration, from the profile).
    """

    model: str | ModelSpec
    gpu: str | GPU
    tp: int = 1
    pp: int = 1
    precision: Precision = field(default_factory=Precision)
    engine: EngineConfig | None = None
    gpu_memory_utilization: float = 0.9
    activation_gb: float | None = None
    kv_pool_gb: float | None = None
    step_overhead_s: float | None = None
    tp_overhead_s: float | None = None
    ep: int = 1
    calibration: tuple[tuple[str, float], ...] | Mapping[str, float] = ()

    def __post_init__(self) -> None:
        if isinstance(self.calibration, Mapping):
            object.__setattr__(self, "calibration", tuple(sorted(self.calibration.items())))
        if self.engine is None:  # resolve now, so `dep.engine` is always an EngineConfig
            cal = self.gpu_spec.calibration
            defaults = EngineConfig(
                max_num_seqs=cal.max_num_seqs, max_batched_tokens=cal.max_batched_tokens
            )
            object.__setattr__(self, "engine", defaults)
        if self.ep not in (1, self.tp):
            raise ValueError(
                f"expert parallelism must be 1 or equal to TP ({self.tp}), not {self.ep}"
            )

    @property
    def model_spec(self) -> ModelSpec:
        return self.model if isinstance(self.model, ModelSpec) else get_model(self.model)

    @property
    def gpu_spec(self) -> GPU:
        g = self.gpu if isinstance(self.gpu, GPU) else get_gpu(self.gpu)
        overrides = dict(self.calibration)
        return g.with_calibration(**overrides) if overrides else g

    @property
    def parallelism(self) -> Parallelism:
        return Parallelism(self.tp, self.pp, self.ep)

    @property
    def engine_config(self) -> EngineConfig:
        """The engine settings in force: explicit, or vLLM's defaults for this GPU."""
        assert self.engine is not None  # resolved in __post_init__
        return self.engine

    def memory(self) -> MemoryPlan:
        eng = self.engine_config
        return plan_memory(
            self.model_spec,
            self.gpu_spec,
            self.parallelism,
            self.precision,
            gpu_memory_utilization=self.gpu_memory_utilization,
            block_size=eng.block_size,
            max_batched_tokens=eng.max_batched_tokens,
            max_num_seqs=eng.max_num_seqs,
            activation_bytes=None if self.activation_gb is None else self.activation_gb * 2**30,
            kv_pool_bytes=None if self.kv_pool_gb is None else self.kv_pool_gb * 1e9,
        )

    def cost(self) -> StepCost:
        return _cost(
            self.model_spec,
            self.gpu_spec,
            self.parallelism,
            self.precision,
            self.step_overhead_s,
            self.tp_overhead_s,
            max(self.engine_config.max_batched_tokens, 1),
        )


@lru_cache(maxsize=256)
def _cost(
    model: ModelSpec,
    gpu: GPU,
    par: Parallelism,
    prec: Precision,
    overhead: float | None,
    tp_overhead: float | None,
    max_tokens: int,
) -> StepCost:
    """Operator tables are pure functions of the configuration: build each one once."""
    return StepCost(model, gpu, par, prec, overhead, tp_overhead, max_tokens)


def fits(dep: Deployment) -> tuple[bool, str]:
    """Can this replica serve at all? Returns (ok, reason)."""
    plan = dep.memory()
    return plan.fits, plan.reason


def _ops_dict(ops: list[Op]) -> list[dict[str, Any]]:
    return [
        {"op": o.name, "time_s": o.time_s, "flops": o.flops, "bytes": o.bytes, "bound": o.bound}
        for o in ops
    ]


def analyze(
    dep: Deployment, batch: int = 1, input_len: int = 1024, output_len: int = 128
) -> dict[str, Any]:
    """Static (single-batch) analysis: per-operator prefill and decode breakdown plus totals.

    The operator tables are one forward pass (all pipeline stages in sequence), decode at the
    mean context of the generation (input + output/2). The totals price each iteration as the
    engine does (`StepCost.cycle_time`): with pipeline stages the batch is split into
    micro-batches that overlap across the stages, so TTFT and TPOT agree with `run` on the
    same batch; without stages a cycle is that forward pass. End-to-end latency sums the
    exact per-step decode cycles over the whole generation.
    """
    m, g, par, prec = dep.model_spec, dep.gpu_spec, dep.parallelism, dep.precision
    plan = dep.memory()
    pre = operator_breakdown(
        m, g, par, prec, batch, input_len, 0, dep.step_overhead_s, dep.tp_overhead_s
    )
    mid = input_len + output_len // 2
    dec = operator_breakdown(m, g, par, prec, batch, 1, mid, dep.step_overhead_s, dep.tp_overhead_s)
    cost = dep.cost()
    prefill_cycle = cost.cycle_time(0, 0.0, [(input_len, 0)] * batch, sampled=batch)
    ttft = prefill_cycle + cost.request_overhead
    decode_cycle = cost.cycle_time(batch, float(batch * (mid + 1)))
    steps = np.arange(output_len - 1)
    ctx = (input_len + 1 + steps) * batch
    tpots = np.array([cost.cycle_time(batch, float(c)) for c in ctx]) if len(steps) else np.zeros(0)
    decode_total = float(tpots.sum())
    e2e = ttft + decode_total
    weight_bytes_gpu = plan.weight_bytes
    need_ctx = input_len + output_len
    return {
        "model": m.name,
        "gpu": g.key,
        "tp": par.tp,
        "pp": par.pp,
        "batch": batch,
        "input_len": input_len,
        "output_len": output_len,
        "precision": {
            "weight_bits": prec.weight_bits,
            "act_bits": prec.act_bits,
            "kv_bits": prec.kv_bits,
            "weight_format": prec.format.name,
            "stored_weight_bits": prec.stored_weight_bits,
            "head_bits": prec.head_weight_bits,
        },
        "efficiency": {
            "class": g.efficiency.name,
            "compute": g.efficiency.compute,
            "memory": g.efficiency.memory,
            "comm": g.efficiency.comm,
            "step_overhead_s": cost.fixed_overhead,
        },
        "calibration": asdict(g.calibration),
        "prefill": {"ops": _ops_dict(pre), "time_s": ttft, "cycle_s": prefill_cycle},
        "decode": {"ops": _ops_dict(dec), "time_s": sum(o.time_s for o in dec),
                   "cycle_s": decode_cycle, "context": mid},
        "totals": {
            "ttft_s": ttft,
            "tpot_s": decode_total / max(1, output_len - 1),
            "e2e_s": e2e,
            "output_tokens_per_s": batch * output_len / e2e if e2e > 0 else 0.0,
            "decode_floor_s": weight_bytes_gpu / g.mem_bw,
        },
        "memory": plan.to_dict()
        | {
            "fits_batch": plan.fits and plan.max_batch(need_ctx) >= batch,
            "max_batch_at_context": plan.max_batch(need_ctx) if plan.fits else 0,
        },
    }


def run(
    dep: Deployment,
    workload: Workload,
    replicas: int = 1,
    router: str = "least_outstanding",
    slo: SLO | None = None,
    max_concurrency: int | None = None,
    include_requests: bool = False,
    timeline_points: int = 200,
    seed: int = 0,
) -> dict[str, Any]:
    """Serve `workload` on `replicas` copies of `dep`; return the summary (and requests)."""
    plan = dep.memory()
    if not plan.fits:
        return {"fits": False, "reason": plan.reason}
    out = simulate(
        workload, dep.cost(), plan, dep.engine_config, replicas, router, max_concurrency, seed
    )
    res = summarize(out, slo, timeline_points)
    res["fits"] = True
    res["deployment"] = {
        "model": dep.model_spec.name,
        "gpu": dep.gpu_spec.key,
        "tp": dep.tp,
        "pp": dep.pp,
        "replicas": replicas,
        "router": router,
        "kv_tokens_per_replica": plan.kv_tokens,
        "cost_per_hour": dep.gpu_spec.cost_per_hour * dep.tp * dep.pp * replicas,
    }
    if include_requests:
        res["per_request"] = requests_json(out)
    return res


def mean_latency(
    dep: Deployment,
    replicas: int,
    rate: float,
    input_dist: str,
    output_dist: str,
    duration: float = 300.0,
    seed: int = 0,
) -> float:
    """Mean end-to-end latency of a Poisson workload: the placer's objective L(W, A, P).

    Returns +inf when the replica does not fit or requests are rejected, so an optimiser
    can treat it as infeasible.
    """
    wl = synthetic(
        rate, duration=duration, input_dist=input_dist, output_dist=output_dist, seed=seed
    )
    res = run(dep, wl, replicas=replicas, timeline_points=0)
    if not res.get("fits") or res["rejected"]:
        return float("inf")
    return float(res["e2e_s"]["mean"])


def max_throughput(
    dep: Deployment,
    input_len: int,
    output_len: int,
    concurrency: int | None = None,
    requests: int = 200,
) -> dict[str, float]:
    """Saturated throughput of one replica (closed loop): the capacity a placer can assign.

    `concurrency` defaults to the most sequences of this length the KV cache holds.
    """
    plan = dep.memory()
    if not plan.fits:
        return {"requests_per_s": 0.0, "output_tokens_per_s": 0.0, "concurrency": 0.0}
    c = concurrency or max(1, plan.max_batch(input_len + output_len))
    n = max(requests, 3 * c)
    wl = Workload.from_arrays(np.zeros(n), np.full(n, input_len), np.full(n, output_len))
    # what `run(dep, wl, max_concurrency=c)` simulates, reading only its two rates
    out = simulate(wl, dep.cost(), plan, dep.engine_config, 1, "least_outstanding", c, 0)
    rps, tokens_per_s = throughput(out)
    return {
        "requests_per_s": rps,
        "output_tokens_per_s": tokens_per_s,
        "concurrency": float(c),
    }

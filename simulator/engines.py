"""Serving-engine profiles (catalog/engines.toml) and the engine settings a benchmark tool
chooses for itself.

A published figure names an engine (vLLM, TensorRT-LLM, ...) whose host side and scheduler
differ in ways the GPU's calibration profile cannot carry: how much host work each iteration
and each sequence costs, whether that work overlaps the GPU, whether prompts are chunked,
whether admission reserves the whole output. `engine_profile(name)` reads one; `deployment`
builds a `Deployment` with it applied. `trtllm_bench_settings` reproduces the maximum batch
size and token budget `trtllm-bench` picks when none is given (its tuning heuristic, restated
from the documented formula), so a TensorRT-LLM throughput table is simulated with the
settings it was measured with.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from simulator.api import Deployment
from simulator.engine import EngineConfig
from simulator.models import ModelSpec
from simulator.roofline import Precision

CATALOG = Path(__file__).with_name("catalog") / "engines.toml"


@dataclass(frozen=True)
class EngineProfile:
    """What one serving engine changes on top of a GPU profile (see catalog/engines.toml)."""

    name: str
    description: str
    source: str
    chunk_prompts: bool = True
    reserve_output_ratio: float = 0.0
    calibration: dict[str, float] = field(default_factory=dict)


@cache
def _load(path: Path = CATALOG) -> dict[str, EngineProfile]:
    with path.open("rb") as fh:
        raw = tomllib.load(fh)
    return {
        name: EngineProfile(
            name=name,
            description=str(body["description"]),
            source=str(body["source"]),
            chunk_prompts=bool(body.get("chunk_prompts", True)),
            reserve_output_ratio=float(body.get("reserve_output_ratio", 0.0)),
            calibration={k: float(v) for k, v in body.get("calibration", {}).items()},
        )
        for name, body in raw["engine"].items()
    }


def engine_profiles() -> dict[str, EngineProfile]:
    """Every engine profile of the catalog, by name."""
    return dict(_load())


def engine_profile(name: str) -> EngineProfile:
    """One engine profile; KeyError naming the known ones otherwise."""
    profiles = _load()
    if name not in profiles:
        raise KeyError(f"unknown engine {name!r}; known: {', '.join(sorted(profiles))}")
    return profiles[name]


def deployment(
    model: str | ModelSpec,
    gpu: str,
    engine: str = "vllm",
    *,
    tp: int = 1,
    pp: int = 1,
    precision: Precision | None = None,
    max_num_seqs: int | None = None,
    max_batched_tokens: int | None = None,
    kv_pool_gb: float | None = None,
    gpu_memory_utilization: float = 0.9,
    frontend: bool = True,
    calibration: dict[str, float] | None = None,
) -> Deployment:
    """A `Deployment` of `model` on `gpu` run by `engine`: the engine's calibration overrides
    and scheduler applied; batch limits default to the GPU profile's (vLLM's defaults).
    `frontend` False drops the per-request HTTP/tokenizer cost (offline clients)."""
    prof = engine_profile(engine)
    base = Deployment(model, gpu, tp=tp, pp=pp, precision=precision or Precision())
    defaults = base.engine_config
    cfg = EngineConfig(
        max_num_seqs=max_num_seqs or defaults.max_num_seqs,
        max_batched_tokens=max_batched_tokens or defaults.max_batched_tokens,
        chunk_prompts=prof.chunk_prompts,
        reserve_output_ratio=prof.reserve_output_ratio,
    )
    cal = dict(prof.calibration)
    if not frontend:
        cal["request_overhead_s"] = 0.0
    cal.update(calibration or {})
    return Deployment(
        model,
        gpu,
        tp=tp,
        pp=pp,
        precision=precision or Precision(),
        engine=cfg,
        kv_pool_gb=kv_pool_gb,
        gpu_memory_utilization=gpu_memory_utilization,
        calibration=cal,
    )


def _round_up(x: float, step: int) -> int:
    return step * math.ceil(x / step)


def trtllm_bench_settings(
    model: ModelSpec,
    gpu_runtime_bytes: float,
    tp: int,
    pp: int,
    prec: Precision,
    isl: int,
    osl: int,
    kv_fraction: float = 0.95,
    chunked_prefill: bool = False,
) -> tuple[int, int]:
    """(max batch size, max tokens per iteration) that `trtllm-bench throughput` sets when the
    user gives none (tensorrt_llm/bench/build/tuning.py: calc_engine_setting and
    finetune_setting; tensorrt_llm/bench/benchmark/utils/general.py: get_settings).

    It estimates how many requests of isl+osl tokens the KV cache holds from the weights
    (parameter count times bytes per weight) and the devices' total memory, caps that at
    4096 and divides it among the pipeline stages, then allows as many tokens per iteration
    as those requests need at the isl/osl ratio (capped at 32768), and rounds both up to
    coarse steps (batch at least 64, tokens at least 2048). Without chunked prefill (its
    default) the token budget is raised to hold the longest prompt plus a token for every
    sequence of the batch, so that a prompt always fits one iteration.
    """
    kv_heads = max(tp, model.kv_heads)
    layers = model.layers - model.sliding_layers
    kv_bytes_token = 2 * layers * kv_heads * model.head_dim * prec.kv_bits / 8
    gpus = tp * pp
    # trtllm-bench's own estimate: every parameter at the format's nominal bytes (its
    # BYTES_PER_ELEM: NVFP4 0.5, FP8 1), no scales, no BF16 head; not the memory the
    # runtime holds (memory.weight_bytes_per_gpu), which sizes the KV cache
    weights = model.total_params * prec.weight_bits / 8
    free = gpu_runtime_bytes * gpus - weights
    if free <= 0 or kv_bytes_token <= 0:
        return 64, 2048
    requests = free * kv_fraction / (kv_bytes_token * (isl + osl))
    raw_bs = min(requests, 4096) / pp
    raw_tokens = min(raw_bs * (1 + isl / osl), 32768)
    if raw_bs < 256:
        max_bs = max(64, _round_up(raw_bs, 32))
    elif raw_bs < 1024:
        max_bs = _round_up(raw_bs, 128)
    else:
        max_bs = _round_up(raw_bs, 256)
    if raw_tokens < 4096:
        max_tokens = max(2048, _round_up(raw_tokens, 256))
    elif raw_tokens < 8192:
        max_tokens = _round_up(raw_tokens, 512)
    else:
        max_tokens = _round_up(raw_tokens, 1024)
    if not chunked_prefill:
        max_tokens = max(max_tokens, isl + max_bs)
    return max_bs, max_tokens


def trtllm_kv_pool_gb(dep: Deployment, kv_fraction: float) -> float:
    """TensorRT-LLM's KV cache: `kv_fraction` (--kv_cache_free_gpu_mem_fraction) of the memory
    left free once weights, activations and the runtime's own buffers are in place (not of the
    total, as vLLM's gpu_memory_utilization is). In GB, for `Deployment.kv_pool_gb`."""
    plan = Deployment(
        dep.model_spec,
        dep.gpu_spec,
        tp=dep.tp,
        pp=dep.pp,
        precision=dep.precision,
        engine=dep.engine_config,
        gpu_memory_utilization=1.0,
        calibration=dep.calibration,
    ).memory()
    return max(plan.kv_pool_bytes, 0.0) * kv_fraction / 1e9


def describe(name: str) -> dict[str, Any]:
    """An engine profile as a plain dict (CLI listing)."""
    p = engine_profile(name)
    return {
        "engine": p.name,
        "description": p.description,
        "chunk_prompts": p.chunk_prompts,
        "reserve_output_ratio": p.reserve_output_ratio,
        "calibration": dict(p.calibration),
        "source": p.source,
    }

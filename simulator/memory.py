"""Per-GPU memory budget: weights, activation reserve, paged KV cache, and what fits.

Mirrors how vLLM/SGLang size their KV pool: usable = capacity x gpu_memory_utilization,
minus weights, minus a runtime/activation reserve; the rest is cut into fixed-size blocks.
Every "does not fit" answer carries a human-readable reason.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from otela.hardware.catalog import GPU
from simulator.models import ModelSpec
from simulator.roofline import Parallelism, Precision

GIB = 1024**3


@dataclass(frozen=True)
class MemoryPlan:
    """Result of sizing one replica (all numbers per GPU unless named otherwise)."""

    fits: bool
    reason: str
    capacity_bytes: float
    usable_bytes: float
    weight_bytes: float
    activation_bytes: float
    kv_pool_bytes: float
    kv_bytes_per_token: float  # per GPU, growing (full-attention) layers only
    block_size: int
    kv_blocks: int
    max_context: int  # longest single sequence the pool (and the model) allows
    max_num_seqs: int

    @property
    def kv_tokens(self) -> int:
        return self.kv_blocks * self.block_size

    def max_batch(self, context: int) -> int:
        """How many sequences of `context` tokens fit in the KV pool at once."""
        if context <= 0:
            return self.max_num_seqs
        per_seq = math.ceil(context / self.block_size)
        return min(self.max_num_seqs, self.kv_blocks // per_seq)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["kv_tokens"] = self.kv_tokens
        return d


def weight_bytes_total(model: ModelSpec, prec: Precision) -> float:
    """Bytes of all weights as the checkpoint stores them: quantized weights with their
    block scales (`Precision.stored_weight_bits`), experts at their own precision, and the
    embedding and lm_head at theirs (`Precision.head_weight_bits`: BF16 in quantized
    checkpoints)."""
    expert = model.layers * model.experts * model.expert_params if model.is_moe else 0
    emb = model.embedding_params
    rest = model.total_params - expert - emb
    return (
        rest * prec.stored_weight_bits / 8
        + expert * prec.expert_bits_for(model) / 8
        + emb * prec.head_weight_bits / 8
    )


def weight_bytes_per_gpu(model: ModelSpec, par: Parallelism, prec: Precision) -> float:
    """Weights on the fullest GPU: its share of layers plus the (vocab-parallel) embedding or
    lm_head that sits on the first/last pipeline stage."""
    emb_params = model.vocab * model.hidden
    head_b = prec.head_weight_bits / 8
    layer_bytes = (
        weight_bytes_total(model, prec) - model.embedding_params * head_b
    ) / model.layers
    layers_stage = math.ceil(model.layers / par.pp)
    emb_stage = emb_params * (1 if par.pp > 1 or model.tie_embeddings else 2)
    return (layers_stage * layer_bytes + emb_stage * head_b) / par.tp


def activation_reserve_bytes(
    model: ModelSpec, par: Parallelism, prec: Precision, max_batched_tokens: int, max_num_seqs: int
) -> float:
    """Peak transient memory of one forward pass plus runtime overhead.

    What the engine's profiling run measures: the widest intermediate tensors of a step with
    `max_batched_tokens` tokens (MLP up-projection, attention buffers, logits for every running
    sequence in fp32). The runtime's own memory (CUDA context, graphs, NCCL) is separate:
    `runtime_reserve_bytes`.
    """
    ab = prec.act_bits / 8
    inter = (
        2 * model.moe_intermediate * model.experts_per_token
        if model.is_moe
        else 2 * model.intermediate
    )
    width = (
        inter / par.tp
        + 4 * model.hidden
        + (model.heads + 2 * model.kv_heads) * model.head_dim / par.tp
    )
    act = 2 * max_batched_tokens * width * ab
    logits = max_num_seqs * model.vocab / par.tp * 4
    return act + logits


def runtime_reserve_bytes(gpu: GPU, par: Parallelism) -> float:
    """Per-GPU memory the runtime holds outside weights, activations and KV: CUDA context and
    CUDA graphs on every GPU, plus NCCL / custom all-reduce buffers on every rank of a TP or
    PP group (from the GPU's calibration profile)."""
    cal = gpu.calibration
    extra = cal.tp_reserve_gib if par.gpus > 1 else 0.0
    return (cal.runtime_reserve_gib + extra) * GIB


def plan_memory(
    model: ModelSpec,
    gpu: GPU,
    par: Parallelism | None = None,
    prec: Precision | None = None,
    *,
    gpu_memory_utilization: float = 0.9,
    block_size: int = 16,
    max_batched_tokens: int = 8192,
    max_num_seqs: int = 256,
    activation_bytes: float | None = None,
    kv_pool_bytes: float | None = None,
    max_model_len: int | None = None,
) -> MemoryPlan:
    """Size the KV pool of one replica and decide whether it can serve at all.

    `kv_pool_bytes` forces the KV pool size (what Prism's experiment varies); otherwise it is
    whatever memory remains.
    """
    par = par or Parallelism()
    prec = prec or Precision()
    reasons: list[str] = []
    if model.heads % par.tp:
        reasons.append(f"TP={par.tp} does not divide {model.heads} attention heads")
    if par.pp > model.layers:
        reasons.append(f"PP={par.pp} exceeds {model.layers} layers")
    # engines size the pool from the total the runtime reports (GiB), not the datasheet GB
    capacity = gpu.runtime_bytes
    usable = capacity * gpu_memory_utilization
    weights = weight_bytes_per_gpu(model, par, prec)
    act = (
        activation_bytes
        if activation_bytes is not None
        else activation_reserve_bytes(model, par, prec, max_batched_tokens, max_num_seqs)
        + runtime_reserve_bytes(gpu, par)
    )
    kv_heads_gpu = math.ceil(model.kv_heads / par.tp)
    layers_stage = math.ceil((model.layers - model.sliding_layers) / par.pp)
    per_token = layers_stage * model.kv_elems_per_token_layer(par.tp) * prec.kv_bits / 8
    # sliding-window layers hold at most `window` tokens per sequence: reserve that up front
    sliding = 0.0
    if model.sliding_layers:
        sw_layers = math.ceil(model.sliding_layers / par.pp)
        sliding = (
            max_num_seqs
            * model.sliding_window
            * 2
            * sw_layers
            * kv_heads_gpu
            * model.head_dim
            * prec.kv_bits
            / 8
        )
    free = usable - weights - act - sliding
    pool = free if kv_pool_bytes is None else min(kv_pool_bytes, max(free, 0.0))
    if kv_pool_bytes is not None and kv_pool_bytes > free:
        reasons.append(
            f"requested KV pool {kv_pool_bytes / GIB:.1f} GiB exceeds free {free / GIB:.1f} GiB"
        )
    if free <= 0:
        reasons.append(
            f"weights {weights / GIB:.1f} GiB + activations {act / GIB:.1f} GiB"
            + (f" + sliding-window KV {sliding / GIB:.1f} GiB" if sliding else "")
            + f" exceed usable {usable / GIB:.1f} GiB per GPU"
            + f" ({gpu.key}, TP={par.tp}, PP={par.pp}, {prec.weight_bits:g}-bit weights"
            + f" ({prec.format.name}))"
        )
    blocks = max(0, int(pool // (per_token * block_size))) if per_token > 0 else 0
    limit = max_model_len or model.max_context
    max_ctx = min(blocks * block_size, limit)
    if not reasons and blocks == 0:
        reasons.append("no memory left for even one KV-cache block")
    fits = not reasons
    return MemoryPlan(
        fits=fits,
        reason="fits" if fits else "; ".join(reasons),
        capacity_bytes=capacity,
        usable_bytes=usable,
        weight_bytes=weights,
        activation_bytes=act,
        kv_pool_bytes=max(pool, 0.0),
        kv_bytes_per_token=per_token,
        block_size=block_size,
        kv_blocks=blocks,
        max_context=max_ctx,
        max_num_seqs=max_num_seqs,
    )

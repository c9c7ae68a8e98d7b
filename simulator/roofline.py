"""Operator-level roofline: pure math, no I/O, no state.

Every operator is costed as ``max(flops / (peak * compute_eff), bytes / (bw * memory_eff))``
on ONE GPU of a tensor-parallel group; communication is costed separately from the
interconnect. `StepCost` pre-tabulates these sums so the event engine can price an engine
step (any mix of decode tokens and prefill chunks) in a few array look-ups.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from simulator.hardware import GPU
from simulator.models import ModelSpec


@dataclass(frozen=True)
class Precision:
    """Storage precision of weights, activations and KV cache, in bits."""

    weight_bits: float = 16
    act_bits: float = 16
    kv_bits: float = 16
    expert_bits: float | None = None  # None: min(weight_bits, model's shipped expert bits)

    @property
    def compute_bits(self) -> int:
        """8-bit tensor math only when both operands are 8-bit (W8A8 / FP8); else 16-bit."""
        return 8 if self.weight_bits <= 8 and self.act_bits <= 8 else 16

    def expert_bits_for(self, model: ModelSpec) -> float:
        if self.expert_bits is not None:
            return self.expert_bits
        return min(self.weight_bits, model.default_expert_bits)


@dataclass(frozen=True)
class Parallelism:
    """Tensor- and pipeline-parallel degrees of one replica."""

    tp: int = 1
    pp: int = 1

    @property
    def gpus(self) -> int:
        return self.tp * self.pp


@dataclass(frozen=True)
class Op:
    """One operator's cost summed over all the layers it appears in (one GPU's view)."""

    name: str
    flops: float
    bytes: float
    time_s: float
    bound: str  # "compute" | "memory" | "comm" | "overhead"


def roofline_time(flops: float, nbytes: float, peak: float, bw: float) -> tuple[float, str]:
    """Roofline time of one kernel and which roof binds it."""
    tc = flops / peak if peak > 0 else 0.0
    tm = nbytes / bw if bw > 0 else 0.0
    return (tc, "compute") if tc >= tm else (tm, "memory")


def allreduce_time(nbytes: float, tp: int, gpu: GPU) -> float:
    """Ring all-reduce: 2(n-1)/n of the message over one link direction, plus a fixed latency."""
    if tp <= 1 or nbytes <= 0:
        return 0.0
    bw = gpu.interconnect_bw / 2 * gpu.efficiency.comm
    return 2 * (tp - 1) / tp * nbytes / bw + gpu.efficiency.collective_latency_s


def p2p_time(nbytes: float, gpu: GPU) -> float:
    """Point-to-point activation hand-off between pipeline stages."""
    if nbytes <= 0:
        return 0.0
    return nbytes / (gpu.interconnect_bw / 2 * gpu.efficiency.comm) + gpu.efficiency.p2p_latency_s


def expected_active_experts(tokens: np.ndarray | float, experts: int, top_k: int) -> np.ndarray:
    """Expected number of distinct experts hit by `tokens` tokens routing uniformly top-k."""
    t = np.asarray(tokens, dtype=float)
    return experts * (1.0 - (1.0 - top_k / experts) ** t)


@dataclass(frozen=True)
class _Linear:
    name: str
    params: float  # weight elements on one GPU, per layer
    out_per_token: float  # output activations per token on one GPU
    in_per_token: float  # input activations per token


def _linears(m: ModelSpec, tp: int) -> list[_Linear]:
    qkv_out = (m.heads + 2 * m.kv_heads) * m.head_dim
    ops = [
        _Linear("qkv_proj", m.hidden * qkv_out / tp, qkv_out / tp, m.hidden),
        _Linear(
            "o_proj", m.heads * m.head_dim * m.hidden / tp, m.hidden, m.heads * m.head_dim / tp
        ),
    ]
    if not m.is_moe:
        ops += [
            _Linear(
                "mlp_gate_up", 2 * m.hidden * m.intermediate / tp, 2 * m.intermediate / tp, m.hidden
            ),
            _Linear("mlp_down", m.intermediate * m.hidden / tp, m.hidden, m.intermediate / tp),
        ]
    elif m.shared_expert_intermediate:
        s = m.shared_expert_intermediate
        ops.append(_Linear("shared_expert", 3 * m.hidden * s / tp, m.hidden, m.hidden))
    return ops


@dataclass
class StepCost:
    """Per-replica cost tables: price any engine step from token counts and context sums.

    All times are the latency of one forward pass through the whole replica (all pipeline
    stages in sequence). Construction is O(max_tokens) numpy work; pricing is O(1) plus the
    number of prefill chunks in the step.
    """

    model: ModelSpec
    gpu: GPU
    par: Parallelism = field(default_factory=Parallelism)
    prec: Precision = field(default_factory=Precision)
    step_overhead_s: float = 1.0e-3
    tp_overhead_s: float = 0.0
    max_tokens: int = 8192

    def __post_init__(self) -> None:
        m, g, tp, pp = self.model, self.gpu, self.par.tp, self.par.pp
        eff = g.efficiency
        self.peak = g.peak_flops(self.prec.compute_bits) * eff.compute
        self.bw = g.mem_bw * eff.memory
        self.wb = self.prec.weight_bits / 8
        self.ab = self.prec.act_bits / 8
        self.kvb = self.prec.kv_bits / 8
        self.eb = self.prec.expert_bits_for(m) / 8
        self.kv_heads_gpu = math.ceil(m.kv_heads / tp)
        self.heads_gpu = m.heads / tp
        self.full_layers = m.layers - m.sliding_layers
        self._table_n = self.max_tokens + 1
        self.token_table = self._per_token_table(np.arange(self._table_n, dtype=float))
        # Decode attention is one batched kernel; flops and bytes are both linear in the summed
        # context, so its roofline is linear too: slope per context token over all layers.
        d = m.head_dim
        f_tok = 4 * self.heads_gpu * d
        b_tok = 2 * self.kv_heads_gpu * d * self.kvb
        self.attn_slope_per_layer = max(f_tok / self.peak, b_tok / self.bw)
        self.attn_slope = self.attn_slope_per_layer * self.full_layers
        self.attn_slope_sliding = self.attn_slope_per_layer * m.sliding_layers
        # per decoded sequence: read q, write o (tiny, but keeps batch-1 honest)
        self.attn_per_seq = m.layers * 2 * self.heads_gpu * d * self.ab / self.bw
        self.fixed_overhead = self.step_overhead_s + self.tp_overhead_s * (tp * pp - 1)
        del eff, g

    # ---- linear layers, norms, MoE, communication: functions of tokens in the step ----
    def _per_token_table(self, t: np.ndarray) -> np.ndarray:
        m, tp, pp = self.model, self.par.tp, self.par.pp
        total = np.zeros_like(t)
        for op in _linears(m, tp):
            flops = 2 * op.params * t
            nbytes = op.params * self.wb + (op.in_per_token + op.out_per_token) * t * self.ab
            total += np.maximum(flops / self.peak, nbytes / self.bw)
        if m.is_moe:
            router = m.hidden * m.experts
            total += np.maximum(
                2 * router * t / self.peak, (router * self.wb + m.hidden * t * self.ab) / self.bw
            )
            active = expected_active_experts(t, m.experts, m.experts_per_token)
            flops = 2 * t * m.experts_per_token * m.expert_params / tp
            nbytes = (
                active * m.expert_params / tp * self.eb
                + 3 * m.hidden * t * m.experts_per_token * self.ab
            )
            total += np.maximum(flops / self.peak, nbytes / self.bw)
        # two RMSNorms + residual adds per layer: memory bound elementwise passes
        total += 6 * m.hidden * t * self.ab / self.bw
        total *= m.layers
        # TP: one all-reduce after attention and one after the MLP, per layer
        msg = t * m.hidden * self.ab
        if tp > 1:
            bw = self.gpu.interconnect_bw / 2 * self.gpu.efficiency.comm
            ar = 2 * (tp - 1) / tp * msg / bw + self.gpu.efficiency.collective_latency_s
            total += np.where(t > 0, 2 * m.layers * ar, 0.0)
        if pp > 1:
            p2p = (
                msg / (self.gpu.interconnect_bw / 2 * self.gpu.efficiency.comm)
                + self.gpu.efficiency.p2p_latency_s
            )
            total += np.where(t > 0, (pp - 1) * p2p, 0.0)
        # embedding gather
        total += t * m.hidden * (self.wb + self.ab) / self.bw
        return total

    def tokens_time(self, tokens: int) -> float:
        """Time of all per-token operators for a step carrying `tokens` tokens."""
        if tokens < self._table_n:
            return float(self.token_table[tokens])
        return float(self._per_token_table(np.array([float(tokens)]))[0])

    def head_time(self, sampled: int) -> float:
        """Final norm + lm_head for the sequences that emit a token this step."""
        if sampled <= 0:
            return 0.0
        m = self.model
        params = m.vocab * m.hidden / self.par.tp
        flops = 2 * params * sampled
        nbytes = params * self.wb + sampled * (m.hidden + m.vocab / self.par.tp) * self.ab
        return max(flops / self.peak, nbytes / self.bw)

    def prefill_attn_time(self, chunk: int, prior: int) -> float:
        """FlashAttention-style causal attention of `chunk` new tokens over `prior` cached ones.

        Flops: 4·h·d per (query, key) pair, causal half within the chunk. Bytes: Q and O once,
        the K/V of the visible context re-read once per 128-query tile, new K/V written.
        """
        if chunk <= 0:
            return 0.0
        m, d = self.model, self.model.head_dim
        t = 0.0
        for layers, window in ((self.full_layers, 0), (m.sliding_layers, m.sliding_window)):
            if layers == 0:
                continue
            keys = prior + (chunk + 1) / 2
            if window:
                keys = min(keys, window)
            flops = 4 * self.heads_gpu * d * chunk * keys
            tiles = math.ceil(chunk / 128)
            visible = min(prior + chunk, window) if window else prior + chunk
            kv = 2 * self.kv_heads_gpu * d * self.kvb
            nbytes = 2 * chunk * self.heads_gpu * d * self.ab + tiles * visible * kv + chunk * kv
            t += layers * max(flops / self.peak, nbytes / self.bw)
        return t

    def decode_attn_time(self, n_seqs: int, ctx_sum: float, sliding_ctx_sum: float) -> float:
        """Batched decode attention over `ctx_sum` cached tokens (full-attention layers)."""
        if n_seqs <= 0:
            return 0.0
        return (
            self.attn_slope * ctx_sum
            + self.attn_slope_sliding * sliding_ctx_sum
            + (self.attn_per_seq * n_seqs)
        )

    def step_time(
        self,
        decode_seqs: int,
        decode_ctx_sum: float,
        prefill_chunks: list[tuple[int, int]] | None = None,
        sampled: int | None = None,
        sliding_ctx_sum: float | None = None,
    ) -> float:
        """Latency of one engine iteration: decode tokens plus (chunk, prior) prefill pieces."""
        chunks = prefill_chunks or []
        tokens = decode_seqs + sum(c for c, _ in chunks)
        if tokens == 0:
            return 0.0
        if sampled is None:
            sampled = decode_seqs + len(chunks)
        if sliding_ctx_sum is None:
            w = self.model.sliding_window
            sliding_ctx_sum = min(decode_ctx_sum, decode_seqs * w) if w else 0.0
        t = self.tokens_time(tokens) + self.head_time(sampled) + self.fixed_overhead
        t += self.decode_attn_time(decode_seqs, decode_ctx_sum, sliding_ctx_sum)
        for c, p in chunks:
            t += self.prefill_attn_time(c, p)
        return t


def operator_breakdown(
    model: ModelSpec,
    gpu: GPU,
    par: Parallelism,
    prec: Precision,
    batch: int,
    new_tokens: int,
    context: int,
    step_overhead_s: float = 1.0e-3,
    tp_overhead_s: float = 0.0,
) -> list[Op]:
    """Per-operator cost of ONE forward pass where each of `batch` sequences adds `new_tokens`
    tokens on top of `context` cached ones (prefill: context=0; decode: new_tokens=1).

    Times are the replica latency (pipeline stages in sequence), flops/bytes per GPU.
    """
    m, tp, pp = model, par.tp, par.pp
    eff = gpu.efficiency
    peak = gpu.peak_flops(prec.compute_bits) * eff.compute
    bw = gpu.mem_bw * eff.memory
    wb, ab, kvb = prec.weight_bits / 8, prec.act_bits / 8, prec.kv_bits / 8
    eb = prec.expert_bits_for(m) / 8
    t = batch * new_tokens
    L = m.layers
    ops: list[Op] = []

    def add(name: str, flops: float, nbytes: float, count: int = 1) -> None:
        tt, bound = roofline_time(flops, nbytes, peak, bw)
        ops.append(Op(name, flops * count, nbytes * count, tt * count, bound))

    add("embedding", 0.0, t * m.hidden * (wb + ab))
    for op in _linears(m, tp):
        add(
            op.name,
            2 * op.params * t,
            op.params * wb + (op.in_per_token + op.out_per_token) * t * ab,
            L,
        )
        if op.name == "o_proj":
            add("norms+residual", 0.0, 6 * m.hidden * t * ab, L)
    if m.is_moe:
        router = m.hidden * m.experts
        add("moe_router", 2 * router * t, router * wb + m.hidden * t * ab, L)
        active = float(expected_active_experts(t, m.experts, m.experts_per_token))
        add(
            f"moe_experts({active:.1f}/{m.experts} active)",
            2 * t * m.experts_per_token * m.expert_params / tp,
            active * m.expert_params / tp * eb + 3 * m.hidden * t * m.experts_per_token * ab,
            L,
        )
    cost = StepCost(m, gpu, par, prec, step_overhead_s, tp_overhead_s, max_tokens=1)
    d = m.head_dim
    kv = 2 * cost.kv_heads_gpu * d * kvb
    for layers, window, label in (
        (cost.full_layers, 0, "attention"),
        (m.sliding_layers, m.sliding_window, "attention(sliding)"),
    ):
        if not layers:
            continue
        if new_tokens == 1 and context > 0:
            ctx = min(context + 1, window) if window else context + 1
            flops = 4 * cost.heads_gpu * d * ctx * batch
            nbytes = batch * (ctx * kv + 2 * cost.heads_gpu * d * ab)
            add(f"{label}_decode", flops, nbytes, layers)
        else:
            keys = context + (new_tokens + 1) / 2
            keys = min(keys, window) if window else keys
            visible = min(context + new_tokens, window) if window else context + new_tokens
            flops = 4 * cost.heads_gpu * d * new_tokens * keys * batch
            tiles = math.ceil(new_tokens / 128)
            nbytes = batch * (
                2 * new_tokens * cost.heads_gpu * d * ab + tiles * visible * kv + new_tokens * kv
            )
            add(f"{label}_prefill", flops, nbytes, layers)
    params = m.vocab * m.hidden / tp
    add("lm_head", 2 * params * batch, params * wb + batch * (m.hidden + m.vocab / tp) * ab)
    if tp > 1:
        msg = t * m.hidden * ab
        ar = allreduce_time(msg, tp, gpu)
        ops.append(
            Op(f"all_reduce(tp={tp})", 0.0, 2 * L * 2 * (tp - 1) / tp * msg, 2 * L * ar, "comm")
        )
    if pp > 1:
        msg = t * m.hidden * ab
        ops.append(Op(f"p2p(pp={pp})", 0.0, (pp - 1) * msg, (pp - 1) * p2p_time(msg, gpu), "comm"))
    ops.append(Op("engine_overhead", 0.0, 0.0, cost.fixed_overhead, "overhead"))
    # per-GPU flops/bytes: layer ops were per GPU of a TP group for ALL layers; a pipeline
    # stage holds L/pp of them, but latency (time) stays the sum over stages.
    if pp > 1:
        ops = [Op(o.name, o.flops / pp, o.bytes / pp, o.time_s, o.bound) for o in ops]
    return ops

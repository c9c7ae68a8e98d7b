"""Operator-level roofline: ONE cost function, pure math, no I/O, no state.

`StepCost` describes every operator of a forward pass as a `Term` (FLOPs and bytes on one
GPU of a tensor-parallel group, and how many layers it appears in) and prices each with the
same `kernel_time`. Two views use those terms:

* the event engine asks `step_time(...)` for an iteration (decode tokens plus prefill chunks)
  and gets a sum whose per-token part is pre-tabulated for speed;
* `step_ops(...)` (and `operator_breakdown`, what `otela sim analyze` prints) lists the same
  terms one by one.

Both read the same terms, so they cannot drift apart; `tests/simulator/test_roofline.py`
checks that they agree to rounding error. With pipeline stages the engine charges
`cycle_time` instead: the same terms, priced per micro-batch and overlapped across stages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from otela.hardware.catalog import GPU
from simulator.models import ModelSpec

Array = np.ndarray


@dataclass(frozen=True)
class WeightFormat:
    """How a quantized checkpoint stores its weights, beyond the values' own bits.

    * `scale_bits` / `block`: a block-scaled format stores one scale (and, for asymmetric
      integer formats, one zero point) of `scale_bits` bits per `block` weights, read with
      them by every GEMM; `block = 0` is a per-tensor or per-channel scale, negligible.
    * `head_bits`: the precision of the token embedding and the lm_head. The quantizers
      that produce serving checkpoints leave both unquantized (ModelOpt disables `*lm_head*`
      in every default config and quantizes only linear layers; vLLM's quantization methods
      apply to linear and MoE layers, not to the vocab-parallel embedding and head), so they
      stay BF16 whatever the weights' format.

    Sources in docs/simulator.md ("Quantized checkpoints").
    """

    name: str
    scale_bits: float = 0.0
    block: int = 0
    head_bits: float = 16.0

    @property
    def overhead_bits(self) -> float:
        """Scale (and zero-point) bits per weight."""
        return self.scale_bits / self.block if self.block else 0.0


WEIGHT_FORMATS: dict[str, WeightFormat] = {
    f.name: f
    for f in (
        # unquantized: the embedding and head at the weights' own precision
        WeightFormat("bf16", head_bits=16.0),
        # FP8 E4M3, one FP32 scale per tensor (ModelOpt FP8_DEFAULT_CFG, vLLM `fp8`)
        WeightFormat("fp8"),
        # FP8 E4M3 with one FP32 scale per 128 x 128 block (DeepSeek-V3's checkpoint)
        WeightFormat("fp8-block", scale_bits=32.0, block=128 * 128),
        # INT8 weights, one scale per output channel (weight-only or SmoothQuant W8A8)
        WeightFormat("int8"),
        # NVFP4: E2M1 values, one FP8 E4M3 scale per 16 (+ a per-tensor FP32): 4.5 bits
        WeightFormat("nvfp4", scale_bits=8.0, block=16),
        # MXFP4 (OCP MX): E2M1 values, one E8M0 scale per 32: 4.25 bits
        WeightFormat("mxfp4", scale_bits=8.0, block=32),
        # INT4 AWQ / GPTQ, group 128: an FP16 scale and a packed 4-bit zero per group
        WeightFormat("int4-g128", scale_bits=16.0 + 4.0, block=128),
    )
}


def default_weight_format(weight_bits: float, act_bits: float) -> WeightFormat:
    """The format a checkpoint of these bits is shipped in when nothing else is said:
    16 bits and more unquantized; 8 bits FP8 (W8A8) or INT8 (weight-only); 4 bits NVFP4
    when the activations are 4-bit too (W4A4 is NVFP4's), else INT4 in groups of 128 (AWQ,
    GPTQ). Any other width is taken as already including its scales, with a BF16 head."""
    if weight_bits >= 16:
        return WeightFormat("bf16", head_bits=weight_bits)
    if weight_bits == 8:
        return WEIGHT_FORMATS["fp8" if act_bits <= 8 else "int8"]
    if weight_bits == 4:
        return WEIGHT_FORMATS["nvfp4" if act_bits <= 4 else "int4-g128"]
    return WeightFormat(f"{weight_bits:g}-bit")


@dataclass(frozen=True)
class Precision:
    """Storage precision of weights, activations and KV cache, in bits.

    `weight_bits` is the width of one quantized weight value; what the checkpoint stores
    beyond it (block scales) and the precision of its embedding and lm_head come from its
    format (`weight_format`, a key of `WEIGHT_FORMATS`; "" picks `default_weight_format`).
    `head_bits` overrides the embedding and lm_head precision, for a checkpoint that did
    quantize its head.
    """

    weight_bits: float = 16
    act_bits: float = 16
    kv_bits: float = 16
    expert_bits: float | None = None  # None: min(stored weight bits, model's shipped ones)
    weight_format: str = ""
    head_bits: float | None = None

    def __post_init__(self) -> None:
        if self.weight_format and self.weight_format not in WEIGHT_FORMATS:
            raise ValueError(
                f"unknown weight format {self.weight_format!r}; "
                f"known: {', '.join(WEIGHT_FORMATS)}"
            )

    @property
    def compute_bits(self) -> int:
        """Low-precision tensor math only when both operands are that narrow (W8A8, W4A4)."""
        return _compute_bits(self.weight_bits, self.act_bits)

    @property
    def format(self) -> WeightFormat:
        """The weights' storage format (named, or the default for their bits)."""
        if self.weight_format:
            return WEIGHT_FORMATS[self.weight_format]
        return default_weight_format(self.weight_bits, self.act_bits)

    @property
    def stored_weight_bits(self) -> float:
        """Bits stored and read per quantized weight: the value and its share of the block
        scales (NVFP4 4.5, MXFP4 4.25, INT4 group-128 4.16, FP8 and INT8 8)."""
        return self.weight_bits + self.format.overhead_bits

    @property
    def head_weight_bits(self) -> float:
        """Precision of the token embedding and the lm_head."""
        return self.head_bits if self.head_bits is not None else self.format.head_bits

    @property
    def head_compute_bits(self) -> int:
        """Tensor-math width of the lm_head GEMM (16-bit when the head is BF16)."""
        return _compute_bits(self.head_weight_bits, self.act_bits)

    def expert_bits_for(self, model: ModelSpec) -> float:
        if self.expert_bits is not None:
            return self.expert_bits
        return min(self.stored_weight_bits, model.default_expert_bits)


def _compute_bits(weight_bits: float, act_bits: float) -> int:
    widest = max(weight_bits, act_bits)
    if widest <= 4:
        return 4
    return 8 if widest <= 8 else 16


@dataclass(frozen=True)
class Parallelism:
    """Tensor-, pipeline- and expert-parallel layout of one replica.

    `ep` is 1 (experts sliced across the TP group, each rank holds 1/tp of every expert) or
    equal to `tp` (vLLM's `--enable-expert-parallel`: each rank holds E/tp whole experts,
    attention stays tensor-parallel).
    """

    tp: int = 1
    pp: int = 1
    ep: int = 1

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


@dataclass(frozen=True)
class Term:
    """One kernel of a forward pass: per-layer FLOPs/bytes on one GPU, and its layer count."""

    name: str
    flops: Array | float
    bytes: Array | float
    layers: int = 1
    compute_scale: float = 1.0  # kernel-specific efficiency relative to the profile's
    memory_scale: float = 1.0

    def time(self, cost: StepCost) -> Array | float:
        """Roofline time of one layer's instance of this kernel."""
        return cost._t(self.flops / self.compute_scale, self.bytes / self.memory_scale)


def kernel_time(
    flops: Array | float, nbytes: Array | float, peak: float, bw: float, sharpness: float = 0.0
) -> Array | float:
    """Time of one kernel under the roofline.

    With `sharpness` 0 it is the ideal roofline, max(compute, memory). Real kernels do not
    overlap their loads and math perfectly, least of all near the ridge point, where a GEMM
    is neither clearly bound: `sharpness` k > 0 blends the two as (tc^k + tm^k)^(1/k), which
    equals the max far from the ridge and exceeds it by 2^(1/k) at the ridge.
    """
    tc = np.asarray(flops, dtype=float) / peak if peak > 0 else np.zeros_like(flops, dtype=float)
    tm = np.asarray(nbytes, dtype=float) / bw if bw > 0 else np.zeros_like(nbytes, dtype=float)
    if sharpness <= 0:
        return np.maximum(tc, tm)
    hi = np.maximum(tc, tm)
    safe = np.where(hi > 0, hi, 1.0)
    return hi * ((tc / safe) ** sharpness + (tm / safe) ** sharpness) ** (1.0 / sharpness)


def roofline_time(flops: float, nbytes: float, peak: float, bw: float) -> tuple[float, str]:
    """Ideal roofline time of one kernel and which roof binds it."""
    tc = flops / peak if peak > 0 else 0.0
    tm = nbytes / bw if bw > 0 else 0.0
    return (tc, "compute") if tc >= tm else (tm, "memory")


def nodes_spanned(ranks: int, gpu: GPU) -> int:
    """Nodes that `ranks` GPUs of one group occupy, packed `gpus_per_node` to a node (0: one
    node whatever the count)."""
    per_node = gpu.efficiency.gpus_per_node
    if per_node <= 0 or ranks <= per_node:
        return 1
    return -(-ranks // per_node)


def allreduce_latency(tp: int, gpu: GPU) -> float:
    """Fixed cost of one all-reduce over `tp` ranks: the profile's two-rank latency plus one
    hop latency per further ring step. A ring all-reduce takes 2(n-1) steps, each waiting on
    its neighbour (NCCL's own cost model, `src/graph/tuning.cc`: base latency + 2(n-1) x the
    per-hop latency of the link), so TP8 pays 12 hops more than TP2. A group spanning k nodes
    crosses the network in 2(k-1) of those steps, each at the network's hop latency."""
    if tp <= 1:
        return 0.0
    cal = gpu.efficiency
    net_steps = 2 * (nodes_spanned(tp, gpu) - 1)
    base = cal.collective_latency_s - 2 * cal.collective_hop_s  # the 2(n-1) steps priced apart
    return (
        base + (2 * (tp - 1) - net_steps) * cal.collective_hop_s + net_steps * cal.internode_hop_s
    )


def allreduce_bandwidth(tp: int, gpu: GPU) -> float:
    """Bus bandwidth of an all-reduce over `tp` ranks (bytes/s). Inside a node: one direction
    of the GPU's link at the profile's efficiency. A group spanning nodes runs its rings through
    the network as well, one NIC per GPU (rail-optimised, as DGX/HGX nodes are cabled), so the
    node-to-node traffic shares the NICs of the group's GPUs in one node: the bus bandwidth is
    the smaller of the link's and `min(tp, gpus_per_node) x internode_gbs`."""
    cal = gpu.efficiency
    bw = gpu.interconnect_bw / 2 * cal.comm
    if nodes_spanned(tp, gpu) > 1:
        per_node = min(tp, cal.gpus_per_node)
        bw = min(bw, per_node * cal.internode_gbs * 1e9)
    return bw


def allreduce_time(nbytes: Array | float, tp: int, gpu: GPU) -> Array | float:
    """Ring all-reduce: 2(n-1)/n of the message at the group's bus bandwidth, plus a latency
    that grows with the ring's steps (zero for an empty message or a single rank)."""
    b = np.asarray(nbytes, dtype=float)
    if tp <= 1:
        return np.zeros_like(b) if b.ndim else 0.0
    bw = allreduce_bandwidth(tp, gpu)
    t = np.where(b > 0, 2 * (tp - 1) / tp * b / bw + allreduce_latency(tp, gpu), 0.0)
    return t if t.ndim else float(t)


def p2p_time(nbytes: Array | float, gpu: GPU, internode: bool = False) -> Array | float:
    """Point-to-point activation hand-off between pipeline stages: over the GPU's link, or
    over the network (one NIC, plus the network's hop latency) between stages on two nodes."""
    b = np.asarray(nbytes, dtype=float)
    cal = gpu.efficiency
    if internode:
        bw, lat = cal.internode_gbs * 1e9, cal.p2p_latency_s + cal.internode_hop_s
    else:
        bw, lat = gpu.interconnect_bw / 2 * cal.comm, cal.p2p_latency_s
    t = np.where(b > 0, b / bw + lat, 0.0)
    return t if t.ndim else float(t)


def internode_handoffs(tp: int, pp: int, gpu: GPU) -> int:
    """How many of a replica's `pp - 1` stage boundaries cross a node: stage s holds GPUs
    s*tp .. (s+1)*tp - 1, packed `gpus_per_node` to a node."""
    per_node = gpu.efficiency.gpus_per_node
    if per_node <= 0 or tp * pp <= per_node:
        return 0
    return sum(1 for i in range(1, pp) if (i * tp - 1) // per_node != (i * tp) // per_node)


def _even_split(n: int, parts: int) -> list[int]:
    """`n` items over at most `parts` non-empty groups, as evenly as whole items allow
    (largest first)."""
    k = min(n, parts)
    q, r = divmod(n, k)
    return [q + 1] * r + [q] * (k - r)


def expected_active_experts(tokens: Array | float, experts: int, top_k: int) -> Array:
    """Expected number of distinct experts hit by `tokens` tokens routing uniformly top-k."""
    t = np.asarray(tokens, dtype=float)
    return experts * (1.0 - (1.0 - top_k / experts) ** t)


def busiest_rank_factor(mean: Array | float, var: Array | float, ranks: int) -> Array:
    """Expected load of the busiest of `ranks` equally loaded ranks over the mean load
    (Gaussian approximation of the maximum: mean + sd * sqrt(2 ln ranks))."""
    m = np.asarray(mean, dtype=float)
    if ranks <= 1:
        return np.ones_like(m)
    sd = np.sqrt(np.maximum(np.asarray(var, dtype=float), 0.0))
    return np.where(m > 0, (m + sd * math.sqrt(2 * math.log(ranks))) / np.where(m > 0, m, 1), 1.0)


@dataclass(frozen=True)
class _Linear:
    name: str
    params: float  # weight elements on one GPU, per layer
    out_per_token: float  # output activations per token on one GPU
    in_per_token: float  # input activations per token
    layers: int


def _linears(m: ModelSpec, tp: int) -> list[_Linear]:
    """The dense projections of one GPU of a TP group, with the layers each appears in."""
    L = m.layers
    ops: list[_Linear] = []
    if m.is_mla:
        h, qk = m.heads, m.qk_head_dim
        if m.q_lora_rank:  # q_a is replicated on every rank (vLLM fuses it with kv_a)
            ops.append(_Linear("q_a_proj", m.hidden * m.q_lora_rank, m.q_lora_rank, m.hidden, L))
            ops.append(
                _Linear("q_b_proj", m.q_lora_rank * h * qk / tp, h * qk / tp, m.q_lora_rank, L)
            )
        else:
            ops.append(_Linear("q_proj", m.hidden * h * qk / tp, h * qk / tp, m.hidden, L))
        lat = m.kv_lora_rank + m.qk_rope_head_dim
        ops.append(_Linear("kv_a_proj", m.hidden * lat, lat, m.hidden, L))
        kv_b = m.kv_lora_rank * h * (m.qk_nope_head_dim + m.v_head_dim) / tp
        ops.append(
            _Linear(
                "kv_b_proj", kv_b, h * (m.qk_nope_head_dim + m.v_head_dim) / tp, m.kv_lora_rank, L
            )
        )
        ops.append(
            _Linear("o_proj", h * m.v_head_dim * m.hidden / tp, m.hidden, h * m.v_head_dim / tp, L)
        )
    else:
        qkv_out = (m.heads + 2 * m.kv_heads) * m.head_dim
        ops.append(_Linear("qkv_proj", m.hidden * qkv_out / tp, qkv_out / tp, m.hidden, L))
        ops.append(
            _Linear(
                "o_proj",
                m.heads * m.head_dim * m.hidden / tp,
                m.hidden,
                m.heads * m.head_dim / tp,
                L,
            )
        )
    dense = L - m.moe_layers
    if dense:
        up = m.mlp_matrices - 1  # gate+up (gated) or up alone
        label = "" if not m.is_moe else "(dense layers)"
        ops.append(
            _Linear(
                ("mlp_gate_up" if m.mlp_gated else "mlp_up") + label,
                up * m.hidden * m.intermediate / tp,
                up * m.intermediate / tp,
                m.hidden,
                dense,
            )
        )
        ops.append(
            _Linear(
                "mlp_down" + label,
                m.intermediate * m.hidden / tp,
                m.hidden,
                m.intermediate / tp,
                dense,
            )
        )
    if m.is_moe and m.shared_expert_intermediate:
        s = m.shared_expert_intermediate
        ops.append(
            _Linear(
                "shared_expert",
                m.mlp_matrices * m.hidden * s / tp,
                m.hidden,
                m.hidden,
                m.moe_layers,
            )
        )
    return ops


@dataclass
class StepCost:
    """The replica's roofline cost model: price any engine iteration, or list its operators.

    All times are the latency of one forward pass through the whole replica (all pipeline
    stages in sequence), except `cycle_time`: what the engine charges for one iteration, the
    same as `step_time` without pipeline stages, and with them the pace at which `pp`
    micro-batches in flight let every sequence advance (stages overlap). Construction
    tabulates the per-token operators for every token count up to `max_tokens`
    (O(max_tokens) numpy work); pricing a step is O(1) plus the number of prefill chunks.
    `step_overhead_s` and `tp_overhead_s` override the GPU's calibration profile when given.
    """

    model: ModelSpec
    gpu: GPU
    par: Parallelism = field(default_factory=Parallelism)
    prec: Precision = field(default_factory=Precision)
    step_overhead_s: float | None = None
    tp_overhead_s: float | None = None
    max_tokens: int = 8192

    def __post_init__(self) -> None:
        m, g, tp = self.model, self.gpu, self.par.tp
        cal = g.calibration
        self.calib = cal
        if self.step_overhead_s is None:
            self.step_overhead_s = cal.step_overhead_s
        if self.tp_overhead_s is None:
            self.tp_overhead_s = cal.tp_overhead_s
        self.peak = g.effective_peak(self.prec.compute_bits)
        self.bw = g.mem_bw * cal.memory
        self.sharp = cal.ridge_sharpness
        self.wb = self.prec.stored_weight_bits / 8
        # the embedding and lm_head keep their own precision (BF16 in quantized checkpoints),
        # and the lm_head GEMM runs at that precision's tensor peak
        self.hb = self.prec.head_weight_bits / 8
        self.head_compute_scale = g.effective_peak(self.prec.head_compute_bits) / self.peak
        self.ab = self.prec.act_bits / 8
        # The residual stream between layers stays 16-bit whatever the GEMMs' input precision:
        # FP8/FP4 GEMMs write BF16 outputs, which the TP all-reduce sums and the norms read;
        # activations are quantised only at the next GEMM's input (vLLM, TensorRT-LLM).
        self.sb = max(self.prec.act_bits, 16) / 8
        self.kvb = self.prec.kv_bits / 8
        self.eb = self.prec.expert_bits_for(m) / 8
        self.kv_heads_gpu = math.ceil(m.kv_heads / tp)
        self.heads_gpu = m.heads / tp
        self.full_layers = m.layers - m.sliding_layers
        self.linears = _linears(m, tp)
        self.fixed_overhead = self.step_overhead_s + self.tp_overhead_s * (self.par.gpus - 1)
        self.seq_overhead = cal.seq_overhead_s
        self.layer_overhead = cal.launch_per_layer_s * m.layers
        # further per-layer cost of a pass that carries prompt tokens, for runtimes that launch
        # their context phase kernel by kernel (no CUDA graph): TensorRT-LLM 0.5/0.6's session
        self.context_layer_overhead = cal.context_launch_per_layer_s * m.layers
        self.request_overhead = cal.request_overhead_s
        # host work of step n+1 prepared while the GPU runs step n (see `combine`)
        self.host_overlap = cal.host_overlap > 0
        # Decode attention is one batched kernel whose FLOPs and bytes are both linear in the
        # summed context, so its time is linear too: a slope per context token.
        f_ctx, b_ctx = self._decode_attn_per_token()
        self.attn_slope_per_layer = float(self._t(f_ctx, b_ctx))
        self.attn_slope = self.attn_slope_per_layer * self.full_layers
        self.attn_slope_sliding = self.attn_slope_per_layer * m.sliding_layers
        self.attn_per_seq = m.layers * float(self._t(0.0, self._decode_qo_bytes()))
        self._table_n = self.max_tokens + 1
        self.token_table = self._tokens_time(np.arange(self._table_n, dtype=float))
        # memos of pure functions of a small integer, filled as the engine asks: an engine
        # prices ~10^5 cycles an hour, but from a few thousand distinct batch shapes
        self._head_memo: dict[int, float] = {}
        self._handoff_memo: dict[int, float] = {}
        self._decode_lines_memo: dict[int, tuple[int, float, float, float, float, float]] = {}
        self._decode_mb_memo: dict[int, tuple[float, float, float, float]] = {}
        self._tokens_memo: dict[int, float] = {}
        self._prompt_attn_memo: dict[int, float] = {}
        self._prompt_mb_memo: dict[tuple[int, int], tuple[float, float, float, float]] = {}

    # ---- the one roofline --------------------------------------------------------------
    def _t(self, flops: Array | float, nbytes: Array | float) -> Array | float:
        return kernel_time(flops, nbytes, self.peak, self.bw, self.sharp)

    def _ts(self, flops: float, nbytes: float) -> float:
        """`_t` for plain floats (the engine prices chunks one by one: no numpy overhead)."""
        tc, tm = flops / self.peak, nbytes / self.bw
        if self.sharp <= 0:
            return tc if tc > tm else tm
        hi = max(tc, tm)
        if hi <= 0:
            return 0.0
        k = self.sharp
        return hi * ((tc / hi) ** k + (tm / hi) ** k) ** (1.0 / k)

    def _bound(self, flops: float, nbytes: float) -> str:
        return "compute" if flops / self.peak >= nbytes / self.bw else "memory"

    # ---- terms that scale with the tokens in the step ----------------------------------
    def token_terms(self, t: Array) -> list[Term]:
        """Projections, MoE, norms and the embedding for a step carrying `t` tokens."""
        m, tp, ep = self.model, self.par.tp, self.par.ep
        terms = [
            Term(
                op.name,
                2 * op.params * t,
                op.params * self.wb + (op.in_per_token + op.out_per_token) * t * self.ab,
                op.layers,
            )
            for op in self.linears
        ]
        if m.is_moe:
            router = m.hidden * m.experts
            terms.append(
                Term(
                    "moe_router",
                    2 * router * t,
                    router * self.wb + m.hidden * t * self.ab,
                    m.moe_layers,
                )
            )
            k, e = m.experts_per_token, m.experts
            shard = ep if ep > 1 else tp
            active = expected_active_experts(t, e, k)  # distinct experts over all ranks
            flops = 2 * t * k * m.expert_params / shard
            w_bytes = active * m.expert_params / shard * self.eb
            if ep > 1:  # whole experts per rank: the busiest rank sets the pace
                p = np.minimum(active / e, 1.0)
                local = e / ep
                w_bytes = w_bytes * busiest_rank_factor(local * p, local * p * (1 - p), ep)
                routed = t * k / ep
                flops = flops * busiest_rank_factor(routed, routed * (1 - 1 / ep), ep)
            nbytes = w_bytes + 3 * m.hidden * t * k * self.ab / (ep if ep > 1 else 1)
            label = f"moe_experts(ep={ep})" if ep > 1 else "moe_experts"
            cal = self.calib
            terms.append(Term(label, flops, nbytes, m.moe_layers, cal.moe_compute, cal.moe_memory))
        # two RMSNorms + residual adds per layer: memory-bound elementwise passes
        terms.append(Term("norms+residual", 0.0 * t, 6 * m.hidden * t * self.sb, m.layers))
        terms.append(Term("embedding", 0.0 * t, t * m.hidden * (self.hb + self.ab), 1))
        return terms

    def comm_terms(self, t: Array) -> list[tuple[str, Array, Array]]:
        """(name, bytes moved per GPU, time) of the step's collectives for `t` tokens."""
        m, tp, pp = self.model, self.par.tp, self.par.pp
        msg = t * m.hidden * self.sb
        out = []
        if tp > 1:  # one all-reduce after attention and one after the MLP, per layer
            ar = np.asarray(allreduce_time(msg, tp, self.gpu))
            out.append(
                (f"all_reduce(tp={tp})", 2 * m.layers * 2 * (tp - 1) / tp * msg, 2 * m.layers * ar)
            )
        if pp > 1:
            out.append((f"p2p(pp={pp})", (pp - 1) * msg, np.asarray(self._handoffs(msg))))
        return out

    def _tokens_time(self, t: Array) -> Array:
        total = np.zeros_like(t)
        for term in self.token_terms(t):
            total = total + term.layers * term.time(self)
        for _, _, time in self.comm_terms(t):
            total = total + time
        return total

    def tokens_time(self, tokens: int) -> float:
        """Time of all per-token operators for a step carrying `tokens` tokens."""
        if tokens < self._table_n:
            return float(self.token_table[tokens])
        # beyond the table (a pipeline micro-batch of several chunks): priced once per count
        t = self._tokens_memo.get(tokens)
        if t is None:
            t = self._tokens_memo[tokens] = float(self._tokens_time(np.array([float(tokens)]))[0])
        return t

    # ---- lm_head ----------------------------------------------------------------------
    def head_term(self, sampled: int) -> Term:
        """Final norm + lm_head (vocab-parallel) for the sequences that emit a token, at the
        head's own precision (`Precision.head_weight_bits`: BF16 in quantized checkpoints, so
        its bytes are two per weight and its GEMM runs at the 16-bit peak)."""
        m = self.model
        params = m.vocab * m.hidden / self.par.tp
        return Term(
            "lm_head",
            2 * params * sampled,
            params * self.hb + sampled * (m.hidden + m.vocab / self.par.tp) * self.ab,
            compute_scale=self.head_compute_scale,
        )

    def head_time(self, sampled: int) -> float:
        if sampled <= 0:
            return 0.0
        t = self._head_memo.get(sampled)
        if t is None:
            h = self.head_term(sampled)
            t = self._head_memo[sampled] = self._ts(
                float(h.flops) / h.compute_scale, float(h.bytes) / h.memory_scale
            )
        return t

    # ---- attention --------------------------------------------------------------------
    def _decode_attn_per_token(self) -> tuple[float, float]:
        """Decode attention FLOPs and bytes per cached token, per layer, on one GPU."""
        m = self.model
        if m.is_mla:  # absorbed MLA: every head scores and mixes the shared latent
            lat = m.kv_lora_rank + m.qk_rope_head_dim
            return 2 * self.heads_gpu * (lat + m.kv_lora_rank), lat * self.kvb
        d = m.head_dim
        # a kernel that is not GQA-aware reads the shared K/V head again for every further
        # query head of its group (`decode_kv_per_query_head`: the share of those re-reads
        # that costs as much as the first read)
        extra = self.calib.decode_kv_per_query_head * (self.heads_gpu - self.kv_heads_gpu)
        return 4 * self.heads_gpu * d, 2 * (self.kv_heads_gpu + extra) * d * self.kvb

    def _decode_qo_bytes(self) -> float:
        """Per decoded sequence and layer: read q, write o."""
        m = self.model
        if m.is_mla:
            lat = m.kv_lora_rank + m.qk_rope_head_dim
            return self.heads_gpu * (lat + m.kv_lora_rank) * self.ab
        return 2 * self.heads_gpu * m.head_dim * self.ab

    def prefill_attn_terms(self, chunk: int, prior: int) -> list[Term]:
        """FlashAttention-style causal attention of `chunk` new tokens over `prior` cached ones.

        FLOPs: 2·h·(d_qk + d_v) per (query, key) pair, causal half within the chunk. Bytes: Q
        and O once, the visible KV re-read once per 128-query tile, new KV written. MLA
        prefill runs un-absorbed: the prior context's latents are expanded by kv_b_proj first.
        """
        if chunk <= 0:
            return []
        m = self.model
        if m.is_mla:
            qk, vd = m.qk_head_dim, m.v_head_dim
            kv_tok = (m.kv_lora_rank + m.qk_rope_head_dim) * self.kvb
        else:
            qk = vd = m.head_dim
            kv_tok = 2 * self.kv_heads_gpu * m.head_dim * self.kvb
        terms = []
        for layers, window, label in (
            (self.full_layers, 0, "attention_prefill"),
            (m.sliding_layers, m.sliding_window, "attention_prefill(sliding)"),
        ):
            if layers == 0:
                continue
            keys = prior + (chunk + 1) / 2
            if window:
                keys = min(keys, window)
            flops = 2 * self.heads_gpu * (qk + vd) * chunk * keys
            tiles = math.ceil(chunk / 128)
            visible = min(prior + chunk, window) if window else prior + chunk
            nbytes = (
                chunk * self.heads_gpu * (qk + vd) * self.ab + (tiles * visible + chunk) * kv_tok
            )
            if m.is_mla and prior:
                expand = m.kv_lora_rank * self.heads_gpu * (m.qk_nope_head_dim + vd)
                flops += 2 * expand * prior
                nbytes += prior * self.heads_gpu * (m.qk_nope_head_dim + vd) * self.ab
            terms.append(Term(label, flops, nbytes, layers))
        return terms

    def prefill_attn_time(self, chunk: int, prior: int) -> float:
        if prior == 0:  # a whole prompt in one chunk, the common case: memoised per length
            t = self._prompt_attn_memo.get(chunk)
            if t is None:
                t = self._prompt_attn_memo[chunk] = self._prefill_attn_time(chunk, 0)
            return t
        return self._prefill_attn_time(chunk, prior)

    def _prefill_attn_time(self, chunk: int, prior: int) -> float:
        return sum(
            t.layers * self._ts(float(t.flops), float(t.bytes))
            for t in self.prefill_attn_terms(chunk, prior)
        )

    def decode_attn_time(self, n_seqs: int, ctx_sum: float, sliding_ctx_sum: float) -> float:
        """Batched decode attention over `ctx_sum` cached tokens (full-attention layers)."""
        if n_seqs <= 0:
            return 0.0
        return (
            self.attn_slope * ctx_sum
            + self.attn_slope_sliding * sliding_ctx_sum
            + (self.attn_per_seq * n_seqs)
        )

    # ---- overheads --------------------------------------------------------------------
    def overhead_time(self, seqs: int, has_prefill: bool) -> float:
        """Time that is not in the roofline of any kernel: per iteration (scheduling,
        sampling, growing with the TP ranks the step is broadcast to), per sequence in the
        batch (input preparation, sampling, output processing), and per layer (a dozen
        kernels whose launch and ramp-up/tail cost a few microseconds each, CUDA graphs or
        not), plus `context_launch_per_layer_s` per layer when the pass carries prompt tokens
        (`launch_time`)."""
        return self.fixed_overhead + self.seq_overhead * seqs + self.launch_time(has_prefill)

    def launch_time(self, has_prefill: bool) -> float:
        """Per-layer launch cost of one forward pass: the profile's per-layer cost, and the
        engine's context-pass cost when the pass carries prompt tokens."""
        if has_prefill:
            return self.layer_overhead + self.context_layer_overhead
        return self.layer_overhead

    def combine(self, gpu: float, host: float) -> float:
        """An iteration's duration from its GPU work and its host work (scheduling, input
        preparation, sampling, output processing). An engine that runs them in turn pays the
        sum; one that prepares the next step while the GPU runs this one (`host_overlap`:
        TensorRT-LLM's and SGLang's overlap schedulers, vLLM's async scheduling) pays the
        longer of the two, so host work only shows once it outgrows the GPU's."""
        if self.host_overlap:
            return gpu if gpu >= host else host
        return gpu + host

    def decode_base(self, b: int) -> float:
        """Constant part of a pure-decode step of `b` sequences (everything but the context),
        host work included as the engine serialises it (an upper line when it overlaps)."""
        return (
            self.tokens_time(b)
            + self.head_time(b)
            + self.overhead_time(b, False)
            + self.attn_per_seq * b
        )

    def decode_gpu_base(self, b: int) -> float:
        """GPU part of `decode_base`: kernels and their launches, no host work."""
        return self.tokens_time(b) + self.head_time(b) + self.layer_overhead + self.attn_per_seq * b

    # ---- pipeline parallelism: micro-batches in flight ---------------------------------
    def host_time(self, seqs: int) -> float:
        """The part of `overhead_time` spent on the host (scheduling, input preparation,
        sampling, output processing): one scheduler process does it for every micro-batch in
        turn. The per-layer launch part runs on the GPUs, stage by stage."""
        return self.fixed_overhead + self.seq_overhead * seqs

    def _handoffs(self, msg: Array | float) -> Array | float:
        """The `pp - 1` hand-offs of a `msg`-byte activation: over the GPUs' link, or the
        network for the boundaries between two nodes (`internode_handoffs`)."""
        pp = self.par.pp
        net = internode_handoffs(self.par.tp, pp, self.gpu)
        intra = (pp - 1 - net) * p2p_time(msg, self.gpu)
        return intra + net * p2p_time(msg, self.gpu, internode=True) if net else intra

    def handoff_time(self, tokens: int) -> float:
        """The `pp - 1` activation hand-offs of one forward pass carrying `tokens` tokens."""
        if self.par.pp <= 1 or tokens <= 0:
            return 0.0
        t = self._handoff_memo.get(tokens)
        if t is None:
            msg = tokens * self.model.hidden * self.sb
            t = self._handoff_memo[tokens] = float(self._handoffs(msg))
        return t

    def _stage_share(self, latency: float, host: float, head: float, handoff: float) -> float:
        """GPU time of the busiest stage for one micro-batch of forward-pass `latency`: the
        layer work (with its per-layer launches) split evenly over `pp` stages, plus the
        lm_head on the last one; the host part and the hand-offs are not stage work."""
        return (latency - host - head - handoff) / self.par.pp + head

    def decode_cycle_lines(self, b: int, sliding_ctx_sum: float = 0.0) -> list[tuple[float, float]]:
        """A pure-decode cycle of `b` sequences as max over lines a + slope * ctx_sum.

        With pp = 1 it is the one line of `step_time` (`decode_base`, `attn_slope`). With
        pp > 1 the batch is split into min(pp, b) micro-batches as even as whole sequences
        allow (the summed context shared in proportion, `micro_batches`); `cycle_time` is the
        largest of the three lines, each linear in the context, so a run of decode cycles
        stays an arithmetic series while the same line binds (the engine's macro-steps):

        * the biggest micro-batch's latency through every stage (hand-offs included): a
          sequence cannot emit its next token before its last one has come out;
        * the busiest stage's work summed over the micro-batches (stage-bound throughput);
        * the host work of all micro-batches, done by one process in turn.
        """
        sw = self.attn_slope_sliding * sliding_ctx_sum
        pp = self.par.pp
        if pp <= 1:
            if self.host_overlap:  # the longer of the GPU's step and the host's
                return [(self.decode_gpu_base(b) + sw, self.attn_slope), (self.host_time(b), 0.0)]
            return [(self.decode_base(b) + sw, self.attn_slope)]
        memo = self._decode_lines_memo.get(b)
        if memo is None:
            memo = self._decode_lines_memo[b] = self._decode_lines_without_context(b)
        big, lat_a, lat_s, stage_a, stage_s, host = memo
        return [(lat_a + sw * big / b, lat_s), (stage_a + sw / pp, stage_s), (host, 0.0)]

    def _decode_lines_without_context(
        self, b: int
    ) -> tuple[int, float, float, float, float, float]:
        """The parts of `decode_cycle_lines` (pp > 1) that depend on `b` alone: the biggest
        micro-batch, the latency line, the stage line and the host time (memoised per `b`;
        the sliding-window term is added per call)."""
        pp = self.par.pp
        sizes = _even_split(b, pp)
        big = sizes[0]
        stage = host = 0.0
        overlap = self.host_overlap
        for n in sizes:
            h = self.head_time(n)
            o = self.host_time(n)
            if overlap:  # the host prepares each micro-batch while the GPUs run another
                stage += self._stage_share(self.decode_gpu_base(n), 0.0, h, self.handoff_time(n))
            else:
                stage += self._stage_share(self.decode_base(n), o, h, self.handoff_time(n))
            host += o
        lat = self.decode_gpu_base(big) if overlap else self.decode_base(big)
        return big, lat, self.attn_slope * big / b, stage, self.attn_slope / pp, host

    def micro_batches(
        self,
        decode_seqs: int,
        decode_ctx_sum: float,
        prefill_chunks: list[tuple[int, int]],
        sampled: int,
        sliding_ctx_sum: float,
    ) -> list[tuple[int, float, list[tuple[int, int]], int, float]]:
        """Split one cycle's work into at most `pp` micro-batches: (decode seqs, their context
        sum, prefill chunks, sampled rows, sliding context sum) each.

        Prefill chunks ride apart from the decodes while there is room (up to `pp - 1`
        micro-batches of chunks, each chunk joining the one with the fewest tokens), so a long
        chunk does not hold back the decodes that cycle around it. Decodes are spread over
        the other micro-batches as evenly as whole sequences allow and carry the context in
        proportion (the engine tracks the batch's summed context, not which sequence rides
        where). Rows sampled beyond the decodes are the prompts that finish, chunk by chunk.
        """
        pp = self.par.pp
        if not prefill_chunks:
            slots = 0
        elif not decode_seqs:
            slots = pp
        else:
            slots = min(len(prefill_chunks), pp - 1)
        sizes = _even_split(decode_seqs, pp - slots) if decode_seqs else []
        out: list[tuple[int, float, list[tuple[int, int]], int, float]] = []
        for n in sizes:
            share = n / decode_seqs
            out.append((n, decode_ctx_sum * share, [], n, sliding_ctx_sum * share))
        parts: list[list[tuple[int, int]]] = [[] for _ in range(slots)]
        load = [0] * slots
        extra = [0] * slots
        left = sampled - decode_seqs
        for c, p in prefill_chunks:
            # the least-loaded micro-batch, the first on a tie (as min over range(slots) with
            # key=load would pick; this runs once per chunk, a thousand times in a profiling
            # step, and a list's own min and index cost a fraction of a key function's calls)
            i = load.index(min(load))
            parts[i].append((c, p))
            load[i] += c
            if left > 0:
                extra[i] += 1
                left -= 1
        out += [(0, 0.0, parts[i], extra[i], 0.0) for i in range(slots) if parts[i]]
        return out

    def cycle_time(
        self,
        decode_seqs: int,
        decode_ctx_sum: float,
        prefill_chunks: list[tuple[int, int]] | None = None,
        sampled: int | None = None,
        sliding_ctx_sum: float | None = None,
    ) -> float:
        """Time for every sequence of an iteration to make one step of progress.

        pp = 1: the iteration is one forward pass, `step_time` exactly. pp > 1 (vLLM keeps
        up to `pp` scheduled batches in flight): the work is split into micro-batches
        (`micro_batches`) that follow one another through the stages, so in steady state a
        cycle lasts as long as the busiest stage's share of all of them (or the host's),
        not the sum of the stages; but never less than a decoding micro-batch's whole
        latency, because a sequence's next token needs its previous one through every stage
        and hand-off. A lone sequence therefore sees the same latency as `step_time`.

        A micro-batch of prefill chunks only gates the cycle when nothing decodes: otherwise
        the decodes go round while it crosses the stages (its stage work still counts), and
        its prompt's first token is reported at the cycle's end, up to its latency minus
        the cycle early (a documented approximation of the engine's one clock per replica).
        """
        if self.par.pp <= 1:
            return self.step_time(
                decode_seqs, decode_ctx_sum, prefill_chunks, sampled, sliding_ctx_sum
            )
        chunks = prefill_chunks or []
        if decode_seqs + sum(c for c, _ in chunks) == 0:
            return 0.0
        sampled, sliding_ctx_sum = self._defaults(
            decode_seqs, decode_ctx_sum, chunks, sampled, sliding_ctx_sum
        )
        if not chunks and sampled == decode_seqs:
            return max(
                a + s * decode_ctx_sum
                for a, s in self.decode_cycle_lines(decode_seqs, sliding_ctx_sum)
            )
        latency = stage = host = 0.0
        for b, ctx, parts, smp, sw in self.micro_batches(
            decode_seqs, decode_ctx_sum, chunks, sampled, sliding_ctx_sum
        ):
            if parts:
                t, o, head, handoff = self._chunk_micro_batch(b, ctx, parts, smp, sw)
                hst = self.host_time(b + len(parts))
            else:  # decodes only: `step_time` with its context-free part memoised
                fixed, o, head, handoff = self._decode_micro_batch(b)
                t = fixed + self.decode_attn_time(b, ctx, sw)
                hst = self.host_time(b)
            if b or not decode_seqs:
                latency = max(latency, t)
            stage += self._stage_share(t, o, head, handoff)
            host += hst
        return max(latency, stage, host)

    def _chunk_micro_batch(
        self, b: int, ctx: float, parts: list[tuple[int, int]], smp: int, sw: float
    ) -> tuple[float, float, float, float]:
        """For a micro-batch with prefill chunks `parts`: its `step_time`, host time, lm_head
        time and hand-offs. A lone whole prompt without decodes (how `micro_batches` places a
        request's prompt beside the decodes, the usual chunk micro-batch) depends on its
        length and sampled rows alone, so it is memoised per (length, sampled): pricing it
        was a third of an arrival step's `cycle_time`."""
        key = (parts[0][0], smp) if not b and len(parts) == 1 and parts[0][1] == 0 else None
        if key is not None:
            memo = self._prompt_mb_memo.get(key)
            if memo is not None:
                return memo
        if self.host_overlap:  # GPU latency alone: the host work overlaps other micro-batches
            memo = (
                self.gpu_time(b, ctx, parts, smp, sw),
                0.0,
                self.head_time(smp),
                self.handoff_time(b + sum(c for c, _ in parts)),
            )
        else:
            memo = (
                self.step_time(b, ctx, parts, smp, sw),
                self.host_time(b + len(parts)),
                self.head_time(smp),
                self.handoff_time(b + sum(c for c, _ in parts)),
            )
        if key is not None:
            self._prompt_mb_memo[key] = memo
        return memo

    def _decode_micro_batch(self, b: int) -> tuple[float, float, float, float]:
        """For a micro-batch of `b` decodes: the part of `step_time(b, ...)` before its
        attention term (summed in the same order, so adding the attention gives the same
        float), its host time, lm_head time and hand-offs. Memoised per `b`."""
        memo = self._decode_mb_memo.get(b)
        if memo is None:
            fixed = self.tokens_time(b) + self.head_time(b)
            if self.host_overlap:  # GPU latency alone (see `_chunk_micro_batch`)
                memo = (fixed + self.layer_overhead, 0.0, self.head_time(b), self.handoff_time(b))
            else:
                fixed += self.overhead_time(b, False)
                memo = (fixed, self.host_time(b), self.head_time(b), self.handoff_time(b))
            self._decode_mb_memo[b] = memo
        return memo

    # ---- one iteration ----------------------------------------------------------------
    def _defaults(
        self,
        decode_seqs: int,
        decode_ctx_sum: float,
        chunks: list[tuple[int, int]],
        sampled: int | None,
        sliding_ctx_sum: float | None,
    ) -> tuple[int, float]:
        if sampled is None:
            sampled = decode_seqs + len(chunks)
        if sliding_ctx_sum is None:
            w = self.model.sliding_window
            sliding_ctx_sum = min(decode_ctx_sum, decode_seqs * w) if w else 0.0
        return sampled, sliding_ctx_sum

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
        sampled, sliding_ctx_sum = self._defaults(
            decode_seqs, decode_ctx_sum, chunks, sampled, sliding_ctx_sum
        )
        if self.host_overlap:
            gpu = self.gpu_time(decode_seqs, decode_ctx_sum, chunks, sampled, sliding_ctx_sum)
            return self.combine(gpu, self.host_time(decode_seqs + len(chunks)))
        t = self.tokens_time(tokens) + self.head_time(sampled)
        t += self.overhead_time(decode_seqs + len(chunks), bool(chunks))
        t += self.decode_attn_time(decode_seqs, decode_ctx_sum, sliding_ctx_sum)
        for c, p in chunks:
            t += self.prefill_attn_time(c, p)
        return t

    def gpu_time(
        self,
        decode_seqs: int,
        decode_ctx_sum: float,
        prefill_chunks: list[tuple[int, int]] | None = None,
        sampled: int | None = None,
        sliding_ctx_sum: float | None = None,
    ) -> float:
        """The GPU's part of `step_time`: kernels and their per-layer launches, no host work."""
        chunks = prefill_chunks or []
        tokens = decode_seqs + sum(c for c, _ in chunks)
        if tokens == 0:
            return 0.0
        sampled, sliding_ctx_sum = self._defaults(
            decode_seqs, decode_ctx_sum, chunks, sampled, sliding_ctx_sum
        )
        t = self.tokens_time(tokens) + self.head_time(sampled) + self.launch_time(bool(chunks))
        t += self.decode_attn_time(decode_seqs, decode_ctx_sum, sliding_ctx_sum)
        for c, p in chunks:
            t += self.prefill_attn_time(c, p)
        return t

    def step_ops(
        self,
        decode_seqs: int,
        decode_ctx_sum: float,
        prefill_chunks: list[tuple[int, int]] | None = None,
        sampled: int | None = None,
        sliding_ctx_sum: float | None = None,
    ) -> list[Op]:
        """The same iteration as `step_time`, operator by operator (one GPU's FLOPs/bytes;
        times are replica latency). Its times sum to `step_time`."""
        chunks = prefill_chunks or []
        tokens = decode_seqs + sum(c for c, _ in chunks)
        if tokens == 0:
            return []
        sampled, sliding_ctx_sum = self._defaults(
            decode_seqs, decode_ctx_sum, chunks, sampled, sliding_ctx_sum
        )
        ops: list[Op] = []

        def add(term: Term) -> None:
            f, b = float(term.flops), float(term.bytes)
            ops.append(
                Op(
                    term.name,
                    f * term.layers,
                    b * term.layers,
                    float(term.time(self)) * term.layers,
                    self._bound(f / term.compute_scale, b / term.memory_scale),
                )
            )

        t = np.array(float(tokens))
        for term in self.token_terms(t):
            add(term)
        if sampled > 0:
            add(self.head_term(sampled))
        merged: dict[str, list[float]] = {}
        for c, p in chunks:
            for term in self.prefill_attn_terms(c, p):
                f, b = float(term.flops) * term.layers, float(term.bytes) * term.layers
                acc = merged.setdefault(term.name, [0.0, 0.0, 0.0])
                acc[0] += f
                acc[1] += b
                acc[2] += float(self._t(term.flops, term.bytes)) * term.layers
        for name, (f, b, tt) in merged.items():
            ops.append(Op(name, f, b, tt, self._bound(f, b)))
        if decode_seqs:
            f_ctx, b_ctx = self._decode_attn_per_token()
            full, sw = (
                decode_ctx_sum * self.full_layers,
                sliding_ctx_sum * self.model.sliding_layers,
            )
            qo = self._decode_qo_bytes() * decode_seqs * self.model.layers
            f = f_ctx * (full + sw)
            b = b_ctx * (full + sw) + qo
            tt = self.decode_attn_time(decode_seqs, decode_ctx_sum, sliding_ctx_sum)
            ops.append(Op("attention_decode", f, b, tt, self._bound(f, b)))
        for name, nbytes, time in self.comm_terms(t):
            ops.append(Op(name, 0.0, float(nbytes), float(time), "comm"))
        if self.host_overlap:  # launches on the GPU; host work only where it outlasts the GPU
            launches = self.launch_time(bool(chunks))
            ops.append(Op("kernel_launches", 0.0, 0.0, launches, "overhead"))
            gpu = sum(o.time_s for o in ops)
            host = self.host_time(decode_seqs + len(chunks))
            ops.append(Op("host_not_overlapped", 0.0, 0.0, max(0.0, host - gpu), "overhead"))
        else:
            ops.append(
                Op(
                    "engine_overhead",
                    0.0,
                    0.0,
                    self.overhead_time(decode_seqs + len(chunks), bool(chunks)),
                    "overhead",
                )
            )
        if self.par.pp > 1:  # per-GPU work: a stage holds 1/pp of the layers
            pp = self.par.pp
            ops = [Op(o.name, o.flops / pp, o.bytes / pp, o.time_s, o.bound) for o in ops]
        return ops


def operator_breakdown(
    model: ModelSpec,
    gpu: GPU,
    par: Parallelism,
    prec: Precision,
    batch: int,
    new_tokens: int,
    context: int,
    step_overhead_s: float | None = None,
    tp_overhead_s: float | None = None,
) -> list[Op]:
    """Per-operator cost of ONE forward pass where each of `batch` sequences adds `new_tokens`
    tokens on top of `context` cached ones (prefill: context=0; decode: new_tokens=1).

    Times are the replica latency (pipeline stages in sequence), FLOPs/bytes per GPU. This is
    `StepCost.step_ops` for that iteration, so it sums to `StepCost.step_time`.
    """
    cost = StepCost(model, gpu, par, prec, step_overhead_s, tp_overhead_s, max_tokens=1)
    if new_tokens == 1 and context > 0:
        return cost.step_ops(batch, float(batch * (context + 1)))
    return cost.step_ops(0, 0.0, [(new_tokens, context)] * batch, sampled=batch)

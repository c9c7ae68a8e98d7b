"""Hardware catalog: datasheet peaks plus the calibration profile each device runs with.

The roofline never reads a bare constant: every peak comes from `otela/hardware/catalog.toml`
(with its datasheet citation), and every derating or overhead comes from the device's
calibration profile in the same file — a class default (`[profile.<class>]`) that a device
may override field by field (`[gpu.<key>.calibration]`). A reviewer can see, and the CLI
can change (`otela sim ... --calib key=value`), every number that shapes a prediction.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields, replace
from functools import cache
from pathlib import Path
from typing import Any

CATALOG = Path(__file__).with_name("catalog.toml")
GIB = 1024**3


@dataclass(frozen=True)
class Calibration:
    """What real kernels and engines achieve on one device, beyond its datasheet.

    Efficiencies are fractions of datasheet peaks; overheads are seconds; reserves GiB.
    Every field is documented in otela/hardware/catalog.toml and docs/simulator.md, where the
    public measurement that sets it is cited.
    """

    name: str
    compute: float  # 16-bit tensor math, fraction of dense peak
    memory: float  # streaming reads, fraction of DRAM peak
    comm: float  # all-reduce bus bandwidth, fraction of one link direction
    collective_latency_s: float  # fixed cost of one small all-reduce over two ranks
    p2p_latency_s: float
    compute_fp8: float = 0.0  # 8-bit math; 0 = same as `compute`
    compute_fp4: float = 0.0  # 4-bit math (Blackwell); 0 = same as `compute_fp8`
    ridge_sharpness: float = 0.0  # 0 = hard max(compute, memory); k = (tc^k + tm^k)^(1/k)
    step_overhead_s: float = 1.0e-3  # per engine iteration: scheduling, sampling, launch
    seq_overhead_s: float = 0.0  # per sequence in an iteration (input prep, sampling, output)
    tp_overhead_s: float = 0.0  # per extra tensor-parallel rank, per iteration
    # latency of each further ring step of an all-reduce over more than two ranks (a ring
    # all-reduce over n ranks takes 2(n-1) steps; NCCL's tuning model charges each its link's
    # per-hop latency): collective_latency_s + 2(n-2) x this
    collective_hop_s: float = 0.0
    # A TP or PP group larger than a node spans nodes joined by a network (InfiniBand / RoCE):
    # GPUs per node, the network bandwidth one GPU reaches (GB/s, one direction: one 400 Gb/s
    # NIC per GPU at ~90 %), and the latency of each ring step or hand-off that crosses it
    # (NCCL's `hwLat` for the network, LL128: 4 us).
    gpus_per_node: int = 8
    internode_gbs: float = 45.0
    internode_hop_s: float = 4.0e-6
    launch_per_layer_s: float = 0.0  # per layer per forward pass: kernel launch + ramp/tail
    # per layer of a pass that carries prompt tokens, on top of launch_per_layer_s: a runtime
    # that launches its context phase kernel by kernel (TensorRT-LLM 0.5/0.6 session runtime)
    context_launch_per_layer_s: float = 0.0
    request_overhead_s: float = 0.0  # per request: API, tokenizer, first-chunk output
    runtime_reserve_gib: float = 1.5  # per GPU: CUDA context, CUDA graphs, allocator slack
    tp_reserve_gib: float = 0.0  # per GPU when TP > 1: NCCL / custom all-reduce buffers
    max_batched_tokens: int = 8192  # engine default token budget on this device (vLLM V1)
    max_num_seqs: int = 256  # engine default concurrent sequences on this device
    moe_compute: float = 1.0  # routed-expert grouped GEMMs, relative to dense `compute`
    moe_memory: float = 1.0  # routed-expert weight streaming, relative to dense `memory`
    # 1 = the engine prepares step n+1 on the host while the GPU runs step n (TensorRT-LLM's
    # overlap scheduler, SGLang's, vLLM's async scheduling): an iteration lasts the longer of
    # its GPU work and its host work instead of their sum. 0 = host and GPU in turn.
    host_overlap: float = 0.0
    # 1 = the decode attention kernel reads each cached K/V head once per *query* head that
    # shares it (TensorRT-LLM's masked multi-head attention before its GQA-aware XQA kernel,
    # v0.5-0.7): GQA saves KV memory but not KV reads. 0 = once per KV head (FlashAttention,
    # FlashInfer, XQA: every current engine).
    decode_kv_per_query_head: float = 0.0

    def compute_for(self, bits: int) -> float:
        """Compute efficiency for the math precision actually used."""
        if bits <= 4 and self.compute_fp4 > 0:
            return self.compute_fp4
        if bits <= 8 and self.compute_fp8 > 0:
            return self.compute_fp8
        return self.compute

    def changed(self, **changes: Any) -> Calibration:
        """Copy with some fields replaced (names checked, values cast to the field type)."""
        known = {f.name: f for f in fields(self)}
        cast: dict[str, Any] = {}
        for key, value in changes.items():
            if key not in known or key == "name":
                raise KeyError(f"unknown calibration field {key!r}; known: {', '.join(known)}")
            cast[key] = int(value) if known[key].type == "int" else float(value)
        return replace(self, **cast)


# Older name: the efficiency class was the whole calibration before overheads moved here.
Efficiency = Calibration


@dataclass(frozen=True)
class GPU:
    """One accelerator: dense peaks, memory, interconnect and price (SI units inside)."""

    key: str
    name: str
    fp16_flops: float
    fp8_flops: float
    int8_ops: float
    mem_bytes: float  # datasheet capacity (GB = 1e9 bytes)
    mem_bw: float
    interconnect_bw: float
    cost_per_hour: float
    efficiency: Calibration
    source: str
    aliases: tuple[str, ...] = ()
    fp4_flops: float = 0.0
    usable_bytes: float = 0.0  # capacity the CUDA/ROCm runtime reports (what engines size from)

    @property
    def calibration(self) -> Calibration:
        return self.efficiency

    @property
    def runtime_bytes(self) -> float:
        """Total memory the runtime reports (torch.cuda.mem_get_info), not the datasheet GB."""
        return self.usable_bytes or self.mem_bytes

    def peak_flops(self, compute_bits: int) -> float:
        """Dense peak for the math precision actually used (falls back to wider math)."""
        if compute_bits <= 4 and self.fp4_flops > 0:
            return self.fp4_flops
        if compute_bits <= 8:
            eight = self.fp8_flops or self.int8_ops
            if eight > 0:
                return eight
        return self.fp16_flops

    def effective_peak(self, compute_bits: int) -> float:
        """Achievable FLOP/s: the datasheet peak derated for that precision."""
        if compute_bits <= 4 and self.fp4_flops > 0:
            bits = 4
        elif compute_bits <= 8 and (self.fp8_flops or self.int8_ops):
            bits = 8
        else:
            bits = 16
        return self.peak_flops(compute_bits) * self.efficiency.compute_for(bits)

    def with_efficiency(self, **changes: Any) -> GPU:
        """Copy with some calibration fields overridden (sensitivity studies, CLI --calib)."""
        return replace(self, efficiency=self.efficiency.changed(**changes))

    with_calibration = with_efficiency


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def _calibration(name: str, raw: dict[str, Any]) -> Calibration:
    base = Calibration(
        name=name,
        compute=float(raw["compute"]),
        memory=float(raw["memory"]),
        comm=float(raw["comm"]),
        collective_latency_s=float(raw["collective_latency_s"]),
        p2p_latency_s=float(raw["p2p_latency_s"]),
    )
    rest = {k: v for k, v in raw.items() if k not in {f.name for f in fields(base)[:6]}}
    return base.changed(**rest) if rest else base


@cache
def _load(path: Path = CATALOG) -> dict[str, GPU]:
    with path.open("rb") as fh:
        raw = tomllib.load(fh)
    classes = {name: _calibration(name, body) for name, body in raw["profile"].items()}
    gpus: dict[str, GPU] = {}
    for key, g in raw["gpu"].items():
        calib = classes[g["class"]]
        if g.get("calibration"):
            calib = replace(calib.changed(**g["calibration"]), name=f"{calib.name}/{key}")
        gpus[key] = GPU(
            key=key,
            name=g["name"],
            fp16_flops=float(g["fp16_tflops"]) * 1e12,
            fp8_flops=float(g["fp8_tflops"]) * 1e12,
            int8_ops=float(g["int8_tops"]) * 1e12,
            fp4_flops=float(g.get("fp4_tflops", 0.0)) * 1e12,
            mem_bytes=float(g["mem_gb"]) * 1e9,
            usable_bytes=float(g.get("runtime_gib", 0.0)) * GIB,
            mem_bw=float(g["mem_bw_gbs"]) * 1e9,
            interconnect_bw=float(g["interconnect_gbs"]) * 1e9,
            cost_per_hour=float(g["cost_per_hour"]),
            efficiency=calib,
            source=g["source"],
            aliases=tuple(g.get("aliases", ())),
        )
    return gpus


def list_gpus() -> list[GPU]:
    """All catalog devices in file order."""
    return list(_load().values())


def get_gpu(name: str) -> GPU:
    """Look a device up by key or alias, case-insensitively; raise KeyError listing choices."""
    gpus = _load()
    wanted = _norm(name)
    for gpu in gpus.values():
        if wanted == _norm(gpu.key) or wanted in {_norm(a) for a in gpu.aliases}:
            return gpu
    raise KeyError(f"unknown GPU {name!r}; known: {', '.join(sorted(gpus))}")


def parse_calibration(items: list[str] | tuple[str, ...]) -> dict[str, float]:
    """`["step_overhead_s=0.002", "memory=0.8"]` -> dict, with clear errors for bad input."""
    out: dict[str, float] = {}
    known = {f.name for f in fields(Calibration)} - {"name"}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in known:
            raise ValueError(
                f"bad calibration override {item!r}: use FIELD=VALUE with FIELD one of "
                + ", ".join(sorted(known))
            )
        try:
            out[key] = float(value)
        except ValueError as e:
            raise ValueError(f"bad calibration override {item!r}: {value!r} is not a number") from e
    return out

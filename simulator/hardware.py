"""GPU catalog: datasheet peaks plus the explicit efficiency class each GPU belongs to.

The roofline never reads a bare constant: every peak comes from `catalog/hardware.toml`
(with its datasheet citation) and every derating from the GPU's efficiency class in the same
file, so a reviewer can see, and change, every number that shapes a prediction.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

CATALOG = Path(__file__).with_name("catalog") / "hardware.toml"


@dataclass(frozen=True)
class Efficiency:
    """Fraction of datasheet peaks that real kernels reach on one hardware class."""

    name: str
    compute: float
    memory: float
    comm: float
    collective_latency_s: float
    p2p_latency_s: float


@dataclass(frozen=True)
class GPU:
    """One accelerator: dense peaks, memory, interconnect and price (SI units inside)."""

    key: str
    name: str
    fp16_flops: float
    fp8_flops: float
    int8_ops: float
    mem_bytes: float
    mem_bw: float
    interconnect_bw: float
    cost_per_hour: float
    efficiency: Efficiency
    source: str
    aliases: tuple[str, ...] = ()

    def peak_flops(self, compute_bits: int) -> float:
        """Dense peak for the math precision actually used (8-bit falls back to 16-bit)."""
        if compute_bits <= 8:
            eight = self.fp8_flops or self.int8_ops
            if eight > 0:
                return eight
        return self.fp16_flops

    def with_efficiency(self, **changes: float) -> GPU:
        """Copy with some efficiency factors overridden (for sensitivity studies)."""
        eff = replace(self.efficiency, **changes)  # type: ignore[arg-type]
        return replace(self, efficiency=eff)


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


@cache
def _load(path: Path = CATALOG) -> dict[str, GPU]:
    with path.open("rb") as fh:
        raw = tomllib.load(fh)
    classes = {
        name: Efficiency(name=name, **{k: float(v) for k, v in fields.items()})
        for name, fields in raw["efficiency"].items()
    }
    gpus: dict[str, GPU] = {}
    for key, g in raw["gpu"].items():
        gpus[key] = GPU(
            key=key,
            name=g["name"],
            fp16_flops=float(g["fp16_tflops"]) * 1e12,
            fp8_flops=float(g["fp8_tflops"]) * 1e12,
            int8_ops=float(g["int8_tops"]) * 1e12,
            mem_bytes=float(g["mem_gb"]) * 1e9,
            mem_bw=float(g["mem_bw_gbs"]) * 1e9,
            interconnect_bw=float(g["interconnect_gbs"]) * 1e9,
            cost_per_hour=float(g["cost_per_hour"]),
            efficiency=classes[g["class"]],
            source=g["source"],
            aliases=tuple(g.get("aliases", ())),
        )
    return gpus


def list_gpus() -> list[GPU]:
    """All catalog GPUs in file order."""
    return list(_load().values())


def get_gpu(name: str) -> GPU:
    """Look a GPU up by key or alias, case-insensitively; raise KeyError listing choices."""
    gpus = _load()
    wanted = _norm(name)
    for gpu in gpus.values():
        if wanted == _norm(gpu.key) or wanted in {_norm(a) for a in gpu.aliases}:
            return gpu
    raise KeyError(f"unknown GPU {name!r}; known: {', '.join(sorted(gpus))}")

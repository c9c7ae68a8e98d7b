"""Discover the hardware summary a node advertises: GPUs if any, else CPU and memory.

GPUs come from ``nvidia-smi`` or ``rocm-smi``; CPU cores from the process's affinity
(a Slurm job sees only its allocated cores) and memory from ``/proc/meminfo``. Each part
can be overridden in the configuration (``[hardware]``), for nodes whose tools lie or are
absent, and for tests.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

from otela.registry.records import GPU, Hardware

GB = 1_000_000_000
_GPU_SPEC = re.compile(r"^(?:(\d+)\s*x\s*)?(.+?):\s*(\d+(?:\.\d+)?)$")


def discover(
    cpus: int | None = None, memory_gb: float | None = None, gpus: str | None = None
) -> Hardware:
    """This machine's hardware, with any overrides applied."""
    return Hardware(
        cpus=cpus if cpus is not None else _cpu_count(),
        memory_bytes=int(memory_gb * GB) if memory_gb is not None else _memory_bytes(),
        gpus=parse_gpu_spec(gpus) if gpus is not None else _nvidia_gpus() or _rocm_gpus(),
    )


def parse_gpu_spec(spec: str) -> tuple[GPU, ...]:
    """``"4xA100-SXM4:80, L40S:48"`` -> GPUs (memory in GB); ValueError if malformed."""
    out: list[GPU] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        match = _GPU_SPEC.match(part)
        if not match:
            raise ValueError(f"bad GPU spec {part!r}: expected [COUNTx]NAME:MEMORY_GB")
        count, name, memory = match.groups()
        out += [GPU(name=name.strip(), memory_bytes=int(float(memory) * GB))] * int(count or 1)
    return tuple(out)


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 0


def _memory_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _run(argv: list[str]) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def _nvidia_gpus() -> tuple[GPU, ...]:
    out = _run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"])
    return tuple(parse_nvidia_smi(out)) if out else ()


def _rocm_gpus() -> tuple[GPU, ...]:
    out = _run(["rocm-smi", "--showproductname", "--showmeminfo", "vram", "--json"])
    return tuple(parse_rocm_smi(out)) if out else ()


def parse_nvidia_smi(csv_text: str) -> list[GPU]:
    """Parse ``name, memory MiB`` lines as printed by ``nvidia-smi --format=csv``."""
    gpus = []
    for line in csv_text.strip().splitlines():
        name, _, mem = line.rpartition(",")
        if name and mem.strip().isdigit():
            gpus.append(GPU(name=name.strip(), memory_bytes=int(mem.strip()) * 1024 * 1024))
    return gpus


def parse_rocm_smi(json_text: str) -> list[GPU]:
    """Parse ``rocm-smi --showproductname --showmeminfo vram --json`` (one entry per card)."""
    try:
        data = json.loads(json_text)
    except ValueError:
        return []
    gpus = []
    for card, info in sorted(data.items()) if isinstance(data, dict) else []:
        if not (card.startswith("card") and isinstance(info, dict)):
            continue
        name = info.get("Card Series") or info.get("Card series") or info.get("Card SKU") or card
        total = info.get("VRAM Total Memory (B)", "0")
        memory = int(total) if str(total).isdigit() else 0
        gpus.append(GPU(name=str(name), memory_bytes=memory))
    return gpus

"""Discover the hardware summary a node advertises: GPUs if any, else CPU and memory."""

from __future__ import annotations

import os
import shutil
import subprocess

from otela.registry.records import GPU, Hardware


def discover() -> Hardware:
    return Hardware(cpus=os.cpu_count() or 0, memory_bytes=_memory_bytes(), gpus=_nvidia_gpus())


def _memory_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _nvidia_gpus() -> tuple[GPU, ...]:
    if shutil.which("nvidia-smi") is None:
        return ()
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(parse_nvidia_smi(out))


def parse_nvidia_smi(csv_text: str) -> list[GPU]:
    """Parse ``name, memory MiB`` lines as printed by ``nvidia-smi --format=csv``."""
    gpus = []
    for line in csv_text.strip().splitlines():
        name, _, mem = line.rpartition(",")
        if name and mem.strip().isdigit():
            gpus.append(GPU(name=name.strip(), memory_bytes=int(mem.strip()) * 1024 * 1024))
    return gpus

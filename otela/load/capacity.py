"""A node's capacity weight from the GPUs it reports, via the simulator's hardware catalog.

GPU names come from ``nvidia-smi``/``rocm-smi`` ("NVIDIA H100 80GB HBM3", "NVIDIA
A100-SXM4-80GB"); the catalog knows devices by keys and aliases ("h100", "a100-80gb").
The longest catalog name contained in the reported one wins, so "gh200" beats "h20" and
"a100" beats "a10". Unknown devices count as one unit.
"""

from __future__ import annotations

import functools
import re

from otela.registry.records import Hardware
from otela.routing.load import capacity_of_gpus

_UNKNOWN_GBS = 2000.0  # one capacity unit


def _plain(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


@functools.cache
def _catalog() -> tuple[tuple[str, float], ...]:
    from otela.hardware.catalog import list_gpus

    labels = []
    for gpu in list_gpus():
        if gpu.key == "cpu" or "cpu" in gpu.aliases:
            continue
        for label in (gpu.key, *gpu.aliases):
            plain = _plain(label)
            if len(plain) >= 2:
                labels.append((plain, gpu.mem_bw / 1e9))
    labels.sort(key=lambda item: len(item[0]), reverse=True)
    return tuple(labels)


@functools.cache
def bandwidth_gbs(name: str) -> float:
    """Memory bandwidth (GB/s) of the GPU called ``name``, or one unit's if unknown."""
    plain = _plain(name)
    for label, gbs in _catalog():
        if label in plain:
            return gbs
    return _UNKNOWN_GBS


def capacity_of(hardware: Hardware) -> float:
    return capacity_of_gpus([bandwidth_gbs(g.name) for g in hardware.gpus])

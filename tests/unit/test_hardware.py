"""Hardware discovery parsers and overrides."""

from __future__ import annotations

import json

import pytest

from otela.hardware import GB, discover, parse_gpu_spec, parse_nvidia_smi, parse_rocm_smi
from otela.registry.records import GPU


def test_gpu_spec():
    assert parse_gpu_spec("2xA100-SXM4:80, L40S:48") == (
        GPU("A100-SXM4", 80 * GB), GPU("A100-SXM4", 80 * GB), GPU("L40S", 48 * GB))
    with pytest.raises(ValueError, match="bad GPU spec"):
        parse_gpu_spec("A100")


def test_overrides_replace_discovery():
    hw = discover(cpus=64, memory_gb=512, gpus="4xH100:80")
    assert (hw.cpus, hw.memory_bytes, len(hw.gpus)) == (64, 512 * GB, 4)


def test_vendor_tools_output():
    assert parse_nvidia_smi("NVIDIA H100 80GB HBM3, 81559\n") == [
        GPU("NVIDIA H100 80GB HBM3", 81559 * 1024 * 1024)]
    rocm = {"card0": {"Card Series": "AMD Instinct MI250X", "VRAM Total Memory (B)": "68702699520"},
            "system": {"x": 1}}
    assert parse_rocm_smi(json.dumps(rocm)) == [GPU("AMD Instinct MI250X", 68702699520)]
    assert parse_rocm_smi("not json") == []

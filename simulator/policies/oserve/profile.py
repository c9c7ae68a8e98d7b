"""OSERVE Appendix D, one-time profiling: each replica shape's throughput on each request type.

The paper profiles layers on the GPUs and composes them; otela asks its own simulator, which
prices the same prefill/decode/communication terms: n_kj is the saturated throughput
(requests/s) of one replica of shape k serving only type j, with as many requests in flight
as its KV cache holds (`simulator.api.max_throughput`). Results are memoised per process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache

import numpy as np

from simulator.api import Deployment, max_throughput
from simulator.models import ModelSpec, get_model
from simulator.policies.interfaces import Shape


def candidate_shapes(
    model: str | ModelSpec, gpu: str, max_gpus: int, pipeline: bool = True
) -> list[Shape]:
    """Shapes whose weights fit: TP in powers of two dividing the heads, PP in {1, 2, 4},
    at most `max_gpus` (one host) GPUs."""
    spec = model if isinstance(model, ModelSpec) else get_model(model)
    out = []
    for pp in (1, 2, 4) if pipeline else (1,):
        for tp in (1, 2, 4, 8):
            if tp * pp > max_gpus or spec.heads % tp or spec.layers < pp:
                continue
            dep = Deployment(spec, gpu, tp=tp, pp=pp)
            if dep.memory().fits:
                out.append(Shape(gpu, tp, pp))
    return out


@lru_cache(maxsize=4096)
def _capacity(
    model: str | ModelSpec, shape: Shape, input_len: int, output_len: int,
    calibration: tuple[tuple[str, float], ...],
) -> float:
    dep = Deployment(model, shape.gpu, tp=shape.tp, pp=shape.pp, calibration=calibration)
    plan = dep.memory()
    if not plan.fits or input_len + output_len > plan.max_context:
        return 0.0
    return float(max_throughput(dep, input_len, output_len)["requests_per_s"])


def capacity_table(
    model: str | ModelSpec,
    shapes: Sequence[Shape],
    lengths: Sequence[tuple[int, int]],
    calibration: Mapping[str, float] | None = None,
) -> dict[Shape, np.ndarray]:
    """n[shape][j]: requests/s of type j (at its centroid lengths) one replica sustains."""
    cal = tuple(sorted((calibration or {}).items()))
    return {
        s: np.array([_capacity(model, s, int(i), int(o), cal) for i, o in lengths])
        for s in shapes
    }

"""A replica's identity: a short hash of everything that defines what it runs.

Two replicas with the same hash are interchangeable, so the controller only counts them;
a replica whose hash differs from the deployment's current one runs something else (an
old command, another GPU shape) and is rolled: replaced by new ones that serve first,
then drained. What only changes how many run (``replicas``, ``min``/``max``, autoscaling)
or where the next one may go (``clusters``, a cluster's account or time limit) is not in
the hash, so changing it scales or steers instead of restarting everything. Pure.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from otela.fleet.spec import Deployment

SPEC_LENGTH = 10


@dataclass(frozen=True)
class Shape:
    """What a replica gets: GPUs per replica and their type (resolved for ``"auto"``)."""

    gpus: int
    gpu_type: str | None = None


def spec_hash(deployment: Deployment, shape: Shape) -> str:
    """The hash of what defines one replica of ``deployment`` with ``shape``."""
    defining = {
        "model": deployment.model,
        "command": deployment.command,
        "gpus": shape.gpus,
        "gpu_type": shape.gpu_type,
        "otela": dict(sorted(deployment.otela.items())),
        "env": dict(sorted(deployment.env.items())),
    }
    text = json.dumps(defining, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:SPEC_LENGTH]

"""What the controller remembers between passes and restarts, in its state directory.

None of it says what runs: that is Slurm's job list and the registry, read afresh on every
pass, so a controller that lost this file submits no duplicate and stops nothing by
mistake. What is here only makes it better informed: the running estimates of queue wait
and engine start per cluster (handover timing), when each job's node was first seen
SERVING (to measure engine start), recent failures (backoff; Slurm forgets finished jobs
after ``MinJobAge``), deployments the operator stopped (``otela fleet stop``), the
autoscaler's state and the load history the forecaster reads.

Directory: ``$OTELA_FLEET_STATE`` or ``$XDG_STATE_HOME/otela/fleet/<fleet name>``
(``~/.local/state/...``).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from otela.fleet.state import Estimate, Failure

MAX_FAILURES_KEPT = 200
MAX_HISTORY = 2 * 1440  # load bins kept per deployment for the forecaster


def state_dir(fleet: str) -> Path:
    explicit = os.environ.get("OTELA_FLEET_STATE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "otela" / "fleet" / fleet


@dataclass
class ScaleState:
    """One autoscaled deployment's controller state (``autoscale.py``)."""

    target: int | None = None
    last_up: float = 0.0
    last_down: float = 0.0
    last_request: float = 0.0  # when a request was last seen (scale to zero)
    recent: list[tuple[float, int]] = field(default_factory=list)  # (time, raw wish)
    requests: float | None = None  # last counter reading, and when
    requests_at: float = 0.0
    rate: float = 0.0
    ttft_sum: float = 0.0  # last first-byte counters read, and when
    ttft_count: float | None = None
    ttft_at: float = 0.0
    ttft: float | None = None
    history: list[float] = field(default_factory=list)  # rate per forecast bin
    bin_start: float = 0.0
    bin_sum: float = 0.0
    bin_samples: int = 0


@dataclass
class Memory:
    estimates: dict[str, Estimate] = field(default_factory=dict)
    serving_since: dict[str, float] = field(default_factory=dict)  # "cluster/job" -> time
    started_seen: dict[str, float] = field(default_factory=dict)  # "cluster/job" -> start
    failures: list[Failure] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    scale: dict[str, ScaleState] = field(default_factory=dict)

    def add_failure(self, failure: Failure) -> bool:
        """Record ``failure`` once (a job's failure is seen on every pass while Slurm
        remembers it); whether it is new."""
        for known in self.failures:
            if failure.job_id and known.job_id == failure.job_id and \
                    known.cluster == failure.cluster:
                return False
        self.failures.append(failure)
        del self.failures[:-MAX_FAILURES_KEPT]
        return True

    def to_dict(self) -> dict[str, Any]:
        return {
            "estimates": {k: asdict(v) for k, v in self.estimates.items()},
            "serving_since": self.serving_since,
            "started_seen": self.started_seen,
            "failures": [asdict(f) for f in self.failures],
            "stopped": self.stopped,
            "scale": {k: {**asdict(v), "history": v.history[-MAX_HISTORY:]}
                      for k, v in self.scale.items()},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Memory:
        scale = {}
        for name, raw in (data.get("scale") or {}).items():
            raw = dict(raw)
            raw["recent"] = [tuple(item) for item in raw.get("recent", [])]
            scale[name] = ScaleState(**raw)
        return cls(
            estimates={k: Estimate(**v) for k, v in (data.get("estimates") or {}).items()},
            serving_since=dict(data.get("serving_since") or {}),
            started_seen=dict(data.get("started_seen") or {}),
            failures=[Failure(**f) for f in data.get("failures") or []],
            stopped=list(data.get("stopped") or []),
            scale=scale,
        )


class MemoryFile:
    """``memory.json`` in the state directory, written atomically."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / "memory.json"

    def load(self) -> Memory:
        try:
            return Memory.from_dict(json.loads(self.path.read_text()))
        except FileNotFoundError:
            return Memory()
        except (ValueError, TypeError, KeyError):
            # A damaged cache costs estimates and history, never correctness.
            return Memory()

    def save(self, memory: Memory) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(memory.to_dict()))
        tmp.replace(self.path)

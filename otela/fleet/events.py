"""Every decision the controller takes, three ways: a JSON line in ``events.jsonl`` (what
``otela fleet status`` shows, and what log shippers read), a log line, and Prometheus
metrics (``otela_fleet_*``: desired and actual replicas, submissions, failures,
handovers, drains, queue wait and engine start per cluster)."""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otela.metrics import Registry

log = logging.getLogger("otela.fleet")

MAX_LOG_BYTES = 8 * 2**20  # events.jsonl is rotated to events.jsonl.1 past this
RECENT = 200


@dataclass(frozen=True)
class Event:
    at: float
    kind: str  # submit, drain, cancel, handover, serving, failed, unreachable, ...
    message: str
    deployment: str = ""
    cluster: str = ""
    job_id: str = ""
    fields: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ts": round(self.at, 3), "kind": self.kind,
                               "message": self.message}
        for key in ("deployment", "cluster", "job_id"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        out.update(self.fields)
        return out


class FleetMetrics:
    """The controller's Prometheus metrics (served by ``otela fleet run --metrics-port``
    and written to ``metrics.prom`` in the state directory after every pass)."""

    def __init__(self) -> None:
        self.registry = Registry()
        r = self.registry
        self.desired = r.gauge("otela_fleet_desired_replicas", "Replicas each deployment "
                               "should have now (fixed, or the autoscaler's target).",
                               ("deployment",))
        self.replicas = r.gauge("otela_fleet_replicas", "Replicas by what they are doing: "
                                "pending, starting, serving, ending.",
                                ("deployment", "status"))
        self.submissions = r.counter("otela_fleet_submissions_total", "Jobs submitted.",
                                     ("deployment", "cluster"))
        self.failures = r.counter("otela_fleet_failures_total", "Replicas that failed "
                                  "(engine exited, never served in time, sbatch refused).",
                                  ("deployment", "cluster"))
        self.handovers = r.counter("otela_fleet_handovers_total", "Replicas drained at the "
                                   "end of their wall time once a successor served.",
                                   ("deployment",))
        self.drains = r.counter("otela_fleet_drains_total", "Replicas asked to drain.",
                                ("deployment",))
        self.cancels = r.counter("otela_fleet_cancels_total", "Jobs cancelled.",
                                 ("deployment",))
        self.queue_wait = r.gauge("otela_fleet_queue_wait_seconds", "Estimated queue wait "
                                  "(sbatch to start) per cluster.", ("cluster",))
        self.engine_start = r.gauge("otela_fleet_engine_start_seconds", "Estimated engine "
                                    "start (job start to SERVING) per cluster.", ("cluster",))
        self.cluster_up = r.gauge("otela_fleet_cluster_up", "1 if the cluster's Slurm "
                                  "answered the last pass.", ("cluster",))
        self.events = r.counter("otela_fleet_events_total", "Decisions and observations, "
                                "by kind.", ("kind",))
        self.passes = r.counter("otela_fleet_passes_total", "Reconcile passes.")


class EventLog:
    def __init__(self, path: Path | None, metrics: FleetMetrics | None = None,
                 echo: bool = True) -> None:
        self.path = path
        self.metrics = metrics
        self.echo = echo
        self.recent: deque[Event] = deque(maxlen=RECENT)

    def emit(self, kind: str, message: str, *, deployment: str = "", cluster: str = "",
             job_id: str = "", at: float | None = None, **fields: Any) -> Event:
        event = Event(time.time() if at is None else at, kind, message, deployment,
                      cluster, job_id, fields)
        self.recent.append(event)
        if self.metrics is not None:
            self.metrics.events.inc(kind)
        if self.echo:
            where = "/".join(p for p in (deployment, cluster, job_id) if p)
            log.info("%s%s: %s", kind, f" [{where}]" if where else "", message)
        if self.path is not None:
            self._write(event)
        return event

    def _write(self, event: Event) -> None:
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            if self.path.stat().st_size > MAX_LOG_BYTES:
                self.path.replace(self.path.with_name(self.path.name + ".1"))
        except FileNotFoundError:
            pass
        with self.path.open("a") as out:
            out.write(json.dumps(event.to_dict()) + "\n")


def read_events(path: Path, limit: int = 20) -> list[dict[str, Any]]:
    """The last ``limit`` events of ``events.jsonl`` (for ``otela fleet status``)."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines[-limit:]:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out

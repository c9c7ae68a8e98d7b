"""What the fleet controller sees and decides, as plain values: the vocabulary of the pure
reconcile core (``reconcile.py``).

Observed state comes from Slurm (jobs, tagged with the fleet, deployment and spec in
their comment) and from the federation's registry (nodes, tagged the same way); desired
state comes from the fleet file and the autoscaler. The core turns both into actions,
which only the controller carries out. Pure.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace


class JobState(enum.Enum):
    """Slurm's job states, as the controller needs them."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    ENDING = "ENDING"  # COMPLETING: on its way out, serves nothing
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"  # FAILED, NODE_FAIL, BOOT_FAIL, OUT_OF_MEMORY, DEADLINE
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    OTHER = "OTHER"

    @classmethod
    def from_slurm(cls, text: str) -> JobState:
        name = text.strip().upper().split()[0] if text.strip() else ""
        if name in ("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
                    "RESV_DEL_HOLD", "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT"):
            return cls.PENDING if name != "SIGNALING" else cls.RUNNING
        if name == "RUNNING":
            return cls.RUNNING
        if name == "COMPLETING":
            return cls.ENDING
        if name in ("COMPLETED",):
            return cls.COMPLETED
        if name in ("FAILED", "NODE_FAIL", "BOOT_FAIL", "OUT_OF_MEMORY", "DEADLINE"):
            return cls.FAILED
        if name in ("CANCELLED", "PREEMPTED", "REVOKED", "SPECIAL_EXIT"):
            return cls.CANCELLED
        if name == "TIMEOUT":
            return cls.TIMEOUT
        return cls.OTHER

    @property
    def active(self) -> bool:
        return self in (JobState.PENDING, JobState.RUNNING)


@dataclass(frozen=True)
class Job:
    """One Slurm job of this fleet (its comment says which deployment and spec)."""

    cluster: str
    job_id: str
    deployment: str
    spec: str
    state: JobState
    submitted_at: float | None = None
    started_at: float | None = None
    ends_at: float | None = None  # the wall time, on the controller's clock
    ended_at: float | None = None  # when it ended (finished jobs Slurm still lists)
    reason: str = ""  # why it is pending, as squeue says
    marks: frozenset[str] = frozenset()  # "drain": the controller asked it to drain
    presumed: bool = False  # its cluster did not answer: known only from its node
    partition: str | None = None
    size: int = 1  # replicas it runs (several on a whole-node partition)

    @property
    def key(self) -> tuple[str, str]:
        return (self.cluster, self.job_id)

    @property
    def draining(self) -> bool:
        return "drain" in self.marks

    def label(self) -> str:
        return f"{self.cluster}/{self.job_id}"


@dataclass(frozen=True)
class Node:
    """A registry entry of a node started by one of this fleet's jobs."""

    session_id: str
    cluster: str
    job_id: str
    deployment: str
    spec: str
    state: str  # JOIN, SERVING, DOWN, LEFT
    http_url: str = ""
    models: tuple[str, ...] = ()
    end_time: float | None = None  # the job's wall time, as the node read it from squeue
    version: int = 0

    @property
    def job_key(self) -> tuple[str, str]:
        return (self.cluster, self.job_id)

    @property
    def live(self) -> bool:
        return self.state in ("JOIN", "SERVING")


@dataclass(frozen=True)
class Failure:
    """A replica that failed (``kind="failed"``: its engine exited, or it never served in
    time) or waited too long in a queue (``kind="pending"``): the first backs the
    deployment off, both steer its next replicas to other clusters for a while."""

    deployment: str
    cluster: str
    at: float
    reason: str
    kind: str = "failed"
    job_id: str = ""


@dataclass(frozen=True)
class Estimate:
    """A cluster's running estimate of how long a new replica takes to serve: queue wait
    (sbatch to start) plus engine start (start to SERVING). Mean and mean deviation, each
    smoothed like TCP's round-trip estimator, so one slow start widens the margin at
    once and a run of fast ones narrows it slowly."""

    queue_wait: float = 60.0
    queue_dev: float = 0.0
    engine_start: float = 120.0
    start_dev: float = 0.0
    queue_samples: int = 0
    start_samples: int = 0

    @property
    def lead(self) -> float:
        """Seconds from sbatch to SERVING, with a margin of two deviations each."""
        return (self.queue_wait + 2 * self.queue_dev) + (self.engine_start + 2 * self.start_dev)


ALPHA, BETA = 0.25, 0.25


def observe_queue_wait(estimate: Estimate, seconds: float) -> Estimate:
    if estimate.queue_samples == 0:
        return replace(estimate, queue_wait=seconds, queue_dev=seconds / 2, queue_samples=1)
    return replace(
        estimate,
        queue_dev=(1 - BETA) * estimate.queue_dev + BETA * abs(seconds - estimate.queue_wait),
        queue_wait=(1 - ALPHA) * estimate.queue_wait + ALPHA * seconds,
        queue_samples=estimate.queue_samples + 1)


def observe_engine_start(estimate: Estimate, seconds: float) -> Estimate:
    if estimate.start_samples == 0:
        return replace(estimate, engine_start=seconds, start_dev=seconds / 2, start_samples=1)
    return replace(
        estimate,
        start_dev=(1 - BETA) * estimate.start_dev + BETA * abs(seconds - estimate.engine_start),
        engine_start=(1 - ALPHA) * estimate.engine_start + ALPHA * seconds,
        start_samples=estimate.start_samples + 1)


@dataclass(frozen=True)
class Want:
    """One deployment's desired state, as the core needs it."""

    name: str
    spec: str
    count: int
    clusters: tuple[str, ...]  # allowed, in order of preference
    pack: Mapping[str, int] = field(default_factory=dict)  # replicas per job, by cluster


@dataclass(frozen=True)
class ClusterPolicy:
    drain_margin: float = 120.0  # the node drains itself this long before its wall time
    pending_limit: float = 600.0
    serve_deadline: float = 900.0


@dataclass(frozen=True)
class Policy:
    """Fleet-wide knobs of the core (from the fleet file)."""

    clusters: Mapping[str, ClusterPolicy] = field(default_factory=dict)
    backoff: float = 30.0
    max_backoff: float = 600.0
    failure_window: float = 1800.0
    max_failures: int = 2
    handover_slack: float = 30.0
    interval: float = 15.0

    def cluster(self, name: str) -> ClusterPolicy:
        return self.clusters.get(name, ClusterPolicy())


@dataclass(frozen=True)
class Observed:
    now: float
    jobs: tuple[Job, ...] = ()
    nodes: tuple[Node, ...] = ()
    unreachable: frozenset[str] = frozenset()
    failures: tuple[Failure, ...] = ()
    estimates: Mapping[str, Estimate] = field(default_factory=dict)

    def estimate(self, cluster: str) -> Estimate:
        return self.estimates.get(cluster, Estimate())


# -- what the core decides ------------------------------------------------------------

@dataclass(frozen=True)
class Submit:
    deployment: str
    cluster: str
    spec: str
    reason: str
    size: int = 1  # replicas in the job

    kind = "submit"


@dataclass(frozen=True)
class Drain:
    """Ask a serving replica to leave gracefully (``scancel --batch --signal=TERM``: otela
    announces DOWN, finishes what it relays, stops its engine, LEFT)."""

    deployment: str
    cluster: str
    job_id: str
    reason: str

    kind = "drain"


@dataclass(frozen=True)
class Cancel:
    """End a job that serves nothing (pending, or not serving yet). ``failure`` says it
    failed (and why); ``pending_too_long`` that it waited past the cluster's limit."""

    deployment: str
    cluster: str
    job_id: str
    reason: str
    failure: str | None = None
    pending_too_long: bool = False

    kind = "cancel"


@dataclass(frozen=True)
class Note:
    """A decision that is not an action (waiting out a backoff, no cluster reachable, a
    handover under way), for the event log."""

    deployment: str
    what: str
    message: str

    kind = "note"


Action = Submit | Drain | Cancel

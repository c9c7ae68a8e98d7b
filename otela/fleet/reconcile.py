"""The reconcile core: desired state + observed state -> actions. Pure: no I/O, no clock.

For each deployment the replicas it has are sorted into kinds:

- *ending*: drain requested, or the node is DOWN/LEFT (it is on its way out);
- *stale*: another spec (the command or GPU shape changed) or a cluster no longer
  allowed: to be rolled;
- *expiring*: its wall time comes within the cluster's lead time (queue wait + engine
  start + slack) of its drain point: it needs a successor now;
- *current*: the rest (pending, starting, serving).

Then: current replicas are brought to the desired count (submit, or cancel/drain the
surplus: pending first, then starting, then the serving ones with least time left);
stale and expiring replicas that serve are drained only while enough others serve to keep
the desired count, so a roll or a wall-time handover never drops capacity below it (the
old ones drain once the new ones serve, or at their own hard margin). Failures are
replaced with exponential backoff and steered to other clusters (a replica whose node went
DOWN without a drain counts as failed at once, before Slurm reports its job's end: else
its replacement went out without backoff in the seconds Slurm takes to say FAILED, and a
broken engine was resubmitted at the pass interval); a job pending past the
cluster's limit is cancelled and tried on another cluster; jobs on a cluster that does
not answer are counted from their nodes in the registry and otherwise replaced
elsewhere, never acted on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from otela.fleet.state import (
    Action,
    Cancel,
    Drain,
    Failure,
    Job,
    JobState,
    Node,
    Note,
    Observed,
    Policy,
    Submit,
    Want,
)

PENDING, STARTING, SERVING, ENDING = "pending", "starting", "serving", "ending"


@dataclass(frozen=True)
class Replica:
    """A job with what the registry says of its node(s). A job packed with ``size``
    replicas (a whole-node partition) runs that many nodes; it counts as ``size`` replicas
    and serves with as many as ``serving`` says."""

    job: Job
    node: Node | None  # its best node (the only one, unless packed)
    status: str  # PENDING, STARTING, SERVING, ENDING
    serving: int = 0  # its nodes that serve

    @property
    def actionable(self) -> bool:
        return not self.job.presumed

    @property
    def size(self) -> int:
        return self.job.size


@dataclass
class Decision:
    actions: list[Action] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)


def node_index(nodes: Sequence[Node]) -> dict[tuple[str, str], Node]:
    """Each job's node: its newest live session if any (a node evicted by mistake rejoins
    under a new session), else its newest one."""
    best: dict[tuple[str, str], Node] = {}
    for node in nodes:
        current = best.get(node.job_key)
        if current is None or (node.live, node.version) > (current.live, current.version):
            best[node.job_key] = node
    return best


def nodes_by_job(nodes: Sequence[Node]) -> dict[tuple[str, str], list[Node]]:
    out: dict[tuple[str, str], list[Node]] = {}
    for node in nodes:
        out.setdefault(node.job_key, []).append(node)
    return out


def replica_of(job: Job, nodes: Sequence[Node]) -> Replica:
    """What a job is doing, from its nodes' registry entries. A node that went DOWN
    without a drain request means its engine failed: a packed job's script then stops
    the others and the job ends, so the job is ending either way."""
    best = None
    for node in nodes:
        if best is None or (node.live, node.version) > (best.live, best.version):
            best = node
    serving = min(sum(1 for n in nodes if n.state == "SERVING"), job.size)
    if job.draining or any(n.state == "DOWN" for n in nodes) or \
            (best is not None and not best.live):
        return Replica(job, best, ENDING, serving)
    if job.state is JobState.PENDING:
        return Replica(job, best, PENDING)
    return Replica(job, best, SERVING if serving else STARTING, serving)


def reconcile(wants: Sequence[Want], observed: Observed, policy: Policy) -> Decision:
    """What to do now so that each deployment converges to what ``wants`` says. Jobs of
    deployments not in ``wants`` are wound down (a deployment removed from the file)."""
    decision = Decision()
    nodes = nodes_by_job(observed.nodes)
    observed = _with_engine_failures(observed, nodes)
    by_deployment: dict[str, list[Replica]] = {}
    for job in observed.jobs:
        if job.state.active:
            by_deployment.setdefault(job.deployment, []).append(
                replica_of(job, nodes.get(job.key, ())))
    wanted = {w.name for w in wants}
    for want in wants:
        _deployment(want, by_deployment.get(want.name, []), observed, policy, decision)
    for name in sorted(set(by_deployment) - wanted):
        gone = Want(name=name, spec="", count=0, clusters=())
        _deployment(gone, by_deployment[name], observed, policy, decision,
                    why="not in the fleet file")
    return decision


def _with_engine_failures(observed: Observed,
                          nodes: dict[tuple[str, str], list[Node]]) -> Observed:
    """``observed`` with a failure for each job whose node went DOWN though nobody asked it
    to drain (its engine failed; otela then exits and the job ends FAILED), counted now
    rather than once Slurm reports the end (module docstring)."""
    known = {f.job_id for f in observed.failures if f.job_id}
    fresh = tuple(
        Failure(job.deployment, job.cluster, observed.now, "engine failed (node DOWN)",
                "failed", job.job_id)
        for job in observed.jobs
        if job.state in (JobState.RUNNING, JobState.ENDING) and not job.draining
        and job.job_id not in known
        and any(n.state == "DOWN" for n in nodes.get(job.key, ())))
    if not fresh:
        return observed
    return dataclasses.replace(observed, failures=(*observed.failures, *fresh))


def _deployment(want: Want, replicas: list[Replica], observed: Observed, policy: Policy,
                decision: Decision, why: str = "") -> None:
    now = observed.now
    actions, notes = decision.actions, decision.notes
    avoid: set[str] = set()  # clusters given up on in this pass (a job pended too long)
    reasons: list[str] = []  # why replicas are missing, for the submissions' reasons
    current: list[Replica] = []
    retiring: list[tuple[Replica, str]] = []
    usable = [c for c in want.clusters if c not in observed.unreachable]

    for replica in replicas:
        job = replica.job
        if replica.status == ENDING:
            continue
        if job.spec != want.spec or job.cluster not in want.clusters:
            what = why or ("cluster no longer allowed" if job.spec == want.spec
                           else f"spec {job.spec} -> {want.spec}")
            retiring.append((replica, f"roll ({what})"))
            continue
        cluster = policy.cluster(job.cluster)
        if replica.status == STARTING and replica.actionable and job.started_at is not None \
                and now - job.started_at > cluster.serve_deadline:
            actions.append(Cancel(want.name, job.cluster, job.job_id,
                                  f"did not serve within {cluster.serve_deadline:.0f}s of "
                                  "starting", failure="never served"))
            reasons.append(f"replaces {job.label()} (never served)")
            continue
        if replica.status == PENDING and replica.actionable and job.submitted_at is not None \
                and now - job.submitted_at > cluster.pending_limit \
                and any(c != job.cluster for c in usable):
            actions.append(Cancel(want.name, job.cluster, job.job_id,
                                  f"pending for {now - job.submitted_at:.0f}s (limit "
                                  f"{cluster.pending_limit:.0f}s; {job.reason or 'no reason'})"
                                  ": trying another cluster", pending_too_long=True))
            avoid.add(job.cluster)
            reasons.append(f"replaces {job.label()} (pending too long)")
            continue
        ends = _ends(replica)
        if replica.status == SERVING and ends is not None and \
                _expiring(replica, ends, observed, policy):
            retiring.append((replica, "wall time"))
            reasons.append(f"successor of {job.label()} (wall time in {ends - now:.0f}s)")
            continue
        current.append(replica)

    # -- the count (in replicas: a packed job holds several) ---------------------------
    missing = want.count - sum(r.size for r in current)
    if missing > 0:
        for replica, what in retiring:
            if what.startswith("roll"):
                reasons.append(f"replaces {replica.job.label()} ({what})")
        _submit(want, missing, reasons, observed, policy, avoid, decision)
    elif missing < 0:
        for victim in _surplus(current, -missing):
            current.remove(victim)
            actions.append(_remove(want.name, victim, f"scale to {want.count}"))

    # -- retiring replicas: never below the count while they serve -------------------
    serving_current = sum(r.serving for r in current if r.status == SERVING)
    serving_retiring = [(r, what) for r, what in retiring if r.status == SERVING]
    spare = serving_current + sum(r.serving for r, _ in serving_retiring) - want.count
    serving_retiring.sort(key=lambda item: (not item[1].startswith("roll"),
                                            item[0].job.ends_at or float("inf")))
    for replica, what in retiring:
        if replica.status != SERVING and replica.actionable:
            actions.append(_remove(want.name, replica, what))
    for replica, what in serving_retiring:
        if replica.serving > spare or not replica.actionable:
            if replica.actionable:
                notes.append(Note(want.name, "waiting", f"{replica.job.label()} keeps serving "
                                  f"({what}) until a successor serves"))
            continue
        actions.append(Drain(want.name, replica.job.cluster, replica.job.job_id,
                             f"{what}: {serving_current} other replica(s) serve"))
        spare -= replica.serving


def _ends(replica: Replica) -> float | None:
    """When the replica's job hits its wall time: from Slurm, else as its node read it."""
    if replica.job.ends_at is not None:
        return replica.job.ends_at
    return None if replica.node is None else replica.node.end_time


def _expiring(replica: Replica, ends: float, observed: Observed, policy: Policy) -> bool:
    """Whether the serving replica's successor must be submitted now to serve before it
    drains. The lead is capped at half the job's serving life: when queue waits grow
    longer than that, starting successors earlier would replace each replica as soon as
    it serves (and its successor, in turn), so they start at half-life, and capacity dips
    at the hard margin if they are late."""
    job = replica.job
    cluster = policy.cluster(job.cluster)
    lead = observed.estimate(job.cluster).lead + policy.handover_slack + policy.interval
    if job.started_at is not None:
        lead = min(lead, max(0.0, ends - cluster.drain_margin - job.started_at) / 2)
    return observed.now >= ends - cluster.drain_margin - lead


def _surplus(current: list[Replica], count: int) -> list[Replica]:
    """Which jobs to give up when there are ``count`` replicas too many: pending ones
    (newest first), then starting ones (newest first), then serving ones with the least
    wall time left (they would need a successor soonest). Never one that cannot be acted
    on (its cluster does not answer), nor a packed job larger than what is left of the
    surplus (a whole node is kept rather than go below the count)."""
    def order(replica: Replica) -> tuple[int, float]:
        job = replica.job
        if replica.status == PENDING:
            return (0, -(job.submitted_at or 0.0))
        if replica.status == STARTING:
            return (1, -(job.started_at or job.submitted_at or 0.0))
        return (2, job.ends_at if job.ends_at is not None else float("inf"))

    out = []
    for replica in sorted((r for r in current if r.actionable), key=order):
        if replica.size <= count:
            out.append(replica)
            count -= replica.size
    return out


def _remove(deployment: str, replica: Replica, reason: str) -> Action:
    job = replica.job
    if replica.status == SERVING:
        return Drain(deployment, job.cluster, job.job_id, reason)
    return Cancel(deployment, job.cluster, job.job_id, reason)


def _submit(want: Want, count: int, reasons: list[str], observed: Observed, policy: Policy,
            avoid: set[str], decision: Decision) -> None:
    now = observed.now
    recent = [f for f in observed.failures if f.deployment == want.name
              and now - f.at < policy.failure_window]
    usable = [c for c in want.clusters if c not in observed.unreachable]
    if not usable:
        decision.notes.append(Note(want.name, "no_cluster", f"{count} replica(s) missing "
                                   "and no allowed cluster answers"))
        return
    cluster = choose_cluster(want, usable, recent, avoid, policy)
    # Backoff on the cluster chosen: failing again where it just failed is what it
    # prevents; another cluster, where it has not failed, is tried at once.
    failed = [f for f in recent if f.kind == "failed" and f.cluster == cluster]
    if failed:
        last = max(f.at for f in failed)
        delay = min(policy.backoff * 2 ** (len(failed) - 1), policy.max_backoff)
        if now < last + delay:
            decision.notes.append(Note(
                want.name, "backoff", f"{len(failed)} failure(s) on {cluster} in the last "
                f"{policy.failure_window:.0f}s: next replica in {last + delay - now:.0f}s "
                f"({count} missing)"))
            return
    pack = max(1, want.pack.get(cluster, 1))
    index = 0
    while count > 0:
        size = min(pack, count)
        reason = "; ".join(reasons[index:index + size]) or f"scale to {want.count}"
        decision.actions.append(Submit(want.name, cluster, want.spec, reason, size))
        index, count = index + size, count - size


def choose_cluster(want: Want, usable: list[str], recent: list[Failure], avoid: set[str],
                   policy: Policy) -> str:
    """The first allowed cluster in the deployment's order, unless the deployment failed
    there ``max_failures`` times recently or a job waited too long there: then the next
    one that did not (the least-failed one when all did)."""
    def rank(cluster: str) -> tuple[bool, int, int]:
        strikes = sum(1 for f in recent if f.cluster == cluster and f.kind == "failed")
        pended = cluster in avoid or any(f.cluster == cluster and f.kind == "pending"
                                         for f in recent)
        bad = strikes >= policy.max_failures or pended
        return (bad, strikes if bad else 0, usable.index(cluster))

    return min(usable, key=rank)

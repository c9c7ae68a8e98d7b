"""The fleet controller: observe, decide (``reconcile``, pure), act; once (``apply``) or
in a loop (``run``).

A pass reads every cluster's jobs of this fleet (concurrently; a cluster that does not
answer is *unreachable* for this pass) and the fleet's nodes from the registry of the
first ingress that answers. Without the registry it acts on nothing: it could not tell a
serving replica from a dead one. It then updates what it learns from what it saw
(queue-wait and engine-start estimates, failures), works out the desired count of each
deployment (fixed, stopped, or the autoscaler's), asks the core for actions and carries
them out, recording each as an event.

The loop wakes every ``interval``, sooner (every few seconds) while replicas are pending
or starting (their start is measured to that precision) and at once when an ingress holds
a request for a deployment with no replica (scale to zero).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from otela.fleet import autoscale
from otela.fleet.errors import ClusterUnreachable
from otela.fleet.events import EventLog, FleetMetrics
from otela.fleet.federation import Federation, FederationUnreachable, ModelLoad, Snapshot
from otela.fleet.identity import spec_hash
from otela.fleet.memory import Memory, MemoryFile, ScaleState, state_dir
from otela.fleet.placement import Placement
from otela.fleet.reconcile import (
    ENDING,
    Decision,
    node_index,
    nodes_by_job,
    reconcile,
    replica_of,
)
from otela.fleet.script import render
from otela.fleet.slurmctl import SlurmClient, SubmitError
from otela.fleet.spec import Deployment, Fleet
from otela.fleet.state import (
    Cancel,
    ClusterPolicy,
    Drain,
    Estimate,
    Failure,
    Job,
    JobState,
    Node,
    Observed,
    Policy,
    Submit,
    Want,
    observe_engine_start,
    observe_queue_wait,
)

log = logging.getLogger("otela.fleet")

BUSY_INTERVAL_S = 3.0  # between passes while replicas are pending or starting
HELD_POLL_S = 1.0  # how often `run` asks the ingresses for held requests


@dataclass
class Observation:
    now: float
    jobs: list[Job]
    nodes: list[Node]
    unreachable: dict[str, str]  # cluster -> why
    loads: dict[str, ModelLoad] = field(default_factory=dict)


@dataclass
class PassResult:
    observation: Observation
    wants: list[Want]
    decision: Decision
    done: list[str] = field(default_factory=list)  # what was carried out (or would be)


class Controller:
    def __init__(self, fleet: Fleet, state: Path | None = None,
                 clock: Callable[[], float] = time.time, echo: bool = True) -> None:
        self.clock = clock
        self.state_dir = state or state_dir(fleet.name)
        self.memory_file = MemoryFile(self.state_dir)
        self.memory: Memory = self.memory_file.load()
        self.metrics = FleetMetrics()
        self.events = EventLog(self.state_dir / "events.jsonl", self.metrics, echo=echo)
        self.use(fleet)
        self._starting: set[str] = set()  # jobs seen running but not serving yet
        self._unreachable: set[str] = set()
        self._noted: set[tuple[str, str]] = set()  # notes of the last pass
        self.last: PassResult | None = None

    def use(self, fleet: Fleet) -> None:
        """Work to ``fleet`` from now on (at start, and when its file changed)."""
        self.fleet = fleet
        self._mtime = _mtime(fleet.path)
        self.clients = {name: SlurmClient(cluster) for name, cluster in fleet.clusters.items()}
        self.federation = Federation(fleet.ingress, fleet.name)
        self.placement = Placement(fleet)  # a new pool is planned anew ("auto" shapes)
        self.policy = Policy(
            clusters={name: ClusterPolicy(c.drain_margin, c.pending_limit, c.serve_deadline)
                      for name, c in fleet.clusters.items()},
            backoff=fleet.backoff, max_backoff=fleet.max_backoff,
            failure_window=fleet.failure_window, max_failures=fleet.max_failures,
            handover_slack=fleet.handover_slack, interval=fleet.interval)

    def reload_if_changed(self) -> None:
        """``run`` follows edits of the fleet file: a valid new version is used from the
        next pass on; one with an error is reported (an event naming file, line and field)
        and the running version kept, so a typo never stops or starts anything."""
        from otela.fleet.errors import FleetFileError
        from otela.fleet.spec import load

        mtime = _mtime(self.fleet.path)
        if mtime == self._mtime:
            return
        self._mtime = mtime
        try:
            fleet = load(self.fleet.path)
        except FleetFileError as exc:
            self.events.emit("reload_failed", f"{exc}; keeping the previous version")
            return
        if fleet.name != self.fleet.name:
            self.events.emit("reload_failed", f"{self.fleet.path}: the fleet's name changed "
                             f"({self.fleet.name} -> {fleet.name}); restart the controller "
                             "to switch fleets")
            return
        self.use(fleet)
        self.events.emit("reloaded", f"{self.fleet.path} changed: using the new version")

    # -- observing ----------------------------------------------------------------------

    async def observe(self, with_load: bool = True) -> Observation:
        jobs: list[Job] = []
        unreachable: dict[str, str] = {}

        async def one(name: str, client: SlurmClient) -> None:
            try:
                jobs.extend(await client.jobs(self.fleet.name))
            except (ClusterUnreachable, ValueError) as exc:
                unreachable[name] = str(exc)

        models = [d.model for d in self.fleet.deployments]
        registry: list[Snapshot | FederationUnreachable] = []

        async def read_registry() -> None:
            try:
                registry.append(await self.federation.snapshot(models, with_load))
            except FederationUnreachable as exc:
                registry.append(exc)

        async with trio.open_nursery() as nursery:
            for name, client in self.clients.items():
                nursery.start_soon(one, name, client)
            nursery.start_soon(read_registry)
        snapshot = registry[0]
        if isinstance(snapshot, FederationUnreachable):
            raise snapshot
        now = self.clock()
        jobs.extend(self._presumed(snapshot.nodes, set(unreachable), jobs))
        return Observation(now, jobs, snapshot.nodes, unreachable, snapshot.loads)

    @staticmethod
    def _presumed(nodes: Sequence[Node], unreachable: set[str], seen: Sequence[Job]
                  ) -> list[Job]:
        """Jobs of clusters that did not answer, as far as their live nodes tell."""
        known = {job.key for job in seen}
        out = {}
        for node in nodes:
            if node.cluster in unreachable and node.live and node.job_key not in known:
                out[node.job_key] = Job(
                    cluster=node.cluster, job_id=node.job_id, deployment=node.deployment,
                    spec=node.spec, state=JobState.RUNNING, ends_at=node.end_time,
                    presumed=True)
        return list(out.values())

    def learn(self, obs: Observation) -> None:
        """Update estimates, failures and the metrics from what was seen."""
        memory, now = self.memory, obs.now
        for name in self.fleet.clusters:
            was_down = name in self._unreachable
            if name in obs.unreachable and not was_down:
                self._unreachable.add(name)
                self.events.emit("unreachable", obs.unreachable[name], cluster=name, at=now)
            elif name not in obs.unreachable and was_down:
                self._unreachable.discard(name)
                self.events.emit("reachable", "answers again", cluster=name, at=now)
            self.metrics.cluster_up.set(name, value=0 if name in obs.unreachable else 1)
        nodes = node_index(obs.nodes)
        for job in obs.jobs:
            key = f"{job.cluster}/{job.job_id}"
            node = nodes.get(job.key)
            if job.state is JobState.RUNNING and job.started_at is not None \
                    and key not in memory.started_seen and job.submitted_at is not None:
                memory.started_seen[key] = job.started_at
                wait = max(0.0, job.started_at - job.submitted_at)
                self._estimate(job.cluster, queue_wait=wait)
            serving = node is not None and node.state == "SERVING"
            if job.state is JobState.RUNNING and not serving and not job.presumed:
                self._starting.add(key)
            if serving and key not in memory.serving_since:
                memory.serving_since[key] = now
                if key in self._starting and job.started_at is not None:
                    self._estimate(job.cluster, engine_start=max(0.0, now - job.started_at))
                self.events.emit("serving", "replica serves", deployment=job.deployment,
                                 cluster=job.cluster, job_id=job.job_id, at=now)
            if serving:
                self._starting.discard(key)
            if job.state is JobState.FAILED or (job.state is JobState.CANCELLED
                                                 and "failed" in job.marks):
                failure = Failure(job.deployment, job.cluster, job.ended_at or now,
                                  f"job {job.state.value}", "failed", job.job_id)
                if memory.add_failure(failure):
                    self.metrics.failures.inc(job.deployment, job.cluster)
                    self.events.emit("failed", f"job ended {job.state.value}",
                                     deployment=job.deployment, cluster=job.cluster,
                                     job_id=job.job_id, at=now)
        active = {f"{j.cluster}/{j.job_id}" for j in obs.jobs if j.state.active}
        for table in (memory.serving_since, memory.started_seen):
            for key in [k for k in table if k not in active and now - table[k] > 86400]:
                del table[key]
        for name, estimate in memory.estimates.items():
            self.metrics.queue_wait.set(name, value=estimate.queue_wait)
            self.metrics.engine_start.set(name, value=estimate.engine_start)

    def _estimate(self, cluster: str, queue_wait: float | None = None,
                  engine_start: float | None = None) -> None:
        estimate = self.memory.estimates.get(cluster) or self._prior(cluster)
        if queue_wait is not None:
            estimate = observe_queue_wait(estimate, queue_wait)
        if engine_start is not None:
            estimate = observe_engine_start(estimate, engine_start)
        self.memory.estimates[cluster] = estimate

    def _prior(self, cluster: str) -> Estimate:
        spec = self.fleet.clusters[cluster]
        return Estimate(queue_wait=spec.expected_queue_wait,
                        engine_start=spec.expected_engine_start)

    def estimates(self) -> dict[str, Estimate]:
        return {name: self.memory.estimates.get(name) or self._prior(name)
                for name in self.fleet.clusters}

    # -- deciding ---------------------------------------------------------------------

    def wants(self, obs: Observation, scale: bool = True) -> list[Want]:
        out = []
        for deployment in self.fleet.deployments:
            shape, clusters = self.placement.shape(deployment)
            spec = spec_hash(deployment, shape)
            count = self._count(deployment, spec, obs, scale)
            if deployment.name in self.memory.stopped:
                count = 0
            self.metrics.desired.set(deployment.name, value=count)
            pack = {name: self.placement.per_job(shape, self.fleet.clusters[name])
                    for name in clusters}
            out.append(Want(deployment.name, spec, count, clusters, pack))
        return out

    def _count(self, deployment: Deployment, spec: str, obs: Observation,
               scale: bool) -> int:
        if not deployment.autoscaled:
            return deployment.fixed_count
        assert deployment.autoscale is not None and deployment.max is not None
        state = self.memory.scale.setdefault(deployment.name, ScaleState())
        nodes = nodes_by_job(obs.nodes)
        replicas = [replica_of(j, nodes.get(j.key, ())) for j in obs.jobs
                    if j.deployment == deployment.name and j.state.active and j.spec == spec]
        current = sum(r.size for r in replicas if r.status != ENDING)
        if not scale:  # diff, status: what the last pass decided, or what runs
            low, high = deployment.min or 0, deployment.max
            return state.target if state.target is not None else min(max(current, low), high)
        load = obs.loads.get(deployment.model)
        serving = sum(1 for n in obs.nodes if n.deployment == deployment.name
                      and n.state == "SERVING")
        signals = autoscale.Signals(
            requests=None if load is None else load.requests,
            in_flight=0.0 if load is None else load.in_flight,
            held=0.0 if load is None else load.held,
            queued=0.0 if load is None else load.queued,
            ttft_sum=None if load is None else load.ttft_sum,
            ttft_count=None if load is None else load.ttft_count, serving=serving)
        forecast = None
        if deployment.autoscale.forecast:
            autoscale.record_history(state, state.rate, obs.now,
                                     deployment.autoscale.forecast_bin)
            lead = max((self.estimates()[c].lead for c in deployment.clusters), default=0.0)
            forecast = autoscale.forecast_rate(state, deployment.autoscale, lead)
        result = autoscale.step(deployment.autoscale, deployment.min or 0, deployment.max,
                                state, signals, obs.now, current, forecast)
        if result.reason is not None:
            self.events.emit("scale", result.reason, deployment=deployment.name, at=obs.now,
                             target=result.target, rate=round(result.rate, 3))
        return result.target

    def observed(self, obs: Observation) -> Observed:
        return Observed(now=obs.now, jobs=tuple(obs.jobs), nodes=tuple(obs.nodes),
                        unreachable=frozenset(obs.unreachable),
                        failures=tuple(self.memory.failures), estimates=self.estimates())

    # -- a pass -----------------------------------------------------------------------

    async def reconcile_once(self, dry_run: bool = False) -> PassResult:
        """One pass; with ``dry_run`` nothing is submitted, drained or cancelled (and
        nothing learnt is saved), for ``otela fleet diff``."""
        obs = await self.observe(with_load=any(d.autoscaled for d in self.fleet.deployments))
        if not dry_run:
            self.learn(obs)
        wants = self.wants(obs, scale=not dry_run)
        decision = reconcile(wants, self.observed(obs), self.policy)
        result = PassResult(obs, wants, decision)
        self._count_replicas(obs, wants)
        if dry_run:
            result.done = [describe(a) for a in decision.actions]
            return result
        # A note is an event when it starts (a backoff, a wait for a successor), not on
        # every pass while it lasts.
        noted = {(note.deployment, note.what) for note in decision.notes}
        for note in decision.notes:
            if (note.deployment, note.what) not in self._noted:
                self.events.emit(note.what, note.message, deployment=note.deployment,
                                 at=obs.now)
        self._noted = noted
        self.metrics.passes.inc()
        for action in decision.actions:
            result.done.append(await self.execute(action, obs))
        self.memory_file.save(self.memory)
        self.write_metrics()
        self.last = result
        return result

    def _count_replicas(self, obs: Observation, wants: Sequence[Want]) -> None:
        nodes = nodes_by_job(obs.nodes)
        for want in wants:
            counts = dict.fromkeys(("pending", "starting", "serving", "ending"), 0)
            for job in obs.jobs:
                if job.deployment == want.name and job.state.active:
                    counts[replica_of(job, nodes.get(job.key, ())).status] += job.size
            for status, value in counts.items():
                self.metrics.replicas.set(want.name, status, value=value)

    async def execute(self, action: Submit | Drain | Cancel, obs: Observation) -> str:
        client = self.clients[action.cluster]
        try:
            if isinstance(action, Submit):
                return await self._submit(action, client, obs)
            job = next((j for j in obs.jobs if j.key == (action.cluster, action.job_id)), None)
            spec = job.spec if job is not None else ""
            size = job.size if job is not None else 1
            if isinstance(action, Drain):
                await client.mark(action.job_id, self.fleet.name, action.deployment, spec,
                                  ["drain"], size)
                await client.drain(action.job_id)
                self.metrics.drains.inc(action.deployment)
                handover = action.reason.startswith("wall time")
                if handover:
                    self.metrics.handovers.inc(action.deployment)
                self.events.emit("handover" if handover else "drain", action.reason,
                                 deployment=action.deployment, cluster=action.cluster,
                                 job_id=action.job_id)
                return describe(action)
            if action.failure:
                await client.mark(action.job_id, self.fleet.name, action.deployment, spec,
                                  ["failed"], size)
                self.memory.add_failure(Failure(action.deployment, action.cluster, obs.now,
                                                action.failure, "failed", action.job_id))
                self.metrics.failures.inc(action.deployment, action.cluster)
            if action.pending_too_long:
                self.memory.add_failure(Failure(action.deployment, action.cluster, obs.now,
                                                "pending too long", "pending", action.job_id))
            await client.cancel(action.job_id)
            self.metrics.cancels.inc(action.deployment)
            self.events.emit("cancel", action.reason, deployment=action.deployment,
                             cluster=action.cluster, job_id=action.job_id)
            return describe(action)
        except ClusterUnreachable as exc:
            self.events.emit("unreachable", f"{describe(action)} not done: {exc}",
                             deployment=action.deployment, cluster=action.cluster)
            return f"{describe(action)} (not done: cluster unreachable)"

    async def _submit(self, action: Submit, client: SlurmClient, obs: Observation) -> str:
        deployment = self.fleet.deployment(action.deployment)
        cluster = self.fleet.clusters[action.cluster]
        shape, _ = self.placement.shape(deployment)
        script = render(self.fleet, cluster, deployment, action.spec,
                        self.placement.job_shape(shape, cluster, deployment), action.size)
        try:
            job_id = await client.submit(script, f"{cluster.workdir.rstrip('/')}/"
                                         f"{self.fleet.name}")
        except SubmitError as exc:
            self.memory.add_failure(Failure(action.deployment, action.cluster, obs.now,
                                            str(exc), "failed"))
            self.metrics.failures.inc(action.deployment, action.cluster)
            self.events.emit("submit_failed", str(exc), deployment=action.deployment,
                             cluster=action.cluster)
            return f"{describe(action)} (sbatch refused: {exc})"
        self.metrics.submissions.inc(action.deployment, action.cluster)
        self.events.emit("submit", action.reason, deployment=action.deployment,
                         cluster=action.cluster, job_id=job_id, spec=action.spec)
        return f"{describe(action)}: job {job_id}"

    def write_metrics(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_dir / "metrics.prom.tmp"
        tmp.write_bytes(self.metrics.registry.render())
        tmp.replace(self.state_dir / "metrics.prom")

    # -- stop / resume ------------------------------------------------------------------

    def set_stopped(self, deployment: str, stopped: bool) -> None:
        self.fleet.deployment(deployment)  # KeyError: not in the file
        if stopped and deployment not in self.memory.stopped:
            self.memory.stopped.append(deployment)
        elif not stopped and deployment in self.memory.stopped:
            self.memory.stopped.remove(deployment)
        self.memory_file.save(self.memory)
        self.events.emit("stop" if stopped else "resume",
                         "stopped by the operator" if stopped else "resumed by the operator",
                         deployment=deployment)

    # -- the loop -----------------------------------------------------------------------

    async def run(self, passes: int | None = None,
                  task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Reconcile until cancelled (or ``passes`` passes)."""
        wake = trio.Event()
        done = 0
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_held, lambda: wake.set())
            task_status.started()
            while passes is None or done < passes:
                self.reload_if_changed()
                try:
                    result = await self.reconcile_once()
                    busy = self._busy(result)
                except FederationUnreachable as exc:
                    self.events.emit("federation_unreachable", f"{exc}; nothing changed")
                    busy = True
                except (OSError, ValueError) as exc:  # a garbled answer, a full disk
                    self.events.emit("error", f"pass failed: {exc!r}; trying again")
                    busy = True
                done += 1
                if passes is not None and done >= passes:
                    break
                wake = trio.Event()
                with trio.move_on_after(BUSY_INTERVAL_S if busy else self.fleet.interval):
                    await wake.wait()
            nursery.cancel_scope.cancel()

    def _busy(self, result: PassResult) -> bool:
        nodes = nodes_by_job(result.observation.nodes)
        for job in result.observation.jobs:
            if job.state.active and \
                    replica_of(job, nodes.get(job.key, ())).status != "serving":
                return True
        return bool(result.decision.actions)

    async def _watch_held(self, wake: Callable[[], None]) -> None:
        """Wake the loop as soon as an ingress holds a request for a model that has no
        replica (scale to zero): the first request's wait is what this saves."""
        while True:
            await trio.sleep(HELD_POLL_S)
            cold = [d for d in self.fleet.deployments if d.autoscaled and (d.min or 0) == 0
                    and not (self.memory.scale.get(d.name) or ScaleState()).target]
            if not cold:
                continue
            try:
                held = await self.federation.held([d.model for d in cold])
            except FederationUnreachable:
                continue
            if any(held.get(d.model, 0) > 0 for d in cold):
                wake()


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime_ns / 1e9
    except OSError:
        return None


def describe(action: Submit | Drain | Cancel) -> str:
    if isinstance(action, Submit):
        return f"submit {action.deployment} on {action.cluster} ({action.reason})"
    verb = "drain" if isinstance(action, Drain) else "cancel"
    return f"{verb} {action.deployment} job {action.cluster}/{action.job_id} ({action.reason})"


"""``otela fleet status``: desired against actual, read afresh from Slurm and the registry
(never from the controller's memory), with the recent events of ``events.jsonl``."""

from __future__ import annotations

from typing import Any

from otela.fleet.controller import Controller
from otela.fleet.events import read_events
from otela.fleet.reconcile import nodes_by_job, replica_of


async def build_status(controller: Controller, events: int = 10) -> dict[str, Any]:
    obs = await controller.observe(with_load=False)
    wants = {w.name: w for w in controller.wants(obs, scale=False)}
    nodes = nodes_by_job(obs.nodes)
    deployments = []
    for deployment in controller.fleet.deployments:
        want = wants[deployment.name]
        jobs = []
        counts = dict.fromkeys(("pending", "starting", "serving", "ending"), 0)
        for job in sorted(obs.jobs, key=lambda j: (j.cluster, int(j.job_id)
                                                    if j.job_id.isdigit() else 0)):
            if job.deployment != deployment.name or not job.state.active:
                continue
            replica = replica_of(job, nodes.get(job.key, ()))
            node = replica.node
            counts[replica.status] += job.size
            jobs.append({
                "cluster": job.cluster, "job_id": job.job_id, "state": job.state.value,
                "status": replica.status, "spec": job.spec, "current": job.spec == want.spec,
                "node": None if node is None else node.state,
                "time_left": None if job.ends_at is None else round(job.ends_at - obs.now),
                "reason": job.reason, "presumed": job.presumed, "size": job.size,
                "serving": replica.serving,
            })
        if deployment.autoscaled:
            desired = f"{want.count} ({deployment.min}..{deployment.max})"
        else:
            desired = str(want.count)
        deployments.append({
            "name": deployment.name, "model": deployment.model, "spec": want.spec,
            "desired": want.count, "desired_text": desired,
            "stopped": deployment.name in controller.memory.stopped, **counts, "jobs": jobs,
        })
    orphans = sorted({j.deployment for j in obs.jobs if j.state.active}
                     - {d.name for d in controller.fleet.deployments})
    return {
        "fleet": controller.fleet.name,
        "unreachable": obs.unreachable,
        "deployments": deployments,
        "orphans": orphans,
        "estimates": {name: {"queue_wait": round(e.queue_wait, 1),
                             "engine_start": round(e.engine_start, 1),
                             "lead": round(e.lead, 1)}
                      for name, e in controller.estimates().items()},
        "events": read_events(controller.state_dir / "events.jsonl", events),
    }


def _left(seconds: int | None) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(max(seconds, 0), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def render_status(report: dict[str, Any]) -> None:
    import time

    from rich.table import Table

    from otela.console import make_console

    console = make_console()
    summary = Table(title=f"fleet {report['fleet']}")
    for column in ("deployment", "model", "desired", "serving", "starting", "pending",
                   "ending", "spec"):
        summary.add_column(column)
    for d in report["deployments"]:
        desired = d["desired_text"] + (" [stopped]" if d["stopped"] else "")
        summary.add_row(d["name"], d["model"], desired, str(d["serving"]),
                        str(d["starting"]), str(d["pending"]), str(d["ending"]), d["spec"])
    console.print(summary)
    jobs = Table(title="jobs")
    for column in ("deployment", "job", "slurm", "node", "wall time left", "spec", "note"):
        jobs.add_column(column)
    for d in report["deployments"]:
        for job in d["jobs"]:
            note = job["reason"] if job["state"] == "PENDING" else ""
            if job["presumed"]:
                note = "cluster unreachable: seen in the registry"
            node = job["node"] or "-"
            if job["size"] > 1:
                node = f"{node} ({job['serving']}/{job['size']} serve)"
            jobs.add_row(d["name"], f"{job['cluster']}/{job['job_id']}", job["state"],
                         node, _left(job["time_left"]),
                         job["spec"] + ("" if job["current"] else " (old)"), note)
    console.print(jobs)
    for cluster, why in report["unreachable"].items():
        console.print(f"[yellow]cluster {cluster} unreachable: {why}[/yellow]")
    for name in report["orphans"]:
        console.print(f"[yellow]jobs of deployment {name}, no longer in the file, are "
                      "being wound down[/yellow]")
    estimates = ", ".join(f"{c}: queue {e['queue_wait']:g}s + start {e['engine_start']:g}s"
                          for c, e in report["estimates"].items())
    console.print(f"[dim]estimates: {estimates}[/dim]")
    if report["events"]:
        console.print("recent events:")
        for event in report["events"]:
            when = time.strftime("%H:%M:%S", time.localtime(event.get("ts", 0)))
            where = "/".join(str(event[k]) for k in ("deployment", "cluster", "job_id")
                             if event.get(k))
            console.print(f"  {when} {event.get('kind')} {where}: {event.get('message')}")

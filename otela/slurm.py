"""Slurm awareness: which allocation a node runs in, and draining before its wall time.

Inside a job, Slurm's environment says the job id, partition, node list and allocated
CPUs/GPUs; the node puts them in its record. Slurm 22.05 exports no end time, so the
time left comes from ``squeue -h -j $SLURM_JOB_ID -o %L``. ``watch_wall_time`` asks it
periodically (a time limit can be changed with ``scontrol``) and triggers a graceful
drain ``margin`` seconds before the limit, so no request is cut off by the time limit.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace

import trio

from otela.registry.records import FleetTag, SlurmJob

log = logging.getLogger("otela.slurm")

SQUEUE_TIMEOUT_S = 15.0
_TIME_LEFT = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(?:(\d+):)?(\d+)$")


def _env_int(env: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        value = env.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return None


def _gpu_count(env: Mapping[str, str]) -> int | None:
    count = _env_int(env, "SLURM_GPUS_ON_NODE")
    if count is not None:
        return count
    for name in ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS"):
        ids = [g for g in env.get(name, "").split(",") if g.strip()]
        if ids:
            return len(ids)
    return None


def job_from_env(env: Mapping[str, str]) -> SlurmJob | None:
    """The allocation this process runs in, or ``None`` outside Slurm."""
    job_id = env.get("SLURM_JOB_ID", "").strip()
    if not job_id:
        return None
    return SlurmJob(
        job_id=job_id,
        partition=env.get("SLURM_JOB_PARTITION") or None,
        node_list=env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or None,
        cpus=_env_int(env, "SLURM_CPUS_ON_NODE", "SLURM_JOB_CPUS_PER_NODE"),
        gpus=_gpu_count(env),
    )


FLEET_TAG_ENV = "OTELA_FLEET_TAG"
"""Set by ``otela fleet`` in the jobs it submits: ``fleet=F,deployment=D,spec=H,cluster=C``."""


def fleet_tag_from_env(env: Mapping[str, str]) -> FleetTag | None:
    """The fleet deployment this job's node belongs to (``None``: not started by a fleet
    controller, or outside Slurm). Malformed tags are ignored with a warning: a node
    serves just as well untagged, the controller then only sees it through Slurm."""
    text, job_id = env.get(FLEET_TAG_ENV, "").strip(), env.get("SLURM_JOB_ID", "").strip()
    if not text or not job_id:
        return None
    fields = dict(part.split("=", 1) for part in text.split(",") if "=" in part)
    try:
        return FleetTag(fleet=fields["fleet"], deployment=fields["deployment"],
                        spec=fields["spec"], cluster=fields["cluster"], job_id=job_id)
    except KeyError as exc:
        log.warning("ignoring %s=%r: no %s", FLEET_TAG_ENV, text, exc)
        return None


def parse_time_left(text: str) -> float | None:
    """Seconds from squeue's ``%L`` (``[D-][HH:]MM:SS``); ``None`` if unlimited or unknown."""
    match = _TIME_LEFT.match(text.strip())
    if not match:
        return None  # UNLIMITED, NOT_SET, INVALID, or empty (job gone)
    days, first, second, seconds = match.groups()
    # With two colons the fields are H:M:S; with one, M:S (squeue drops leading zeros).
    hours, minutes = (first, second) if second is not None else (None, first)
    return int(days or 0) * 86400 + int(hours or 0) * 3600 + int(minutes or 0) * 60 + int(seconds)


async def query_time_left(job_id: str) -> float | None:
    """Ask squeue how long the job has left; ``None`` if it cannot tell."""
    try:
        with trio.fail_after(SQUEUE_TIMEOUT_S):
            result = await trio.run_process(
                ["squeue", "-h", "-j", job_id, "-o", "%L"],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
    except (OSError, trio.TooSlowError) as exc:
        log.warning("cannot run squeue: %s", exc)
        return None
    if result.returncode != 0:
        log.warning("squeue failed: %s", result.stderr.decode(errors="replace").strip())
        return None
    return parse_time_left(result.stdout.decode(errors="replace"))


async def with_end_time(job: SlurmJob) -> SlurmJob:
    """``job`` with its end time (unix seconds) filled in, if squeue can tell."""
    left = await query_time_left(job.job_id)
    return job if left is None else replace(job, end_time=round(time.time() + left))


async def watch_wall_time(
    job_id: str,
    margin: float,
    poll_interval: float,
    on_drain: Callable[[float], None],
    query: Callable[[str], Awaitable[float | None]] | None = None,
) -> None:
    """Call ``on_drain(seconds_left)`` once the job has at most ``margin`` seconds left.

    Re-reads the time left every ``poll_interval`` seconds, and wakes up exactly at the
    drain point in between.
    """
    ask = query or query_time_left
    while True:
        left = await ask(job_id)
        if left is not None:
            if left <= margin:
                log.info("Slurm job %s has %.0fs left: draining", job_id, left)
                on_drain(left)
                return
            await trio.sleep(min(poll_interval, left - margin))
        else:
            await trio.sleep(poll_interval)

"""Driving one cluster's Slurm: ``squeue``, ``sbatch``, ``scontrol`` and ``scancel``, on
this machine or over SSH on a login node.

Every call is one process (``ssh ... -- sh -c '...'`` for a remote cluster, key
authentication only: ``BatchMode=yes`` never waits for a password), bounded by a timeout.
A cluster that cannot be reached (SSH failing, a command missing, no answer in time) raises
``ClusterUnreachable``; the controller then leaves its jobs alone and compensates
elsewhere. Times come back on the controller's clock: the cluster's own clock and time
zone are read in the same call as ``squeue`` (``date``), so a login node in another zone,
or with a skewed clock, gives the right wall times.
"""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import trio

from otela.fleet.errors import ClusterUnreachable
from otela.fleet.script import comment, parse_comment
from otela.fleet.spec import Cluster
from otela.fleet.state import Job, JobState
from otela.slurm import parse_time_left

log = logging.getLogger("otela.fleet")

CALL_TIMEOUT_S = 30.0
SEP = "|"
SQUEUE_FORMAT = SEP.join(["%i", "%T", "%V", "%S", "%e", "%L", "%P", "%r", "%k"])
SSH_UNREACHABLE = 255  # ssh's own exit status: it could not connect or authenticate


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str


class SlurmClient:
    """One cluster's Slurm commands."""

    def __init__(self, cluster: Cluster, timeout: float = CALL_TIMEOUT_S) -> None:
        self.cluster = cluster
        self.timeout = timeout

    def argv(self, script: str) -> list[str]:
        """The process that runs ``script`` (sh) on the cluster."""
        if self.cluster.ssh is None:
            return ["sh", "-c", script]
        return ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
                "-o", "ServerAliveInterval=10", *self.cluster.ssh_options, self.cluster.ssh,
                "--", shlex.join(["sh", "-c", script])]

    async def run(self, script: str, stdin: bytes = b"") -> CommandResult:
        """Run ``script`` there; ``ClusterUnreachable`` if it cannot be run at all."""
        argv = self.argv(script)
        try:
            with trio.fail_after(self.timeout):
                result = await trio.run_process(argv, stdin=stdin, capture_stdout=True,
                                                capture_stderr=True, check=False)
        except trio.TooSlowError:
            raise ClusterUnreachable(f"cluster {self.cluster.name}: no answer within "
                                     f"{self.timeout:.0f}s") from None
        except OSError as exc:
            raise ClusterUnreachable(f"cluster {self.cluster.name}: cannot run {argv[0]}: "
                                     f"{exc.strerror or exc}") from None
        out = CommandResult(result.returncode, result.stdout.decode(errors="replace"),
                            result.stderr.decode(errors="replace"))
        if self.cluster.ssh is not None and out.returncode == SSH_UNREACHABLE:
            raise ClusterUnreachable(f"cluster {self.cluster.name}: ssh {self.cluster.ssh}: "
                                     f"{_last_line(out.stderr) or 'failed'}")
        if out.returncode == 127:  # sh: command not found (no Slurm there)
            raise ClusterUnreachable(f"cluster {self.cluster.name}: "
                                     f"{_last_line(out.stderr) or 'command not found'}")
        return out

    async def jobs(self, fleet: str) -> list[Job]:
        """This fleet's jobs on this cluster (recently finished ones too, as long as
        Slurm remembers them: ``MinJobAge``)."""
        script = (f"date '+%s %z' && exec squeue --me -h -t all -o "
                  f"{shlex.quote(SQUEUE_FORMAT)}")
        result = await self.run(script)
        if result.returncode != 0:
            raise ClusterUnreachable(f"cluster {self.cluster.name}: squeue failed: "
                                     f"{_last_line(result.stderr)}")
        return parse_squeue(result.stdout, fleet, self.cluster.name, time.time())

    async def submit(self, script: str, workdir: str) -> str:
        """``sbatch`` the script (read from standard input) in ``workdir``; the job id."""
        directory = _shell_path(workdir)
        command = (f'd={directory}; mkdir -p "$d" && exec sbatch --parsable --chdir="$d" '
                   f'--output="$d/%x-%j.out"')
        result = await self.run(command, stdin=script.encode())
        if result.returncode != 0:
            raise SubmitError(f"sbatch on {self.cluster.name} failed: "
                              f"{_last_line(result.stderr) or result.returncode}")
        job_id = result.stdout.strip().split(";")[0]
        if not job_id.isdigit():
            raise SubmitError(f"sbatch on {self.cluster.name} answered {result.stdout!r}")
        return job_id

    async def mark(self, job_id: str, fleet: str, deployment: str, spec: str,
                   marks: Sequence[str], size: int = 1) -> None:
        """Write the controller's decision into the job's comment (where a restarted
        controller reads it back)."""
        text = comment(fleet, deployment, spec, self.cluster.name, tuple(marks), size)
        await self.run(f"scontrol update JobId={int(job_id)} Comment={shlex.quote(text)}")

    async def drain(self, job_id: str) -> None:
        """Signal only the batch shell (otela, which the script exec'd): it drains, stops
        its engine and leaves; the job ends COMPLETED."""
        result = await self.run(f"scancel --batch --signal=TERM {int(job_id)}")
        if result.returncode != 0:
            log.warning("scancel --batch on %s job %s: %s", self.cluster.name, job_id,
                        _last_line(result.stderr))

    async def cancel(self, job_id: str) -> None:
        result = await self.run(f"scancel {int(job_id)}")
        if result.returncode != 0:
            log.warning("scancel on %s job %s: %s", self.cluster.name, job_id,
                        _last_line(result.stderr))


class SubmitError(Exception):
    """sbatch refused the job (bad partition, account, limits): the operator must act."""


def _size(text: str | None) -> int:
    return int(text) if text is not None and text.isdigit() and 0 < int(text) < 1000 else 1


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def _shell_path(path: str) -> str:
    """``~/x`` as a shell word that expands ``$HOME`` there, anything else quoted."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def parse_squeue(text: str, fleet: str, cluster: str, now: float) -> list[Job]:
    """Jobs from ``date '+%s %z'`` followed by ``squeue -o SQUEUE_FORMAT`` lines, with
    times converted to the controller's clock (``now``). Pure."""
    lines = text.splitlines()
    if not lines:
        return []
    try:
        stamp, zone = lines[0].split()
        there = float(stamp)
        tz = timezone(timedelta(hours=int(zone[:3]), minutes=int(zone[0] + zone[3:5])))
    except ValueError:
        raise ValueError(f"unexpected clock line from {cluster}: {lines[0]!r}") from None
    offset = now - there  # add to a cluster time to get the controller's

    def when(value: str) -> float | None:
        value = value.strip()
        if not value or value in ("N/A", "Unknown", "None"):
            return None
        try:
            return datetime.fromisoformat(value).replace(tzinfo=tz).timestamp() + offset
        except ValueError:
            return None

    jobs = []
    for line in lines[1:]:
        fields = line.split(SEP, 8)
        if len(fields) != 9:
            continue
        job_id, state, submitted, started, ended, left, partition, reason, text_comment = \
            fields
        parsed = parse_comment(text_comment)
        if parsed is None:
            continue
        tag, marks = parsed
        if tag["fleet"] != fleet or tag["cluster"] != cluster:
            continue
        job_state = JobState.from_slurm(state)
        remaining = parse_time_left(left) if job_state is JobState.RUNNING else None
        jobs.append(Job(
            cluster=cluster, job_id=job_id.strip(), deployment=tag["deployment"],
            spec=tag["spec"], state=job_state, submitted_at=when(submitted),
            started_at=when(started) if job_state is not JobState.PENDING else None,
            ends_at=None if remaining is None else now + remaining,
            ended_at=when(ended) if not job_state.active else None,
            reason=reason.strip() if reason.strip() != "None" else "", marks=marks,
            partition=partition.strip() or None, size=_size(tag.get("n"))))
    return jobs

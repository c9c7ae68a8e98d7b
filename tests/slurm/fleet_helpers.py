"""Driving ``otela fleet`` against the real single-node Slurm cluster: fleet files for the
echo engine, the CLI as a real process, and reading back what Slurm and the registry say.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otela.testing.localfed import LocalNode, wait_for

ECHO = f"{sys.executable} -m otela.engine.demo.echo --port {{port}} --model {{model}}"


def fleet_name() -> str:
    """A fleet name of its own per test: Slurm lists finished jobs for MinJobAge (10 min
    on the test cluster), and another test's jobs must not look like this one's."""
    return "t" + uuid.uuid4().hex[:8]


def cluster_toml(name: str, tmp: Path, *, ssh: str | None = None,
                 ssh_options: list[str] | None = None, time_limit: str = "10",
                 drain_margin: str = "30s", extra: str = "") -> str:
    lines = [f"[clusters.{name}]"]
    if ssh:
        lines.append(f"ssh = {ssh!r}")
        lines.append(f"ssh_options = {ssh_options or []!r}".replace("'", '"'))
    lines += [
        'partition = "debug"',
        f'time_limit = "{time_limit}"',
        "gpus_per_node = 0",
        "cpus_per_job = 1",
        f'drain_margin = "{drain_margin}"',
        f'workdir = "{tmp / "work"}"',
        'expected_queue_wait = "2s"',
        'expected_engine_start = "8s"',
        'env = { OTELA_HOST = "127.0.0.1", OTELA_LOG_LEVEL = "INFO" }',
    ]
    return "\n".join(lines) + "\n" + extra + "\n"


def deployment_toml(name: str, model: str, *, replicas: int | None = 1,
                    command: str = ECHO, clusters: list[str] | None = None,
                    extra: str = "") -> str:
    lines = ["[[deployments]]", f'name = "{name}"', f'model = "{model}"',
             f"command = {json.dumps(command)}", "gpus = 0"]
    if replicas is not None:
        lines.append(f"replicas = {replicas}")
    if clusters is not None:
        lines.append("clusters = [" + ", ".join(f'"{c}"' for c in clusters) + "]")
    return "\n".join(lines) + "\n" + extra + "\n"


def fleet_toml(name: str, ingress: LocalNode, *, interval: str = "5s",
               extra: str = "") -> str:
    otela = f"{sys.executable} -m otela"
    return (f'[fleet]\nname = "{name}"\nbootstrap = ["{ingress.multiaddr}"]\n'
            f'ingress = ["{ingress.http_url}"]\notela = "{otela}"\ninterval = "{interval}"\n'
            f'provider_id = "fleet-test"\n{extra}\n')


def cli_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTELA_")}
    env["XDG_CONFIG_HOME"] = str(tmp / "xdg")
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    return env


@dataclass
class FleetCli:
    """``otela fleet`` on one fleet file and state directory, as real processes."""

    file: Path
    state: Path
    tmp: Path
    runs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __call__(self, *args: str, check: bool = True, timeout: float = 120
                 ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [sys.executable, "-m", "otela", "fleet", *args, "--file", str(self.file),
             "--state", str(self.state)],
            capture_output=True, text=True, timeout=timeout, env=cli_env(self.tmp))
        if check:
            assert result.returncode == 0, f"otela fleet {shlex.join(args)}:\n" \
                f"{result.stdout}\n{result.stderr}"
        return result

    def start_run(self, *extra: str) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"fleet-run-{len(self.runs)}.log", "ab")  # noqa: SIM115
        process = subprocess.Popen(
            [sys.executable, "-m", "otela", "fleet", "run", "--file", str(self.file),
             "--state", str(self.state), *extra],
            stdout=log, stderr=subprocess.STDOUT, env=cli_env(self.tmp),
            start_new_session=True)
        log.close()
        self.runs.append(process)
        return process

    def stop_runs(self) -> None:
        for process in self.runs:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.runs:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def run_log(self) -> str:
        return "\n".join((self.tmp / f"fleet-run-{i}.log").read_text(errors="replace")[-4000:]
                         for i in range(len(self.runs)))

    def events(self) -> list[dict[str, Any]]:
        import json

        path = self.state / "events.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    state: str
    comment: str

    @property
    def deployment(self) -> str:
        return dict(w.split("=", 1) for w in self.comment.split() if "=" in w)["deployment"]

    @property
    def spec(self) -> str:
        return dict(w.split("=", 1) for w in self.comment.split() if "=" in w)["spec"]

    @property
    def cluster(self) -> str:
        return dict(w.split("=", 1) for w in self.comment.split() if "=" in w)["cluster"]


def fleet_jobs(fleet: str) -> list[SlurmJob]:
    """Every job of ``fleet`` Slurm lists (finished ones too, within MinJobAge)."""
    out = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i|%T|%k"], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    jobs = []
    for line in out.splitlines():
        job_id, state, text = line.split("|", 2)
        if f"fleet={fleet} " in text + " ":
            jobs.append(SlurmJob(job_id, state, text))
    return jobs


def cluster_picture() -> str:
    """Every job on the test cluster with why it waits, and the node's state: what a
    failure needs when a job of this test stays PENDING behind something else."""
    commands = [["squeue", "-h", "-t", "all", "-o", "%i %T %r %C %M %l %k"],
                ["sinfo", "-N", "-h", "-o", "%N %T %C %E"]]
    return "\n".join(subprocess.run(c, capture_output=True, text=True, timeout=30).stdout
                     for c in commands)


def active(jobs: list[SlurmJob]) -> list[SlurmJob]:
    return [j for j in jobs if j.state in ("PENDING", "RUNNING", "CONFIGURING")]


def fleet_nodes(observer: LocalNode, fleet: str, state: str | None = None
                ) -> list[dict[str, Any]]:
    nodes = [n for n in observer.nodes()
             if (n.get("fleet") or {}).get("fleet") == fleet]
    return [n for n in nodes if state is None or n["state"] == state]


def serving_count(observer: LocalNode, fleet: str, deployment: str | None = None) -> int:
    return sum(1 for n in fleet_nodes(observer, fleet, "SERVING")
               if deployment is None or n["fleet"]["deployment"] == deployment)


def wait_serving(observer: LocalNode, fleet: str, count: int, timeout: float = 120,
                 deployment: str | None = None, exact: bool = True) -> None:
    def ok() -> bool:
        n = serving_count(observer, fleet, deployment)
        return n == count if exact else n >= count

    wait_for(ok, timeout, f"{count} serving replica(s) of fleet {fleet}", interval=0.5)


@contextmanager
def cancel_fleet_jobs(fleet: str) -> Iterator[None]:
    """Leave no job of ``fleet`` behind, whatever the test did."""
    try:
        yield
    finally:
        ids = [j.job_id for j in active(fleet_jobs(fleet))]
        if ids:
            subprocess.run(["scancel", *ids], timeout=30)

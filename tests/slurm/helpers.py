"""Submitting the slurm/ templates and watching their nodes join and leave."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from otela.testing.localfed import (
    FederationError,
    LocalFederation,
    LocalNode,
    echo_engine_command,
    free_port,
    wait_for,
)

TEMPLATES = Path(__file__).resolve().parents[2] / "slurm"
CONVERGE_S = 20.0


def chat(node: LocalNode, model: str, content: str = "hello") -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": content}]}
    return httpx.post(f"{node.http_url}/v1/chat/completions", json=body, timeout=30,
                      trust_env=False)


def serving_node(fed: LocalFederation, name: str, bootstrap: LocalNode, model: str,
                 *engine_args: str) -> LocalNode:
    command = echo_engine_command(free_port(), [model], *engine_args)
    return fed.start_node(name, bootstrap=[bootstrap], process=command)


def wait_state(observer: LocalNode, target: LocalNode, state: str) -> None:
    wait_for(lambda: observer.states().get(target.session_id) == state, CONVERGE_S,
             f"{observer.name} to see {target.name} {state}")


def job_env(ingress: LocalNode, tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTELA_")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env.update(
        OTELA_BOOTSTRAP=ingress.multiaddr,
        OTELA_HOST="127.0.0.1",
        OTELA_HOME_ROOT=str(tmp / "homes"),
        OTELA_LOG_SINK=str(tmp / "sink"),
        XDG_CONFIG_HOME=str(tmp / "xdg"),
        **extra,
    )
    return env


def submit(template: str, env: dict[str, str], tmp: Path, *args: str) -> str:
    """sbatch a template from slurm/ (no GPUs here: --gres=none); its job id."""
    result = subprocess.run(
        ["sbatch", "--parsable", "--gres=none", f"--output={tmp}/job-%j.out", *args,
         str(TEMPLATES / template)],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().split(";")[0]


def job_state(job_id: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-t", "all", "-o", "%T"],
                         capture_output=True, text=True, timeout=30).stdout
    return out.strip()


def job_output(tmp: Path, job_id: str) -> str:
    path = tmp / f"job-{job_id}.out"
    return path.read_text(errors="replace") if path.exists() else "(no output)"


def node_of_job(observer: LocalNode, job_id: str) -> dict[str, Any] | None:
    for node in observer.nodes():
        if (node.get("slurm") or {}).get("job_id") == job_id:
            return node
    return None


QUEUED_S = 180.0  # a job may wait this long for the previous test's job to finish


def wait_job_node(observer: LocalNode, job_id: str, state: str, timeout: float,
                  tmp: Path) -> dict[str, Any]:
    """The job's node once ``observer`` lists it in ``state``: within ``timeout`` of the
    job's start. Time in the queue does not count (a cancelled job of the test before may
    still be completing on the one-node cluster)."""
    try:
        wait_for(lambda: job_state(job_id) not in ("PENDING", "CONFIGURING"), QUEUED_S,
                 f"job {job_id} to start", interval=0.2)
    except FederationError as exc:
        queue = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i %T %r"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
        raise FederationError(f"{exc}; the queue:\n{queue}") from None

    def found() -> dict[str, Any] | None:
        node = node_of_job(observer, job_id)
        if node is None and job_state(job_id) in ("FAILED", "COMPLETED", "CANCELLED"):
            raise AssertionError(f"job {job_id} ended:\n{job_output(tmp, job_id)[-3000:]}")
        return node if node is not None and node["state"] == state else None

    try:
        return wait_for(found, timeout, f"job {job_id}'s node to be {state}", interval=0.2)
    except FederationError as exc:
        reason = subprocess.run(["squeue", "-h", "-j", job_id, "-t", "all", "-o", "%T %r"],
                                capture_output=True, text=True, timeout=30).stdout.strip()
        raise FederationError(f"{exc}; job state: {reason or 'unknown'}\n"
                              f"{job_output(tmp, job_id)[-2000:]}") from None


@dataclass
class StateWatcher:
    """Records the sequence of states an observer reports for one session."""

    observer: LocalNode
    session_id: str
    seen: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> StateWatcher:
        self._thread = threading.Thread(target=self._run)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                state = self.observer.states().get(self.session_id)
            except httpx.HTTPError:
                state = None
            if state and (not self.seen or self.seen[-1] != state):
                self.seen.append(state)
            self._stop.wait(0.05)

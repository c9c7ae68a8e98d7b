"""Run the engine as a supervised child process.

The child gets its own process group (so a terminal's Ctrl-C reaches otela first and
otela decides how to stop it) and a parent-death signal (so it cannot outlive a
SIGKILLed otela and keep a GPU busy). Its output goes to a log file under the node's home.

The child is forked from the main thread on purpose: Linux delivers the parent-death
signal when the forking *thread* exits, and trio's ``open_process`` forks from a worker
thread that retires after ~10 s idle, which would kill a healthy engine. Waiting uses a
pidfd, so no thread sits blocked in ``waitpid``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
import trio

from otela.children import die_with_parent, wait_exited
from otela.engine.command import EngineCommand
from otela.names import model_id_problem
from otela.registry.records import MAX_MODELS, ModelInfo

log = logging.getLogger("otela.engine")


class EngineFailed(RuntimeError):
    """The engine exited or never became ready."""


def parse_models(payload: Any) -> list[ModelInfo]:
    """Model ids (and context length where the engine says it) from ``/v1/models``.

    Only ids that are model ids (``otela.names``: every replica refuses a record
    with anything else) and at most ``MAX_MODELS`` of them are announced; the rest are
    named in a warning, so an operator sees why a model is not offered."""
    models: list[ModelInfo] = []
    for item in (payload or {}).get("data", []):
        if isinstance(item, dict) and isinstance(item.get("id"), str):
            problem = model_id_problem(item["id"])
            if problem is not None:
                log.warning("not announcing the engine's model %r: %s (choose another name, "
                            "e.g. with vLLM's --served-model-name)", item["id"][:300], problem)
                continue
            if len(models) == MAX_MODELS:
                log.warning("the engine lists more than %d models; announcing the first %d",
                            MAX_MODELS, MAX_MODELS)
                break
            ctx = item.get("max_model_len") or item.get("context_length")
            max_context = ctx if isinstance(ctx, int) and 0 < ctx < 2**63 else None
            models.append(ModelInfo(id=item["id"], max_context=max_context))
    return models


class EngineProcess:
    def __init__(self, command: EngineCommand, log_path: Path) -> None:
        self.command = command
        self.log_path = log_path
        self.output: trio.lowlevel.FdStream | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._pidfd: int | None = None
        self.exited = trio.Event()

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def returncode(self) -> int | None:
        return None if self._process is None else self._process.poll()

    async def start(self, env: dict[str, str] | None = None) -> None:
        """Launch the engine; its combined stdout/stderr is then readable from ``output``."""
        try:
            self._process = subprocess.Popen(
                list(self.command.argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
                env=env,
            )
        except OSError as exc:
            raise EngineFailed(f"cannot launch engine {self.command.argv[0]!r}: {exc}") from exc
        assert self._process.stdout is not None
        self.output = trio.lowlevel.FdStream(os.dup(self._process.stdout.fileno()))
        self._process.stdout.close()
        self._pidfd = os.pidfd_open(self._process.pid)

    async def watch(self) -> None:
        """Own the pidfd: return (and set ``exited``) when the engine exits. Run as one task."""
        process = self._process
        assert process is not None and self._pidfd is not None, "engine not started"
        try:
            await wait_exited(process, self._pidfd)
        finally:
            os.close(self._pidfd)
            self._pidfd = None
        self.exited.set()

    async def wait(self) -> int:
        """Wait for the engine to exit; its exit code (negative: killed by that signal)."""
        await self.exited.wait()
        assert self._process is not None
        return self._process.returncode

    async def wait_ready(
        self, client: httpx.AsyncClient, timeout: float, poll_interval: float = 0.25
    ) -> list[ModelInfo]:
        """Poll ``/v1/models`` until the engine lists at least one model.

        Fails fast if the child exits while we wait, instead of waiting out the timeout.
        """
        return await wait_ready(client, self.command, timeout, self, poll_interval)

    async def stop(self, grace: float) -> None:
        """SIGTERM the engine's process group, then SIGKILL it after ``grace`` seconds."""
        process = self._process
        if process is None:
            return
        if process.poll() is not None:
            # The leader is gone; make sure no helper it spawned (vLLM's engine core,
            # tensor-parallel workers) lingers on the GPU.
            self._signal_group(signal.SIGKILL)
            return
        self._signal_group(signal.SIGTERM)
        with trio.move_on_after(grace):
            await self.wait()
            return
        self._signal_group(signal.SIGKILL)
        with trio.CancelScope(shield=True):
            await self.wait()

    def _signal_group(self, sig: int) -> None:
        assert self._process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, sig)


async def wait_ready(
    client: httpx.AsyncClient,
    command: EngineCommand,
    timeout: float,
    process: EngineProcess | None = None,
    poll_interval: float = 0.25,
) -> list[ModelInfo]:
    """Poll ``/v1/models`` until the engine lists a model (or its process exits)."""
    url = f"{command.url}/v1/models"
    where = f" (see {process.log_path})" if process is not None else ""
    with trio.move_on_after(timeout):
        while True:
            if process is not None and process.returncode is not None:
                raise EngineFailed(
                    f"engine exited with code {process.returncode} before becoming ready{where}"
                )
            try:
                response = await client.get(url, timeout=5.0)
                if response.status_code == 200:
                    models = parse_models(response.json())
                    if models:
                        return models
            except (httpx.HTTPError, ValueError):
                pass
            await trio.sleep(poll_interval)
    raise EngineFailed(f"engine not ready after {timeout:.0f}s at {url}{where}")

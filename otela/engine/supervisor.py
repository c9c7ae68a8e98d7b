"""Supervise one engine for a node: launch, readiness, metadata, health, fail-stop.

``Supervisor.run`` drives the engine's whole life and reports to the node through two
callbacks: ``on_ready(models)`` once the engine serves (with metadata merged from its
command line, its own reports and the provider's overrides), and ``on_failure(reason)``
the first time something proves it cannot be trusted (paper §7.1, fail-stop): it exited,
never became ready, failed ``health_failures`` checks in a row, or printed a fatal log
line. The node then announces DOWN and calls ``stop``; ``collect_logs`` copies the engine
logs to the sink for a post-mortem.

An engine given only by ``--engine-url`` (not launched by otela) is supervised the same
way, minus the process: readiness and health checks only.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import trio

from otela.config import NodeConfig
from otela.engine.command import EngineCommand
from otela.engine.health import watch_health
from otela.engine.logs import FatalPatterns, RotatingLog, copy_to_sink, pump_output
from otela.engine.metadata import command_metadata, enrich, probe_engine_details
from otela.engine.process import EngineFailed, EngineProcess, wait_ready
from otela.mesh.listening import accepts_connections
from otela.registry.records import ModelInfo

log = logging.getLogger("otela.engine")

# An engine that exits cleanly or on SIGTERM was most likely stopped by the same signal
# that is stopping us (Slurm signals every process of a job): wait this long for our own
# stop request before calling its exit a failure.
STOP_SIGNAL_WAIT_S = 2.0
_CLEAN_EXIT_CODES = {0, -signal.SIGTERM, 128 + signal.SIGTERM, -signal.SIGINT}


class Supervisor:
    def __init__(
        self,
        command: EngineCommand,
        config: NodeConfig,
        client: httpx.AsyncClient,
        on_ready: Callable[[list[ModelInfo]], Awaitable[None]],
        on_failure: Callable[[str], None],
        stop_requested: trio.Event,
    ) -> None:
        self.command = command
        self.config = config
        self.client = client
        self.on_ready = on_ready
        self.on_failure = on_failure
        self.stop_requested = stop_requested
        self.failure: str | None = None
        self.ready = False
        self.process = EngineProcess(command, config.engine_log) if command.argv else None
        self._log: RotatingLog | None = None
        self._output_done = trio.Event()
        self._output_done.set()

    def fail(self, reason: str) -> None:
        """Record the first failure and tell the node (later ones add nothing)."""
        if self.failure is None and not self.stop_requested.is_set():
            self.failure = reason
            log.error("engine failed: %s; announcing DOWN (fail-stop)", reason)
            self.on_failure(reason)

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            if self.process is not None:
                try:
                    await self._launch(nursery)
                except EngineFailed as exc:
                    self.fail(str(exc))
                    return
            try:
                models = await wait_ready(
                    self.client, self.command, self.config.ready_timeout, self.process
                )
            except EngineFailed as exc:
                self.fail(str(exc))
                return
            if self.failure is not None or self.stop_requested.is_set():
                return
            details = await probe_engine_details(self.client, self.command)
            models = enrich(models, command_metadata(self.command), details, self.config.model_meta)
            self.ready = True
            await self.on_ready(models)
            reason = await watch_health(
                self.client,
                self.command,
                self.config.health_interval,
                self.config.health_failures,
            )
            self.fail(reason)

    async def _launch(self, nursery: trio.Nursery) -> None:
        assert self.process is not None
        config = self.config
        self._log = RotatingLog(config.engine_log, config.log_max_bytes, config.log_backups)
        self._log.write(f"--- otela: launching {' '.join(self.command.argv)}\n".encode())
        await refuse_taken_port(self.command.url)
        await self.process.start(env=dict(os.environ))
        assert self.process.output is not None
        self._output_done = trio.Event()
        nursery.start_soon(self._pump, self.process.output)
        nursery.start_soon(self._watch_exit)
        log.info("engine started (pid %s), waiting for %s", self.process.pid, self.command.url)

    async def _pump(self, stream: trio.lowlevel.FdStream) -> None:
        assert self._log is not None
        patterns = FatalPatterns(self.config.fatal_patterns)

        def fatal(pattern: str, line: str) -> None:
            self.fail(f"fatal engine log line (pattern {pattern!r}): {line[:500]}")

        try:
            await pump_output(stream, self._log, patterns, fatal)
        finally:
            self._output_done.set()

    async def _watch_exit(self) -> None:
        assert self.process is not None
        await self.process.watch()
        code = self.process.returncode
        if code in _CLEAN_EXIT_CODES:
            with trio.move_on_after(STOP_SIGNAL_WAIT_S):
                await self.stop_requested.wait()
        when = "" if self.ready else " before becoming ready"
        self.fail(f"engine exited with code {code}{when} (see {self.config.engine_log})")

    async def stop(self, grace: float) -> None:
        """Stop the engine (SIGTERM, SIGKILL after ``grace``) and flush its output."""
        if self.process is None:
            return
        await self.process.stop(grace)
        with trio.move_on_after(grace):
            await self._output_done.wait()
        if self._log is not None:
            self._log.close()

    def collect_logs(self, name: str) -> Path | None:
        """Copy the engine logs to the configured sink; where they went, if anywhere."""
        sink = self.config.log_sink
        if sink is None:
            return None
        files = self._log.files() if self._log is not None else [self.config.engine_log]
        node_log = self.config.home / "node.log"
        try:
            return copy_to_sink(sink, name, [*files, node_log], self.failure or "stopped")
        except OSError as exc:
            log.error("could not copy logs to %s: %s", sink, exc)
            return None


async def refuse_taken_port(url: str) -> None:
    """Fail if some process already listens where the engine is to listen.

    Readiness and health are asked over HTTP at that address, so another server there (a
    second node's engine on the same ``--port``, a leftover engine) would answer for an
    engine that in fact failed to bind, and the node would announce a model it cannot
    serve. A connect that is refused or unanswered does not block the launch.
    """
    parts = urlsplit(url)
    host, port = parts.hostname, parts.port
    if host is None or port is None:
        return
    if await accepts_connections(host, port):
        raise EngineFailed(
            f"something already listens at {url} (port {port}): another engine or service "
            f"holds the port this engine is to use; stop it or give the engine another --port"
        )

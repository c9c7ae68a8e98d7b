"""The control process's side of ``--workers N``: spawn the data-path workers, keep them
fed with the federation's state, add up what they report, and stop them.

- The node's HTTP port is reserved here (bound with ``SO_REUSEPORT``, never listened on)
  so that ``--http-port 0`` still gives every worker the same port; each worker binds it
  too and listens, and the kernel spreads connections over them.
- A snapshot (``view.snapshot_of``) goes to every worker whenever the registry, the
  suspected peers or this node's own state changed, checked every ``PUSH_INTERVAL_S``.
- Each worker reports requests in flight (total and per serving session), its metrics and
  its trace records; the node adds them up for draining, ``/v1/health``, ``/metrics``,
  load-aware routing and the trace file.
- An internal HTTP port on 127.0.0.1 serves the workers: the node's API (inspection,
  models, metrics) and requests for nodes behind NAT, sent on over libp2p (this process
  owns the libp2p host); the latter require the per-run token the workers were given.
- When this process's admin API changes keys or teams, ``refresh_keys`` tells every
  worker to refresh its copy of them at once and waits (bounded) until each has: a key
  the call created works, and a key it revoked is refused, on every worker when the
  call returns, not up to a refresh interval later.
- A worker that dies while the node runs is started again; workers exit when told to,
  or when this process dies (the channel closes, and the parent-death signal fires).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from otela.children import die_with_parent, wait_exited
from otela.config import NodeConfig
from otela.dataplane.errors import (
    NotDelivered,
    RequestError,
    UpstreamFailed,
    UpstreamTimeout,
    clip,
)
from otela.dataplane.http import Handler, Request, Response
from otela.dataplane.outcome import Outcome
from otela.dataplane.p2p_client import EngineStreamClient
from otela.dataplane.relay import relay, send_error
from otela.registry.store import Registry
from otela.workers.channel import Channel, ChannelClosed
from otela.workers.worker import INTERNAL_PREFIX, INTERNAL_TOKEN

log = logging.getLogger("otela.workers")

PUSH_INTERVAL_S = 0.05
LOAD_PUSH_EVERY = 10  # push intervals between two load states (0.5 s)
RESTART_DELAY_S = 1.0
STOP_TIMEOUT_S = 5.0
# How long an admin call waits for the workers to refresh their keys (a worker whose
# database is slow refreshes on its own schedule, within a second of it answering).
KEYS_REFRESH_TIMEOUT_S = 2.0


def reserve_port(host: str, port: int) -> socket.socket:
    """Bind (not listen) ``host:port`` with ``SO_REUSEPORT``: the port is ours and the
    workers can bind it too; no connection is ever queued on this socket."""
    family, _, _, _, address = socket.getaddrinfo(
        host or "0.0.0.0", port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except BaseException:
        sock.close()
        raise
    return sock


@dataclass
class _Worker:
    index: int
    channel: Channel | None = None
    process: subprocess.Popen[bytes] | None = None
    report: dict[str, Any] = field(default_factory=dict)
    received: int = 0  # reports received from this slot, over its restarts
    keys_round: int = 0  # the last key refresh it has done when told (``refresh_keys``)


class WorkerPool:
    def __init__(self, config: NodeConfig, count: int, state_key: Callable[[], Any],
                 snapshot: Callable[[], dict[str, Any]],
                 on_traces: Callable[[list[dict[str, Any]]], None],
                 load_state: Callable[[], dict[str, Any]] = dict,
                 start_state: Callable[[], dict[str, Any]] = dict) -> None:
        self.config = config
        self.count = count
        self.state_key = state_key  # cheap: changes whenever ``snapshot`` would
        self.snapshot = snapshot  # the current state to route with (``view.snapshot_of``)
        self.on_traces = on_traces
        self.load_state = load_state  # the node's load and others' reports, for routing
        self.start_state = start_state  # what a worker starting is sent after the snapshot
        self.token = os.urandom(16).hex().encode()
        self.workers = [_Worker(i + 1) for i in range(count)]
        self.port = 0
        self.internal_port = 0
        self.restarts = 0
        self._stopping = False
        self._last_key: Any = None
        self._last_busy: dict[str, int] = {}
        self._keys_round = 0
        self._keys_refreshed = trio.Event()  # set (and replaced) at every worker's answer

    # -- what the workers report ---------------------------------------------------------

    def in_flight(self) -> int:
        return sum(int(w.report.get("inflight", 0)) for w in self.workers)

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no worker has a request in flight, judged only on reports sent after
        this call (``False`` if ``timeout`` ran out first). A report from before can miss
        a request accepted since: a stream answered just before SIGTERM was cut when the
        drain trusted a report a fraction of a reporting interval old."""
        marks = [w.received for w in self.workers]
        with trio.move_on_after(timeout):
            while True:
                fresh = all(w.channel is None or w.received > mark
                            for w, mark in zip(self.workers, marks, strict=True))
                if fresh and self.in_flight() == 0:
                    return True
                await trio.sleep(0.05)
        return False

    def busy(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for worker in self.workers:
            total.update(worker.report.get("busy", {}))
        return total

    def reports(self) -> list[dict[str, Any]]:
        return [w.report for w in self.workers]

    def total(self, key: str) -> int:
        return sum(int(w.report.get(key, 0)) for w in self.workers)

    def metric_states(self) -> list[dict[str, Any]]:
        return [w.report["metrics"] for w in self.workers if "metrics" in w.report]

    async def refresh_keys(self, timeout: float = KEYS_REFRESH_TIMEOUT_S) -> bool:
        """Tell every worker to read the keys and teams again now; wait until each running
        one has (``False`` if ``timeout`` ran out first). A worker starting meanwhile
        reads them whole as it starts."""
        self._keys_round += 1
        wanted = self._keys_round
        await self._broadcast({"refresh_keys": wanted})
        with trio.move_on_after(timeout):
            while any(w.channel is not None and w.keys_round < wanted
                      for w in self.workers):
                await self._keys_refreshed.wait()
            return True
        return False

    # -- running ---------------------------------------------------------------------------

    async def run(self, internal: Handler, *,
                  task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Reserve the port, serve the internal port, start and supervise the workers."""
        from otela.dataplane.http import HttpServer

        reserved = reserve_port(self.config.listen_host, self.config.http_port)
        self.port = int(reserved.getsockname()[1])
        try:
            async with trio.open_nursery() as nursery:
                bound = await nursery.start(HttpServer(internal).run, "127.0.0.1", 0)
                self.internal_port = int(bound[0][1])
                ready = []
                for worker in self.workers:
                    started = trio.Event()
                    ready.append(started)
                    nursery.start_soon(self._supervise, worker, started)
                for started in ready:
                    await started.wait()
                nursery.start_soon(self._push)
                task_status.started(self.port)
                await trio.sleep_forever()
        finally:
            reserved.close()

    async def stop(self) -> None:
        """Tell every worker to stop; wait (bounded) until they have."""
        self._stopping = True
        for worker in self.workers:
            if worker.channel is not None:
                with contextlib.suppress(ChannelClosed):
                    await worker.channel.send({"stop": True})
        with trio.move_on_after(STOP_TIMEOUT_S):
            for worker in self.workers:
                while worker.process is not None and worker.process.poll() is None:
                    await trio.sleep(0.02)
        for worker in self.workers:
            if worker.process is not None and worker.process.poll() is None:
                worker.process.kill()

    async def _supervise(self, worker: _Worker, started: trio.Event) -> None:
        while not self._stopping:
            ours, theirs = socket.socketpair()
            env = {**os.environ, "OTELA_WORKER_FD": str(theirs.fileno())}
            process = subprocess.Popen(
                [sys.executable, "-m", "otela.workers.worker"], pass_fds=[theirs.fileno()],
                env=env, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
            theirs.close()
            pidfd = os.pidfd_open(process.pid)
            channel = Channel(ours)
            worker.channel, worker.process, worker.report = channel, process, {}
            try:
                async with trio.open_nursery() as nursery:
                    await channel.send({"config": pickle.dumps(self.config),
                                        "index": worker.index, "port": self.port,
                                        "internal_port": self.internal_port,
                                        "token": self.token})
                    await channel.send(self.snapshot())
                    start = self.start_state()
                    if start:
                        await channel.send(start)
                    nursery.start_soon(self._listen, worker, channel)
                    started.set()
                    code = await wait_exited(process, pidfd)
                    nursery.cancel_scope.cancel()
            except ChannelClosed:
                code = await wait_exited(process, pidfd)
            finally:
                os.close(pidfd)
                channel.close()
                worker.channel = None
                worker.report = {}
            if self._stopping:
                return
            self.restarts += 1
            log.error("data-path worker %d exited with %s; starting it again", worker.index,
                      code)
            await trio.sleep(RESTART_DELAY_S)

    async def _listen(self, worker: _Worker, channel: Channel) -> None:
        try:
            while True:
                report = await channel.receive()
                if "keys_refreshed" in report:  # an answer to ``refresh_keys``, no report
                    worker.keys_round = int(report["keys_refreshed"])
                    self._keys_refreshed.set()
                    self._keys_refreshed = trio.Event()
                    continue
                traces = report.pop("traces", None)
                if traces:
                    self.on_traces(traces)
                worker.report = report
                worker.received += 1
        except ChannelClosed:
            return

    async def _push(self) -> None:
        """A full snapshot when the state changed; the federation-wide per-session load
        (which changes with every request) on its own, when it changed; load figures and
        reports every ``LOAD_PUSH_EVERY`` rounds."""
        rounds = 0
        while True:
            rounds += 1
            if rounds % LOAD_PUSH_EVERY == 0:
                await self._broadcast({"load": self.load_state()})
            key = self.state_key()
            if key != self._last_key:
                self._last_key = key
                await self._broadcast(self.snapshot())
            busy = dict(self.busy())
            if busy != self._last_busy:
                self._last_busy = busy
                await self._broadcast({"busy": busy})
            await trio.sleep(PUSH_INTERVAL_S)

    async def _broadcast(self, message: dict[str, Any]) -> None:
        for worker in self.workers:
            if worker.channel is not None:
                # (closed: its supervisor restarts it, and sends it the state)
                with contextlib.suppress(ChannelClosed):
                    await worker.channel.send(message)


class InternalRoutes:
    """The control process's internal port: requests for nodes behind NAT, relayed over
    libp2p on the workers' behalf (token required), and the node's API."""

    def __init__(self, pool: WorkerPool, registry: Registry, p2p: EngineStreamClient,
                 api: Handler, first_byte_timeout: float) -> None:
        self.pool = pool
        self.registry = registry
        self.p2p = p2p
        self.api = api
        self.first_byte_timeout = first_byte_timeout

    async def __call__(self, request: Request, response: Response) -> None:
        prefix = INTERNAL_PREFIX + "/p2p/"
        if not request.path.startswith(prefix):
            await self.api(request, response)
            return
        if request.header(INTERNAL_TOKEN) != self.pool.token:
            await send_error(response, RequestError(403, "not for you", code="forbidden"))
            return
        target = request.target.decode("latin-1")[len(prefix):]
        session, _, rest = target.partition("/")
        node = self.registry.get(session)
        headers = [(k, v) for k, v in request.headers if k != INTERNAL_TOKEN]
        try:
            if node is None:
                raise NotDelivered(f"no session {clip(session)}")
            try:
                with trio.fail_after(self.first_byte_timeout):
                    reply = await self.p2p.request(node, "/" + rest, request.body, headers)
            except trio.TooSlowError:
                raise UpstreamTimeout(f"no answer within {self.first_byte_timeout:.0f} s"
                                      ) from None
        except (NotDelivered, UpstreamFailed, UpstreamTimeout) as exc:
            # The same outcome, flags and all, as the worker would have seen itself.
            await send_error(response, Outcome.of_exception(exc).error())
            return
        # A stream that breaks is cut short, as the hop cut it: the worker ends its
        # client's stream itself, as it would for a node it reached directly.
        await relay(reply, response, [], end_client_streams=False)

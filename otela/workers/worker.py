"""A data-path worker: one of ``--workers N`` processes sharing a node's HTTP port.

The control process (the node: libp2p, the registry, the failure detector, the engine)
spawns it with one end of a socket pair and sends it the node's settings, the port, and a
snapshot of the federation whenever it changes (``view.py``). The worker answers what
reaches it on the port (the kernel spreads connections over the workers, ``SO_REUSEPORT``):

- routed OpenAI requests and the engine hop, exactly as a single-process node does;
- requests for nodes behind NAT go through the control process (it owns libp2p);
- everything else (inspection, models, metrics) is relayed to the control process.
Every quarter second it reports what only it knows: requests in flight (in total and per
serving session, so a draining node waits for all of them and load-aware routing sees the
whole node), its metrics, and the trace records it made. It exits when the control process
tells it to, or when the channel closes (the control process died: a worker must not
outlive it). Stop signals are the control process's business.

Run by the control process as ``python -m otela.workers.worker`` with
``OTELA_WORKER_FD`` naming the inherited socket.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import socket
import sys
import time
from typing import Any

import trio

from otela.api.assembly import Surroundings, assemble
from otela.api.observe import AccessLog, Observer, RequestMetrics
from otela.config import NodeConfig
from otela.dataplane.exchange import Exchange
from otela.dataplane.hop_auth import HopSigner, HopVerifier
from otela.dataplane.http import Request, Response
from otela.dataplane.pool import HttpPool
from otela.dataplane.relay import relay
from otela.dataplane.upstream import Reply, unless_outcome
from otela.identity import load_or_create
from otela.load.engine_metrics import EngineLoad
from otela.load.source import LoadSource
from otela.looplag import LagSampler, freeze_startup_objects
from otela.metrics import LAG_BUCKETS, Registry
from otela.registry.records import NodeRecord
from otela.routing.hold import ModelFirstByte
from otela.services import require_ingress_plugin
from otela.workers.channel import Channel, ChannelClosed
from otela.workers.view import WorkerView

log = logging.getLogger("otela.worker")

INTERNAL_PREFIX = "/otela-internal"
INTERNAL_TOKEN = b"x-otela-internal"
REPORT_INTERVAL_S = 0.25
# Hop-by-hop and framing headers of a client's API request, not relayed to the control.
_NOT_RELAYED = frozenset({b"host", b"content-length", b"transfer-encoding", b"connection",
                          b"keep-alive", b"te", b"trailer", b"upgrade", b"expect"})


class ControlRelay:
    """Requests for nodes behind NAT, and everything that is not the request path, go to
    the control process's internal HTTP port (``otela.workers.control``)."""

    def __init__(self, pool: HttpPool, port: int, token: bytes, timeout: float) -> None:
        self.pool = pool
        self.port = port
        self.token = token
        self.timeout = timeout

    async def request(self, record: NodeRecord, path: str, body: bytes,
                      headers: list[tuple[bytes, bytes]]) -> Reply:
        target = f"{INTERNAL_PREFIX}/p2p/{record.session_id}{path}".encode()
        reply = await self.pool.request("127.0.0.1", self.port, b"POST", target,
                                        [*headers, (INTERNAL_TOKEN, self.token)], body,
                                        self.timeout)
        return await unless_outcome(reply, f"node {record.peer_id} over libp2p")

    async def api(self, request: Request, response: Response) -> None:
        """Relay a request for the node's API to the control process (the pool sets the
        body's length itself: the client's framing headers would be said twice)."""
        headers = [(k, v) for k, v in request.headers if k not in _NOT_RELAYED]
        reply = await self.pool.request("127.0.0.1", self.port, request.method.encode(),
                                        request.target, headers, request.body, self.timeout)
        await relay(reply, response, [])


class TraceForwarding:
    """Trace records go to the control process, which owns the (rotating) trace file."""

    def __init__(self) -> None:
        self.pending: list[dict[str, Any]] = []

    def finished(self, exchange: Exchange) -> None:
        tap = exchange.tap
        self.pending.append({
            "arrival": exchange.arrival, "model": exchange.model,
            "input_tokens": (tap.prompt_tokens or 0) if tap else 0,
            "output_tokens": tap.output_tokens if tap else 0, "status": exchange.status,
            "ttft_s": exchange.first_byte, "e2e_s": exchange.duration,
            "itl_s": tap.gaps if tap and tap.gaps else None, "error": exchange.error,
            "provider": exchange.node_provider or None, "node": exchange.node_peer or None,
            "api_key": exchange.api_key, "stream": exchange.stream,
            "max_tokens": exchange.max_tokens, "request_id": exchange.request_id,
            "prompt": exchange.prompt})


class Worker:
    def __init__(self, config: NodeConfig, index: int, port: int, internal_port: int,
                 token: bytes, channel: Channel) -> None:
        self.config = config
        self.index = index
        self.port = port
        self.channel = channel
        self.view = WorkerView()
        identity = load_or_create(config.home)
        peer_id, key = identity.peer_id.to_base58(), identity.key_pair.private_key
        self.load = LoadSource(1.0, others=self._others_in_flight)
        self.metrics = Registry()
        lag = self.metrics.histogram("otela_event_loop_lag_seconds", "Event-loop lag.",
                                     LAG_BUCKETS, labels=("process",))
        self.lag = LagSampler(lag, label=f"worker-{index}")
        observers: list[Observer] = [RequestMetrics(self.metrics), ModelFirstByte(self.metrics)]
        self.access_log = AccessLog(config.access_log) if config.access_log else None
        if self.access_log is not None:
            observers.append(self.access_log)
        self.traces = TraceForwarding() if config.record_trace else None
        if self.traces is not None:
            observers.append(self.traces)
        # The ingress service's key gate and usage rows, in this process too (its own
        # connection; its own ingress id, so its siblings' use counts against its limits).
        self.ingress_service = None if config.ingress_db is None else (
            require_ingress_plugin().open(config, f"{peer_id}/w{index}"))
        if self.ingress_service is not None:
            observers += self.ingress_service.observers(self.metrics)
        # The request path, assembled as the node assembles its own (otela.api.assembly);
        # the control process serves the node's API and reaches nodes behind NAT.
        api_pool = HttpPool(connect_timeout=config.connect_timeout)
        self.control = ControlRelay(api_pool, internal_port, token, config.response_timeout)
        path = assemble(config, Surroundings(
            registry=lambda: self.view.registry, session=lambda: self.view.session_id,
            engine_url=lambda: self.view.engine_url, served_models=lambda: self.view.models,
            avoided=lambda: self.view.suspected, relayed=self.control,
            signer=HopSigner(key.to_bytes(), peer_id),
            verifier=HopVerifier(key.to_bytes(), peer_id,
                                 lambda peer: self.view.registry.is_member(peer)),
            load=self.load, fallback=self.control.api, observers=observers,
            metrics=self.metrics, keys=self.ingress_service, serve_metrics=False,
            reuse_port=True, warming=lambda: self.view.warming))
        self.pool, self.upstreams, self.router = path.pool, path.upstreams, path.router
        self.inflight, self.server = path.inflight, path.server

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.lag.run)
            if self.access_log is not None:
                await nursery.start(self.access_log.run)
            if self.ingress_service is not None:
                await nursery.start(self.ingress_service.run)
            # The first snapshot before the first request: no request routes on nothing.
            self._take(await self.channel.receive())
            await nursery.start(self.server.run, self.config.listen_host, self.port)
            nursery.start_soon(self._report)
            nursery.start_soon(self._sweep)
            nursery.start_soon(self.router.watch_failures)
            try:
                while True:
                    message = await self.channel.receive()
                    if message.get("stop"):
                        break
                    if "refresh_keys" in message:
                        nursery.start_soon(self._refresh_keys, int(message["refresh_keys"]))
                        continue
                    self._take(message)
            except ChannelClosed:
                log.warning("worker %d: the control process is gone; exiting", self.index)
            nursery.cancel_scope.cancel()
        self.pool.close()
        self.control.pool.close()

    def _take(self, snapshot: dict[str, Any]) -> None:
        self.view.update(snapshot, time.time())
        self.router.registry = self.view.registry
        self.router.shared_busy = self.view.busy
        if "load" in snapshot:
            load = self.view.load
            self.router.loads.absorb(load.get("reports", {}), trio.current_time())
            if "cache" in load:
                self.router.cache.board.absorb(load["cache"], trio.current_time())
            engine = load.get("engine") or {}
            self.load.engine = EngineLoad(engine.get("running"), engine.get("waiting"),
                                          engine.get("kv_usage"))
            self.load.capacity = float(load.get("capacity", self.load.capacity))
            slots = load.get("slots")
            self.load.slots = None if slots is None else int(slots)

    async def _refresh_keys(self, round_: int) -> None:
        """The control process's admin API changed keys: read them again now, then say so
        (a database that fails answers too: the periodic refresh takes over)."""
        if self.ingress_service is not None:
            await self.ingress_service.refresh_keys()
        await self.channel.send({"keys_refreshed": round_})

    def _others_in_flight(self) -> int:
        """The node's engine requests through its other processes, as last reported."""
        total = int(self.view.load.get("engine_in_flight", 0))
        return max(0, total - self.load.in_flight)

    async def _report(self) -> None:
        while True:
            await trio.sleep(REPORT_INTERVAL_S)
            traces = self._take_traces()
            await self.channel.send({
                "inflight": self.inflight.count, "busy": dict(self.router.busy),
                "engine_in_flight": self.load.in_flight,
                "ejections": self.router.ejections.total,
                "ejected": self.router.ejections.report(trio.current_time()),
                "retries": self.router.retries, "resent": self.router.resent,
                "migrated": self.router.migrated,
                **{f"cache_{k}": v for k, v in self.router.cache.stats.items()},
                "abandoned": self.router.watch.abandoned, "connects": self.pool.connects,
                "connect_failures": self.pool.connect_failures,
                "metrics": self.metrics.state(), "traces": traces})

    def _take_traces(self) -> list[dict[str, Any]]:
        if self.traces is None:
            return []
        taken, self.traces.pending = self.traces.pending, []
        return taken

    async def _sweep(self) -> None:
        while True:
            await trio.sleep(self.pool.idle_timeout)
            self.pool.sweep()
            self.control.pool.sweep()


def main() -> None:
    for name in ("SIGINT", "SIGTERM"):  # the control process decides when we stop
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    sock = socket.socket(fileno=int(os.environ["OTELA_WORKER_FD"]))
    channel = Channel(sock)

    async def start() -> None:
        hello = await channel.receive()
        config: NodeConfig = pickle.loads(hello["config"])
        logging.basicConfig(level=getattr(logging, config.log_level, logging.INFO),
                            stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        worker = Worker(config, int(hello["index"]), int(hello["port"]),
                        int(hello["internal_port"]), hello["token"], channel)
        freeze_startup_objects()
        await worker.run()

    with contextlib.suppress(ChannelClosed):
        trio.run(start)


if __name__ == "__main__":
    main()

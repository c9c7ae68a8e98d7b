"""This node's own load report: requests its engine has open through otela (every
ingress's), what the engine's metrics say, and its capacity weight. The engine hop puts
it on every answer (``x-otela-load``); the gossip publisher sends it at a bounded rate.

The engine's metrics are read every ``interval`` seconds while the node serves; an
engine without Prometheus metrics (404, or nothing otela understands) is asked again
only every ``RETRY_MISSING_S``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from otela.dataplane.errors import NotDelivered, UpstreamFailed, UpstreamTimeout
from otela.dataplane.pool import HttpPool
from otela.dataplane.upstream import engine_address
from otela.load.engine_metrics import EngineLoad, parse_engine_metrics
from otela.routing.load import NodeLoad

log = logging.getLogger("otela.load")

RETRY_MISSING_S = 60.0
MAX_METRICS_BYTES = 4 * 1024 * 1024


class LoadSource:
    def __init__(self, capacity: float, others: Callable[[], int] = lambda: 0,
                 slots: int | None = None) -> None:
        self.capacity = capacity
        self.slots = slots  # --max-concurrency: requests the engine takes at once
        self.in_flight = 0  # engine requests open through this process
        # ...and through the node's other processes (data-path workers; for a worker, the
        # rest of the node, as the control process last said)
        self.others_in_flight = others
        self.engine = EngineLoad()
        self.engine_source: str | None = None  # "vllm", "sglang": whose metrics we read
        self._header: bytes | None = None
        self._header_key: tuple[int, EngineLoad] | None = None

    def start(self) -> None:
        self.in_flight += 1

    def end(self) -> None:
        self.in_flight -= 1

    def current(self, answering: int = 0) -> NodeLoad:
        """The node's load; ``answering`` requests are left out (see ``header``)."""
        engine = self.engine
        in_flight = max(0, self.in_flight + self.others_in_flight() - answering)
        return NodeLoad(in_flight=in_flight, running=engine.running, waiting=engine.waiting,
                        kv_usage=engine.kv_usage, capacity=self.capacity, slots=self.slots)

    def header(self) -> bytes:
        """The ``x-otela-load`` value for an answer (rebuilt only when it changed). It
        leaves out the request being answered: the ingress counts that one itself while
        it lasts, and counting it twice would make a node look busy to a user's next
        request once this one is done (prefix affinity would then move the user)."""
        key = (self.in_flight + self.others_in_flight(), self.engine)
        if key != self._header_key:
            self._header_key, self._header = key, self.current(answering=1).header()
        assert self._header is not None
        return self._header


async def read_engine_metrics(pool: HttpPool, engine_url: str, timeout: float = 2.0
                              ) -> EngineLoad | None:
    """The engine's load figures, or ``None`` if it has no metrics otela reads."""
    host, port, prefix = engine_address(engine_url)
    try:
        reply = await pool.request(host, port, b"GET", (prefix + "/metrics").encode(),
                                   [(b"accept", b"text/plain")], b"", timeout)
    except (NotDelivered, UpstreamFailed, UpstreamTimeout):
        return None
    if reply.status != 200 or (reply.content_length or 0) > MAX_METRICS_BYTES:
        await reply.aclose()
        return None
    body = b""
    try:
        with trio.move_on_after(timeout):
            body = await reply.read()
    except UpstreamFailed:
        return None
    load = parse_engine_metrics(body.decode("utf-8", "replace"))
    return None if load.empty else load


async def poll_engine(source: LoadSource, pool: HttpPool,
                      engine_url: Callable[[], str | None], interval: float) -> None:
    """Keep ``source.engine`` current while the node serves (runs for ever)."""
    missing_until = 0.0
    while True:
        await trio.sleep(interval)
        url = engine_url()
        if url is None or trio.current_time() < missing_until:
            if url is None:
                source.engine = EngineLoad()
            continue
        load = await read_engine_metrics(pool, url)
        if load is None:
            if source.engine_source is not None or missing_until == 0.0:
                log.info("the engine has no load metrics otela reads; reporting in-flight "
                         "requests only")
            source.engine, source.engine_source = EngineLoad(), None
            missing_until = trio.current_time() + RETRY_MISSING_S
            continue
        source.engine = load
        source.engine_source = "engine metrics"

"""What happens with each finished request: metrics, the access log, trace recording.

Each observer gets the finished ``Exchange`` once, on the request path, so each does a few
dictionary updates or queues one record and returns; anything slow (writing files) happens
later in a task of its own.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Protocol

import orjson
import trio

from otela.dataplane.exchange import Exchange
from otela.metrics import Registry
from otela.tracing.recorder import TraceRecorder


class Observer(Protocol):
    def finished(self, exchange: Exchange) -> None: ...


class RequestMetrics:
    """``otela_requests_total`` (route, model, status, serving node), request duration and
    time to first byte by route (histograms)."""

    def __init__(self, registry: Registry) -> None:
        self.requests = registry.counter(
            "otela_requests_total", "Requests answered, by route, model, status and the "
            "serving node's peer id (empty when no node took it).",
            ("route", "model", "status", "node"))
        self.duration = registry.histogram(
            "otela_request_duration_seconds", "Time from the request's arrival to the end "
            "of its response, by route.", labels=("route",))
        self.first_byte = registry.histogram(
            "otela_request_first_byte_seconds", "Time from the request's arrival to the first "
            "response byte relayed from the engine (time to first token for streams), by "
            "route.", labels=("route",))
        self.output_tokens = registry.counter(
            "otela_output_tokens_total", "Completion tokens relayed, by model.", ("model",))
        self.input_tokens = registry.counter(
            "otela_input_tokens_total", "Prompt tokens relayed, by model (when the engine "
            "reported usage).", ("model",))

    def finished(self, exchange: Exchange) -> None:
        route = exchange.route
        self.requests.inc(route, exchange.model, str(exchange.status), exchange.node_peer)
        self.duration.observe(exchange.duration, route)
        first = exchange.first_byte
        if first is not None:
            self.first_byte.observe(first, route)
        tap = exchange.tap
        if tap is not None:
            if tap.output_tokens:
                self.output_tokens.inc(exchange.model, by=tap.output_tokens)
            if tap.prompt_tokens:
                self.input_tokens.inc(exchange.model, by=tap.prompt_tokens)


class AccessLog:
    """One JSON line per request (``--access-log PATH``, ``-`` for stdout), buffered and
    flushed by ``run`` every ``flush_interval`` seconds, off the request path."""

    def __init__(self, target: str, flush_interval: float = 1.0) -> None:
        self.target = target
        self.flush_interval = flush_interval
        self._lines: list[bytes] = []

    def finished(self, exchange: Exchange) -> None:
        tap = exchange.tap
        self._lines.append(orjson.dumps({
            "ts": round(exchange.arrival, 6),
            "request_id": exchange.request_id,
            "route": exchange.route,
            "model": exchange.model,
            "status": exchange.status,
            "error": exchange.error,
            "stream": exchange.stream,
            "node": exchange.node_peer or None,
            "provider": exchange.node_provider or None,
            "path": exchange.path_kind or None,
            "attempts": exchange.attempts,
            "duration_ms": round(exchange.duration * 1e3, 3),
            "first_byte_ms": None if exchange.first_byte is None
            else round(exchange.first_byte * 1e3, 3),
            "bytes": exchange.bytes_out,
            "prompt_tokens": tap.prompt_tokens if tap else None,
            "completion_tokens": tap.output_tokens if tap else None,
        }) + b"\n")

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        out: io.BufferedWriter = (open(1, "wb", closefd=False) if self.target == "-"  # noqa: SIM115
                                  else Path(self.target).expanduser().open("ab"))
        task_status.started()
        try:
            while True:
                await trio.sleep(self.flush_interval)
                self._flush(out)
        finally:
            self._flush(out)
            if self.target != "-":
                out.close()

    def _flush(self, out: io.BufferedWriter) -> None:
        if self._lines:
            lines, self._lines = self._lines, []
            out.write(b"".join(lines))
            out.flush()


class TraceRecording:
    """Feeds ``--record-trace``'s recorder (``otela.tracing.recorder``): one record per request."""

    def __init__(self, recorder: TraceRecorder) -> None:
        self.recorder = recorder

    def finished(self, exchange: Exchange) -> None:
        tap = exchange.tap
        first = exchange.first_byte
        self.recorder.record(
            arrival=exchange.arrival, model=exchange.model,
            input_tokens=(tap.prompt_tokens or 0) if tap else 0,
            output_tokens=tap.output_tokens if tap else 0,
            status=exchange.status, ttft_s=first, e2e_s=exchange.duration,
            itl_s=tap.gaps if tap and tap.gaps else None,
            error=exchange.error, provider=exchange.node_provider or None,
            node=exchange.node_peer or None, api_key=exchange.api_key,
            stream=exchange.stream, max_tokens=exchange.max_tokens,
            request_id=exchange.request_id, prompt=exchange.prompt,
        )

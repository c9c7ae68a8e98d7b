"""Replay a trace against an endpoint: open loop (arrivals as recorded) or closed loop.

Open loop sends each request at `start + arrival / speed` whatever the endpoint does (so a
slow endpoint builds a queue, as in production); closed loop keeps N requests in flight
(like `vllm bench serve --max-concurrency`). Every request becomes a record of the result
trace with its measured TTFT, inter-token latencies, end-to-end latency, status and error
kind, and `send_lag`: how late it was sent versus its schedule (the replayer's own error).

Timing: the dispatcher waits on a high-resolution timer (`timer.PreciseTimer`: a timerfd,
because epoll's own timeouts overshoot by milliseconds) until 0.5 ms before a request is due,
then yields in a tight loop until it is due, so sends land within microseconds of schedule
while other tasks keep running.
"""

from __future__ import annotations

import gc
import itertools
import math
import resource
import secrets
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import trio

from otela.tracing.schema import TraceRecord, hash_id, make_header
from traces.io import Trace
from traces.replay.client import (
    ConnectError,
    Connection,
    Endpoint,
    Pool,
    ProtocolError,
    ResetError,
    Response,
    exchange,
)
from traces.replay.payload import PayloadBuilder
from traces.replay.timer import PreciseTimer

LEAD_S = 0.05  # head start before the first arrival, to build the first payloads


@dataclass
class ReplayOptions:
    """How to replay (see `otela trace replay --help` for the user-facing meaning)."""

    url: str
    speed: float = 1.0
    api_key: str | None = None
    stream: bool = True
    api: str = "completions"
    closed_loop: bool = False
    concurrency: int | None = None  # closed loop: workers; open loop: cap on requests in flight
    timeout_s: float = 600.0
    model: str | None = None
    exact_output: bool = True
    warm_connections: int | None = None
    hash_ids: bool = False
    seed: int | None = None  # prompt ids; None: fresh per run, so no run hits another's cache

    def __post_init__(self) -> None:
        if self.speed <= 0:
            raise ValueError("--speed must be > 0")
        if self.closed_loop and not self.concurrency:
            raise ValueError("closed-loop replay needs --concurrency N")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError("--concurrency must be >= 1")
        if self.api not in ("completions", "chat"):
            raise ValueError("--api is completions or chat")


@dataclass
class Live:
    """Counters the request tasks update and the progress callback reads."""

    total: int
    sent: int = 0
    done: int = 0
    failed: int = 0
    inflight: int = 0
    out_tokens: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    started: float = 0.0
    interrupted: bool = False


class Replayer:
    """One replay run; `run()` returns the result trace."""

    def __init__(
        self,
        trace: Trace,
        opts: ReplayOptions,
        progress: Callable[[Live], None] | None = None,
        progress_interval: float = 0.25,
    ) -> None:
        self.trace = trace
        self.opts = opts
        self.ep = Endpoint.parse(opts.url)
        self.pool = Pool(self.ep)
        self.builder = PayloadBuilder(
            host=self.ep.host_header,
            path_prefix=self.ep.prefix,
            api=opts.api,
            stream=opts.stream,
            api_key=opts.api_key,
            model_override=opts.model,
            exact_output=opts.exact_output,
            seed=opts.seed if opts.seed is not None else secrets.randbits(32),
        )
        self.live = Live(total=len(trace))
        self.results: list[TraceRecord] = []
        self.progress = progress
        self.progress_interval = progress_interval
        self.t0 = 0.0
        self._slots: trio.Semaphore | None = None
        self._spare = 0
        self._need_conn = trio.Event()

    # ---- the run --------------------------------------------------------------------
    async def run(self) -> Trace:
        _raise_fd_limit()
        gc.collect()
        gc.freeze()  # the trace itself never becomes garbage: keep collections short
        threshold = gc.get_threshold()
        gc.set_threshold(50_000, 50, 100)
        try:
            return await self._run()
        finally:
            gc.set_threshold(*threshold)
            gc.unfreeze()

    async def _run(self) -> Trace:
        recs = self.trace.records
        self.t0 = time.perf_counter() + LEAD_S
        self.live.started = self.t0
        async with trio.open_nursery() as outer:
            outer.start_soon(self._watch_signals, outer.cancel_scope)
            if self.progress is not None:
                outer.start_soon(self._progress_loop)
            self._spare = self._warm_count()
            await self._warm(self._spare)
            if not self.opts.closed_loop:
                outer.start_soon(self._keep_warm)
            self.t0 = time.perf_counter() + LEAD_S
            self.live.started = self.t0
            async with trio.open_nursery() as requests:
                if self.opts.closed_loop:
                    it = iter(recs)
                    for _ in range(min(self.opts.concurrency or 1, len(recs))):
                        requests.start_soon(self._worker, it)
                else:
                    if self.opts.concurrency:
                        self._slots = trio.Semaphore(self.opts.concurrency)
                    await self._dispatch(recs, requests)
            outer.cancel_scope.cancel()
        await self.pool.aclose()
        if self.progress is not None:
            self.progress(self.live)
        return self._result_trace()

    def _warm_count(self) -> int:
        if self.opts.warm_connections is not None:
            return self.opts.warm_connections
        if self.opts.closed_loop:
            return min(self.opts.concurrency or 1, 256)
        recs = self.trace.records
        if len(recs) < 2:
            return 1
        rate = (len(recs) - 1) / max(recs[-1].arrival - recs[0].arrival, 1e-6) * self.opts.speed
        return int(min(256, max(4, math.ceil(rate * 0.02))))

    async def _warm(self, n: int) -> None:
        for _ in range(n):
            try:
                conn = await self.pool.open()
            except ConnectError:
                return  # the requests will record the connect errors
            self.pool.put(conn)
            conn.reused = False

    async def _keep_warm(self) -> None:
        """Open connections in the background whenever fewer than `_spare` are idle, so a
        request due now rarely waits for a TCP handshake (long streams hold theirs)."""
        while True:
            await self._need_conn.wait()
            self._need_conn = trio.Event()
            while len(self.pool.idle) < self._spare:
                try:
                    conn = await self.pool.open()
                except ConnectError:
                    break
                self.pool.put(conn)
                conn.reused = False

    async def _dispatch(self, recs: list[TraceRecord], nursery: trio.Nursery) -> None:
        timer = PreciseTimer()
        try:
            await self._dispatch_all(recs, nursery, timer)
        finally:
            timer.close()

    async def _dispatch_all(
        self, recs: list[TraceRecord], nursery: trio.Nursery, timer: PreciseTimer
    ) -> None:
        base = recs[0].arrival if recs else 0.0
        speed = self.opts.speed
        for rec in recs:
            due = self.t0 + (rec.arrival - base) / speed
            request = self.builder.request(rec)
            await timer.sleep_until(due)
            if self._slots is not None:
                await self._slots.acquire()
            self.live.sent += 1
            self.live.inflight += 1
            if len(self.pool.idle) <= self._spare // 2:
                self._need_conn.set()
            if self.pool.idle:  # send inline: the timestamp is the moment the bytes leave
                conn = self.pool.idle.pop()
                t_send = time.perf_counter()
                try:
                    written = conn.send_now(request)  # no yield: a due burst goes out at once
                except OSError:
                    conn.usable = False  # the task retries on a fresh connection
                    written = 0
                nursery.start_soon(self._one, rec, request, due, conn, t_send, written)
            else:
                nursery.start_soon(self._one, rec, request, due, None, None, 0)

    async def _worker(self, it: Iterator[TraceRecord]) -> None:
        for rec in it:
            request = self.builder.request(rec)
            self.live.sent += 1
            self.live.inflight += 1
            await self._one(rec, request, None, None, None, 0)

    # ---- one request ----------------------------------------------------------------
    async def _one(
        self,
        rec: TraceRecord,
        request: bytes,
        due: float | None,
        conn: Connection | None,
        t_send: float | None,
        written: int,
    ) -> None:
        """Complete one request. The dispatcher may already have written its first `written`
        bytes on `conn` at `t_send` (or found the connection dead: `conn.usable` False)."""
        if t_send is None:
            t_send = time.perf_counter()
        out = TraceRecord(
            arrival=t_send - self.t0,
            model=self.opts.model or rec.model,
            input_tokens=rec.input_tokens,
            output_tokens=0,
            request_id=rec.request_id,
            stream=self.opts.stream,
            max_tokens=rec.output_tokens,
            prefix_hash=rec.prefix_hash,
            prefix_len=rec.prefix_len,
            send_lag=None if due is None else t_send - due,
        )
        resp: Response | None = None
        try:
            with trio.fail_after(self.opts.timeout_s):
                resp = await self._send(request, conn, written)
        except ConnectError:
            out.status, out.error = 0, "connect"
        except trio.TooSlowError:
            out.status, out.error = 0, "timeout"
        except ResetError:
            out.status, out.error = 0, "reset"
        except ProtocolError:
            out.status, out.error = 0, "protocol"
        if resp is not None:
            self._fill(out, resp, t_send)
        self.results.append(out)
        live = self.live
        live.inflight -= 1
        live.done += 1
        if out.ok:
            live.out_tokens += out.output_tokens
        else:
            live.failed += 1
            live.errors[out.error or "?"] += 1
        if self._slots is not None:
            self._slots.release()

    async def _send(self, request: bytes, conn: Connection | None, written: int) -> Response:
        conn = conn or await self.pool.get()
        try:
            try:
                if not conn.usable:
                    raise ResetError("connection closed before sending")
                rest = request[written:] if written < len(request) else None
                resp = await exchange(conn, rest, self.opts.stream)
            except ResetError:
                if not conn.reused:
                    raise
                # a keep-alive connection the server had closed: retry once on a fresh one
                await conn.aclose()
                conn = await self.pool.open()
                resp = await exchange(conn, request, self.opts.stream)
        except BaseException:  # timeout, cancellation, errors: the socket is not reusable
            await conn.aclose()
            raise
        if conn.usable:
            self.pool.put(conn)
        else:
            await conn.aclose()
        return resp

    def _fill(self, out: TraceRecord, resp: Response, t_send: float) -> None:
        out.status = resp.status
        out.e2e = resp.end - t_send
        st = resp.stream
        if resp.status < 200 or resp.status >= 300:
            out.error = f"http_{resp.status}"
        elif st is not None:
            times = st.token_times
            if st.error:
                out.error = "stream"
            elif not st.done and not times:
                out.error = "empty_stream"
            if times:
                out.ttft = times[0] - t_send
                if len(times) > 1:  # plain Python: numpy costs more than it saves here
                    itl = sorted(b - a for a, b in itertools.pairwise(times))
                    k = len(itl)
                    out.itl_mean = (times[-1] - times[0]) / k
                    out.itl_p50 = itl[k // 2] if k % 2 else (itl[k // 2 - 1] + itl[k // 2]) / 2
                    out.itl_p99 = itl[min(k - 1, round(0.99 * (k - 1)))]
                    out.itl_max = itl[-1]
            out.output_tokens = st.completion_tokens or len(times)
        else:
            out.ttft = out.e2e
            out.output_tokens = resp.completion_tokens or 0
        if resp.prompt_tokens:
            out.input_tokens = resp.prompt_tokens
        provider = resp.headers.get(b"x-otela-provider-id")
        node = resp.headers.get(b"x-otela-peer-id")
        if provider:
            p = provider.decode("latin-1")
            out.provider = hash_id(p) if self.opts.hash_ids else p
        if node:
            n = node.decode("latin-1")
            out.node = hash_id(n) if self.opts.hash_ids else n

    # ---- housekeeping ---------------------------------------------------------------
    async def _progress_loop(self) -> None:
        assert self.progress is not None
        while True:
            await trio.sleep(self.progress_interval)
            self.progress(self.live)

    async def _watch_signals(self, scope: trio.CancelScope) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                self.live.interrupted = True
                scope.cancel()
                return

    def _result_trace(self) -> Trace:
        meta: dict[str, Any] = {
            "url": self.opts.url,
            "speed": self.opts.speed,
            "mode": "closed" if self.opts.closed_loop else "open",
            "concurrency": self.opts.concurrency,
            "stream": self.opts.stream,
            "api": self.opts.api,
            "replayed": self.trace.header.get("source"),
            "requests_in_source": len(self.trace),
            "interrupted": self.live.interrupted,
            "connections_opened": self.pool.opened,
        }
        header = make_header("otela trace replay", start_time=time.time(), replay=meta)
        return Trace(header, self.results).sorted()


def _raise_fd_limit() -> None:
    """Open-loop replay against a slow endpoint holds one socket per request in flight."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def replay(
    trace: Trace, opts: ReplayOptions, progress: Callable[[Live], None] | None = None
) -> Trace:
    """Run a replay to completion (blocking; starts its own trio loop)."""
    return trio.run(Replayer(trace, opts, progress).run)

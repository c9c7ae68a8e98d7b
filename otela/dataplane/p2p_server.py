"""The serving side of ``/otela/http/2``: run members' requests against this node's engine.

The rules are the engine hop's (``gate.py``), the same as over HTTP; the caller's identity
is the stream's peer id, authenticated by Noise, and must be a member (a live session in
the registry). Refusals say "not delivered" (the engine never saw the request), so the
calling node may try another. Each request runs in its own task under the stream's
nursery; responses of concurrent requests interleave frame by frame under one send lock.
Responses stream: every chunk the engine sends becomes a DATA frame. A CANCEL frame (the
caller's client went away) cancels the request, which closes its engine connection.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable
from typing import Any, Protocol

import trio

from otela.dataplane import headers as policy
from otela.dataplane.errors import NotDelivered, UpstreamFailed, UpstreamTimeout
from otela.dataplane.gate import EngineGate, Refusal
from otela.dataplane.inflight import Inflight
from otela.dataplane.p2p_frames import (
    HTTP_PROTOCOL,
    Frame,
    FrameError,
    FrameReader,
    Kind,
    header_pairs,
    packed,
    request_path,
)
from otela.dataplane.pool import HttpPool
from otela.dataplane.upstream import engine_address
from otela.mesh.quota import HTTP_STREAMS, set_capped_handler

log = logging.getLogger("otela.dataplane")

# Requests one stream may have in flight. An ingress sends all its requests to this node on
# one stream, so this is far above any honest concurrency (the engine's own batch); it
# bounds what a misbehaving member can make us hold (a task, buffers, an engine
# connection each). Beyond it: 503, not delivered, so an ingress tries another node.
MAX_IN_FLIGHT_PER_STREAM = 1024


class LoadCounter(Protocol):
    """Counts engine requests and says the node's load (``otela.load.source.LoadSource``)."""

    def start(self) -> None: ...

    def end(self) -> None: ...

    def header(self) -> bytes: ...


class _Connection:
    """One peer's long-lived stream: its send lock and the requests it has in flight."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.lock = trio.Lock()
        self.scopes: dict[int, trio.CancelScope] = {}

    async def send(self, frame: Frame) -> None:
        async with self.lock:
            await self.stream.write(frame.encode())


class EngineStreamServer:
    def __init__(
        self,
        gate: EngineGate,
        pool: HttpPool,
        inflight: Inflight,
        is_member: Callable[[str], bool],
        load: LoadCounter,
    ) -> None:
        self.gate = gate  # also says how long the engine may take (``deadline``)
        self.pool = pool
        self.inflight = inflight
        self.load = load
        self.is_member = is_member
        self.served = 0
        self.refused = 0

    def install(self, host: Any) -> None:
        set_capped_handler(host, HTTP_PROTOCOL, self.handle, HTTP_STREAMS)

    async def handle(self, stream: Any) -> None:
        conn = _Connection(stream)
        reader = FrameReader(stream)
        try:
            async with trio.open_nursery() as nursery:
                while (frame := await reader.next()) is not None:
                    if frame.kind is Kind.REQUEST:
                        refusal = _admit(conn, frame.request_id)
                        if refusal is not None:
                            await conn.send(refusal)
                            continue
                        scope = trio.CancelScope()
                        conn.scopes[frame.request_id] = scope
                        nursery.start_soon(self._serve, conn, frame, scope)
                    elif frame.kind is Kind.CANCEL:
                        running = conn.scopes.get(frame.request_id)
                        if running is not None:
                            running.cancel()
                    else:
                        raise FrameError(f"unexpected {frame.kind.name} frame from a client")
        except Exception as exc:  # a misbehaving peer loses its stream, nothing more
            log.debug("http stream from %s dropped: %s", _peer(stream), exc)
            await _reset(stream)
            return
        await _close(stream)

    async def _serve(self, conn: _Connection, frame: Frame, scope: trio.CancelScope) -> None:
        rid = frame.request_id
        try:
            with scope:
                await self._exchange(conn, rid, frame)
        except Exception as exc:  # the client's stream broke, or something unforeseen
            log.debug("request %d on %s aborted: %s", rid, _peer(conn.stream), exc)
            with contextlib.suppress(Exception):  # the caller must not wait for an answer
                await conn.send(_error(rid, f"request failed: {type(exc).__name__}", True, 502))
        finally:
            conn.scopes.pop(rid, None)

    async def _exchange(self, conn: _Connection, rid: int, frame: Frame) -> None:
        try:
            fields = frame.fields()
            path = request_path(fields.get("path"))
            body = fields.get("body", b"")
            incoming = header_pairs(fields.get("headers", ()))
            if not isinstance(body, bytes):
                raise FrameError("body must be bytes")
        except (FrameError, KeyError, TypeError, ValueError) as exc:
            await conn.send(_error(rid, f"malformed request: {exc}", delivered=False, status=400))
            return
        if not self.is_member(_peer(conn.stream)):
            self.refused += 1
            await conn.send(_error(rid, "the engine hop is for federation members", False, 403))
            return
        verdict = self.gate.check(path, body)
        if isinstance(verdict, Refusal):
            await conn.send(_error(rid, verdict.message, False, verdict.status))
            return
        host, port, prefix = engine_address(verdict.engine)
        request_id = policy.value(incoming, policy.REQUEST_ID) or uuid.uuid4().hex.encode()
        self.load.start()
        try:
            with self.inflight.track():
                await self._relay(conn, rid, host, port, prefix + verdict.target, incoming,
                                  request_id, body, verdict.first_byte_s)
        finally:
            self.load.end()

    async def _relay(self, conn: _Connection, rid: int, host: str, port: int, target: str,
                     incoming: list[tuple[bytes, bytes]], request_id: bytes, body: bytes,
                     timeout: float) -> None:
        try:
            reply = await self.pool.request(
                host, port, b"POST", target.encode(),
                policy.forwarded(incoming, request_id), body, timeout)
        except NotDelivered as exc:
            await conn.send(_error(rid, f"engine unreachable: {exc}", False, 502))
            return
        except (UpstreamFailed, UpstreamTimeout) as exc:  # it may have run: not retried
            await conn.send(_error(rid, f"engine failed: {exc}", True, 502))
            return
        self.served += 1
        try:
            await conn.send(packed(rid, Kind.HEAD, {
                "status": reply.status,
                "headers": [list(h) for h in policy.relayed(
                    reply.headers, [(policy.LOAD, self.load.header())])]}))
            async for chunk in reply.chunks():
                await conn.send(Frame(rid, Kind.DATA, chunk))
        except UpstreamFailed as exc:  # the engine broke off mid-answer
            await conn.send(_error(rid, f"engine failed mid-response: {exc}", True, 502))
            return
        finally:
            await reply.aclose()
        await conn.send(Frame(rid, Kind.END))


def _admit(conn: _Connection, rid: int) -> Frame | None:
    """Why a new request cannot start on ``conn`` (an ERROR frame), or ``None``."""
    if rid in conn.scopes:  # its CANCEL and its answers could not be told apart
        return _error(rid, "a request with this id is already in flight", False, 400)
    if len(conn.scopes) >= MAX_IN_FLIGHT_PER_STREAM:
        return _error(rid, f"more than {MAX_IN_FLIGHT_PER_STREAM} requests in flight on "
                      "this stream", False, 503)
    return None


def _error(rid: int, message: str, delivered: bool, status: int) -> Frame:
    return packed(rid, Kind.ERROR, {"message": message, "not_delivered": not delivered,
                                    "status": status})


def _peer(stream: Any) -> str:
    try:
        return str(stream.muxed_conn.peer_id)
    except Exception:
        return "?"


async def _reset(stream: Any) -> None:
    with contextlib.suppress(Exception):
        await stream.reset()


async def _close(stream: Any) -> None:
    with contextlib.suppress(Exception):
        await stream.close()

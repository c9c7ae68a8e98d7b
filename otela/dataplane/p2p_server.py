"""The serving side of ``/otela/http/2``: run members' requests against this node's engine.

The rules are the engine hop's, the same as over HTTP (``hop_core``: gate, engine, load,
``Outcome`` in ERROR frames); the caller's identity is the stream's peer id, authenticated
by Noise, and must be a member (a live session in the registry). Refusals say "not
delivered" (the engine never saw the request), so the calling node may try another. Each
request runs in its own task under the stream's nursery; responses of concurrent requests
interleave frame by frame under one send lock.
Responses stream: every chunk the engine sends becomes a DATA frame. A CANCEL frame (the
caller's client went away) cancels the request, which closes its engine connection.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable
from typing import Any

import trio

from otela.dataplane import headers as header_rules
from otela.dataplane.errors import UpstreamFailed
from otela.dataplane.headers import Headers
from otela.dataplane.hop_core import HopCore, caller_refused
from otela.dataplane.inflight import Inflight
from otela.dataplane.outcome import Outcome
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
from otela.dataplane.upstream import Reply
from otela.mesh.quota import HTTP_STREAMS, set_capped_handler

log = logging.getLogger("otela.dataplane")

# Requests one stream may have in flight. An ingress sends all its requests to this node on
# one stream, so this is far above any honest concurrency (the engine's own batch); it
# bounds what a misbehaving member can make us hold (a task, buffers, an engine
# connection each). Beyond it: 503, not delivered, so an ingress tries another node.
MAX_IN_FLIGHT_PER_STREAM = 1024


class _Connection:
    """One peer's long-lived stream: its send lock and the requests it has in flight."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.lock = trio.Lock()
        self.scopes: dict[int, trio.CancelScope] = {}

    async def send(self, frame: Frame) -> None:
        async with self.lock:
            await self.stream.write(frame.encode())


class _FrameAnswer:
    """The hop core's answer as frames: an ERROR frame for an outcome, HEAD, DATA... and
    END for the engine's reply (an ERROR frame if the engine breaks off mid-answer)."""

    def __init__(self, conn: _Connection, rid: int) -> None:
        self.conn = conn
        self.rid = rid

    async def outcome(self, outcome: Outcome) -> None:
        await self.conn.send(packed(self.rid, Kind.ERROR, outcome.fields()))

    async def reply(self, reply: Reply, extra: Headers) -> None:
        rid, conn = self.rid, self.conn
        try:
            await conn.send(packed(rid, Kind.HEAD, {
                "status": reply.status,
                "headers": [list(h) for h in header_rules.relayed(reply.headers, extra)]}))
            async for chunk in reply.chunks():
                await conn.send(Frame(rid, Kind.DATA, chunk))
        except UpstreamFailed as exc:  # the engine broke off mid-answer
            await self.outcome(Outcome(502, "upstream_failed",
                                       f"engine failed mid-response: {exc}", delivered=True))
            return
        finally:
            await reply.aclose()
        await conn.send(Frame(rid, Kind.END))


class EngineStreamServer:
    def __init__(self, core: HopCore, inflight: Inflight,
                 is_member: Callable[[str], bool]) -> None:
        self.core = core
        self.inflight = inflight
        self.is_member = is_member
        self.refused = 0

    @property
    def served(self) -> int:
        return self.core.served

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
                await conn.send(_error(rid, Outcome(
                    502, "upstream_failed", f"request failed: {type(exc).__name__}",
                    delivered=True)))
        finally:
            conn.scopes.pop(rid, None)

    async def _exchange(self, conn: _Connection, rid: int, frame: Frame) -> None:
        answer = _FrameAnswer(conn, rid)
        try:
            fields = frame.fields()
            path = request_path(fields.get("path"))
            body = fields.get("body", b"")
            incoming = header_pairs(fields.get("headers", ()))
            if not isinstance(body, bytes):
                raise FrameError("body must be bytes")
        except (FrameError, KeyError, TypeError, ValueError) as exc:
            await answer.outcome(caller_refused(400, "malformed_request",
                                                f"malformed request: {exc}"))
            return
        if not self.is_member(_peer(conn.stream)):
            self.refused += 1
            await answer.outcome(caller_refused(403, "not_a_member",
                                                "the engine hop is for federation members"))
            return
        request_id = (header_rules.value(incoming, header_rules.REQUEST_ID)
                      or uuid.uuid4().hex.encode())
        with self.inflight.track():
            await self.core.serve(path, incoming, body, request_id, answer)


def _admit(conn: _Connection, rid: int) -> Frame | None:
    """Why a new request cannot start on ``conn`` (an ERROR frame), or ``None``."""
    if rid in conn.scopes:  # its CANCEL and its answers could not be told apart
        return _error(rid, Outcome(400, "duplicate_request_id",
                                   "a request with this id is already in flight",
                                   delivered=False))
    if len(conn.scopes) >= MAX_IN_FLIGHT_PER_STREAM:
        return _error(rid, Outcome(503, "too_many_requests", f"more than "
                                   f"{MAX_IN_FLIGHT_PER_STREAM} requests in flight on this "
                                   "stream", delivered=False))
    return None


def _error(rid: int, outcome: Outcome) -> Frame:
    return packed(rid, Kind.ERROR, outcome.fields())


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

"""The serving side of ``/otela/http/1``: run peers' requests against this node's engine.

The same rules as the ``/v1/engine/...`` HTTP hop (``otela.api.app``): only federation
members (the stream's peer id, authenticated by Noise, must have a live session in the
registry), only the OpenAI inference paths, bodies within the node's size limit, only while
SERVING, and an answer that says "not delivered" when the engine never saw the request, so
the ingress may try another node. Each request runs in its own
task under the stream's nursery; responses of concurrent requests interleave frame by frame
under one send lock. Responses stream: every chunk the engine sends becomes a DATA frame.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import httpx
import trio
from libp2p.custom_types import TProtocol

from otela.dataplane.inflight import Inflight
from otela.routing.forward import forwarded_headers
from otela.transport.framing import Frame, FrameError, FrameReader, Kind, packed

log = logging.getLogger("otela.transport")

HTTP_PROTOCOL = TProtocol("/otela/http/1")
# Engine paths peers may reach; anything else (engine admin APIs) stays private.
ENGINE_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings"})
_DROP_RESPONSE_HEADERS = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding",
     "date", "server"}
)


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
        engine_url: Callable[[], str | None],
        client: Callable[[], httpx.AsyncClient],
        inflight: Inflight,
        is_member: Callable[[str], bool],
        max_body_bytes: int,
    ) -> None:
        self.engine_url = engine_url  # None unless the node is SERVING
        self.client = client
        self.inflight = inflight
        self.is_member = is_member
        self.max_body_bytes = max_body_bytes
        self.served = 0
        self.refused = 0

    def install(self, host: Any) -> None:
        host.set_stream_handler(HTTP_PROTOCOL, self.handle)

    async def handle(self, stream: Any) -> None:
        conn = _Connection(stream)
        reader = FrameReader(stream)
        try:
            async with trio.open_nursery() as nursery:
                while (frame := await reader.next()) is not None:
                    if frame.kind is Kind.REQUEST:
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
            path = str(fields["path"])
            body = fields.get("body", b"")
            headers = {str(k).lower(): str(v) for k, v in dict(fields.get("headers", {})).items()}
            if not isinstance(body, bytes):
                raise FrameError("body must be bytes")
        except (FrameError, KeyError, TypeError, ValueError) as exc:
            await conn.send(_error(rid, f"malformed request: {exc}", delivered=False, status=400))
            return
        if not self.is_member(_peer(conn.stream)):
            self.refused += 1
            await conn.send(_error(rid, "the engine hop is for federation members", False, 403))
            return
        if path not in ENGINE_PATHS:
            await conn.send(_error(rid, f"{path[:200]} is not relayed to engines", False, 404))
            return
        if len(body) > self.max_body_bytes:
            await conn.send(_error(rid, f"request body exceeds the {self.max_body_bytes} "
                                   "byte limit", False, 413))
            return
        engine = self.engine_url()
        if engine is None:
            await conn.send(_error(rid, "this node is not serving", False, 503))
            return
        forwarded = forwarded_headers(headers, {})
        client = self.client()
        request = client.build_request("POST", f"{engine}{path}", content=body, headers=forwarded)
        with self.inflight.track():
            try:
                upstream = await client.send(request, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                await conn.send(_error(rid, f"engine unreachable: {exc}", False, 502))
                return
            except httpx.HTTPError as exc:  # it may have reached the engine: not retried
                await conn.send(_error(rid, f"engine failed: {type(exc).__name__}", True, 502))
                return
            self.served += 1
            try:
                out = {k: v for k, v in upstream.headers.items()
                       if k.lower() not in _DROP_RESPONSE_HEADERS}
                await conn.send(packed(rid, Kind.HEAD, {"status": upstream.status_code,
                                                        "headers": out}))
                async for chunk in upstream.aiter_raw():
                    await conn.send(Frame(rid, Kind.DATA, chunk))
            except httpx.HTTPError as exc:  # the engine broke off mid-answer
                await conn.send(_error(rid, f"engine failed mid-response: {exc}", True, 502))
                return
            finally:
                await upstream.aclose()
            await conn.send(Frame(rid, Kind.END))


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

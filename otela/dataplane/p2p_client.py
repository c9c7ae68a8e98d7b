"""The calling side of ``/otela/http/2``: send HTTP requests to a peer's engine over libp2p.

One long-lived stream per peer carries every request to it (request-id framing, see
``framing``); a reader task per stream hands each frame to the request it belongs to. The
stream is opened lazily and replaced when it breaks, and also when hole punching has given
us a direct connection while the stream still runs over the relay (a stream stays on the
connection it was opened on, and DCUtR closes the relayed one 60 s after an upgrade): the
old stream then finishes its requests and is closed.

Failures are classified for the router's retry rule: ``NotDelivered`` only when the engine
provably never saw the request (no connection, no stream, the request frame never left, or
the peer said so); anything later is a ``UpstreamFailed`` and is not retried.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio
from libp2p.peer.id import ID

from otela.dataplane.errors import NotDelivered, UpstreamFailed
from otela.dataplane.headers import Headers
from otela.dataplane.outcome import Outcome
from otela.dataplane.p2p_frames import (
    HTTP_PROTOCOL,
    Frame,
    FrameError,
    FrameReader,
    Kind,
    header_pairs,
    packed,
)
from otela.mesh.connections import connection_kinds, is_relayed
from otela.registry.records import NodeRecord

log = logging.getLogger("otela.dataplane")

OPEN_TIMEOUT_S = 10.0
RESPONSE_BUFFER = 256  # frames buffered per request before the stream's reader waits
HEAD_TIMEOUT_S = 600.0  # a backstop: the router applies its own first-byte timeout
CANCEL_TIMEOUT_S = 2.0


@dataclass
class P2PResponse:
    """An answer over libp2p, with the same surface as an HTTP pool's ``Reply``."""

    status: int
    headers: Headers
    _frames: trio.MemoryReceiveChannel[Frame | None]
    _channel: _Channel
    request_id: int
    _done: bool = False

    @property
    def content_length(self) -> int | None:
        return next((int(v) for k, v in self.headers if k == b"content-length" and v.isdigit()),
                    None)

    @property
    def complete(self) -> bool:
        return False  # the body comes in frames, read with ``chunks``

    def take_buffered(self) -> bytes:
        return b""

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives; raises ``UpstreamFailed`` if the stream breaks first."""
        try:
            async for frame in self._frames:
                if frame is None:
                    break
                if frame.kind is Kind.DATA:
                    yield frame.payload
                elif frame.kind is Kind.END:
                    self._done = True
                    return
                elif frame.kind is Kind.ERROR:
                    raise UpstreamFailed(_error_message(frame))
            raise UpstreamFailed("the libp2p stream closed before the response ended")
        finally:
            await self.aclose()

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    def abort(self) -> None:
        """Give up on this answer now (its node failed, or froze): a task reading it gets
        ``UpstreamFailed`` at once, and closing tells the peer to cancel the request; the
        stream to the peer stays for other requests."""
        frames = self._channel.pending.get(self.request_id)
        if frames is not None:
            frames.close()

    async def aclose(self) -> None:
        """Stop receiving; tells the peer to cancel the request if it is still running
        (also when we are being cancelled ourselves: that is when it matters most)."""
        if not self._done:
            self._done = True
            await _cancel_remotely(self._channel, self.request_id)
        self._channel.forget(self.request_id)


class _Channel:
    """One long-lived stream to a peer and the requests waiting for answers on it."""

    def __init__(self, stream: Any, on_empty: Callable[[_Channel], None]) -> None:
        self.stream = stream
        self.lock = trio.Lock()
        self.pending: dict[int, trio.MemorySendChannel[Frame | None]] = {}
        self.next_id = 1
        self.broken = False
        self.retiring = False
        self._on_empty = on_empty

    def relayed(self, host: Any, peer_id: ID) -> bool:
        for conn in host.get_network().get_connections(peer_id):
            if getattr(conn, "muxed_conn", None) is self.stream.muxed_conn:
                return is_relayed(conn)
        return False

    async def reader(self) -> None:
        frames = FrameReader(self.stream)
        try:
            while (frame := await frames.next()) is not None:
                target = self.pending.get(frame.request_id)
                if target is None:
                    continue  # a request we cancelled
                try:
                    await target.send(frame)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self.pending.pop(frame.request_id, None)
                if frame.kind in (Kind.END, Kind.ERROR):
                    self.forget(frame.request_id)
        except Exception as exc:
            log.debug("http stream to %s broke: %s", self.stream.muxed_conn.peer_id, exc)
        finally:
            self.broken = True
            for waiting in list(self.pending.values()):
                waiting.close()
            self.pending.clear()
            await _close(self.stream)

    async def send_request(self, fields: dict[str, Any]) -> tuple[int, Any]:
        rid = self.next_id
        self.next_id += 1
        send, receive = trio.open_memory_channel[Frame | None](RESPONSE_BUFFER)
        self.pending[rid] = send
        try:
            async with self.lock:
                await self.stream.write(packed(rid, Kind.REQUEST, fields).encode())
        except Exception as exc:
            self.pending.pop(rid, None)
            self.broken = True
            raise NotDelivered(f"request frame not sent: {type(exc).__name__}: {exc}") from exc
        return rid, receive

    async def cancel(self, rid: int) -> None:
        if self.broken or rid not in self.pending:
            return
        try:
            async with self.lock:
                await self.stream.write(Frame(rid, Kind.CANCEL).encode())
        except Exception:
            self.broken = True

    def forget(self, rid: int) -> None:
        send = self.pending.pop(rid, None)
        if send is not None:
            send.close()
        if self.retiring and not self.pending:
            self._on_empty(self)


async def _cancel_remotely(channel: _Channel, rid: int) -> None:
    """Send CANCEL for ``rid`` even from a cancelled task (shielded, bounded), then forget it."""
    with trio.CancelScope(shield=True), trio.move_on_after(CANCEL_TIMEOUT_S):
        await channel.cancel(rid)
    channel.forget(rid)


class EngineStreamClient:
    """Per-peer long-lived streams; run ``run`` in the daemon's nursery first."""

    def __init__(self, host: Any, connect: Callable[[NodeRecord], Awaitable[None]]) -> None:
        self.host = host
        self.connect = connect  # direct or relayed dial (NatTraversal.connect)
        self._channels: dict[str, _Channel] = {}
        self._opening: dict[str, trio.Lock] = {}
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep(math.inf)

    async def request(
        self, record: NodeRecord, path: str, body: bytes, headers: Headers
    ) -> P2PResponse:
        """Send one request; returns once the response head arrived."""
        fields = {"path": path, "headers": [list(h) for h in headers], "body": body}
        channel = await self._channel(record)
        try:
            rid, frames = await channel.send_request(fields)
        except NotDelivered:  # a stale stream (e.g. its connection just closed): one retry
            channel = await self._channel(record)
            rid, frames = await channel.send_request(fields)
        first: Frame | None = None
        try:
            with trio.move_on_after(HEAD_TIMEOUT_S):
                try:
                    first = await frames.receive()
                except (trio.EndOfChannel, trio.ClosedResourceError):
                    first = None
        except BaseException:  # cancelled (the client left, a timeout): stop it remotely
            await _cancel_remotely(channel, rid)
            raise
        if first is None or first.kind not in (Kind.HEAD, Kind.ERROR):
            channel.forget(rid)
            raise UpstreamFailed("the libp2p stream closed before the response began")
        if first.kind is Kind.ERROR:
            channel.forget(rid)
            raise _outcome(first).exception(f"peer {record.peer_id}")
        try:
            status, out = response_head(first)
        except FrameError as exc:  # a serving node's garbage is its failure: a 502
            channel.forget(rid)
            raise UpstreamFailed(f"peer {record.peer_id}: bad response head: {exc}") from exc
        return P2PResponse(status, out, frames, channel, rid)

    async def _channel(self, record: NodeRecord) -> _Channel:
        peer = record.peer_id
        lock = self._opening.setdefault(peer, trio.Lock())
        async with lock:
            channel = self._channels.get(peer)
            peer_id = ID.from_base58(peer)
            if channel is not None and not channel.broken:
                upgraded = "direct" in connection_kinds(self.host, peer_id)
                if not (upgraded and channel.relayed(self.host, peer_id)):
                    return channel
                self._retire(channel)  # hole punched: move new requests to the direct path
            try:
                await self.connect(record)
            except Exception as exc:
                raise NotDelivered(str(exc)) from exc
            try:
                with trio.fail_after(OPEN_TIMEOUT_S):
                    stream = await self.host.new_stream(peer_id, [HTTP_PROTOCOL])
            except Exception as exc:
                raise NotDelivered(
                    f"peer {peer}: cannot open {HTTP_PROTOCOL}: {type(exc).__name__}: {exc}"
                ) from exc
            channel = _Channel(stream, self._closed_when_empty)
            assert self._nursery is not None, "EngineStreamClient.run is not running"
            self._nursery.start_soon(channel.reader)
            self._channels[peer] = channel
            return channel

    def _retire(self, channel: _Channel) -> None:
        channel.retiring = True
        if not channel.pending:
            self._closed_when_empty(channel)

    def _closed_when_empty(self, channel: _Channel) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(_close, channel.stream)

    def stats(self) -> dict[str, Any]:
        return {peer: {"in_flight": len(c.pending), "broken": c.broken}
                for peer, c in self._channels.items()}


def response_head(frame: Frame) -> tuple[int, Headers]:
    """A HEAD frame's status and headers; ``FrameError`` for anything a well-behaved
    server would not send (a status outside 100-599 included: our HTTP server would have
    to write it)."""
    head = frame.fields()
    status = head.get("status")
    if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
        raise FrameError(f"bad status {str(status)[:32]!r}")
    return status, header_pairs(head.get("headers", ()))


def _error_message(frame: Frame) -> str:
    """An ERROR frame's message, clipped; a malformed one says so (never raises)."""
    try:
        return str(frame.fields().get("message"))[:512]
    except FrameError as exc:
        return f"malformed error frame: {exc}"


def _outcome(frame: Frame) -> Outcome:
    """What an ERROR frame says became of the request (``outcome``); a malformed one:
    delivered, as we cannot tell whether it ran (it must not run again)."""
    try:
        return Outcome.of_fields(frame.fields())
    except FrameError as exc:
        return Outcome(502, "upstream_failed", f"malformed error frame: {exc}",
                       delivered=True)


async def _close(stream: Any) -> None:
    with contextlib.suppress(Exception):
        await stream.close()

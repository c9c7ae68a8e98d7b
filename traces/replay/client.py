"""A lean HTTP/1.1 client on trio sockets with httptools (llhttp) parsing.

Why not httpx: at thousands of requests per second per core the general-purpose client's
per-request cost (header models, transport layers) dominates, and replay must keep its own
cost far below the gaps it schedules. This client does one thing: send pre-built request
bytes on a keep-alive connection and time the response as it arrives.
"""

from __future__ import annotations

import socket
import ssl
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httptools
import trio

from traces.replay.sse import StreamState, completion_tokens_of

RECV = 65536


class ConnectError(Exception):
    """The endpoint could not be reached (refused, unresolvable, TLS failure)."""


class ResetError(Exception):
    """The connection closed before the response was complete."""


class ProtocolError(Exception):
    """The endpoint answered something that is not HTTP/1.1."""


@dataclass(frozen=True)
class Endpoint:
    """Where to send: scheme, host, port and an optional path prefix (e.g. a gateway's /api)."""

    scheme: str
    host: str
    port: int
    prefix: str

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        u = urlsplit(url if "://" in url else "http://" + url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"bad URL {url!r}: expected http(s)://HOST[:PORT][/prefix]")
        port = u.port or (443 if u.scheme == "https" else 80)
        prefix = u.path.rstrip("/")
        if prefix.endswith("/v1"):  # accept the OpenAI-style base URL too
            prefix = prefix[:-3]
        return cls(u.scheme, u.hostname, port, prefix)

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        return self.host if self.port == default else f"{self.host}:{self.port}"


class Connection:
    """One keep-alive connection; `reused` tells whether it has served a response before.

    Plain HTTP talks to the trio socket directly (SocketStream's layers cost more than the
    request itself at thousands per second); HTTPS goes through trio's SSLStream.
    """

    def __init__(
        self,
        sock: trio.socket.SocketType | None,
        stream: trio.abc.Stream | None,
        raw: socket.socket | None = None,
    ) -> None:
        self.sock = sock
        self.stream = stream
        self.raw = raw  # the same (non-blocking) fd as `sock`, for sends that must not yield
        self.reused = False
        self.usable = True

    def send_now(self, data: bytes) -> int:
        """Write what the kernel takes right now, without yielding to the trio loop (the
        dispatcher sends a burst of due requests back to back); returns the bytes written,
        0 if the socket buffer is full or this is a TLS connection. Raises OSError."""
        if self.raw is None:
            return 0
        try:
            return self.raw.send(data)
        except BlockingIOError:
            return 0

    async def send(self, data: bytes) -> None:
        if self.sock is not None:
            view = memoryview(data)
            while view:
                sent = await self.sock.send(view)
                view = view[sent:]
        else:
            assert self.stream is not None
            await self.stream.send_all(data)

    async def recv(self) -> bytes:
        if self.sock is not None:
            return await self.sock.recv(RECV)
        assert self.stream is not None
        return await self.stream.receive_some(RECV)

    async def aclose(self) -> None:
        self.usable = False
        if self.sock is not None:
            self.sock.close()
            return
        assert self.stream is not None
        with trio.move_on_after(1) as scope:
            scope.shield = True
            await self.stream.aclose()


class Pool:
    """Idle keep-alive connections to one endpoint, opened on demand."""

    def __init__(self, ep: Endpoint, connect_timeout: float = 10.0) -> None:
        self.ep = ep
        self.idle: list[Connection] = []
        self.opened = 0
        self.connect_timeout = connect_timeout
        self._ssl = ssl.create_default_context() if ep.scheme == "https" else None
        self._addr: tuple[int, Any] | None = None

    async def open(self) -> Connection:
        try:
            with trio.fail_after(self.connect_timeout):
                if self._ssl is not None:
                    stream = await trio.open_ssl_over_tcp_stream(
                        self.ep.host, self.ep.port, ssl_context=self._ssl
                    )
                    conn = Connection(None, stream)
                else:
                    raw = await self._connect()
                    conn = Connection(trio.socket.from_stdlib_socket(raw), None, raw)
        except (OSError, trio.TooSlowError, ssl.SSLError) as e:
            raise ConnectError(str(e) or type(e).__name__) from e
        self.opened += 1
        return conn

    async def _connect(self) -> socket.socket:
        if self._addr is None:
            infos = await trio.socket.getaddrinfo(
                self.ep.host, self.ep.port, type=socket.SOCK_STREAM
            )
            if not infos:
                raise OSError(f"cannot resolve {self.ep.host}")
            self._addr = (int(infos[0][0]), infos[0][4])
        family, addr = self._addr
        raw = socket.socket(family, socket.SOCK_STREAM)
        raw.setblocking(False)
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await trio.socket.from_stdlib_socket(raw).connect(addr)
        except BaseException:
            raw.close()
            raise
        return raw

    async def get(self) -> Connection:
        return self.idle.pop() if self.idle else await self.open()

    def put(self, conn: Connection) -> None:
        if conn.usable:
            conn.reused = True
            self.idle.append(conn)

    async def aclose(self) -> None:
        while self.idle:
            await self.idle.pop().aclose()


@dataclass
class Response:
    """What came back, timed with time.perf_counter()."""

    status: int = 0
    headers: dict[bytes, bytes] = field(default_factory=dict)
    body: bytearray = field(default_factory=bytearray)
    stream: StreamState | None = None
    first_byte: float = 0.0
    end: float = 0.0
    complete: bool = False
    keep_alive: bool = True
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


WANTED_HEADERS = (b"x-otela-provider-id", b"x-otela-peer-id", b"content-type")


class _Parser:
    """httptools callbacks filling a Response; `now` is the receive time of the current read."""

    __slots__ = ("now", "parser", "resp", "streaming")

    def __init__(self, resp: Response, streaming: bool) -> None:
        self.resp = resp
        self.streaming = streaming
        self.now = 0.0
        self.parser = httptools.HttpResponseParser(self)

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.lower()
        if key in WANTED_HEADERS:
            self.resp.headers[key] = value

    def on_headers_complete(self) -> None:
        self.resp.status = self.parser.get_status_code()
        # (llhttp answers this reliably only before the message completes)
        self.resp.keep_alive = self.parser.should_keep_alive()
        ctype = self.resp.headers.get(b"content-type", b"")
        if self.streaming and self.resp.status == 200 and b"event-stream" in ctype:
            self.resp.stream = StreamState()

    def on_body(self, data: bytes) -> None:
        if self.resp.stream is not None:
            self.resp.stream.feed(data, self.now)
        elif len(self.resp.body) < 1 << 20:  # keep error bodies and JSON answers, bounded
            self.resp.body += data

    def on_message_complete(self) -> None:
        self.resp.complete = True


async def send_request(conn: Connection, request: bytes) -> None:
    """Write the request bytes (raises ResetError if the connection is gone)."""
    try:
        await conn.send(request)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
        conn.usable = False
        raise ResetError(str(e) or type(e).__name__) from e


async def exchange(conn: Connection, request: bytes | None, streaming: bool) -> Response:
    """Send one request on `conn` (unless `request` is None: already sent) and read its whole
    response (raises ResetError / ProtocolError)."""
    resp = Response()
    p = _Parser(resp, streaming)
    if request is not None:
        await send_request(conn, request)
    try:
        while not resp.complete:
            data = await conn.recv()
            now = time.perf_counter()
            if not data:
                conn.usable = False
                raise ResetError("connection closed by the server")
            if not resp.first_byte:
                resp.first_byte = now
            p.now = now
            p.parser.feed_data(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
        conn.usable = False
        raise ResetError(str(e) or type(e).__name__) from e
    except httptools.HttpParserError as e:
        conn.usable = False
        raise ProtocolError(str(e)) from e
    resp.end = time.perf_counter()
    if not resp.keep_alive:
        conn.usable = False
    if resp.stream is not None:
        resp.prompt_tokens = resp.stream.prompt_tokens
        resp.completion_tokens = resp.stream.completion_tokens
    elif 200 <= resp.status < 300:
        resp.prompt_tokens, resp.completion_tokens = completion_tokens_of(bytes(resp.body))
    return resp

"""HTTP/1.1 to upstreams (engines, other nodes' engine hops): keep-alive connection pools
on trio sockets, responses parsed by llhttp (``httptools``), bodies relayed as they arrive.

Why not an HTTP client library: a proxy hop must cost tens of microseconds, send the body
it was given as is, hand back the response head as soon as it arrives and then its body
chunk by chunk (an SSE stream is relayed event by event), and know exactly how far a
request got when something fails, because a request that may have reached an engine must
never be sent to another one:

- ``NotDelivered``: no connection could be made (refused, unreachable, connect timeout):
  nothing was sent, trying another node is safe;
- ``NotDelivered`` too: the connection broke before all of the request was sent, or a
  pooled (reused) connection was reset before a byte of answer. That reset means our
  request met a socket whose process had already closed it (a server that read the
  request and then died or closed sends an orderly end-of-file): the keep-alive race,
  seen when a node is SIGKILLed between two requests on one connection. On a fresh
  connection a reset stays ambiguous for an arbitrary server (one may read a request,
  then abort) and is an ``UpstreamFailed``, unless the caller knows the server never
  aborts a connection it has read a request from (``unread_if_reset``: another node's
  engine hop). Such a server that dies after reading all of a request closes with an
  orderly end-of-file; a reset means the request sat unread in its socket, typically in
  the accept queue of a process being killed;
- ``UpstreamFailed``: the connection broke after the request was sent and before the
  response was complete;
- ``UpstreamTimeout``: nothing came back within the first-byte timeout.

Idle connections are kept per upstream (at most ``max_idle``, the most recently used
reused first) and closed after ``idle_timeout``: well below the keep-alive timeout of
engines' servers (uvicorn: 5 s), so a request is never written into a connection the
server is closing; a pooled connection the server did close anyway is noticed before
reuse (it reads as end-of-file) and replaced. A response not read to its end (the client
went away) closes its connection, so the engine sees the disconnect and stops.
"""

from __future__ import annotations

import errno
import socket
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httptools
import trio

from otela.config.schema import default_of
from otela.dataplane import sockio
from otela.dataplane.errors import NotDelivered, UpstreamFailed, UpstreamTimeout

Headers = list[tuple[bytes, bytes]]

_RECV = 65536
# Connect errors that come back at once: the attempt cost nothing.
TURNED_AWAY = frozenset({errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH})
FRESH_S = 0.02  # idle this briefly, a pooled connection is reused without checking it


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    key: tuple[str, int]
    idle_since: float = 0.0
    requests: int = 0


class _Response:
    """httptools callbacks for one response: head fields, body chunks, completion."""

    __slots__ = ("chunks", "done", "head_done", "headers", "keep_alive", "parser", "status")

    def __init__(self) -> None:
        self.status = 0
        self.headers: Headers = []
        self.chunks: deque[bytes] = deque()
        self.done = False
        self.head_done = False
        self.keep_alive = False
        self.parser: Any = None

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.head_done = True
        self.status = self.parser.get_status_code()
        # Read now: once the message is complete the parser resets and says False.
        self.keep_alive = bool(self.parser.should_keep_alive())

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        self.done = True


class Reply:
    """An upstream's answer: its head now, its body as it arrives. Read the body with
    ``chunks()`` (or ``read()``), or ``aclose()`` to abandon it (the connection closes)."""

    def __init__(self, pool: HttpPool, conn: _Conn, response: _Response, head_only: bool,
                 keep_alive: bool) -> None:
        self._pool = pool
        self._conn: _Conn | None = conn
        self._response = response
        self._head_only = head_only
        self._keep_alive = keep_alive
        self.status = response.status
        self.headers = response.headers
        self.content_length: int | None = next(
            (int(v) for k, v in response.headers if k == b"content-length" and v.isdigit()),
            None)

    @property
    def complete(self) -> bool:
        """Whether the whole body has already arrived (small responses usually have)."""
        return self._response.done

    def take_buffered(self) -> bytes:
        """The body received so far, removed from the buffer."""
        chunks = self._response.chunks
        data = b"".join(chunks)
        chunks.clear()
        return data

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives; ``UpstreamFailed`` if the connection breaks first."""
        response = self._response
        try:
            while True:
                while response.chunks:
                    yield response.chunks.popleft()
                if response.done or self._head_only:
                    break
                conn = self._conn
                assert conn is not None
                data = await _recv(conn)
                if not data:
                    raise UpstreamFailed("the upstream closed the connection mid-response")
                _feed(response, data)
        finally:
            await self.aclose()

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    def abort(self) -> None:
        """Give up on this reply now (its node failed): its connection is closed, and a
        task reading it gets ``UpstreamFailed``."""
        if self._conn is not None:
            sockio.close(self._conn.sock)

    async def aclose(self) -> None:
        """Done with this reply: a complete one returns its connection to the pool, an
        incomplete one closes it (that is how the upstream learns we left)."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if (self._response.done or self._head_only) and self._keep_alive:
            self._pool.release(conn)
        else:
            sockio.close(conn.sock)


def _feed(response: _Response, data: bytes) -> None:
    try:
        response.parser.feed_data(data)
    except httptools.HttpParserError as exc:
        raise UpstreamFailed(f"malformed response: {str(exc)[:100]}") from None


async def _recv(conn: _Conn) -> bytes:
    try:
        return await sockio.recv(conn.sock)
    except sockio.Closed as exc:
        raise UpstreamFailed(f"connection broke: {exc}") from None
    except trio.ClosedResourceError:  # closed under us: we gave up on the node (abort)
        raise UpstreamFailed("the node failed mid-response; its connection was closed") \
            from None


@dataclass
class HttpPool:
    """Keep-alive connections per upstream ``(host, port)``."""

    max_idle: int = 64  # idle connections kept per upstream
    idle_timeout: float = 2.0
    connect_timeout: float = default_of("connect_timeout")
    _idle: dict[tuple[str, int], list[_Conn]] = field(default_factory=dict)
    connects: int = 0  # connections opened (for metrics)
    connect_failures: int = 0

    async def request(self, host: str, port: int, method: bytes, target: bytes,
                      headers: Headers, body: bytes, first_byte_timeout: float,
                      connect_timeout: float | None = None, unread_if_reset: bool = False
                      ) -> Reply:
        """Send a request; the ``Reply`` once its head has arrived. Raises ``NotDelivered``,
        ``UpstreamFailed`` or ``UpstreamTimeout`` (see the module docstring).
        ``connect_timeout`` replaces the pool's for a new connection; ``unread_if_reset``:
        the server never aborts a connection after reading a request from it."""
        key = (host, port)
        head = [b"%b %b HTTP/1.1\r\nhost: %b:%d\r\n" % (method, target, host.encode(), port)]
        head.extend(b"%b: %b\r\n" % kv for kv in headers)
        head.append(b"content-length: %d\r\n\r\n" % len(body))
        data = b"".join(head) + body
        conn = self._reusable(key)
        if conn is None:
            conn = await self._connect(key, connect_timeout or self.connect_timeout)
        conn.requests += 1
        response = _Response()
        response.parser = httptools.HttpResponseParser(response)
        try:
            try:
                await sockio.send_all(conn.sock, data)
            except sockio.Closed as exc:
                raise NotDelivered(f"{host}:{port}: the connection broke before the request "
                                   f"was sent: {exc}") from None
            answered = False
            # A plain cancel scope: trio.fail_after is a generator-based context manager,
            # measurably slower on a path that runs once per request.
            with trio.CancelScope(deadline=trio.current_time() + first_byte_timeout) as wait:
                while not response.head_done:
                    try:
                        received = await sockio.recv(conn.sock)
                    except sockio.Closed as exc:
                        if exc.reset and not answered and (unread_if_reset
                                                           or conn.requests > 1):
                            raise NotDelivered(f"{host}:{port} reset the connection before "
                                               f"reading the request: {exc}") from None
                        raise
                    if not received:
                        raise UpstreamFailed("the upstream closed the connection before "
                                             "answering")
                    answered = True
                    _feed(response, received)
            if wait.cancelled_caught:
                sockio.close(conn.sock)
                raise UpstreamTimeout(f"no answer within {first_byte_timeout:.0f} s")
        except sockio.Closed as exc:
            sockio.close(conn.sock)
            raise UpstreamFailed(f"connection broke: {exc}") from None
        except BaseException:
            sockio.close(conn.sock)  # failed, or cancelled (the client left): it must know
            raise
        return Reply(self, conn, response, method == b"HEAD", response.keep_alive)

    def release(self, conn: _Conn) -> None:
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) >= self.max_idle:
            sockio.close(conn.sock)
            return
        conn.idle_since = trio.current_time()
        idle.append(conn)

    def _reusable(self, key: tuple[str, int]) -> _Conn | None:
        idle = self._idle.get(key)
        now = trio.current_time()
        while idle:
            conn = idle.pop()
            idle_for = now - conn.idle_since
            # A connection back in the pool a moment ago is open (servers close idle ones
            # after seconds); older ones are checked: a closed one reads as end-of-file.
            if idle_for < self.idle_timeout and (idle_for < FRESH_S or _still_open(conn.sock)):
                return conn
            sockio.close(conn.sock)
        return None

    async def _connect(self, key: tuple[str, int], timeout: float) -> _Conn:
        host, port = key
        sock = sockio.connected_socket(_family(host))
        try:
            with trio.fail_after(timeout):
                await sockio.connect(sock, (host, port))
        except (OSError, trio.TooSlowError) as exc:
            sockio.close(sock)
            self.connect_failures += 1
            reason = "timed out" if isinstance(exc, trio.TooSlowError) else (
                exc.strerror or str(exc))
            # Refused, unroutable, or no answer to the attempt: nothing reachable listens
            # there now.
            raise NotDelivered(f"cannot connect to {host}:{port}: {reason}",
                               unreachable=True, refused=_turned_away(exc)) from None
        except BaseException:
            sockio.close(sock)
            raise
        self.connects += 1
        return _Conn(sock, key)

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                sockio.close(conn.sock)
        self._idle.clear()

    def sweep(self) -> None:
        """Close idle connections past ``idle_timeout`` (call now and then)."""
        now = trio.current_time()
        for key, idle in list(self._idle.items()):
            keep = [c for c in idle if now - c.idle_since < self.idle_timeout]
            for conn in idle:
                if conn not in keep:
                    sockio.close(conn.sock)
            if keep:
                self._idle[key] = keep
            else:
                del self._idle[key]


def _still_open(sock: socket.socket) -> bool:
    """A pooled connection the server closed reads as end-of-file (or an error) at once;
    a live one has nothing to read."""
    try:
        return sock.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _turned_away(exc: BaseException) -> bool:
    """Whether a failed connect was answered at once (nothing listens, or no route): it
    took no time, unlike an attempt nobody answered."""
    return isinstance(exc, OSError) and exc.errno in TURNED_AWAY

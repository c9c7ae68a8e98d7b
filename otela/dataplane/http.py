"""otela's HTTP/1.1 server: trio sockets and the llhttp parser (``httptools``), with limits.

Every byte a client sends a node passes through here first, so this is where hostile
input is bounded, whatever handler the request reaches afterwards:

- headers must arrive within ``header_timeout`` of the first byte (or of the connection
  opening) and fit in ``max_header_bytes`` (431 otherwise); the body must fit in
  ``max_body_bytes`` (413, checked against ``Content-Length`` before reading, and while
  reading a chunked body) and arrive within ``body_timeout`` (408);
- a client address holds at most ``max_connections_per_client`` connections (429) and the
  server ``max_connections`` (503), so no single client can take every file descriptor;
- an idle keep-alive connection is closed after ``keep_alive_timeout``, a response that
  the client does not read after ``send_timeout``;
- malformed requests get a 400 and the connection is closed (never a traceback);
- a request the node's ``screen`` refuses from its method, target and headers alone (an
  API key that is missing, wrong or over its limits) is answered the moment its headers
  are complete, and its body is never read: the connection closes, so a refused upload
  costs no body bytes and a body that never comes holds nothing.

Requests never outlive their client: while a handler runs, the connection keeps reading,
so a client that hangs up cancels the handler (and with it every upstream request it made).
Pipelined requests that arrive meanwhile are queued and answered in order. Responses are
written with ``Content-Length`` when the handler knows it, chunked otherwise.

Error bodies use the OpenAI shape, so clients report them properly.
"""

from __future__ import annotations

import contextlib
import logging
import resource
import socket
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httptools
import trio

from otela.config.schema import default_of
from otela.dataplane import sockio
from otela.dataplane.errors import RequestError, error_json

log = logging.getLogger("otela.http")

Headers = list[tuple[bytes, bytes]]
# Decides from a request's method, target and headers alone, before its body is read,
# whether it is refused (the error to answer) or may go on (``None``). It runs inside the
# parser's callback: it must be quick and must not raise.
Screen = Callable[[str, bytes, Headers], RequestError | None]


@dataclass(frozen=True)
class Problem:
    """Why a connection's next request is refused: the answer, then the connection closes."""

    status: int
    message: str
    code: str
    headers: tuple[tuple[bytes, bytes], ...] = ()

REASONS = {
    100: "Continue", 200: "OK", 201: "Created", 202: "Accepted", 204: "No Content",
    301: "Moved Permanently", 302: "Found", 304: "Not Modified", 307: "Temporary Redirect",
    400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
    405: "Method Not Allowed", 408: "Request Timeout", 409: "Conflict", 413: "Content Too Large",
    415: "Unsupported Media Type", 422: "Unprocessable Content", 429: "Too Many Requests",
    431: "Request Header Fields Too Large", 500: "Internal Server Error",
    501: "Not Implemented", 502: "Bad Gateway", 503: "Service Unavailable",
    504: "Gateway Timeout",
}
_RECV = 65536
_PIPELINE_DEPTH = 16  # requests queued behind the one being answered before we stop reading


@dataclass(frozen=True)
class ServerLimits:
    """What one client may cost a node. Defaults suit a public ingress: those an operator
    sets are the settings' (``otela.config.schema``), the rest are fixed here."""

    max_body_bytes: int = default_of("max_body_bytes")
    max_header_bytes: int = 64 * 1024
    header_timeout: float = default_of("header_timeout")
    body_timeout: float = default_of("body_timeout")
    keep_alive_timeout: float = 75.0  # longer than clients' pools keep idle connections
    send_timeout: float = 60.0
    max_connections_per_client: int = default_of("max_connections_per_client")
    max_connections: int = 8192


@dataclass
class Request:
    """One parsed request, its body complete."""

    method: str
    target: bytes  # the raw request target: path and query, percent-encoded as sent
    headers: Headers  # names lowercased, values as the bytes the client sent
    body: bytes
    client: tuple[str, int]
    server: tuple[str, int]
    http_version: str
    keep_alive: bool

    @property
    def path(self) -> str:
        return self.target.split(b"?", 1)[0].decode("latin-1")

    @property
    def query(self) -> bytes:
        parts = self.target.split(b"?", 1)
        return parts[1] if len(parts) > 1 else b""

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None


class ClientGone(Exception):
    """The client closed the connection, or stopped reading for ``send_timeout``."""


class Response:
    """How a handler answers: ``send`` a whole response, or ``start``/``write``/``end``."""

    def __init__(self, conn: _Connection, request: Request) -> None:
        self._conn = conn
        self._head_only = request.method == "HEAD"
        self._version = request.http_version
        self.keep_alive = request.keep_alive
        self.started = False
        self.status = 0
        self._chunked = False
        self._ended = False
        self._aborted = False

    async def send(self, status: int, headers: Headers, body: bytes) -> None:
        head = self._head(status, headers, len(body))
        await self._conn.send(head if self._head_only else head + body)
        self._ended = True

    async def start(self, status: int, headers: Headers) -> None:
        """Start a response whose length is not known yet (chunked, or close-delimited)."""
        length = next((v for k, v in headers if k == b"content-length"), None)
        await self._conn.send(self._head(status, headers, None if length is None
                                         else int(length)))

    async def write(self, data: bytes) -> None:
        if not data or self._head_only:
            return
        if self._chunked:
            data = b"%x\r\n%b\r\n" % (len(data), data)
        await self._conn.send(data)

    async def end(self) -> None:
        if self._ended:
            return
        self._ended = True
        if self._chunked and not self._head_only:
            await self._conn.send(b"0\r\n\r\n")

    def abort(self) -> None:
        """End a started response without finishing its body (the upstream broke off): the
        connection closes, so the client sees it cut short instead of complete."""
        self._ended = True
        self._aborted = True
        self.keep_alive = False

    @property
    def complete(self) -> bool:
        return self._ended and not self._aborted

    def _head(self, status: int, headers: Headers, length: int | None) -> bytes:
        self.started = True
        self.status = status
        lines = [b"HTTP/1.1 %d %b\r\n" % (status, REASONS.get(status, "").encode())]
        for key, value in headers:
            if key not in (b"content-length", b"transfer-encoding", b"connection"):
                lines.append(b"%b: %b\r\n" % (key, value))
        if length is not None:
            lines.append(b"content-length: %d\r\n" % length)
        elif status >= 200 and status not in (204, 304):
            if self._version == "1.1":
                self._chunked = True
                lines.append(b"transfer-encoding: chunked\r\n")
            else:
                self.keep_alive = False  # HTTP/1.0: the end of the body is the close
        if not self.keep_alive:
            lines.append(b"connection: close\r\n")
        lines.append(b"\r\n")
        return b"".join(lines)


Handler = Callable[[Request, Response], Awaitable[None]]


class _Parsing:
    """httptools callbacks: collect messages, count sizes, never raise into the parser."""

    def __init__(self, limits: ServerLimits, screen: Screen | None = None) -> None:
        self.limits = limits
        self.screen = screen
        self.done: deque[tuple[Any, ...]] = deque()  # (target, headers, body, keep_alive, ...)
        self.problem: Problem | None = None
        self.closing = False  # no requests after the queued ones (an upgrade was asked)
        self.in_message = False
        self.headers_complete = False
        self.expect_continue = False
        self._target = bytearray()
        self._headers: Headers = []
        self._header_bytes = 0
        # the body as the parser hands it over: joined once at the end (one chunk: as is)
        self._body: list[bytes] = []
        self._body_bytes = 0
        self.parser: Any = None

    def on_message_begin(self) -> None:
        self.in_message = True
        self.headers_complete = False
        self._target = bytearray()
        self._headers = []
        self._header_bytes = 0
        self._body = []
        self._body_bytes = 0

    def on_url(self, url: bytes) -> None:
        self._target += url
        self._count_header(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))
        self._count_header(len(name) + len(value) + 4)

    def _count_header(self, size: int) -> None:
        self._header_bytes += size
        if self._header_bytes > self.limits.max_header_bytes and self.problem is None:
            self.problem = Problem(431, "request headers are too large "
                                   f"(limit {self.limits.max_header_bytes} bytes)",
                                   "headers_too_large")

    def on_headers_complete(self) -> None:
        self.headers_complete = True
        length = next((v for k, v in self._headers if k == b"content-length"), None)
        if length is not None and length.strip().isdigit() and int(length) > \
                self.limits.max_body_bytes and self.problem is None:
            self.problem = self._too_large()
        expect = next((v for k, v in self._headers if k == b"expect"), b"")
        self.expect_continue = expect.lower() == b"100-continue"
        if self.screen is not None and self.problem is None:
            refusal = self._screened()
            if refusal is not None:
                self.problem = Problem(refusal.status, refusal.message, refusal.code or "",
                                       tuple((k.encode(), v.encode())
                                             for k, v in refusal.headers.items()))

    def _screened(self) -> RequestError | None:
        assert self.screen is not None
        try:
            return self.screen(self.parser.get_method().decode(), bytes(self._target),
                               self._headers)
        except Exception:  # a screen's bug must not become a parser error
            log.exception("screening a request failed; letting it through to its handler")
            return None

    def on_body(self, body: bytes) -> None:
        if self.problem is not None:
            return  # refused: nothing more is kept
        self._body.append(body)
        self._body_bytes += len(body)
        if self._body_bytes > self.limits.max_body_bytes and self.problem is None:
            self.problem = self._too_large()

    def on_message_complete(self) -> None:
        self.in_message = False
        self.headers_complete = False
        self.expect_continue = False
        if self.problem is not None:
            return  # the request that broke a limit is refused, not answered
        chunks = self._body
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self.done.append((bytes(self._target), self._headers, body,
                          self.parser.should_keep_alive(), self.parser.get_method().decode(),
                          self.parser.get_http_version()))

    def _too_large(self) -> Problem:
        return Problem(413, f"request body exceeds the {self.limits.max_body_bytes} byte limit",
                       "request_too_large")


class _Connection:
    """One client connection: a reader task takes bytes in, the connection task answers.

    The reader runs for the connection's whole life, so a client that hangs up is noticed
    (and its handler cancelled) at once, without a watcher task per request; requests it
    parses ahead (pipelining) wait in order, up to ``_PIPELINE_DEPTH``."""

    def __init__(self, server: HttpServer, sock: socket.socket,
                 client: tuple[str, int], local: tuple[str, int]) -> None:
        self.server = server
        self.sock = sock
        self.client = client
        self.local = local
        self.limits = server.limits
        self.parsing = _Parsing(self.limits, server.screen)
        self.parser = httptools.HttpRequestParser(self.parsing)
        self.parsing.parser = self.parser
        self.closed = False  # the client hung up (EOF or a reset)
        self.served = 0  # requests answered on this connection
        self.header_bytes = 0  # fed while the current request's headers are incomplete
        self._news = trio.Event()  # the reader took something in (or the client left)
        self._room = trio.Event()  # the answering side took a request off the queue
        self._handler_scope: trio.CancelScope | None = None

    async def send(self, data: bytes) -> None:
        try:
            sent = sockio.try_send(self.sock, data)
            if sent < len(data):
                with trio.fail_after(self.limits.send_timeout):
                    await sockio.send_all(self.sock, data[sent:])
        except (sockio.Closed, trio.TooSlowError) as exc:
            self.closed = True
            raise ClientGone(str(exc) or type(exc).__name__) from None

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read)
                try:
                    while True:
                        request = await self._next_request()
                        if request is None:
                            break
                        keep_alive = await self._answer(request)
                        if not keep_alive or self.closed:
                            break
                except ClientGone:
                    pass
                nursery.cancel_scope.cancel()
        finally:
            sockio.close(self.sock)

    # -- reading -----------------------------------------------------------------------

    async def _read(self) -> None:
        parsing = self.parsing
        while True:
            while (len(parsing.done) >= _PIPELINE_DEPTH or parsing.problem is not None
                   or parsing.closing):
                self._room = trio.Event()  # enough to do: read on once a request is taken
                await self._room.wait()
            try:
                data = await sockio.recv(self.sock)
            except sockio.Closed:
                data = b""
            if not data:
                self.closed = True
                if self._handler_scope is not None:
                    self._handler_scope.cancel()  # nobody is left to answer
                self._news.set()
                return
            self._feed(data)
            self._news.set()

    def _feed(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
            parsing = self.parsing
            if parsing.in_message and not parsing.headers_complete:
                # llhttp buffers a header until it is complete: bound what it may hold.
                self.header_bytes += len(data)
                if self.header_bytes > self.limits.max_header_bytes and parsing.problem is None:
                    parsing.problem = Problem(431, "request headers are too large (limit "
                                              f"{self.limits.max_header_bytes} bytes)",
                                              "headers_too_large")
            else:
                self.header_bytes = 0
        except httptools.HttpParserUpgrade:
            # We never switch protocols (RFC 9110 §7.8 lets a server ignore Upgrade), but
            # what follows is not HTTP any more: answer what was asked, then close.
            self.parsing.closing = True
        except httptools.HttpParserError as exc:
            detail = str(exc)[:120]
            self.parsing.problem = self.parsing.problem or Problem(
                400, f"malformed HTTP request: {detail}", "malformed_request")

    async def _next_request(self) -> Request | None:
        """The next complete request, or ``None`` when the connection should close.

        Deadlines: the first byte within ``header_timeout`` on a new connection (or
        ``keep_alive_timeout`` between requests), the headers within ``header_timeout`` of
        their first byte, the body within ``body_timeout`` of the headers."""
        parsing = self.parsing
        idle = self.limits.keep_alive_timeout if self.served else self.limits.header_timeout
        wait_until = trio.current_time() + idle
        headers_due: float | None = None
        body_due: float | None = None
        while not parsing.done:
            if parsing.problem is not None:
                problem = parsing.problem
                await self._refuse(problem.status, problem.message, problem.code,
                                   headers=problem.headers)
                return None
            if self.closed or parsing.closing:
                return None
            if parsing.in_message and not parsing.headers_complete and headers_due is None:
                headers_due = wait_until = trio.current_time() + self.limits.header_timeout
            if parsing.in_message and parsing.headers_complete and body_due is None:
                body_due = wait_until = trio.current_time() + self.limits.body_timeout
                if parsing.expect_continue:
                    await self.send(b"HTTP/1.1 100 Continue\r\n\r\n")
            self._news = trio.Event()
            with trio.CancelScope(deadline=wait_until):  # (not move_on_at: a generator)
                await self._news.wait()
                continue
            if parsing.in_message:
                what = "body" if parsing.headers_complete else "headers"
                await self._refuse(408, f"the request {what} did not arrive in time",
                                   "request_timeout")
            return None
        target, headers, body, keep_alive, method, version = parsing.done.popleft()
        self._room.set()
        return Request(method, target, headers, body, self.client, self.local, version,
                       keep_alive)

    async def _refuse(self, status: int, message: str, code: str, unread: bool = False,
                      headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        """Answer with an error and close. ``unread``: the connection is refused before
        anything was read from it, so it is marked not delivered: an ingress whose hop
        connection this is sends the request to another node (a busy serving node must not
        turn its connection limit into a client's error)."""
        body = error_json(status, message, code)
        mark = b"x-otela-not-delivered: 1\r\n" if unread else b""
        mark += b"".join(b"%s: %s\r\n" % (k, v) for k, v in headers)
        head = (b"HTTP/1.1 %d %b\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                b"%bconnection: close\r\n\r\n"
                % (status, REASONS.get(status, "").encode(), len(body), mark))
        with contextlib.suppress(ClientGone):
            await self.send(head + body)

    # -- answering ---------------------------------------------------------------------

    async def _answer(self, request: Request) -> bool:
        response = Response(self, request)
        if self.parsing.closing and not self.parsing.done:
            response.keep_alive = False
        self.served += 1
        scope = self._handler_scope = trio.CancelScope()
        try:
            with scope:
                await self.server.handler(request, response)
        except ClientGone:
            pass
        except Exception:
            log.exception("handler failed for %s %s", request.method, request.path[:200])
            if not response.started:
                body = error_json(500, "internal error", "internal_error")
                await response.send(500, [(b"content-type", b"application/json")], body)
            else:
                response.abort()  # a half-sent body: the close tells the client
        finally:
            self._handler_scope = None
        if self.closed:
            return False
        if not response.started:
            await response.send(500, [(b"content-type", b"application/json")],
                                error_json(500, "the handler sent no response", "internal_error"))
        await response.end()
        if self.parsing.done:  # pipelined requests queued: let other connections run first
            await trio.lowlevel.checkpoint()
        return response.keep_alive and response.complete


class HttpServer:
    """Serve ``handler`` on ``host:port``; ``run`` reports the bound (host, port) pairs.
    ``reuse_port`` lets several processes share the port (the kernel spreads connections
    between them: ``--workers``)."""

    def __init__(self, handler: Handler, limits: ServerLimits | None = None,
                 reuse_port: bool = False, screen: Screen | None = None) -> None:
        self.handler = handler
        self.screen = screen
        self.limits = limits or ServerLimits()
        self.reuse_port = reuse_port
        self.connections = 0
        self._per_client: dict[str, int] = {}

    async def run(self, host: str, port: int, *, task_status: Any = trio.TASK_STATUS_IGNORED
                  ) -> None:
        raise_fd_limit()
        listener = self._listen(host, port)
        try:
            task_status.started([tuple(listener.getsockname()[:2])])
            async with trio.open_nursery() as nursery:
                while True:
                    await trio.lowlevel.wait_readable(listener.fileno())
                    while True:
                        try:
                            sock, address = listener.accept()
                        except (BlockingIOError, InterruptedError):
                            break
                        except OSError as exc:  # out of descriptors: let some close first
                            log.warning("accept failed: %s", exc)
                            await trio.sleep(0.1)
                            break
                        nursery.start_soon(self._connection, sock, address)
        finally:
            sockio.close(listener)

    def _listen(self, host: str, port: int) -> socket.socket:
        family, _, _, _, address = socket.getaddrinfo(
            host or "0.0.0.0", port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if self.reuse_port:
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            listener.bind(address)
            listener.listen(1024)
            listener.setblocking(False)
        except BaseException:
            listener.close()
            raise
        return listener

    async def _connection(self, sock: socket.socket, address: Any) -> None:
        sock.setblocking(False)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            client = (str(address[0]), int(address[1]))
            local = tuple(sock.getsockname()[:2])
        except OSError:
            sock.close()
            return
        refusal = None
        if self.connections >= self.limits.max_connections:
            refusal = (503, "this node has too many open connections", "too_many_connections")
        elif self._per_client.get(client[0], 0) >= self.limits.max_connections_per_client:
            refusal = (429, f"too many connections from {client[0]} (limit "
                       f"{self.limits.max_connections_per_client})", "too_many_connections")
        conn = _Connection(self, sock, client, local)
        if refusal is not None:
            await conn._refuse(*refusal, unread=True)
            sockio.close(sock)
            return
        self.connections += 1
        self._per_client[client[0]] = self._per_client.get(client[0], 0) + 1
        try:
            await conn.run()
        finally:
            self.connections -= 1
            left = self._per_client[client[0]] - 1
            if left:
                self._per_client[client[0]] = left
            else:
                del self._per_client[client[0]]


def raise_fd_limit() -> None:
    """Lift the soft descriptor limit to the hard one (often 1024 vs 1M): a node holds
    a connection per client and per upstream, and running out is a silent outage."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        pass

"""A TCP relay in front of a real engine that stalls a streamed answer part-way.

A test that cuts a stream "mid-answer" by killing the node relaying it races the engine:
a tiny model on CPU can finish 200 tokens before a test process on a busy 2-core machine
has read four of them, and then the whole answer already sits in the ingress's buffers
when the kill lands (nothing to continue). Put between that node and its engine, this
relay passes every byte until the ``hold_after``-th server-sent event of a connection, then
forwards nothing more on it: the stream is reliably still open, mid-answer, when the test
kills the node. Everything else (health checks, model lists) passes untouched.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from types import TracebackType

EVENT = b"data: "


class StallingRelay:
    """Listen on 127.0.0.1:``port`` (free one when 0) and relay to ``upstream_port``."""

    def __init__(self, upstream_port: int, hold_after: int) -> None:
        self.upstream_port = upstream_port
        self.hold_after = hold_after
        self.stalled = threading.Event()  # set once a stream was held
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._threads: list[threading.Thread] = []
        self._sockets: list[socket.socket] = [self._listener]
        self._closing = threading.Event()

    def __enter__(self) -> StallingRelay:
        self._spawn(self._accept)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._closing.set()
        for end in self._sockets:  # shutdown wakes a thread blocked on it; close does not
            _close(end)
        for thread in list(self._threads):
            thread.join(timeout=10)

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                downstream, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            self._sockets += (downstream, upstream)
            closed = threading.Event()
            self._spawn(self._requests, downstream, upstream, closed)
            self._spawn(self._answers, upstream, downstream, closed)

    def _requests(self, downstream: socket.socket, upstream: socket.socket,
                  closed: threading.Event) -> None:
        """Client to engine, untouched; when the client goes (killed), both ends close."""
        try:
            while data := downstream.recv(65536):
                upstream.sendall(data)
        except OSError:
            pass  # the client went: both ends close below
        finally:
            closed.set()
            _close(downstream)
            _close(upstream)

    def _answers(self, upstream: socket.socket, downstream: socket.socket,
                 closed: threading.Event) -> None:
        """Engine to client, up to and including the ``hold_after``-th event; then stall
        until the client goes."""
        seen = 0
        try:
            while data := upstream.recv(65536):
                cut = None
                start = 0
                while (at := data.find(EVENT, start)) >= 0:
                    seen += 1
                    if seen > self.hold_after:
                        cut = at
                        break
                    start = at + len(EVENT)
                if cut is not None:
                    downstream.sendall(data[:cut])
                    self.stalled.set()
                    closed.wait()
                    return
                downstream.sendall(data)
        except OSError:
            pass


def _close(end: socket.socket) -> None:
    with contextlib.suppress(OSError):
        end.shutdown(socket.SHUT_RDWR)
    end.close()

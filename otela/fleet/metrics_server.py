"""``otela fleet run --metrics-port``: the controller's Prometheus metrics over HTTP.

A scrape is one small GET a minute or so, so this is a few lines of trio rather than the
node's HTTP server: read the request head (bounded in size and time), answer
``GET /metrics`` with the text exposition and anything else with 404, close.
"""

from __future__ import annotations

import contextlib
from typing import Any

import trio

from otela.metrics import CONTENT_TYPE, Registry

MAX_HEAD = 8192
READ_TIMEOUT_S = 5.0


async def serve_metrics(registry: Registry, host: str, port: int,
                        task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    listeners = await trio.open_tcp_listeners(port, host=host)
    task_status.started(listeners[0].socket.getsockname()[1])

    async def handle(stream: trio.SocketStream) -> None:
        async with stream:
            head = b""
            with trio.move_on_after(READ_TIMEOUT_S):
                while b"\r\n\r\n" not in head and len(head) < MAX_HEAD:
                    chunk = await stream.receive_some(MAX_HEAD)
                    if not chunk:
                        break
                    head += chunk
            line = head.split(b"\r\n", 1)[0].split()
            if len(line) >= 2 and line[0] == b"GET" and line[1].split(b"?")[0] == b"/metrics":
                body, status = registry.render(), b"200 OK"
                kind = CONTENT_TYPE
            else:
                body, status, kind = b"not found\n", b"404 Not Found", b"text/plain"
            with contextlib.suppress(trio.BrokenResourceError):
                await stream.send_all(b"HTTP/1.1 " + status + b"\r\nContent-Type: " + kind +
                                      b"\r\nContent-Length: " + str(len(body)).encode() +
                                      b"\r\nConnection: close\r\n\r\n" + body)

    await trio.serve_listeners(handle, listeners)

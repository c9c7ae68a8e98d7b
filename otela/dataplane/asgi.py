"""Run an ASGI application (the node's FastAPI API) on otela's HTTP server, in process.

The server has already read and bounded the request (``otela.dataplane.http``), so the
app receives the whole body in one ``http.request`` message. A client that hangs up
cancels the app's task (the server cancels its handler), which is what makes requests
never outlive their client, streaming or not; ``receive`` after the body therefore just
waits. A small response is written in one piece with its ``Content-Length``; a streamed
one (``more_body``) is relayed chunk by chunk as the app sends it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import unquote

import trio

from otela.dataplane.http import Request, Response

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]],
                    Callable[[Message], Awaitable[None]]], Awaitable[None]]


def scope_of(request: Request) -> Scope:
    raw_path = request.target.split(b"?", 1)[0]
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": request.http_version,
        "method": request.method,
        "scheme": "http",
        "path": unquote(raw_path.decode("latin-1")),
        "raw_path": raw_path,
        "query_string": request.query,
        "root_path": "",
        "headers": request.headers,
        "client": request.client,
        "server": request.server,
        "state": {},
    }


async def serve_asgi(app: ASGIApp, request: Request, response: Response) -> None:
    body_taken = False

    async def receive() -> Message:
        nonlocal body_taken
        if not body_taken:
            body_taken = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await trio.sleep_forever()  # a disconnect cancels the whole app instead
        raise AssertionError("unreachable")

    status = 500
    headers: list[tuple[bytes, bytes]] = []
    streaming = False

    async def send(message: Message) -> None:
        nonlocal status, headers, streaming
        kind = message["type"]
        if kind == "http.response.start":
            status = int(message["status"])
            headers = [(bytes(k).lower(), bytes(v)) for k, v in message.get("headers", ())]
        elif kind == "http.response.body":
            body = bytes(message.get("body", b""))
            more = bool(message.get("more_body", False))
            if not streaming and not more:
                await response.send(status, headers, body)
                return
            if not streaming:
                streaming = True
                await response.start(status, headers)
            await response.write(body)
            if not more:
                await response.end()

    await app(scope_of(request), receive, send)


class AsgiHandler:
    """An ASGI app as an ``otela.dataplane.http`` handler."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, request: Request, response: Response) -> None:
        await serve_asgi(self.app, request, response)

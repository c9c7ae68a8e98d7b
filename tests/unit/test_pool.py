"""The upstream pool against a real server on 127.0.0.1 (in process): keep-alive reuse, a
pooled connection the server closed is replaced, an abandoned response closes its
connection, and a stream arrives chunk by chunk."""

from __future__ import annotations

import socket
from functools import partial

import pytest
import trio
import trio.testing

from otela.dataplane.errors import NotDelivered, UpstreamFailed
from otela.dataplane.http import HttpServer, Request, Response, ServerLimits
from otela.dataplane.pool import HttpPool

JSON = [(b"content-type", b"application/json")]


async def handler(request: Request, response: Response) -> None:
    if request.path == "/stream":
        await response.start(200, [(b"content-type", b"text/event-stream")])
        for i in range(3):
            await response.write(b"data: %d\n\n" % i)
            await trio.sleep(0.05)
        await response.end()
    elif request.path == "/slow":
        await trio.sleep(10)
    else:
        await response.send(200, JSON, b'{"ok":true,"body":%d}' % len(request.body))


async def with_server(test, limits: ServerLimits) -> None:  # type: ignore[no-untyped-def]
    server = HttpServer(handler, limits)
    async with trio.open_nursery() as nursery:
        (bound,) = await nursery.start(server.run, "127.0.0.1", 0)
        pool = HttpPool()
        try:
            await test(pool, bound[1], server)
        finally:
            pool.close()
        nursery.cancel_scope.cancel()


def run(test, limits: ServerLimits | None = None) -> None:  # type: ignore[no-untyped-def]
    trio.run(with_server, test, limits or ServerLimits())


def test_sequential_requests_share_one_connection():
    async def test(pool: HttpPool, port: int, server: HttpServer) -> None:
        for size in (0, 10, 100_000):
            reply = await pool.request("127.0.0.1", port, b"POST", b"/x", JSON, b"a" * size, 5)
            assert reply.status == 200
            assert await reply.read() == b'{"ok":true,"body":%d}' % size
        assert pool.connects == 1

    run(test)


def test_a_connection_the_server_closed_is_replaced_not_used():
    async def test(pool: HttpPool, port: int, server: HttpServer) -> None:
        reply = await pool.request("127.0.0.1", port, b"POST", b"/x", JSON, b"", 5)
        await reply.read()
        await trio.sleep(0.3)  # the server closes the idle connection after 0.1 s
        again = await pool.request("127.0.0.1", port, b"POST", b"/x", JSON, b"", 5)
        assert again.status == 200 and await again.read()
        assert pool.connects == 2

    run(test, ServerLimits(keep_alive_timeout=0.1))


def test_a_stream_arrives_in_chunks_and_an_abandoned_reply_closes_its_connection():
    async def test(pool: HttpPool, port: int, server: HttpServer) -> None:
        reply = await pool.request("127.0.0.1", port, b"POST", b"/stream", JSON, b"", 5)
        chunks = reply.chunks()
        first = await chunks.__anext__()
        assert first.startswith(b"data: 0")
        await chunks.aclose()  # the client went away
        with trio.fail_after(5):
            while server.connections:
                await trio.sleep(0.01)  # the server saw the close
        reply = await pool.request("127.0.0.1", port, b"POST", b"/x", JSON, b"", 5)
        assert await reply.read() and pool.connects == 2

    run(test)


ANSWER = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


async def answer_once_then_reset(stream: trio.SocketStream) -> None:
    """Answer one request, then die with the next one unread: the kernel resets."""
    await stream.receive_some(65536)
    await stream.send_all(ANSWER)
    await stream.socket.recv(1, socket.MSG_PEEK)  # the next request has arrived, unread
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00" * 2)
    stream.socket.close()


async def reset_without_answering(stream: trio.SocketStream) -> None:
    await stream.socket.recv(1, socket.MSG_PEEK)
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00" * 2)
    stream.socket.close()


async def two_requests(behaviour, unread_if_reset=False) -> list[str]:  # type: ignore[no-untyped-def]
    outcomes = []
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, behaviour, 0, host="127.0.0.1"))
        listener = listeners[0]
        port = listener.socket.getsockname()[1]
        pool = HttpPool()
        for _ in range(2):
            try:
                reply = await pool.request("127.0.0.1", port, b"POST", b"/x", JSON, b"{}", 5,
                                           unread_if_reset=unread_if_reset)
                await reply.read()
                outcomes.append("ok")
            except (NotDelivered, UpstreamFailed) as exc:
                outcomes.append(type(exc).__name__)
        pool.close()
        nursery.cancel_scope.cancel()
    return outcomes


@pytest.mark.parametrize(("behaviour", "unread_if_reset", "expected"), [
    (answer_once_then_reset, False, ["ok", "NotDelivered"]),  # a reused connection's server died
    (reset_without_answering, False, ["UpstreamFailed", "UpstreamFailed"]),  # fresh: ambiguous
    # A server known never to abort after reading (another node's engine hop): a reset
    # says the request was not read, on a fresh connection too.
    (reset_without_answering, True, ["NotDelivered", "NotDelivered"]),
])
def test_a_reset_before_any_answer_is_not_delivered_only_on_a_reused_connection(
        behaviour, unread_if_reset, expected):
    assert trio.run(two_requests, behaviour, unread_if_reset) == expected

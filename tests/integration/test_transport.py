"""HTTP over libp2p (``otela.dataplane``) between two real libp2p hosts and a real engine.

In-process (no root needed): the NAT test covers the same code across real NATs and a
relay; here the edge cases are driven one by one: concurrency on one stream, streaming,
cancellation, and which failures count as "never delivered" (the only ones retried).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from libp2p.tools.anyio_service import background_trio_service

from otela.dataplane.gate import EngineGate
from otela.dataplane.hop_core import HopCore
from otela.dataplane.inflight import Inflight
from otela.dataplane.p2p_client import EngineStreamClient, NotDelivered
from otela.dataplane.p2p_frames import HTTP_PROTOCOL
from otela.dataplane.p2p_server import EngineStreamServer
from otela.dataplane.pool import HttpPool
from otela.engine.demo.echo import EchoSettings, create_app
from otela.load.source import LoadSource
from otela.mesh.host import build_host
from otela.mesh.nat import NatTraversal
from otela.registry.records import Lifecycle, NodeRecord
from otela.testing.localfed import free_port
from tests.integration.peer import new_identity

CHAT = "/v1/chat/completions"


def chat(content: str = "one two three", **extra: object) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": content}],
                       **extra}).encode()


@dataclass
class Pair:
    client: EngineStreamClient
    server: EngineStreamServer
    record: NodeRecord  # the serving node, as the caller's registry would hold it
    server_host: object
    client_host: object
    engine: dict[str, str | None]


async def _noop(*_: object) -> None:
    return None


@asynccontextmanager
async def pair(token_delay: float = 0.0) -> AsyncIterator[Pair]:
    meshes = [build_host(new_identity(), "127.0.0.1", 0) for _ in range(2)]
    config = Config()
    config.bind = [f"127.0.0.1:{free_port()}"]
    config.accesslog = None
    app = create_app(EchoSettings(models=("m",), token_delay=token_delay))
    async with (
        meshes[0].host.run(listen_addrs=[meshes[0].listen_addr]),
        meshes[1].host.run(listen_addrs=[meshes[1].listen_addr]),
        background_trio_service(meshes[0].pubsub), background_trio_service(meshes[0].gossipsub),
        background_trio_service(meshes[1].pubsub), background_trio_service(meshes[1].gossipsub),
        trio.open_nursery() as nursery,
    ):
        binds = await nursery.start(serve, app, config)  # type: ignore[arg-type]
        engine: dict[str, str | None] = {"url": binds[0]}
        gate = EngineGate(lambda: engine["url"], lambda: {"m"}, 32 * 1024 * 1024)
        server = EngineStreamServer(HopCore(gate, HttpPool(), LoadSource(1.0)), Inflight(),
                                    lambda peer: True)
        server.install(meshes[0].host)
        nat = NatTraversal(meshes[1].host, offer_relay=False, relays=list, publish=_noop)
        client = EngineStreamClient(meshes[1].host, nat.connect)
        await nursery.start(client.run)
        server_id = meshes[0].host.get_id().to_base58()
        record = NodeRecord(
            "s", server_id, "p", Lifecycle.SERVING, 1, "http://unused",
            addrs=tuple(f"{a}" for a in meshes[0].host.get_addrs()), reachability="public",
        )
        yield Pair(client, server, record, meshes[0].host, meshes[1].host, engine)
        nursery.cancel_scope.cancel()


def run(test: Callable[[Pair], Awaitable[None]], **kw: float) -> None:
    async def main() -> None:
        with trio.fail_after(60):
            async with pair(**kw) as p:
                await test(p)

    trio.run(main)


def test_requests_and_streams_share_one_long_lived_stream() -> None:
    async def test(p: Pair) -> None:
        response = await p.client.request(p.record, CHAT, chat(), [])
        assert response.status == 200
        assert json.loads(await response.read())["choices"][0]["message"]["content"]

        streamed = await p.client.request(p.record, CHAT, chat(stream=True), [])
        assert dict(streamed.headers)[b"content-type"].startswith(b"text/event-stream")
        chunks = [c async for c in streamed.chunks()]
        assert b"".join(chunks).rstrip().endswith(b"data: [DONE]")

        results: list[int] = []

        async def one(i: int) -> None:
            r = await p.client.request(p.record, CHAT, chat(f"request {i}"), [])
            body = json.loads(await r.read())
            assert f"request {i}" in body["choices"][0]["message"]["content"]
            results.append(r.status)

        async with trio.open_nursery() as nursery:
            for i in range(8):
                nursery.start_soon(one, i)
        assert results == [200] * 8
        assert list(p.client.stats()) == [p.record.peer_id]  # one stream for all of them
        assert p.server.served == 10

    run(test)


def test_failures_before_the_engine_are_not_delivered() -> None:
    async def test(p: Pair) -> None:
        p.engine["url"] = None  # draining / not SERVING
        with pytest.raises(NotDelivered, match="not serving"):
            await p.client.request(p.record, CHAT, chat(), [])
        p.engine["url"] = f"http://127.0.0.1:{free_port()}"  # engine process gone
        with pytest.raises(NotDelivered, match="engine unreachable"):
            await p.client.request(p.record, CHAT, chat(), [])
        with pytest.raises(NotDelivered, match="not relayed"):
            await p.client.request(p.record, "/admin/shutdown", chat(), [])
        with pytest.raises(NotDelivered, match="not relayed"):  # engine admin under /v1
            await p.client.request(p.record, "/v1/load_lora_adapter", chat(), [])
        other_model = json.dumps({"model": "not-here", "messages": []}).encode()
        with pytest.raises(NotDelivered, match="does not serve"):
            await p.client.request(p.record, CHAT, other_model, [])
        nowhere = NodeRecord("x", new_identity().peer_id.to_base58(), "p", Lifecycle.SERVING,
                             1, "http://unused", reachability="private-relayed")
        with pytest.raises(NotDelivered, match="no direct address and no relay circuit"):
            await p.client.request(nowhere, CHAT, chat(), [])
        assert p.server.served == 0

    run(test)


def test_a_garbage_stream_is_dropped_and_the_server_keeps_serving() -> None:
    async def test(p: Pair) -> None:
        first = await p.client.request(p.record, CHAT, chat(), [])  # connects the hosts
        assert first.status == 200 and await first.read()
        raw = await p.client_host.new_stream(p.server_host.get_id(), [HTTP_PROTOCOL])  # type: ignore[attr-defined]
        await raw.write(b"\x00\x00\x00\x01\x63\x00\x00\x00\x00")  # unknown frame kind
        with pytest.raises(Exception):  # noqa: B017 - reset or EOF, both mean "dropped"
            with trio.fail_after(5):
                while True:
                    if not await raw.read(100):
                        raise EOFError
        response = await p.client.request(p.record, CHAT, chat(), [])
        assert response.status == 200 and await response.read()

    run(test)


def test_a_client_that_goes_away_cancels_the_engine_request() -> None:
    async def test(p: Pair) -> None:
        long = chat(" ".join(["word"] * 400), stream=True)
        response = await p.client.request(p.record, CHAT, long, [])
        chunks = response.chunks()
        assert await chunks.__anext__()
        assert p.server.inflight.count == 1
        await chunks.aclose()  # the HTTP client disconnected
        with trio.fail_after(5):
            while p.server.inflight.count:
                await trio.sleep(0.01)
        again = await p.client.request(p.record, CHAT, chat(), [])  # the stream still works
        assert again.status == 200 and await again.read()

    run(test, token_delay=0.02)


def test_bodies_larger_than_the_flow_control_window_go_both_ways() -> None:
    """Megabyte bodies in both directions, several at once on the one stream: the yamux
    receive window (256 KiB) must be re-credited as data is consumed, or this stalls
    (otela has yamux return credit once half the window is read, not on every read)."""

    async def test(p: Pair) -> None:
        async def one(i: int, stream: bool) -> None:
            n = 15_000 if stream else 120_000  # ~1 MB each way (an SSE event per word)
            words = " ".join(f"w{i}x{k}" for k in range(n))
            r = await p.client.request(p.record, CHAT, chat(words, stream=stream), [])
            body = await r.read() if not stream else b"".join([c async for c in r.chunks()])
            assert r.status == 200 and len(body) > 1_000_000
            assert f"w{i}x{n - 1}".encode() in body

        async with trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(one, i, i == 2)

    run(test)

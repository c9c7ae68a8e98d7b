"""The request path as ``otela.api.assembly`` builds it for a node (and for each worker),
driven in process over real sockets: a client, the assembled HTTP server, and a real
engine on a socket. What a user relies on, request by request: the answer and who served
it, the OpenAI-style errors, the key screen before the body, and the engine hop's rules.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import httpx
import trio

from otela.api.assembly import RequestPath, Surroundings, assemble
from otela.api.observe import Observer
from otela.config import NodeConfig, resolve
from otela.dataplane.errors import RequestError
from otela.dataplane.exchange import Exchange
from otela.dataplane.hop_auth import HopSigner, HopVerifier
from otela.dataplane.http import HttpServer, Request, Response
from otela.load.source import LoadSource
from otela.metrics import Registry as Metrics
from otela.registry.crdt import Entry
from otela.registry.records import Lifecycle, ModelInfo, NodeRecord
from otela.registry.session import new_session_id
from otela.registry.store import Registry
from tests.integration.peer import new_identity

MODEL = "m"


async def engine(request: Request, response: Response) -> None:
    """A real engine on a socket: answers chat with what it was asked, and its path."""
    body = json.loads(request.body)
    answer = {"object": "chat.completion", "model": body["model"], "seen_path":
              request.target.decode(), "choices": [{"message": {"content": "hi"}}],
              "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
    await response.send(200, [(b"content-type", b"application/json")],
                        json.dumps(answer).encode())


class Keys:
    """The ingress service's key gate, in memory: one good key."""

    def authenticate(self, authorization: bytes | None) -> Any:
        if authorization != b"Bearer good":
            raise RequestError(401, "Invalid API key.", code="invalid_api_key")
        return SimpleNamespace(id="k1")

    def admit(self, key: Any, model: str, max_tokens: int | None = None,
              prompt_bound: int = 0) -> Any:
        return SimpleNamespace(providers=None)

    def finished(self, grant: Any, tokens: int, prompt_tokens: int = 0,
                 provider: str = "") -> None:
        pass

    def screen(self, authorization: bytes | None) -> None:
        self.authenticate(authorization)


class Seen(Observer):
    def __init__(self) -> None:
        self.exchanges: list[Exchange] = []

    def finished(self, exchange: Exchange) -> None:
        self.exchanges.append(exchange)


@dataclass
class Running:
    url: str
    path: RequestPath
    seen: Seen
    peer: str
    session: str


@asynccontextmanager
async def running(keys: Keys | None = None) -> AsyncIterator[Running]:
    me = new_identity()
    peer = me.peer_id.to_base58()
    config: NodeConfig = resolve({}, env={}).config
    async with trio.open_nursery() as nursery:
        (bound,) = await nursery.start(HttpServer(engine).run, "127.0.0.1", 0)
        engine_url = f"http://127.0.0.1:{bound[1]}"
        session = new_session_id(peer, 1)
        record = NodeRecord(session, peer, "lab", Lifecycle.SERVING, 1, "http://unused",
                            models=(ModelInfo(MODEL),))
        registry = Registry()
        registry.apply(Entry(session, record.state, 1, 0.0, b"", record), 0.0)
        seen = Seen()
        key = me.key_pair.private_key.to_bytes()

        async def api(request: Request, response: Response) -> None:
            await response.send(404, [], b'{"error": {"message": "api"}}')

        served: Collection[str] = {MODEL}
        path = assemble(config, Surroundings(
            registry=lambda: registry, session=lambda: session,
            engine_url=lambda: engine_url, served_models=lambda: served,
            avoided=frozenset, relayed=None,  # type: ignore[arg-type]
            signer=HopSigner(key, peer), verifier=HopVerifier(key, peer, registry.is_member),
            load=LoadSource(1.0), fallback=api, observers=[seen], metrics=Metrics(),
            keys=keys))  # type: ignore[arg-type]
        (port,) = await nursery.start(path.server.run, "127.0.0.1", 0)
        yield Running(f"http://127.0.0.1:{port[1]}", path, seen, peer, session)
        nursery.cancel_scope.cancel()


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "x"}], **extra}


def run(test: Any, keys: Keys | None = None) -> None:
    async def main() -> None:
        with trio.fail_after(30):
            async with running(keys) as r, httpx.AsyncClient(base_url=r.url) as client:
                await test(r, client)

    trio.run(main)


def test_a_request_is_answered_by_the_engine_and_says_who_served_it() -> None:
    async def test(r: Running, client: httpx.AsyncClient) -> None:
        answer = await client.post("/v1/chat//completions/", json=chat())
        assert answer.status_code == 200
        assert answer.json()["seen_path"] == "/v1/chat/completions"  # canonical, as checked
        assert answer.headers["x-otela-session-id"] == r.session
        assert answer.headers["x-otela-peer-id"] == r.peer
        assert "route;dur=" in answer.headers["server-timing"]
        (exchange,) = r.seen.exchanges
        assert (exchange.model, exchange.status, exchange.path_kind) == (MODEL, 200, "local")
        assert (await client.get("/metrics")).status_code == 200

    run(test)


def test_what_is_not_routed_gets_an_openai_error_and_reaches_no_engine() -> None:
    async def test(r: Running, client: httpx.AsyncClient) -> None:
        cases = [
            ("/v1/chat/completions", chat(model="nope"), 404, "model_not_found"),
            ("/v1/chat/completions", {"messages": []}, 400, None),
            ("/v1/chat/completions", [1, 2], 400, None),
            ("/v1/chat/%2e%2e/load_lora_adapter", chat(), 400, "invalid_path"),
            ("/v1/load%5Flora%5Fadapter", chat(), 404, None),  # not a route: the API's
            ("/v1/engine/v1/chat/completions", chat(), 401, "hop_unauthenticated"),
        ]
        for target, body, status, code in cases:
            answer = await client.post(target, json=body)
            assert answer.status_code == status, (target, answer.text)
            error = answer.json()["error"]
            assert "message" in error
            if code is not None:
                assert error["code"] == code, (target, error)
        assert all(e.status != 200 for e in r.seen.exchanges)

    run(test)


def test_with_keys_a_keyless_request_is_refused_from_its_headers() -> None:
    async def test(r: Running, client: httpx.AsyncClient) -> None:
        assert (await client.post("/v1/chat/completions", json=chat(),
                                  headers={"authorization": "Bearer good"})).status_code == 200
        host, port = r.url.removeprefix("http://").split(":")
        with trio.socket.socket() as sock:
            await sock.connect((host, int(port)))
            await sock.send(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                            b"content-length: 1000000\r\n\r\n")  # and no body, ever
            answer = await sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 401 ") and b"invalid_api_key" in answer

    run(test, Keys())

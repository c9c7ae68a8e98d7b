"""One engine hop, three transports, one answer: the same scenarios through the HTTP hop,
HTTP over libp2p, and a data-path worker's relay through its control process must give
the ingress the same outcome (the reply and its status, or the same exception with the
same flags), so the router makes the same retry decision whichever way a request went.

In process, with real sockets: a scenario engine on otela's own HTTP server, the serving
node's ``HopCore`` behind each adapter, two real libp2p hosts, and the ingress side's
``Upstreams``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio
from libp2p.peer.peerinfo import PeerInfo
from libp2p.tools.anyio_service import background_trio_service

from otela.api.hop import EngineHop
from otela.dataplane.deadline import FirstByteTimeouts
from otela.dataplane.errors import NotDelivered, UpstreamFailed, UpstreamTimeout
from otela.dataplane.gate import EngineGate
from otela.dataplane.hop_auth import HopSigner, HopVerifier
from otela.dataplane.hop_core import HopCore
from otela.dataplane.http import HttpServer, Request, Response
from otela.dataplane.inflight import Inflight
from otela.dataplane.p2p_client import EngineStreamClient
from otela.dataplane.p2p_server import EngineStreamServer
from otela.dataplane.pool import HttpPool
from otela.dataplane.upstream import Upstreams
from otela.load.source import LoadSource
from otela.mesh.host import build_host
from otela.registry.crdt import Entry
from otela.registry.records import Lifecycle, NodeRecord
from otela.registry.session import new_session_id
from otela.registry.store import Registry
from otela.workers.control import InternalRoutes
from otela.workers.worker import ControlRelay
from tests.integration.peer import new_identity

CHAT = "/v1/chat/completions"
HOP_TIMEOUTS = FirstByteTimeouts(stream_s=0.5, per_token_s=0.0, ceiling_s=0.5)
INGRESS_WAIT_S = 5.0  # longer than the hop's: the hop's timeout must be the one seen
TRANSPORTS = ("http", "libp2p", "worker")


async def scenario_engine(request: Request, response: Response) -> None:
    """An engine whose answer the request's ``case`` picks."""
    case = json.loads(request.body).get("case")
    json_type = [(b"content-type", b"application/json")]
    if case == "ok":
        await response.send(200, json_type, b'{"answer": "fine"}')
    elif case == "client_error":
        await response.send(400, json_type, b'{"error": {"message": "bad field"}}')
    elif case == "server_error":
        await response.send(500, json_type, b'{"error": {"message": "engine bug"}}')
    elif case == "hang":
        await trio.sleep_forever()
    elif case == "break_mid_body":
        await response.start(200, [*json_type, (b"content-length", b"100")])
        await response.write(b'{"answer": "par')
        response.abort()
    elif case == "cut_stream":
        await response.start(200, [(b"content-type", b"text/event-stream")])
        await response.write(b'data: {"choices": []}\n\n')
        await trio.sleep(0.01)
        response.abort()


@dataclass
class Federation:
    """The serving node's side, once, reachable by all three transports."""

    engine_url: str
    engine: dict[str, str | None]  # what the gate reads: the engine's URL, None if draining
    members: set[str]  # whom the serving node knows as members
    ingress_peer: str
    records: dict[str, NodeRecord]  # how the ingress sees the serving node, per transport
    upstreams: dict[str, Upstreams]  # the ingress side of each transport


class _Token:
    def __init__(self, token: bytes) -> None:
        self.token = token


async def _no_api(request: Request, response: Response) -> None:
    await response.send(404, [], b"")


@asynccontextmanager
async def federation() -> AsyncIterator[Federation]:
    serving_id, ingress_id = new_identity(), new_identity()
    serving = build_host(serving_id, "127.0.0.1", 0)
    ingress = build_host(ingress_id, "127.0.0.1", 0)
    serving_peer = serving_id.peer_id.to_base58()
    ingress_peer = ingress_id.peer_id.to_base58()
    members = {ingress_peer}
    async with (
        serving.host.run(listen_addrs=[serving.listen_addr]),
        ingress.host.run(listen_addrs=[ingress.listen_addr]),
        background_trio_service(serving.pubsub), background_trio_service(serving.gossipsub),
        background_trio_service(ingress.pubsub), background_trio_service(ingress.gossipsub),
        trio.open_nursery() as nursery,
    ):
        (engine_bind,) = await nursery.start(HttpServer(scenario_engine).run, "127.0.0.1", 0)
        engine_url = f"http://127.0.0.1:{engine_bind[1]}"
        engine: dict[str, str | None] = {"url": engine_url}
        gate = EngineGate(lambda: engine["url"], lambda: {"m"}, 1 << 20,
                          timeouts=HOP_TIMEOUTS)
        core = HopCore(gate, HttpPool(), LoadSource(1.0))
        # The HTTP hop.
        verifier = HopVerifier(serving_id.key_pair.private_key.to_bytes(), serving_peer,
                               members.__contains__)
        hop = EngineHop(verifier, core)
        (hop_bind,) = await nursery.start(HttpServer(hop.handle).run, "127.0.0.1", 0)
        # HTTP over libp2p.
        EngineStreamServer(core, Inflight(), members.__contains__).install(serving.host)
        serving_info = PeerInfo(serving.host.get_id(), serving.host.get_addrs())

        async def dial(record: NodeRecord) -> None:  # as a hole-punched connection would
            await ingress.host.connect(serving_info)

        p2p = EngineStreamClient(ingress.host, dial)
        await nursery.start(p2p.run)
        direct = NodeRecord(new_session_id(serving_peer, 1), serving_peer, "p",
                            Lifecycle.SERVING, 1, f"http://127.0.0.1:{hop_bind[1]}",
                            addrs=tuple(str(a) for a in serving.host.get_addrs()))
        behind_nat = NodeRecord(**{**{f: getattr(direct, f) for f in direct.__slots__},
                                   "reachability": "private-relayed"})
        # A worker's relay: its control process reaches the node over libp2p for it.
        registry = Registry()
        registry.apply(Entry(behind_nat.session_id, behind_nat.state, 1, 0.0, b"",
                             behind_nat), 0.0)
        token = _Token(b"control-token")
        internal = InternalRoutes(token, registry, p2p, _no_api,  # type: ignore[arg-type]
                                  INGRESS_WAIT_S)
        (internal_bind,) = await nursery.start(HttpServer(internal).run, "127.0.0.1", 0)
        control = ControlRelay(HttpPool(), internal_bind[1], token.token, INGRESS_WAIT_S)
        signer = HopSigner(ingress_id.key_pair.private_key.to_bytes(), ingress_peer)

        def upstreams(relayed: Any) -> Upstreams:
            return Upstreams(HttpPool(), self_session=lambda: "ingress",
                             local_engine=lambda: None, hop_signer=signer, p2p=relayed)

        yield Federation(engine_url, engine, members, ingress_peer,
                         {"http": direct, "libp2p": behind_nat, "worker": behind_nat},
                         {"http": upstreams(None), "libp2p": upstreams(p2p),
                          "worker": upstreams(control)})
        nursery.cancel_scope.cancel()


async def outcome(fed: Federation, transport: str, case: str) -> tuple[Any, ...]:
    """What the ingress sees: the reply's status and body (or that the body broke off), or
    the exception and its flags."""
    body = json.dumps({"model": "m", "case": case,
                       "messages": [{"role": "user", "content": "x"}]}).encode()
    try:
        reply = await fed.upstreams[transport].send(fed.records[transport], CHAT, body, [],
                                                    INGRESS_WAIT_S)
    except NotDelivered as exc:
        return ("not delivered", exc.refused, exc.unreachable, exc.blameless)
    except UpstreamTimeout:
        return ("timeout",)
    except UpstreamFailed:
        return ("failed",)
    try:
        received = reply.take_buffered() + b"".join([c async for c in reply.chunks()])
    except UpstreamFailed:
        return ("reply", reply.status, "broken")
    finally:
        await reply.aclose()
    return ("reply", reply.status, json.loads(received))


EXPECTED = {
    "ok": ("reply", 200, {"answer": "fine"}),
    "client_error": ("reply", 400, {"error": {"message": "bad field"}}),
    "server_error": ("reply", 500, {"error": {"message": "engine bug"}}),
    "hang": ("timeout",),  # the client gets a 504, and it is never sent again
    "break_mid_body": ("reply", 200, "broken"),
    "cut_stream": ("reply", 200, "broken"),
}


def test_every_transport_gives_the_same_outcome_for_every_scenario() -> None:
    async def main() -> dict[tuple[str, str], tuple[Any, ...]]:
        seen: dict[tuple[str, str], tuple[Any, ...]] = {}
        with trio.fail_after(90):
            async with federation() as fed:
                for transport in TRANSPORTS:
                    for case in EXPECTED:
                        seen[(transport, case)] = await outcome(fed, transport, case)
                    fed.engine["url"] = "http://127.0.0.1:9"  # the engine process is gone
                    seen[(transport, "engine down")] = await outcome(fed, transport, "ok")
                    fed.engine["url"] = None  # draining: not serving any more
                    seen[(transport, "not serving")] = await outcome(fed, transport, "ok")
                    fed.engine["url"] = fed.engine_url
                    fed.members.clear()  # it has not heard of the ingress's session yet
                    seen[(transport, "not a member")] = await outcome(fed, transport, "ok")
                    fed.members.add(fed.ingress_peer)
        return seen

    seen = trio.run(main)
    for transport in TRANSPORTS:
        for case, answer in EXPECTED.items():
            assert seen[(transport, case)] == answer, (transport, case, seen)
    assert seen[("http", "engine down")][0] == "not delivered"
    assert seen[("http", "not serving")] == ("not delivered", False, False, False)
    assert seen[("http", "not a member")] == ("not delivered", False, False, True)
    for case in ("engine down", "not serving", "not a member"):
        assert len({seen[(t, case)] for t in TRANSPORTS}) == 1, (case, seen)

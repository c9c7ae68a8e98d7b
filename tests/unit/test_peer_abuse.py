"""What a misbehaving member can send over otela's libp2p protocols, part by part: stream
floods (per-peer quotas), SWIM request floods on one stream, header injection and
malformed answers over ``/otela/http/2``, and refusals that anyone can cause. The same
abuse from a real peer process: ``tests/integration/test_misbehaving_peer.py``."""

from __future__ import annotations

import logging
from typing import Any

import msgpack
import pytest
import trio
import trio.testing
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from otela.dataplane.errors import NotDelivered, UpstreamFailed
from otela.dataplane.p2p_client import EngineStreamClient, response_head
from otela.dataplane.p2p_frames import (
    Frame,
    FrameError,
    FrameReader,
    Kind,
    header_pairs,
    packed,
    request_path,
)
from otela.liveness.channels import MAX_IN_FLIGHT_PER_STREAM, Channels
from otela.membership.admission import MAX_REFUSALS, Admission
from otela.mesh.framing import read_frame, write_frame
from otela.mesh.quota import StreamQuota, StreamQuotas
from otela.registry.records import Lifecycle, NodeRecord


def peer_id() -> ID:
    return ID.from_pubkey(create_new_key_pair().public_key)


class Conn:
    def __init__(self, peer: ID) -> None:
        self.peer_id = peer


class Stream:
    """One end of an in-memory byte stream with the surface of a libp2p stream."""

    def __init__(self, inner: Any, peer: ID) -> None:
        self.inner = inner
        self.muxed_conn = Conn(peer)
        self.was_reset = False

    async def read(self, n: int = 65536) -> bytes:
        try:
            return bytes(await self.inner.receive_some(n))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            return b""

    async def write(self, data: bytes) -> None:
        await self.inner.send_all(data)

    async def close(self) -> None:
        await self.inner.aclose()

    async def reset(self) -> None:
        self.was_reset = True
        await self.inner.aclose()


def stream_pair(client_peer: ID, server_peer: ID) -> tuple[Stream, Stream]:
    a, b = trio.testing.memory_stream_pair()
    return Stream(a, server_peer), Stream(b, client_peer)


# -- per-peer stream quotas -------------------------------------------------------------


def test_a_quota_counts_open_streams_per_peer_and_forgets_closed_ones():
    quota = StreamQuota(per_peer=2)
    assert quota.acquire("a") and quota.acquire("a") and not quota.acquire("a")
    assert quota.acquire("b") and quota.refused == 1
    quota.release("a")
    assert quota.acquire("a")
    for peer in ("a", "a", "b"):
        quota.release(peer)
    assert quota.open_streams() == 0 and quota.peers() == 0  # nothing left behind


def test_streams_over_a_peers_quota_are_reset_unread_and_others_are_served(caplog):
    quotas = StreamQuotas()
    flooder, honest = peer_id(), peer_id()
    served: list[ID] = []
    release = trio.Event()

    async def handler(stream: Any) -> None:
        served.append(stream.muxed_conn.peer_id)
        await release.wait()

    capped = quotas.guard("/x/1", 3, handler)

    async def main() -> list[Stream]:
        streams = [stream_pair(flooder, flooder)[1] for _ in range(50)]
        streams.append(stream_pair(honest, honest)[1])
        async with trio.open_nursery() as nursery:
            for stream in streams:
                nursery.start_soon(capped, stream)
            await trio.testing.wait_all_tasks_blocked()
            assert quotas.report()["/x/1"] == {"open": 4, "peers": 2, "refused": 47}
            release.set()
        return streams

    with caplog.at_level(logging.WARNING, "otela.mesh"):
        streams = trio.run(main)
    assert served.count(flooder) == 3 and served.count(honest) == 1
    assert sum(s.was_reset for s in streams) == 47
    assert quotas.report()["/x/1"]["open"] == 0
    assert len([r for r in caplog.records if "refused another" in r.message]) <= 10


# -- SWIM: many requests in flight on one stream -----------------------------------------


def test_a_swim_stream_has_at_most_64_requests_in_flight():
    """Each request (an indirect probe of a third peer) ran in its own task, unbounded."""
    me, flooder = peer_id(), peer_id()
    channels = Channels(None, "/otela/swim/2.0.0", lambda _peer, message: msgpack.packb(message),
                        lambda _peer, data: msgpack.unpackb(data))
    answering = 0
    most = 0
    release = trio.Event()

    async def answer(peer: str, message: dict[str, Any]) -> dict[str, Any] | None:
        nonlocal answering, most
        answering += 1
        most = max(most, answering)
        await release.wait()
        answering -= 1
        return {"k": "req-ack", "ok": False}

    async def main() -> int:
        theirs, ours = stream_pair(flooder, me)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(channels.serve, ours, lambda _p: True, answer)
            for i in range(500):
                await write_frame(theirs, msgpack.packb({"k": "req", "target": "x", "i": i}))
            await trio.testing.wait_all_tasks_blocked()
            release.set()
            replies = 0
            with trio.move_on_after(1):
                while True:
                    await read_frame(theirs)
                    replies += 1
            await theirs.close()
        return replies

    replies = trio.run(main)
    assert most == MAX_IN_FLIGHT_PER_STREAM
    assert replies == MAX_IN_FLIGHT_PER_STREAM
    assert channels.stats["requests_dropped"] == 500 - MAX_IN_FLIGHT_PER_STREAM


# -- /otela/http/2: headers and answers --------------------------------------------------


@pytest.mark.parametrize("pair", [
    [b"x-a\r\nx-injected", b"1"], [b"content-type", b"a\r\nx-injected: 1"],
    [b"accept", b"a\nb"], [b"accept", b"a\rb"], [b"user-agent", b"a\0b"], [b"", b"v"],
    [b"bad name", b"v"], [b"bad:name", b"v"], [b"\xff", b"v"],
])
def test_header_names_and_values_that_could_inject_lines_are_refused(pair):
    with pytest.raises(FrameError):
        header_pairs([pair])


@pytest.mark.parametrize("path", [
    "/v1/chat/completions HTTP/1.1\r\nx-injected: 1\r\n\r\nGET /v1/models", "/v1/a b",
    "/v1/x\n", "/v1/\x00", "/v1/\x7f", "v1/x", "", 7, None, b"/v1/x", "/" + "a" * 9000,
])
def test_request_paths_that_could_inject_a_request_line_are_refused(path):
    with pytest.raises(FrameError):
        request_path(path)
    assert request_path("/v1/chat/completions?x=%0D%0A") == "/v1/chat/completions?x=%0D%0A"


def test_ordinary_headers_pass_as_bytes_lowercased():
    assert header_pairs([[b"User-Agent", "naïve\t1".encode()]]) == [
        (b"user-agent", "naïve\t1".encode())]


@pytest.mark.parametrize("head", [
    {"status": "200"}, {"status": 99}, {"status": 600}, {"status": -1}, {"status": 2**40},
    {"status": 1e9}, {"status": True}, {"headers": []}, {"status": 200, "headers": 7},
    {"status": 200, "headers": [[b"x\r\ny", b"1"]]},
])
def test_malformed_response_heads_are_frame_errors(head):
    with pytest.raises(FrameError):
        response_head(packed(1, Kind.HEAD, head))
    with pytest.raises(FrameError):
        response_head(Frame(1, Kind.HEAD, b"\xc1 not msgpack"))


class Host:
    """What ``EngineStreamClient`` uses of a libp2p host; its streams go to ``serve``."""

    def __init__(self, serve: Any, nursery: trio.Nursery) -> None:
        self.serve = serve
        self.nursery = nursery

    async def new_stream(self, peer: ID, protocols: list[str]) -> Stream:
        ours, theirs = stream_pair(peer, peer)
        self.nursery.start_soon(self.serve, theirs)
        return ours

    def get_network(self) -> Any:
        return self

    def get_connections(self, peer: ID) -> list[Any]:
        return []


BAD_ANSWERS = [
    Frame(1, Kind.HEAD, b"\xc1"),  # not msgpack
    Frame(1, Kind.HEAD, msgpack.packb([1, 2])),  # not a map
    packed(1, Kind.HEAD, {"status": "ok", "headers": []}),
    packed(1, Kind.HEAD, {"status": 200, "headers": [[b"set-cookie", b"a\r\nx: 1"]]}),
    Frame(1, Kind.ERROR, b"\xc1"),
    Frame(1, Kind.ERROR, msgpack.packb("text")),
    Frame(1, Kind.DATA, b"data before any head"),
]


@pytest.mark.parametrize("answer", BAD_ANSWERS)
def test_a_serving_nodes_malformed_answer_is_an_upstream_failure_not_a_crash(answer):
    """They raised FrameError out of the client, which the ingress answered with a 500;
    an upstream failure is a 502 (and, possibly delivered, never retried elsewhere)."""
    server_peer = peer_id()
    record = NodeRecord("s", server_peer.to_base58(), "p", Lifecycle.SERVING, 1, "http://x")

    async def serve(stream: Stream) -> None:
        reader = FrameReader(stream)
        await reader.next()
        await stream.write(answer.encode())
        await trio.sleep_forever()

    async def connect(_record: NodeRecord) -> None:
        return None

    async def main() -> BaseException:
        async with trio.open_nursery() as nursery:
            client = EngineStreamClient(Host(serve, nursery), connect)
            await nursery.start(client.run)
            with pytest.raises((UpstreamFailed, NotDelivered)) as caught:
                with trio.fail_after(5):
                    response = await client.request(record, "/v1/x", b"{}", [])
                    await response.read()
            nursery.cancel_scope.cancel()
        return caught.value

    error = trio.run(main)
    assert isinstance(error, UpstreamFailed)


# -- admission: refusals anyone can cause ------------------------------------------------


def test_refused_peers_are_bounded_and_their_warnings_budgeted(caplog):
    admission = Admission(create_new_key_pair().public_key, None)
    with caplog.at_level(logging.WARNING, "otela.mesh"):
        for _ in range(MAX_REFUSALS + 200):
            admission._refuse(peer_id(), "admission handshake failed: junk")
    assert len(admission.refusals) == MAX_REFUSALS
    assert len(caplog.records) <= 25


# -- /otela/http/2: requests in flight on one stream --------------------------------------


class StuckPool:
    """An engine that never answers: every request stays in flight."""

    def __init__(self) -> None:
        self.requests = 0

    async def request(self, *args: Any) -> Any:
        self.requests += 1
        await trio.sleep_forever()


class Load:
    def start(self) -> None: ...

    def end(self) -> None: ...

    def header(self) -> bytes:
        return b"in_flight=0"


def test_one_engine_stream_holds_at_most_1024_requests_and_no_duplicate_ids():
    """Every REQUEST frame started a task (and an engine request), without bound; a second
    request under an id in flight replaced the first one's cancel scope."""
    from otela.dataplane.gate import EngineGate
    from otela.dataplane.hop_core import HopCore
    from otela.dataplane.inflight import Inflight
    from otela.dataplane.p2p_server import MAX_IN_FLIGHT_PER_STREAM, EngineStreamServer

    pool = StuckPool()
    server = EngineStreamServer(
        HopCore(EngineGate(lambda: "http://127.0.0.1:9", lambda: {"m"}, 1 << 20),
                pool, Load()),  # type: ignore[arg-type]
        Inflight(), lambda _peer: True)
    body = b'{"model": "m"}'
    sent = MAX_IN_FLIGHT_PER_STREAM + 100

    async def main() -> list[tuple[int, int]]:
        theirs, ours = stream_pair(peer_id(), peer_id())
        refusals: list[tuple[int, int]] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.handle, ours)
            frames = [packed(rid, Kind.REQUEST, {"path": "/v1/chat/completions", "body": body,
                                                 "headers": []}).encode()
                      for rid in (*range(1, sent + 1), 5)]
            nursery.start_soon(theirs.write, b"".join(frames))
            reader = FrameReader(theirs)
            with trio.move_on_after(5):
                while len(refusals) < sent - MAX_IN_FLIGHT_PER_STREAM + 1:
                    frame = await reader.next()
                    assert frame is not None and frame.kind is Kind.ERROR
                    fields = frame.fields()
                    assert fields["not_delivered"] is True
                    refusals.append((frame.request_id, fields["status"]))
            await trio.testing.wait_all_tasks_blocked()
            assert pool.requests == MAX_IN_FLIGHT_PER_STREAM
            nursery.cancel_scope.cancel()
        return refusals

    refusals = trio.run(main)
    assert sorted(refusals) == sorted(
        [(rid, 503) for rid in range(MAX_IN_FLIGHT_PER_STREAM + 1, sent + 1)] + [(5, 400)])

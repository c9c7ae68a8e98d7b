"""A misbehaving member: a real otela node that sends junk on every protocol otela speaks.

It runs the daemon as ``tests.integration.forger`` does (same flags, same mesh, admitted
like any member, serving its own echo model), waits until it is connected to the others,
then for ``--rounds`` rounds sends, to every connected peer:

- registry gossip (``otela/registry/1``, its own validator switched off so it goes out):
  bytes that are not msgpack, JSON, maps and lists where others belong, a 512 KiB blob,
  its own record correctly signed but with inf/nan/2**64-1 versions, nan times, lists
  where maps belong; evictions (signed) of the honest nodes whose record is not a map;
- liveness gossip (``otela/liveness/1``): news that is not a list, a thousand items,
  suspicions of honest nodes at incarnations inf, nan and 2**64-1;
- anti-entropy streams: garbage frames, wrong types in every message, a digest claiming
  version 2**64-1 followed by junk envelopes, a frame header announcing 2 GiB;
- SWIM streams: garbage, news of the wrong type, 500 requests in flight on one stream,
  40 streams at once;
- ``/otela/http/2`` streams: unknown frame kinds, oversized frames, server frames sent by a
  client, requests with CR/LF in header names and values and in the path, a body that is
  not bytes, 60 streams at once;
- ``POST /v1/load-reports`` (to ingress nodes, over HTTP): garbage, nan, another node's
  session, oversized, signed with its own member key, unsigned and replayed;
- the protocols py-libp2p serves (GossipSub's ``/meshsub/1.1.0``, identify push, relay
  STOP, DCUtR) and otela's dial-back: bytes that are not what they expect; 40 ping
  streams at once.

It also re-announces its own record as reachable only over libp2p and answers every
request routed to it over ``/otela/http/2`` with a malformed head or error frame (the
ingress must answer 502, not 500).

What it saw comes out on stdout as ``abuse: <json>`` lines (``ROUND`` after each round):
how many streams were reset at once in each flood, how each malformed request over
``/otela/http/2`` was answered. Run: ``python -m tests.integration.misbehaving_peer
--rounds N start <otela start flags>`` (``LocalFederation.start_node(launcher=...)``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import struct
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from otela.config import resolve
from otela.daemon import Node
from otela.dataplane.hop_auth import HOP_HEADER
from otela.dataplane.p2p_frames import HEADER, HTTP_PROTOCOL, Frame, FrameReader, Kind, packed
from otela.liveness.detector import LIVENESS_TOPIC, SWIM_PROTOCOL
from otela.load.reports import PATH as LOAD_PATH
from otela.mesh.framing import read_frame, write_frame
from otela.registry.crdt import bucket_of
from otela.registry.records import PRIVATE_RELAYED, Lifecycle, NodeRecord
from otela.registry.wire import EVICTION_DOMAIN, RECORD_DOMAIN, encode
from otela.replication.replicator import AE_PROTOCOL, REGISTRY_TOPIC

from .forger import _start_flags

ROUND = "abuse: round done"
LIBP2P_PROTOCOLS = [TProtocol(p) for p in (
    "/meshsub/1.1.0", "/ipfs/id/push/1.0.0", "/libp2p/circuit/relay/0.2.0/stop",
    "/libp2p/dcutr", "/otela/dialback/1")]
OPEN_S, HOLD_S = 2.0, 1.0  # floods: time to open every stream, then to be reset
INF, NAN = float("inf"), float("nan")
TOO_BIG = 2**64 - 1


def say(**what: Any) -> None:
    print("abuse: " + json.dumps(what, default=str), flush=True)


# -- registry and liveness gossip ---------------------------------------------------------


def signed_junk_records(node: Node) -> list[dict[str, Any]]:
    """Our own record, correctly signed, with values no honest node writes."""
    own = node.replica.record
    assert own is not None
    key = node.identity.key_pair.private_key
    out = []
    for changes in ({"version": INF}, {"version": NAN}, {"version": TOO_BIG},
                    {"version": 2**63}, {"version": -5}, {"updated_at": NAN},
                    {"hardware": [1, 2]}, {"models": {"id": "x"}},
                    {"hardware": {"cpus": INF}}, {"slurm": {"job_id": "1", "end_time": INF}}):
        body = msgpack.packb({**own.to_dict(), **changes}, use_bin_type=True)
        out.append({"v": 1, "t": "rec", "body": body, "sig": key.sign(RECORD_DOMAIN + body),
                    "cert": node.replica.certificate})
    return out


def signed_junk_evictions(node: Node, sessions: list[str]) -> list[dict[str, Any]]:
    """Evictions of honest sessions, signed by us, whose embedded record is not a map."""
    key = node.identity.key_pair.private_key
    me = node.identity.peer_id.to_base58()
    out = []
    for session in sessions:
        for last, at in (([1, 2], 1.0), ("record", 1.0), (7, 1.0), ({}, NAN)):
            body = msgpack.packb({"session_id": session, "evictor": me, "reason": "junk",
                                  "at": at, "last": last}, use_bin_type=True)
            out.append({"v": 1, "t": "evict", "body": body,
                        "sig": key.sign(EVICTION_DOMAIN + body), "cert": node.replica.certificate})
    return out


def honest_sessions(node: Node) -> list[str]:
    me = node.identity.peer_id.to_base58()
    return [r.session_id for r in node.registry if r.peer_id != me]


async def gossip_junk(node: Node) -> int:
    envelopes = signed_junk_records(node) + signed_junk_evictions(node, honest_sessions(node))
    registry = [b"\xc1 not msgpack", b'{"kind": "delta"}', msgpack.packb([1, 2, 3]),
                encode({"kind": "delta", "entries": 5}),
                encode({"kind": "delta", "entries": {"a": 1}}),
                encode({"kind": "delta", "entries": [None, 5, [1], {"v": 1, "t": "rec"}]}),
                b"\x00" * (512 * 1024)]
    registry += [encode({"kind": "delta", "entries": [e]}) for e in envelopes]
    peers = [r.peer_id for r in node.registry
             if r.peer_id != node.identity.peer_id.to_base58()]
    liveness = [b"\xc1", msgpack.packb({"u": 5}), msgpack.packb({"u": {"a": 1}}),
                msgpack.packb({"u": "suspect"}), msgpack.packb({"u": [["x", "suspect", 1]]}),
                msgpack.packb({"u": [["x", "suspect", 1, None, None]] * 1000})]
    for peer in peers:
        for incarnation in (INF, NAN, TOO_BIG, -1):
            liveness.append(msgpack.packb({"u": [[peer, "suspect", incarnation, None, peer]]}))
    for data in registry:
        await node.mesh.pubsub.publish(REGISTRY_TOPIC, data)
    for data in liveness:
        await node.mesh.pubsub.publish(LIVENESS_TOPIC, data)
    return len(registry) + len(liveness)


# -- streams ------------------------------------------------------------------------------


async def on_stream(node: Node, peer: ID, protocol: TProtocol,
                    talk: Callable[[Any], Awaitable[None]], timeout: float = 3.0) -> None:
    """Open a stream, run ``talk`` on it for at most ``timeout``; every error is expected
    (the peer resets us: that is the point)."""
    with trio.move_on_after(timeout):
        try:
            stream = await node.mesh.host.new_stream(peer, [protocol])
        except Exception:
            return  # refused while negotiating: as good as reset
        try:
            with contextlib.suppress(Exception):
                await talk(stream)
        finally:
            with contextlib.suppress(Exception):
                await stream.reset()


def sends(*frames: bytes) -> Callable[[Any], Awaitable[None]]:
    async def talk(stream: Any) -> None:
        for frame in frames:
            await stream.write(frame)
        await stream.read(1)  # wait for the peer to answer or drop us

    return talk


def framed(*payloads: bytes) -> Callable[[Any], Awaitable[None]]:
    return sends(*[struct.pack(">I", len(p)) + p for p in payloads])


async def flood(node: Node, peer: ID, protocol: TProtocol, count: int) -> int:
    """Open ``count`` streams at once and hold them; how many the peer kept open (neither
    refused while opening nor reset nor closed) for ``HOLD_S`` after the last opened."""
    opened = 0
    kept = 0
    all_open = trio.Event()

    async def hold(stream: Any) -> None:
        nonlocal opened, kept
        opened += 1
        closed = trio.Event()

        async def watch() -> None:
            with contextlib.suppress(Exception):
                await stream.read(1)
            closed.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            with trio.move_on_after(OPEN_S):
                await all_open.wait()
            await trio.sleep(HOLD_S)
            kept += not closed.is_set()
            nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(on_stream, node, peer, protocol, hold, OPEN_S + HOLD_S + 1)
        with trio.move_on_after(OPEN_S):
            while opened < count:
                await trio.sleep(0.05)
        all_open.set()
    return kept


async def anti_entropy_junk(node: Node, peer: ID) -> None:
    session = honest_sessions(node)[0]
    junk = signed_junk_records(node) + signed_junk_evictions(node, [session])

    async def claim_then_junk(stream: Any) -> None:
        await write_frame(stream, encode({"kind": "ae-open", "root": b"", "revoked": []}))
        await read_frame(stream)
        claim = {session: (int(Lifecycle.SERVING), TOO_BIG, b"\xff" * 8)}
        await write_frame(stream, encode({"kind": "ae-digests", "revocations": [],
                                          "digests": {bucket_of(session): claim}}))
        await read_frame(stream)
        await write_frame(stream, encode({"kind": "ae-entries", "want": [],
                                          "entries": [None, 5, *junk]}))

    cases = [framed(b"\xc1 garbage"), framed(msgpack.packb([1, 2])),
             framed(encode({"kind": "ae-open", "root": 5, "revoked": 7}),
                    encode({"kind": "ae-digests", "digests": 5, "revocations": {"a": 1}})),
             framed(encode({"kind": "ae-open", "root": b"", "revoked": []}),
                    encode({"kind": "ae-digests", "digests": {"x": {"a": [1]}, 9999: {}},
                            "revocations": [None]})),
             sends(struct.pack(">I", 2**31) + b"x"), claim_then_junk]
    for case in cases:
        await on_stream(node, peer, AE_PROTOCOL, case)


async def swim_junk(node: Node, peer: ID, target: str) -> None:
    for payload in (b"\xc1", msgpack.packb([1]), msgpack.packb({"k": "ping", "i": 1, "u": 5}),
                    msgpack.packb({"k": "ping", "i": "x", "u": {"a": 1}}),
                    msgpack.packb({"k": "req", "target": None, "i": 2}),
                    msgpack.packb({"k": "ping", "i": 3,
                                   "u": [[peer.to_base58(), "suspect", INF, None, None]]})):
        await on_stream(node, peer, SWIM_PROTOCOL, framed(payload), 2.0)
    replies = 0

    async def many_in_flight(stream: Any) -> None:
        nonlocal replies
        for i in range(500):
            await write_frame(stream, msgpack.packb({"k": "req", "target": target, "i": i}))
        while replies < 500:
            await read_frame(stream)
            replies += 1

    await on_stream(node, peer, SWIM_PROTOCOL, many_in_flight, 3.0)
    say(protocol="swim", in_flight_sent=500, replies=replies)


def http_frame(rid: int, kind: int, payload: bytes, length: int | None = None) -> bytes:
    return HEADER.pack(rid, kind, len(payload) if length is None else length) + payload


async def http_junk(node: Node, peer: ID, model: str) -> None:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "x"}]})
    ok = {"path": "/v1/chat/completions", "body": body.encode(),
          "headers": [[b"content-type", b"application/json"]]}
    requests = {
        "value_crlf": {**ok, "headers": [[b"content-type", b"application/json\r\nx-in: 1"]]},
        "value_lf": {**ok, "headers": [[b"user-agent", b"a\nx-in: 1"]]},
        "name_crlf": {**ok, "headers": [[b"x-a\r\nx-in", b"1"]]},
        "name_space": {**ok, "headers": [[b"x a", b"1"]]},
        "path_crlf": {**ok, "path": "/v1/chat/completions HTTP/1.1\r\nx-in: 1\r\n\r\nGET /v1/x"},
        "body_not_bytes": {**ok, "body": {"model": model}},
        "no_path": {"body": ok["body"]},
    }
    answers: dict[str, Any] = {}

    async def ask(stream: Any) -> None:
        for rid, fields in enumerate(requests.values(), start=1):
            await stream.write(packed(rid, Kind.REQUEST, fields).encode())
        await stream.write(Frame(999, Kind.CANCEL).encode())
        await stream.write(http_frame(1000, int(Kind.REQUEST), b"\xc1 not msgpack"))
        names = list(requests)
        reader = FrameReader(stream)
        while len(answers) < len(requests) and (frame := await reader.next()) is not None:
            if 1 <= frame.request_id <= len(names):
                fields = frame.fields() if frame.kind in (Kind.ERROR, Kind.HEAD) else {}
                answers[names[frame.request_id - 1]] = [frame.kind.name, fields.get("status")]

    # The previous round's flood may still fill our quota there for a moment (the peer has
    # not yet processed our resets): ask again on a new stream until answered, 8 s at most.
    with trio.move_on_after(8.0):
        while len(answers) < len(requests):
            answers.clear()
            await on_stream(node, peer, HTTP_PROTOCOL, ask, 4.0)
            if len(answers) < len(requests):
                await trio.sleep(0.1)  # poll interval
    say(protocol="http", answers=answers)
    for frame in (http_frame(1, 99, b""), http_frame(1, int(Kind.REQUEST), b"", 2**31),
                  http_frame(1, int(Kind.HEAD), msgpack.packb({"status": 200})),
                  http_frame(1, int(Kind.REQUEST), b"\x00" * 10)):
        await on_stream(node, peer, HTTP_PROTOCOL, sends(frame), 2.0)


async def libp2p_junk(node: Node, peer: ID) -> None:
    """Raw junk on the protocols py-libp2p serves for otela: GossipSub itself (a second
    stream beside the library's own), identify push, circuit relay STOP, DCUtR and otela's
    dial-back: a varint length of 2**35, and bytes that are not the protobuf or JSON
    expected."""
    async with trio.open_nursery() as nursery:
        for protocol in LIBP2P_PROTOCOLS:
            for frame in (b"\xff\xff\xff\xff\x7f", b"\x10" + b"\xff" * 16,
                          b"\x05\x0a\x03\x0a\x01\xff"):
                nursery.start_soon(on_stream, node, peer, protocol, sends(frame), 2.0)


async def load_junk(node: Node, ingress: NodeRecord, other_session: str) -> None:
    """Junk load reports to an ingress: signed with our member key but malformed or about
    another node's session, then one unsigned and one replayed. Says the statuses."""
    own = node.replica.record
    assert own is not None
    reports = [b"\xc1", b"[1, 2]", b'{"s": 5}',
               json.dumps({"s": other_session, "l": "in_flight=0", "t": 5}).encode(),
               b'{"s": "%s", "l": "in_flight=NaN", "t": 5}' % own.session_id.encode(),
               b'{"s": "%s", "l": "in_flight=1", "t": 1e308}' % own.session_id.encode(),
               b'{"s": "%s", "l": "in_flight=1", "t": NaN}' % own.session_id.encode(),
               b'{"s": "%s", "l": "in_flight=1", "t": 5, "pad": "%s"}'
               % (own.session_id.encode(), b"x" * 600)]
    url = ingress.http_url.rstrip("/") + LOAD_PATH
    statuses = []
    token = ""
    for body in reports:
        token = node.hop_signer.token(ingress.peer_id, "POST", LOAD_PATH, body)
        answer = await node.client.post(url, content=body, headers={HOP_HEADER: token})
        statuses.append(answer.status_code)
    for headers in ({}, {HOP_HEADER: token}):  # unsigned; replayed
        answer = await node.client.post(url, content=reports[-1], headers=headers)
        statuses.append(answer.status_code)
    say(load_reports=statuses)


# -- answering requests routed to us -------------------------------------------------------


BAD_ANSWERS = [
    lambda rid: Frame(rid, Kind.HEAD, b"\xc1 not msgpack"),
    lambda rid: packed(rid, Kind.HEAD, {"status": 99999, "headers": []}),
    lambda rid: packed(rid, Kind.HEAD, {"status": 200,
                                        "headers": [[b"x-a", b"1\r\nset-cookie: evil"]]}),
    lambda rid: Frame(rid, Kind.ERROR, msgpack.packb([1, 2])),
    lambda rid: packed(rid, Kind.HEAD, {"status": "200", "headers": 5}),
]


async def hostile_answers(stream: Any) -> None:
    """What we answer requests routed to us over ``/otela/http/2``: malformed heads."""
    reader = FrameReader(stream)
    answered = 0
    try:
        while (frame := await reader.next()) is not None:
            if frame.kind is Kind.REQUEST:
                await stream.write(BAD_ANSWERS[answered % len(BAD_ANSWERS)](
                    frame.request_id).encode())
                answered += 1
    except Exception:
        return  # the caller gave up on us


# -- the run ------------------------------------------------------------------------------


async def abuse(node: Node, rounds: int, model: str) -> None:
    node.mesh.pubsub.set_topic_validator(REGISTRY_TOPIC, lambda *_: True, False)
    node.mesh.pubsub.set_topic_validator(LIVENESS_TOPIC, lambda *_: True, False)
    node.mesh.host.set_stream_handler(HTTP_PROTOCOL, hostile_answers)
    me = node.identity.peer_id.to_base58()
    while (own := node.replica.record) is None or own.state is not Lifecycle.SERVING or \
            len({r.peer_id for r in node.registry} - {me}) < 2 or \
            len(node.replicator.connected_peers()) < 2:
        await trio.sleep(0.1)
    await node.replica.announce(reachability=PRIVATE_RELAYED)
    say(ready=True, session=own.session_id)
    nobody = ID.from_pubkey(create_new_key_pair().public_key).to_base58()
    for _ in range(rounds):
        if node.replica.record and node.replica.record.reachability != PRIVATE_RELAYED:
            await node.replica.announce(reachability=PRIVATE_RELAYED)
        say(gossip_sent=await gossip_junk(node))
        async with trio.open_nursery() as nursery:
            for peer in node.replicator.connected_peers():
                nursery.start_soon(abuse_streams, node, peer, nobody, model)
        print(ROUND, flush=True)


async def abuse_streams(node: Node, peer: ID, nobody: str, model: str) -> None:
    """Junk on every protocol ``peer`` serves, then floods of each at once."""
    ingress = next((r for r in node.registry
                    if r.ingress and r.peer_id == peer.to_base58()), None)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(anti_entropy_junk, node, peer)
        nursery.start_soon(swim_junk, node, peer, nobody)
        nursery.start_soon(http_junk, node, peer, model)
        nursery.start_soon(libp2p_junk, node, peer)
        if ingress is not None:
            others = [s for s in honest_sessions(node) if s != ingress.session_id] or ["x"]
            nursery.start_soon(load_junk, node, ingress, others[0])
    counts = {str(SWIM_PROTOCOL): 40, str(HTTP_PROTOCOL): 60, str(AE_PROTOCOL): 40,
              "/ipfs/ping/1.0.0": 40}
    floods: dict[str, int] = {}

    async def one(protocol: str, count: int) -> None:
        floods[protocol] = await flood(node, peer, TProtocol(protocol), count)

    async with trio.open_nursery() as nursery:
        for protocol, count in counts.items():
            nursery.start_soon(one, protocol, count)
    say(peer=peer.to_base58(), kept_open=floods)


async def run(node: Node, rounds: int, model: str) -> int:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(abuse, node, rounds, model)
        code = await node.run()
        nursery.cancel_scope.cancel()
    return code


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model", required=True, help="an honest node's model, to ask for")
    parser.add_argument("start", nargs=argparse.REMAINDER, help="start, then otela start flags")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    flags = _start_flags([a for a in args.start if a not in ("--", "start")])
    node = Node(resolve(flags).config)
    return trio.run(run, node, args.rounds, args.model)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

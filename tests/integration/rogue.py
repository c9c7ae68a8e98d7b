"""A member that lies about itself: a real otela daemon with the security review's attacks
added (``docs/security.md#a-member-that-lies-about-itself``).

It runs the daemon exactly as ``otela start`` does (same settings, mesh and engine), waits
until it serves, then, as asked:

- ``--sessions N``: signs N more sessions of its own peer id, each SERVING its models at
  its own address, half with newer epochs than its real session and half older, most of
  them padded to just under the record size limit (``--padded``), plus one over it; and
  sends them by gossip (its own validator off, so pubsub lets them out) and by
  anti-entropy to every connected peer (a digest claiming them all, then the records, in
  frames under the message limit);
- ``--evict PEER_ID``: signs an eviction of that peer's current session every 20 ms for
  ``--seconds`` seconds, each with its own signed suspicion as the only evidence, by
  gossip and, every second, by anti-entropy.

Capacity lies need no code: the tests start it with ``--capacity 1000``.
Progress comes out on stdout as ``rogue: <what> <count>`` lines. Run:
``python -m tests.integration.rogue [options] start <otela start flags>``
(``LocalFederation.start_node(launcher=...)``).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time
from typing import Any

import msgpack
import trio

from otela.config import resolve
from otela.daemon import Node
from otela.mesh.framing import read_frame, write_frame
from otela.registry import evidence
from otela.registry.crdt import bucket_of
from otela.registry.records import MAX_META, MAX_MODELS, Lifecycle, ModelInfo, NodeRecord
from otela.registry.session import epoch_of, new_session_id
from otela.registry.wire import (
    MAX_MESSAGE_BYTES,
    RECORD_DOMAIN,
    WIRE_VERSION,
    decode,
    encode,
    sign_eviction,
)
from otela.replication.replicator import AE_PROTOCOL, REGISTRY_TOPIC

from .forger import _start_flags

PADDED_BYTES = 15_500  # just under the 16 KiB record limit


def signed(node: Node, record: NodeRecord) -> dict[str, Any]:
    """The record's envelope, signed with the rogue's own key, whatever its size (the
    daemon's own signing refuses records over the limit; a rogue need not)."""
    body = msgpack.packb(record.to_dict(), use_bin_type=True)
    return {"v": WIRE_VERSION, "t": "rec", "body": body,
            "sig": node.identity.key_pair.private_key.sign(RECORD_DOMAIN + body),
            "cert": node.replica.certificate}


def padded(record: NodeRecord, size: int) -> NodeRecord:
    """``record`` with metadata added until it encodes to about ``size`` bytes."""
    models = list(record.models)
    value = "v" * 200
    while len(msgpack.packb(record.to_dict(), use_bin_type=True)) < size:
        index = len(models) - 1
        meta = models[index].meta
        if len(meta) >= MAX_META:
            if len(models) >= MAX_MODELS:
                break
            models.append(ModelInfo(f"{record.models[0].id}-pad{len(models)}"))
            index += 1
            meta = ()
        models[index] = dataclasses.replace(
            models[index], meta=(*meta, (f"pad{len(meta):02d}", value)))
        record = dataclasses.replace(record, models=tuple(models))
    return record


async def push(node: Node, peer: Any, envelopes: list[dict[str, Any]]) -> None:
    """Claim newer versions of every envelope's session in a digest exchange, then send
    the envelopes when asked for them."""
    stream = await node.mesh.host.new_stream(peer, [AE_PROTOCOL])
    try:
        await write_frame(stream, encode({"kind": "ae-open", "root": b"", "revoked": []}))
        decode(await read_frame(stream))
        digests: dict[int, dict[str, Any]] = {}
        for envelope in envelopes:
            session = str(msgpack.unpackb(envelope["body"])["session_id"])
            digests.setdefault(bucket_of(session), {})[session] = (
                int(Lifecycle.LEFT), 10**9, b"\xff" * 8)
        await write_frame(stream, encode({"kind": "ae-digests", "revocations": [],
                                          "digests": digests}))
        decode(await read_frame(stream))
        await write_frame(stream, encode({"kind": "ae-entries", "entries": envelopes,
                                          "want": []}))
    finally:
        await stream.close()


async def push_all(node: Node, envelopes: list[dict[str, Any]]) -> int:
    """``push`` to every connected peer, in frames well under the message limit."""
    sent = 0
    frames: list[list[dict[str, Any]]] = [[]]
    size = 0
    for envelope in envelopes:
        length = len(envelope["body"]) + 200
        if size + length > MAX_MESSAGE_BYTES // 2:
            frames.append([])
            size = 0
        frames[-1].append(envelope)
        size += length
    for peer in node.replicator.connected_peers():
        for frame in frames:
            try:
                await push(node, peer, frame)
                sent += len(frame)
            except Exception as exc:  # a peer that hung up on us: try the others
                print(f"rogue: anti-entropy with {peer} failed: {exc}", flush=True)
    return sent


async def serving(node: Node) -> NodeRecord:
    while (own := node.replica.record) is None or own.state is not Lifecycle.SERVING:
        await trio.sleep(0.1)
    return own


async def flood_sessions(node: Node, count: int, padded_share: float) -> None:
    own = await serving(node)
    me = own.peer_id
    base = epoch_of(own.session_id)
    envelopes = []
    for i in range(count):
        epoch = base + 1 + i if i % 2 == 0 else base - 1 - i  # newer and older ones
        record = dataclasses.replace(own, session_id=new_session_id(me, epoch), version=1,
                                     updated_at=time.time())
        if i < count * padded_share:
            record = padded(record, PADDED_BYTES)
        envelopes.append(signed(node, record))
    envelopes.append(signed(node, padded(dataclasses.replace(
        own, session_id=new_session_id(me, base + 2 * count + 7), version=1,
        updated_at=time.time()), 40_000)))  # over the limit
    sizes = sorted(len(e["body"]) for e in envelopes)
    print(f"rogue: record bytes min {sizes[0]} max {sizes[-1]}", flush=True)
    node.mesh.pubsub.set_topic_validator(REGISTRY_TOPIC, lambda *_: True, False)
    published = 0
    for envelope in envelopes:
        await node.replicator.publish(envelope)
        published += 1
    print(f"rogue: sessions gossiped {published}", flush=True)
    print(f"rogue: sessions pushed {await push_all(node, envelopes)}", flush=True)


async def evict(node: Node, victim: str, seconds: float) -> None:
    await serving(node)
    node.mesh.pubsub.set_topic_validator(REGISTRY_TOPIC, lambda *_: True, False)
    me = node.identity.peer_id.to_base58()
    key = node.identity.key_pair.private_key
    deadline = trio.current_time() + seconds
    sent, pushed_at = 0, 0.0
    while trio.current_time() < deadline:
        session = node.registry.map.session_of(victim)
        target = None if session is None else node.registry.entry(session)
        if target is not None and target.evicted_by is None and target.proof is not None:
            now = time.time()
            own_word = evidence.sign(key.sign, me, victim, target.key, 0, now)
            envelope = sign_eviction(target, evictor_key=key, evictor_peer_id=me,
                                     reason="rogue", now=now, evidence=[own_word],
                                     cert=node.replica.certificate)
            await node.replicator.publish(envelope)
            sent += 1
            if trio.current_time() - pushed_at >= 1.0:
                pushed_at = trio.current_time()
                await push_all(node, [envelope])
                print(f"rogue: evictions sent {sent}", flush=True)
        await trio.sleep(0.02)
    print(f"rogue: evictions done {sent}", flush=True)


async def run(node: Node, args: argparse.Namespace) -> int:
    async with trio.open_nursery() as nursery:
        if args.sessions:
            nursery.start_soon(flood_sessions, node, args.sessions, args.padded)
        if args.evict:
            nursery.start_soon(evict, node, args.evict, args.seconds)
        code = await node.run()
        nursery.cancel_scope.cancel()
    return code


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=0)
    parser.add_argument("--padded", type=float, default=0.25,
                        help="share of the sessions padded to the record size limit")
    parser.add_argument("--evict", help="peer id whose sessions to evict")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("start", nargs=argparse.REMAINDER, help="start, then otela start flags")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    start = [a for a in args.start if a not in ("--", "start")]
    capacity = None
    if "--capacity" in start:
        i = start.index("--capacity")
        capacity = float(start[i + 1])
        del start[i:i + 2]
    flags = _start_flags(start)
    if capacity is not None:
        flags["capacity"] = str(capacity)
    node = Node(resolve(flags).config)
    return trio.run(run, node, args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

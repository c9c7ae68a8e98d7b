"""Load reports (otela.load.reports): who gets them, what a receiver accepts, the rate."""

from __future__ import annotations

import struct
from dataclasses import replace

import trio
import trio.testing
from libp2p.peer.id import ID

from otela.load.reports import (
    MAX_REPORT_BYTES,
    LoadReports,
    changed,
    decode,
    encode,
    ingresses,
    interval_for,
)
from otela.registry.records import Lifecycle, NodeRecord
from otela.routing.load import NodeLoad
from tests.unit.registry_helpers import new_node, record


def test_reports_go_to_live_ingresses_only_one_per_peer_never_to_ourselves() -> None:
    plain = record("plain")
    gateway = replace(record("gw", peer_id="peer-gw"), ingress=True, updated_at=10.0)
    restarted = replace(record("gw2", peer_id="peer-gw"), ingress=True, updated_at=20.0)
    gone = replace(record("gone", state=Lifecycle.LEFT), ingress=True)
    down = replace(record("down", state=Lifecycle.DOWN), ingress=True)
    me = replace(record("me"), ingress=True)
    targets = ingresses([plain, gateway, restarted, gone, down, me], own_peer_id="peer-me")
    assert set(targets) == {"peer-gw", "peer-down"}
    assert targets["peer-gw"] is restarted  # the newest session's addresses


def test_a_report_round_trips_and_anything_malformed_is_dropped() -> None:
    load = NodeLoad(in_flight=3, running=2, waiting=1, kv_usage=0.25, capacity=1.5)
    session, back, ttl = decode(encode("s1", load, 6.0)) or ("", None, 0.0)
    assert (session, back, ttl) == ("s1", load, 6.0)
    for bad in (b"", b"not json", b"[]", b'{"s": "s1", "l": "f=1"}',
                b'{"s": "s1", "l": "f=1", "t": 0}', b'{"s": "s1", "l": "f=1", "t": 1e9}',
                b'{"s": "s1", "l": "f=1", "t": NaN}', b'{"s": "s1", "l": "f=x", "t": 1}',
                b'{"s": "' + b"x" * MAX_REPORT_BYTES + b'", "l": "f=1", "t": 1}'):
        assert decode(bad) is None, bad


def test_the_rate_is_bounded_per_ingress_and_only_changes_are_said() -> None:
    assert interval_for(3, 2.0, 0.5) == 2.0
    assert interval_for(50, 2.0, 0.5) == 25.0  # 50 nodes: two reports a second in all
    assert not changed(None, NodeLoad())  # an idle node says nothing
    assert changed(None, NodeLoad(in_flight=1))
    assert not changed(NodeLoad(in_flight=1, kv_usage=0.30), NodeLoad(in_flight=1,
                                                                       kv_usage=0.32))
    assert changed(NodeLoad(in_flight=1, kv_usage=0.30), NodeLoad(in_flight=1, kv_usage=0.4))
    assert changed(NodeLoad(in_flight=1), NodeLoad(in_flight=2))


class FakeStream:
    """A stream's reading end holding what a sender wrote, then EOF."""

    def __init__(self, peer: ID, frames: list[bytes], raw: bytes = b"") -> None:
        self.data = b"".join(struct.pack(">I", len(f)) + f for f in frames) + raw
        self.muxed_conn = type("Conn", (), {"peer_id": peer})()
        self.was_reset = False

    async def read(self, n: int) -> bytes:
        chunk, self.data = self.data[:n], self.data[n:]
        return chunk

    async def reset(self) -> None:
        self.was_reset = True


def receiver(registry: list[NodeRecord], admitted: bool = True
             ) -> tuple[LoadReports, list[tuple[str, NodeLoad, float]]]:
    taken: list[tuple[str, NodeLoad, float]] = []
    host = type("Host", (), {"get_id": lambda self: ID.from_base58(new_node().peer_id)})()
    by_session = {r.session_id: r for r in registry}
    view = type("View", (), {"get": lambda self, s: by_session.get(s),
                             "__iter__": lambda self: iter(registry),
                             "__len__": lambda self: len(registry)})()

    async def connect(_: NodeRecord) -> None:
        raise AssertionError("a receiver sends nothing")

    reports = LoadReports(host, lambda: view, None,  # type: ignore[arg-type]
                          lambda *r: taken.append(r), session=lambda: "mine",
                          serving=lambda: False, admitted=lambda _: admitted,
                          connect=connect, receive=True)
    return reports, taken


def test_an_ingress_takes_a_members_reports_about_itself_only() -> None:
    sender, other = new_node(), new_node()
    own = record("own", peer_id=sender.peer_id)
    theirs = record("theirs", peer_id=other.peer_id)
    reports, taken = receiver([own, theirs])
    load = NodeLoad(in_flight=2)
    stream = FakeStream(ID.from_base58(sender.peer_id), [
        encode(own.session_id, load, 6.0),
        encode(theirs.session_id, NodeLoad(in_flight=9), 6.0),  # another node's load
        b"garbage",
        encode(own.session_id, NodeLoad(in_flight=1), 6.0),
    ])
    trio.run(reports._take, stream)
    assert taken == [(own.session_id, load, 6.0), (own.session_id, NodeLoad(in_flight=1), 6.0)]
    assert reports.stats["received"] == 2 and reports.stats["refused"] == 2
    assert stream.was_reset and reports.linked_peers() == set()  # forgotten once closed


def test_an_oversized_frame_or_a_non_member_ends_the_stream() -> None:
    sender = new_node()
    own = record("own", peer_id=sender.peer_id)
    reports, taken = receiver([own])
    huge = FakeStream(ID.from_base58(sender.peer_id), [],
                      raw=struct.pack(">I", 1 << 30) + b"x" * 64
                      + struct.pack(">I", 5) + b"after")
    trio.run(reports._take, huge)
    assert taken == [] and huge.was_reset

    outsider, _ = receiver([own], admitted=False)
    stream = FakeStream(ID.from_base58(sender.peer_id),
                        [encode(own.session_id, NodeLoad(in_flight=2), 6.0)])
    trio.run(outsider._take, stream)
    assert outsider.stats["refused"] == 1 and stream.was_reset


class StuckStream(FakeStream):
    """A stream whose pending read is not woken by resetting it (as with Yamux here)."""

    async def read(self, n: int) -> bytes:
        await trio.sleep_forever()
        return b""


def test_a_newer_stream_from_a_sender_ends_the_older_ones_reader() -> None:
    """Resetting the older stream left its reader waiting for ever: a task and a slot of
    the sender's stream quota each, so after a few replacements its reports were refused."""
    sender = new_node()
    reports, _ = receiver([record("own", peer_id=sender.peer_id)])
    peer = ID.from_base58(sender.peer_id)
    streams = [StuckStream(peer, []) for _ in range(5)]

    ended: list[int] = []

    async def take(i: int) -> None:
        await reports._take(streams[i])
        ended.append(i)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for i in range(len(streams)):
                nursery.start_soon(take, i)
                await trio.testing.wait_all_tasks_blocked()
            assert sorted(ended) == [0, 1, 2, 3]  # the newest still reads
            assert [s.was_reset for s in streams] == [True] * 4 + [False]
            assert len(reports.linked_peers()) == 1
            nursery.cancel_scope.cancel()

    trio.run(main)

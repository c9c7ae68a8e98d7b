"""NAT traversal pieces that need no network: frames, verdicts, records, the network log."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from libp2p.network.stream.exceptions import StreamEOF

from otela.dataplane.p2p_frames import HEADER, Frame, FrameError, FrameReader, Kind, packed
from otela.doctor import bootstrap_verdict, peer_verdict, render, self_verdict
from otela.mesh.circuit_relay import circuit_addr, is_circuit
from otela.mesh.netlog import NetLog
from otela.mesh.reachability import DialBackAnswer, parse_ports, probe, reachability, verdict
from otela.registry.records import Lifecycle, NodeRecord


class FakeStream:
    """Delivers ``data`` in pieces of ``step`` bytes, then raises StreamEOF like libp2p."""

    def __init__(self, data: bytes, step: int = 3) -> None:
        self.data, self.step = data, step

    async def read(self, n: int | None = None) -> bytes:
        if not self.data:
            raise StreamEOF()
        chunk, self.data = self.data[: self.step], self.data[self.step :]
        return chunk


def read_all(data: bytes, step: int = 3) -> list[Frame]:
    async def go() -> list[Frame]:
        reader = FrameReader(FakeStream(data, step))
        out = []
        while (frame := await reader.next()) is not None:
            out.append(frame)
        return out

    return trio.run(go)


def test_frames_survive_arbitrary_read_boundaries() -> None:
    frames = [
        packed(1, Kind.REQUEST, {"path": "/v1/chat/completions", "headers": {}, "body": b"{}"}),
        Frame(1, Kind.DATA, b"x" * 1000),
        Frame(2, Kind.CANCEL),
        Frame(1, Kind.END),
    ]
    data = b"".join(f.encode() for f in frames)
    for step in (1, 7, 4096):
        assert read_all(data, step) == frames
    assert frames[0].fields()["body"] == b"{}"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (HEADER.pack(1, 99, 0), "unknown frame kind 99"),
        (HEADER.pack(1, int(Kind.DATA), 1 << 30), "exceeds"),
        (HEADER.pack(1, int(Kind.DATA), 10) + b"abc", "inside a frame"),
        (b"\x00\x00", "inside a frame header"),
    ],
)
def test_bad_frames_are_rejected_with_a_reason(data: bytes, message: str) -> None:
    with pytest.raises(FrameError, match=message):
        read_all(data)


def test_a_frame_payload_that_is_not_a_map_is_an_error() -> None:
    with pytest.raises(FrameError):
        Frame(1, Kind.HEAD, b"\xff\xff").fields()


def test_reachability_verdicts() -> None:
    yes = DialBackAnswer("p1", "1.2.3.4", ("/ip4/1.2.3.4/tcp/1",))
    no = DialBackAnswer("p2", "1.2.3.4", ())
    failed = DialBackAnswer("p3", None, (), error="timeout")
    assert verdict([no, yes]) is True
    assert verdict([no, failed]) is False
    assert verdict([failed]) is None and verdict([]) is None
    assert reachability(True, 0) == "public"
    assert reachability(False, 1) == "private-relayed"
    assert reachability(False, 0) == "unreachable"
    assert reachability(None, 3) == "unknown"


def test_dial_back_requests_are_bounded() -> None:
    assert parse_ports({"ports": [1, 2, 3, 4, 5, 6, 0, 70000, "x", True]}) == [1, 2, 3, 4]
    for bad in ([], {"ports": "1"}, None):
        with pytest.raises(ValueError):
            parse_ports(bad)


def test_probe_tells_a_libp2p_listener_from_a_closed_port() -> None:
    async def go() -> tuple[bool, bool]:
        async def multistream(stream: trio.SocketStream) -> None:
            await stream.receive_some(64)
            await stream.send_all(b"\x13/multistream/1.0.0\n")

        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(trio.serve_tcp, multistream, 0)
            port = listeners[0].socket.getsockname()[1]
            ok = await probe("127.0.0.1", port)
            nursery.cancel_scope.cancel()
        closed = await probe("127.0.0.1", port, timeout=1.0)
        return ok, closed

    assert trio.run(go) == (True, False)


def test_record_round_trips_nat_fields_and_rejects_unknown_reachability() -> None:
    record = NodeRecord("s", "p", "prov", Lifecycle.SERVING, 3, "http://h", reachability=
                        "private-relayed", relay=True, circuit_addrs=("/ip4/1/p2p-circuit",))
    again = NodeRecord.from_dict(record.to_dict())
    assert again == record and again.needs_relayed_path()
    legacy = {k: v for k, v in record.to_dict().items()
              if k not in ("reachability", "relay", "circuit_addrs")}
    assert NodeRecord.from_dict(legacy).reachability == "unknown"
    with pytest.raises(ValueError, match="reachability"):
        NodeRecord.from_dict({**record.to_dict(), "reachability": "maybe"})


def test_circuit_addresses() -> None:
    addr = circuit_addr("/ip4/10.0.0.1/tcp/4001", "Relay", "Me")
    assert addr == "/ip4/10.0.0.1/tcp/4001/p2p/Relay/p2p-circuit/p2p/Me"
    assert circuit_addr("/ip4/10.0.0.1/tcp/4001/p2p/Relay", "Relay", "Me") == addr
    assert is_circuit(addr) and not is_circuit("/ip4/10.0.0.1/tcp/4001")


def test_netlog_records_a_hole_punch_upgrade_and_bounds_errors() -> None:
    log = NetLog()
    log.observe_connections("peer", {"relayed"}, now=100.0)
    log.observe_connections("peer", {"relayed", "direct"}, now=103.5)
    punch = log.peers()["peer"].to_dict()["hole_punch"]
    assert punch == {"relayed_since": 100.0, "upgraded_to_direct": True, "upgrade_after_s": 3.5}
    for i in range(20):
        log.dial_failed("peer", "addr", f"error {i}")
    errors = log.peers()["peer"].to_dict()["dial_errors"]
    assert len(errors) == 5 and errors[-1]["error"] == "error 19"


def nat_report(state: str, **nat: Any) -> dict[str, Any]:
    return {"nat": {"reachability": state, "dial_back": {"listen_ports": [4001], "answers": [
        {"peer_id": "r", "observed_ip": "203.0.113.7", "reachable": [], "error": None}]},
        **nat}, "bootstrap": [], "connected_peers": 1}


def test_self_verdicts_name_the_cause_and_the_fix() -> None:
    text = self_verdict(nat_report("unreachable", known_relays=[], reservation_errors={}))
    assert text.startswith("behind NAT, no relay reservation")
    assert "203.0.113.7:4001" in text and "no node in the registry offers relaying" in text
    assert "--relay" in text and "port 4001" in text
    text = self_verdict(nat_report("unreachable", known_relays=["R"],
                                   reservation_errors={"R": "relay R refused"}))
    assert "relay R: relay R refused" in text
    relayed = nat_report("private-relayed", reservations=[{"relay_peer_id": "R"}])
    assert "reachable through relay(s) R" in self_verdict(relayed)
    assert self_verdict(nat_report("public")).startswith("publicly reachable")


def test_bootstrap_verdict_only_when_no_bootstrap_is_connected() -> None:
    failing = {"addr": "/ip4/10.0.0.9/tcp/1", "connected": False, "failures": 4,
               "last_error": "refused"}
    report = {"bootstrap": [failing]}
    assert "bootstrap unreachable" in (bootstrap_verdict(report) or "")
    report = {"bootstrap": [failing, {"addr": "x", "connected": True, "failures": 0}]}
    assert bootstrap_verdict(report) is None


def test_peer_verdicts() -> None:
    assert "never appeared" in peer_verdict({"peer_id": "x", "record": None, "log": None})
    left = {"peer_id": "x", "record": {"state": "LEFT"}, "left_at": 0.0, "evicted_by": None}
    assert "announced LEFT" in peer_verdict(left)
    assert "evicted by y" in peer_verdict({**left, "evicted_by": "y"})
    nat = {"peer_id": "x", "record": {"state": "SERVING", "reachability": "unreachable"}}
    assert "behind NAT with no relay reservation" in peer_verdict(nat)
    punched = {"peer_id": "x", "record": {"state": "SERVING", "reachability": "private-relayed"},
               "log": {"connection": "direct", "hole_punch": {"upgraded_to_direct": True,
                                                              "upgrade_after_s": 3.4}}}
    assert "hole punching upgraded it after 3.4s" in peer_verdict(punched)


def test_doctor_shows_the_eviction_brake_only_when_it_is_on() -> None:
    report: dict[str, Any] = {"self": {"peer_id": "me", "addrs": []}, "nat": {},
                              "verdict": "ok", "liveness": {"eviction_brake": False}}
    assert "eviction brake" not in render(report)
    report["liveness"] = {"eviction_brake": True, "members": 40,
                          "suspected": {f"p{i}": None for i in range(6)}}
    assert "eviction brake on: 6 of 40 peers suspected at once" in render(report)


def test_doctor_says_when_a_node_is_cut_off_and_evicts_no_one() -> None:
    report: dict[str, Any] = {"self": {"peer_id": "me", "addrs": []}, "nat": {},
                              "verdict": "ok", "liveness": {"cut_off": False}}
    assert "cut off" not in render(report)
    report["liveness"]["cut_off"] = True
    assert "cut off: most members picked at random do not answer" in render(report)

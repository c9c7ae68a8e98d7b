"""The process-wide py-libp2p adjustments keep their guarantees while saving work."""

import inspect
import os

import libp2p.pubsub.gossipsub as gossipsub
import libp2p.pubsub.pubsub as pubsub

from otela.mesh import workarounds
from otela.mesh.host import build_host  # noqa: F401 - importing applies the workarounds


class Rpc:
    def __init__(self, record: bytes | None) -> None:
        self.senderRecord = record

    def HasField(self, name: str) -> bool:
        return self.senderRecord is not None


class Host:
    pass


def test_workarounds_are_installed_where_pubsub_looks_them_up():
    assert gossipsub.env_to_send_in_RPC is pubsub.env_to_send_in_RPC
    assert gossipsub.env_to_send_in_RPC.__name__ == "env_to_send_in_rpc"
    assert gossipsub.maybe_consume_signed_record is pubsub.maybe_consume_signed_record
    assert os.environ["PY_YAMUX_RELEASE_ON_READ"] == "0"
    # The replay to new subscribers is switched off where pubsub still calls it.
    assert pubsub.Pubsub._replay_recent_messages is workarounds.no_replay
    assert "self._replay_recent_messages" in inspect.getsource(pubsub.Pubsub)


def test_a_host_reuses_its_signed_record_instead_of_rebuilding_it_per_rpc():
    built: list[Host] = []

    def build(host: Host) -> tuple[bytes, bool]:
        built.append(host)
        return f"record-{len(built)}".encode(), True

    reuse = workarounds.reused_record(build)
    a, b = Host(), Host()
    assert reuse(a) == (b"record-1", True)
    assert reuse(a) == (b"record-1", False)
    assert reuse(b) == (b"record-2", True)  # per host
    assert built == [a, b]


def test_each_record_is_verified_once_and_bad_ones_are_still_rejected():
    checked: list[bytes] = []

    def consume(msg: Rpc, host: object, peer_id: object = None) -> bool:
        checked.append(msg.senderRecord)
        return msg.senderRecord == b"good"

    once = workarounds.verified_once(consume)
    assert once(Rpc(None), None, "p")  # no record: nothing to check
    assert once(Rpc(b"good"), None, "p") and once(Rpc(b"good"), None, "p")
    assert not once(Rpc(b"forged"), None, "p") and not once(Rpc(b"forged"), None, "p")
    assert once(Rpc(b"good"), None, "q")  # the same record from another sender: checked
    assert checked == [b"good", b"forged", b"forged", b"good"]


def test_junk_on_a_pubsub_stream_reaches_the_handler_as_a_parse_error():
    """Bytes that are not a protobuf RPC raised DecodeError past the library's handler,
    which killed the pubsub service and the node; the handler resets the stream and drops
    the peer on ParseError."""
    import pytest
    import trio
    from google.protobuf.message import DecodeError
    from libp2p.exceptions import ParseError

    assert pubsub.Pubsub.continuously_read_stream.__qualname__.startswith("tolerant_reader")
    assert "ParseError" in inspect.getsource(pubsub.Pubsub.stream_handler)

    async def junk(self: object, stream: object) -> None:
        raise DecodeError("Error parsing message with type 'pubsub.pb.RPC'")

    async def cancelled(self: object, stream: object) -> None:
        raise trio.Cancelled._create()  # type: ignore[attr-defined]

    with pytest.raises(ParseError, match="DecodeError"):
        trio.run(workarounds.tolerant_reader(junk), None, None)
    with pytest.raises(trio.Cancelled):  # cancellation is not a peer's fault: untouched
        trio.run(workarounds.tolerant_reader(cancelled), None, None)

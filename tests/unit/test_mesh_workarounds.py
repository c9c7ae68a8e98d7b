"""The process-wide py-libp2p adjustments keep their guarantees while saving work."""

import inspect
import os

import libp2p.pubsub.gossipsub as gossipsub
import libp2p.pubsub.pubsub as pubsub
import libp2p.stream_muxer.yamux.yamux as yamux
import trio

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
    assert "PY_YAMUX_RELEASE_ON_READ" not in os.environ
    assert yamux.YamuxStream._auto_tune_and_send_window_update is workarounds.credit_at_half_window
    assert "self._auto_tune_and_send_window_update(" in inspect.getsource(yamux.YamuxStream.read)
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


def test_rpcs_leave_without_the_senders_signed_record_and_are_still_taken():
    """otela does not send its signed peer record on every RPC (~174 bytes each); a
    receiver of any version (py-libp2p's own consumer) takes an RPC without one."""
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.id import ID
    from libp2p.pubsub.pb import rpc_pb2
    from libp2p.pubsub.utils import maybe_consume_signed_record

    assert pubsub.Pubsub.write_msg.__qualname__ == "without_sender_record.write_msg"
    written: list[bytes] = []

    class Out:
        async def write(self, data: bytes) -> None:
            written.append(data)

    key = create_new_key_pair(b"\x07" * 32)
    message = rpc_pb2.Message(data=b"delta", topicIDs=["otela/registry/1"],
                              from_id=ID.from_pubkey(key.public_key).to_bytes(),
                              seqno=(1).to_bytes(8, "big"))
    rpc = rpc_pb2.RPC(publish=[message], senderRecord=b"r" * 174)
    with_record = len(rpc.SerializeToString())
    assert trio.run(pubsub.Pubsub.write_msg, object(), Out(), rpc)
    sent = rpc_pb2.RPC()
    sent.ParseFromString(written[0][1:])  # after the one-byte length prefix
    assert not sent.HasField("senderRecord") and sent.publish[0].data == b"delta"
    assert len(written[0]) - 1 == with_record - 177  # the record, its tag and length
    assert maybe_consume_signed_record(sent, None, None)  # type: ignore[arg-type]


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


class Stream(yamux.YamuxStream):
    """A Yamux stream's window bookkeeping without a connection: updates are recorded."""

    def __init__(self) -> None:
        self.stream_id = 1
        self.conn = type("Conn", (), {"stream_buffers": {1: bytearray()}, "rtt": lambda _: 0.0})()
        self.window_lock = trio.Lock()
        self.recv_window = self.target_recv_window = yamux.DEFAULT_WINDOW_SIZE
        self.epoch_start = 0.0
        self.updates: list[int] = []

    async def send_window_update(self, increment: int, skip_lock: bool = False) -> None:
        self.updates.append(increment)

    async def receive_and_read(self, size: int) -> None:
        self.recv_window -= size  # what handle_incoming does when a DATA frame arrives
        await workarounds.credit_at_half_window(self, bytes_read=size)


def test_small_reads_return_no_credit_until_half_the_window_is_consumed():
    async def main() -> Stream:
        stream = Stream()
        for _ in range(100):  # a probe's worth of bytes, a hundred times
            await stream.receive_and_read(16)
        assert stream.updates == []
        half = yamux.DEFAULT_WINDOW_SIZE // 2
        await stream.receive_and_read(half - 1600)
        return stream

    stream = trio.run(main)
    assert len(stream.updates) == 1  # one update, returning all the credit consumed
    assert stream.updates[0] >= yamux.DEFAULT_WINDOW_SIZE // 2
    # The peer holds a full window again (auto-tuning may have grown it).
    assert stream.recv_window == stream.target_recv_window >= yamux.DEFAULT_WINDOW_SIZE


def test_bytes_buffered_but_unread_are_not_credited():
    async def main() -> Stream:
        stream = Stream()
        stream.recv_window -= yamux.DEFAULT_WINDOW_SIZE  # a whole window arrived
        stream.conn.stream_buffers[1].extend(b"x" * yamux.DEFAULT_WINDOW_SIZE)
        await workarounds.credit_at_half_window(stream)
        assert stream.updates == []  # nothing read yet
        del stream.conn.stream_buffers[1][: yamux.DEFAULT_WINDOW_SIZE // 2]
        await workarounds.credit_at_half_window(stream, bytes_read=yamux.DEFAULT_WINDOW_SIZE // 2)
        return stream

    stream = trio.run(main)
    assert len(stream.updates) == 1
    # Credit for what was read; the half still buffered stays counted against the peer.
    buffered = yamux.DEFAULT_WINDOW_SIZE // 2
    assert stream.recv_window + buffered == stream.target_recv_window

"""Process-wide adjustments to py-libp2p 0.8.1, each answering a measured problem.

Applied once, on import of ``otela.mesh.host`` (see docs/mesh.md for the table):
- B1: every dial waited a 250 ms happy-eyeballs delay, even with one address.
- Yamux sent a WINDOW_UPDATE frame for every read (``PY_YAMUX_RELEASE_ON_READ`` defaults
  on), so every gossip message cost a second frame back, each one a Noise encryption and
  a syscall on one side and a decryption and parse on the other. Credit is returned
  go-yamux style instead, once half the window has been consumed (~10-20 % less CPU
  under registry churn). An operator's own ``PY_YAMUX_RELEASE_ON_READ`` wins.
  Setting that variable was not enough: a second branch ("partial slack") still credited
  every read whose bytes left the window short of its target, which for the small frames
  of probes and gossip is every read. Measured on an idle 16-node federation, 55 of a
  node's 88 frames sent in 10 s were these 12-byte updates, each a Noise encryption and a
  syscall here and a wake-up, decryption and parse at the peer. The whole credit decision
  is now go-yamux's ``sendWindowUpdate``: return credit once the peer's unused window
  falls below half the target, growing the target as py-libp2p's auto-tuning does.
- Signed peer records on every GossipSub RPC: py-libp2p attaches the sender's signed
  peer record to each RPC, rebuilding it from ``host.get_addrs()`` (multiaddr parsing)
  each time, and every receiver verifies its Ed25519 signature each time. Profiled in a
  100-node federation this was ~15 % of a node's CPU. The sender now reuses its record
  for ``RECORD_REUSE_S`` seconds, and a receiver verifies each distinct (record, sender)
  pair once; a record that fails verification is still rejected, as before. (otela
  learns addresses from its signed registry, not from these records.)
- ...and otela no longer sends them on its RPCs at all (issue 38's churn fix): the
  record, ~174 bytes with one address, rode on every gossip message and every IHAVE and
  IWANT, a fifth of a registry delta's bytes on the wire and more than half of an
  IHAVE's. Nothing here reads it: GossipSub uses peer records only for peer exchange on
  PRUNE, which otela leaves off (peering owns the connections), and identify carries the
  same record once per connection. The field is removed as an RPC is written; a
  receiver of any version takes an RPC without one (py-libp2p's
  ``maybe_consume_signed_record`` accepts its absence), and records from peers that
  still send them are verified once as above. Subscription announcements still carry
  one (they bypass ``write_msg``; once per topic and connection).
- Replay of the message cache to every new subscriber: on each new connection py-libp2p
  sends the peer every message of its last few heartbeats, one RPC each (a guard for
  messages published while the connection was being set up). Under connection churn this
  multiplied the cost of each reconnection: ~12 % of a node's CPU, by py-spy, in a
  128-node federation after an overload. otela does not need it: a registry delta missed
  on one link arrives on the others or by anti-entropy, and liveness news rides on probes.
- An inbound GossipSub stream carrying bytes that are not a protobuf RPC raised
  ``DecodeError`` out of ``Pubsub.continuously_read_stream``, which the stream handler did
  not catch: the pubsub service, and with it the node, died (found by
  ``tests/integration/test_misbehaving_peer.py``). Anything the reader raises is now a
  ``ParseError``, which the handler already treats as a broken peer stream (reset it,
  drop the peer from pubsub, reopen while still connected).
"""

from __future__ import annotations

import os
import time
import weakref
from collections import OrderedDict
from typing import Any

import libp2p.network.swarm as _swarm
import libp2p.pubsub.gossipsub as _gossipsub
import libp2p.pubsub.pubsub as _pubsub
import libp2p.stream_muxer.yamux.yamux as _yamux
from libp2p.exceptions import ParseError

RECORD_REUSE_S = 60.0
VERIFIED_RECORDS_KEPT = 4096

_applied = False


def apply() -> None:
    """Install every adjustment (idempotent)."""
    global _applied
    if _applied:
        return
    _applied = True
    _swarm._HAPPY_EYEBALLS_DELAY = 0.0
    if "PY_YAMUX_RELEASE_ON_READ" not in os.environ:
        _yamux.YamuxStream._auto_tune_and_send_window_update = (  # type: ignore[method-assign]
            credit_at_half_window)
    build = _pubsub.env_to_send_in_RPC
    consume = _pubsub.maybe_consume_signed_record
    reuse = reused_record(build)
    once = verified_once(consume)
    for module in (_pubsub, _gossipsub):
        module.env_to_send_in_RPC = reuse  # type: ignore[attr-defined]
        module.maybe_consume_signed_record = once  # type: ignore[attr-defined]
    _pubsub.Pubsub._replay_recent_messages = no_replay  # type: ignore[method-assign]
    _pubsub.Pubsub.write_msg = without_sender_record(  # type: ignore[method-assign]
        _pubsub.Pubsub.write_msg)
    _pubsub.Pubsub.continuously_read_stream = (  # type: ignore[method-assign]
        tolerant_reader(_pubsub.Pubsub.continuously_read_stream))


async def credit_at_half_window(self: Any, *, bytes_read: int = 0) -> None:
    """Stands in for ``YamuxStream._auto_tune_and_send_window_update``: go-yamux's rule.

    ``recv_window`` is the credit the peer still holds; bytes buffered here but not yet
    read are not returned. Credit goes back only when at least half the target window has
    been consumed (``bytes_read`` is already reflected in ``recv_window`` and the buffer),
    so a stream of small messages costs one update per half window, not one per read. A
    writer never waits on a reader that keeps reading: it holds at least half a window.
    """
    del bytes_read
    async with self.window_lock:
        buffered = len(self.conn.stream_buffers.get(self.stream_id, b""))
        consumed = self.target_recv_window - (self.recv_window + buffered)
        if consumed <= 0 or consumed < self._grow_threshold():
            return
        increment = self._grow_to_delta(buffered) + self._apply_autotune_epoch(buffered)
    if increment > 0:
        await self.send_window_update(increment, skip_lock=True)


async def no_replay(self: Any, peer_id: Any, topic: str) -> None:
    """Stands in for ``Pubsub._replay_recent_messages`` (see the module docstring)."""


def tolerant_reader(read: Any) -> Any:
    """Wrap ``Pubsub.continuously_read_stream`` so that whatever a peer's bytes make it
    raise reaches the stream handler as a ``ParseError`` (see the module docstring)."""

    async def continuously_read_stream(self: Any, stream: Any) -> None:
        try:
            await read(self, stream)
        except ParseError:
            raise
        except Exception as exc:  # DecodeError, and anything else junk can cause
            raise ParseError(f"malformed pubsub RPC: {type(exc).__name__}: {exc}") from exc

    return continuously_read_stream


def without_sender_record(write: Any) -> Any:
    """Wrap ``Pubsub.write_msg`` so that no RPC leaves with the sender's signed peer
    record (see the module docstring)."""

    async def write_msg(self: Any, stream: Any, rpc_msg: Any) -> bool:
        if rpc_msg.HasField("senderRecord"):
            rpc_msg.ClearField("senderRecord")
        return bool(await write(self, stream, rpc_msg))

    write_msg.__qualname__ = "without_sender_record.write_msg"
    write_msg.__wrapped_write__ = write  # type: ignore[attr-defined]  # benchmarks/gossip_wire.py
    return write_msg


def reused_record(build: Any) -> Any:
    """Wrap GossipSub's per-RPC signed-peer-record builder: reuse a host's record for
    60 s instead of signing a new one for every RPC (see the module docstring)."""
    cache: weakref.WeakKeyDictionary[Any, tuple[bytes, float]] = weakref.WeakKeyDictionary()

    def env_to_send_in_rpc(host: Any) -> tuple[bytes, bool]:
        now = time.monotonic()
        cached = cache.get(host)
        if cached is not None and now - cached[1] < RECORD_REUSE_S:
            return cached[0], False
        envelope, created = build(host)
        cache[host] = (envelope, now)
        return envelope, created

    return env_to_send_in_rpc


def verified_once(consume: Any) -> Any:
    """Wrap GossipSub's consumer of a received signed peer record: verify each (record,
    sender) pair once, not on every RPC that carries it (see the module docstring)."""
    verified: OrderedDict[tuple[bytes, Any], None] = OrderedDict()

    def maybe_consume_signed_record(msg: Any, host: Any, peer_id: Any = None) -> bool:
        if not msg.HasField("senderRecord"):
            return True
        key = (bytes(msg.senderRecord), peer_id)
        if key in verified:
            verified.move_to_end(key)
            return True
        ok = bool(consume(msg, host, peer_id))
        if ok:
            verified[key] = None
            if len(verified) > VERIFIED_RECORDS_KEPT:
                verified.popitem(last=False)
        return ok

    return maybe_consume_signed_record

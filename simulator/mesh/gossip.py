"""GossipSub as py-libp2p 0.8.1 runs it for otela, modelled (the library, not otela's code).

Each node keeps a mesh of ``D`` (6) of its connections per the library's parameters
(``D_lo`` 4, ``D_hi`` 12: ``otela/mesh/host.py``); one mesh serves both otela topics here.
A node forwards a message it sees first, and its validator accepts, to its mesh peers
(not back to the sender nor to the origin); duplicates cost bytes and a little CPU. Every
heartbeat (1 s) a node that saw messages in the last ``HISTORY`` heartbeats advertises
their ids (IHAVE) to ``D_LAZY`` connections outside its mesh, which ask (IWANT) for those
they lack: the repair path for a message a mesh link did not deliver.

Message sizes are py-libp2p's own protobufs, measured (``Wire``): otela's payload plus
the message's fields (origin, seqno, topic; the signature and public key of a strictly
signed message) and the RPC's length prefix; IHAVE and IWANT by their id lists.
py-libp2p also attaches the sender's signed peer record (177 bytes with one address) to
every RPC it sends, which otela stopped sending (``otela/mesh/workarounds.py``, issue
38's churn fix): ``Wire(sender_record=True)`` models the daemon before that change.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from simulator.mesh.network import Network

D, D_LO, D_HI, D_LAZY = 6, 4, 12, 6
HISTORY = 3  # heartbeats a message id is advertised for
HEARTBEAT_S = 1.0
SEEN_TTL_S = 120.0
# An RPC carrying one message, beyond its data, as py-libp2p 0.8.1 serialises it (with
# its uvarint length prefix): origin peer id (38 bytes), seqno (8), the topic, and for a
# strictly signed message the signature (64) and the public key (36).
MESSAGE_SIGNED = 180
MESSAGE_UNSIGNED = 76
SENDER_RECORD = 177  # the sender's signed peer record (one address) in an RPC, if attached
IHAVE_BYTES, IWANT_BYTES = 24, 6  # an IHAVE (with its topic) or IWANT RPC, without ids
MID_BYTES = 48  # a message id (origin peer id + seqno) in an IHAVE or IWANT


@dataclass(frozen=True)
class Wire:
    """What py-libp2p puts around otela's data on a GossipSub connection."""

    signed: bool = True  # strict signing: every message carries a signature and key
    sender_record: bool = False  # every RPC carries the sender's signed peer record
    # GossipSub 1.2 as py-libp2p 0.8.1 runs it: on every message it publishes or forwards,
    # an IDONTWANT RPC with the message's id to each mesh peer, whatever its size (go-libp2p
    # only above 1 KiB); a peer skips forwarding that message to it, and forgets what it
    # was told at each heartbeat (``_prune_idontwant_entries``), at most 10 ids per peer.
    idontwant: bool = False

    @property
    def rpc(self) -> int:
        """Bytes every RPC carries beyond its messages or control ids."""
        return SENDER_RECORD if self.sender_record else 0

    @property
    def message(self) -> int:
        """Bytes a message carries beyond its data, in an RPC of its own."""
        return (MESSAGE_SIGNED if self.signed else MESSAGE_UNSIGNED) + self.rpc


# The daemon's wire (``otela/mesh/host.py``, ``workarounds.py``), before and after issue
# 38's churn fix; "unsigned" is a what-if the daemon does not run (docs/scale.md).
WIRES = {"peer-record": Wire(sender_record=True), "signed": Wire(),
         "unsigned": Wire(signed=False), "idontwant": Wire(idontwant=True)}
IDONTWANT_KEPT = 10  # ids a py-libp2p 0.8.1 node keeps per peer (``max_idontwant_messages``)


@dataclass
class Message:
    mid: int
    topic: str
    origin: int
    data: bytes
    published: float


@dataclass
class GossipNode:
    mesh: set[int] = field(default_factory=set)
    seen: dict[int, float] = field(default_factory=dict)
    recent: list[tuple[float, Message]] = field(default_factory=list)
    beating: bool = False
    dont_send: dict[int, set[int]] = field(default_factory=dict)  # peer -> ids (IDONTWANT)


class Gossip:
    def __init__(self, net: Network, rng: random.Random,
                 connections: Callable[[int], set[int]],
                 alive: Callable[[int], bool],
                 validate: Callable[[int, int, Message], bool],
                 deliver: Callable[[int, Message], None], wire: Wire | None = None,
                 degree: tuple[int, int, int, int] = (D, D_LO, D_HI, D_LAZY)) -> None:
        self.net = net
        self.wire = wire or Wire()
        # D, D_lo, D_hi, D_lazy: the daemon's (otela/mesh/host.py) unless a what-if
        self.d, self.d_lo, self.d_hi, self.d_lazy = degree
        self.rng = rng
        self.connections = connections
        self.alive = alive
        self.validate = validate  # (node, forwarder, message): the topic validator
        self.deliver = deliver
        self.nodes: dict[int, GossipNode] = {}
        self._mid = 0
        self.duplicates = 0
        # What the churn breakdown reads (docs/scale.md): copies of a message received
        # (first ones and duplicates), and the bytes of gossip sent split into the
        # payload (otela's delta) and what GossipSub adds around it.
        self.firsts = 0
        self.payload_bytes = 0
        self.envelope_bytes = 0

    def reset_counts(self) -> None:
        self.duplicates = self.firsts = self.payload_bytes = self.envelope_bytes = 0

    def node(self, index: int) -> GossipNode:
        state = self.nodes.get(index)
        if state is None:
            state = self.nodes[index] = GossipNode()
        return state

    # -- the mesh ------------------------------------------------------------------------

    def connected(self, a: int, b: int) -> None:
        """A new connection: each end grafts the other while its mesh is under ``D``."""
        na, nb = self.node(a), self.node(b)
        d, d_hi = self.d, self.d_hi
        if (len(na.mesh) < d and len(nb.mesh) < d_hi) or (len(nb.mesh) < d and len(na.mesh) < d_hi):
            na.mesh.add(b)
            nb.mesh.add(a)

    def disconnected(self, a: int, b: int) -> None:
        for x, y in ((a, b), (b, a)):
            state = self.nodes.get(x)
            if state is not None and y in state.mesh:
                state.mesh.discard(y)
                if len(state.mesh) < self.d_lo:
                    self._top_up(x)

    def _top_up(self, index: int) -> None:
        state = self.node(index)
        spare = sorted(self.connections(index) - state.mesh)
        self.rng.shuffle(spare)
        for peer in spare[: self.d - len(state.mesh)]:
            if len(self.node(peer).mesh) < self.d_hi:
                state.mesh.add(peer)
                self.node(peer).mesh.add(index)

    def forget(self, index: int) -> None:
        for peer in self.node(index).mesh:
            other = self.nodes.get(peer)
            if other is not None:
                other.mesh.discard(index)
        self.nodes.pop(index, None)

    # -- messages ------------------------------------------------------------------------

    def publish(self, origin: int, topic: str, data: bytes) -> Message:
        self._mid += 1
        message = Message(self._mid, topic, origin, data, self.net.loop.now)
        self.node(origin).seen[message.mid] = self.net.loop.now
        self._remember(origin, message)
        self._forward(origin, -1, message)
        return message

    def _forward(self, index: int, sender: int, message: Message) -> None:
        state = self.node(index)
        if self.wire.idontwant:
            for peer in sorted(state.mesh):
                self.net.send(index, peer, self.wire.rpc + IWANT_BYTES + MID_BYTES,
                              "idontwant", self._idontwant, peer, index, message.mid)
        for peer in sorted(state.mesh):
            if (peer != sender and peer != message.origin
                    and message.mid not in state.dont_send.get(peer, ())):
                self._send_message(index, peer, message)

    def _idontwant(self, index: int, sender: int, mid: int) -> None:
        kept = self.node(index).dont_send.setdefault(sender, set())
        if len(kept) < IDONTWANT_KEPT:
            kept.add(mid)

    def _send_message(self, index: int, peer: int, message: Message,
                      overhead: int | None = None) -> None:
        """Send ``message`` to ``peer``; ``overhead``: its bytes beyond the data when not
        an RPC of its own (a second message in an IWANT's answer)."""
        extra = self.wire.message if overhead is None else overhead
        if self.net.send(index, peer, len(message.data) + extra,
                         f"gossip {message.topic}", self.receive, peer, index, message):
            self.payload_bytes += len(message.data)
            self.envelope_bytes += extra

    def receive(self, index: int, sender: int, message: Message) -> None:
        if not self.alive(index):
            return
        state = self.node(index)
        if message.mid in state.seen:
            self.duplicates += 1
            return
        self.net.charge(index, self.net.config.cpu_gossip_s)
        self.firsts += 1
        state.seen[message.mid] = self.net.loop.now
        if not self.validate(index, sender, message):
            return
        self._remember(index, message)
        self._forward(index, sender, message)
        self.deliver(index, message)

    def _remember(self, index: int, message: Message) -> None:
        state = self.node(index)
        state.recent.append((self.net.loop.now, message))
        if not state.beating:
            state.beating = True
            self.net.loop.after(HEARTBEAT_S * (0.5 + self.rng.random() / 2), self._heartbeat,
                                index)

    def _heartbeat(self, index: int) -> None:
        state = self.nodes.get(index)
        if state is None or not self.alive(index):
            return
        now = self.net.loop.now
        state.dont_send.clear()
        state.recent = [(t, m) for t, m in state.recent if now - t < HISTORY * HEARTBEAT_S]
        if len(state.seen) > 4096:
            state.seen = {mid: t for mid, t in state.seen.items() if now - t < SEEN_TTL_S}
        if not state.recent:
            state.beating = False
            return
        others = sorted(self.connections(index) - state.mesh)
        self.rng.shuffle(others)
        mids = [m for _, m in state.recent]
        for peer in others[:self.d_lazy]:
            self.net.send(index, peer, self.wire.rpc + IHAVE_BYTES + MID_BYTES * len(mids),
                          "ihave", self._ihave, peer, index, mids)
        self.net.loop.after(HEARTBEAT_S, self._heartbeat, index)

    def _ihave(self, index: int, sender: int, messages: list[Message]) -> None:
        if not self.alive(index):
            return
        seen = self.node(index).seen
        wanted = [m for m in messages if m.mid not in seen]
        if wanted:
            self.net.send(index, sender, self.wire.rpc + IWANT_BYTES + MID_BYTES * len(wanted),
                          "iwant", self._iwant, sender, index, wanted)

    def _iwant(self, index: int, asker: int, messages: list[Message]) -> None:
        # One RPC answers them all (py-libp2p's handle_iwant): one record, if any.
        for k, message in enumerate(messages):
            self._send_message(index, asker, message,
                               None if k == 0 else self.wire.message - self.wire.rpc)

    def spare(self, index: int) -> Any:
        return self.nodes.get(index)

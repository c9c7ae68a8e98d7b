"""GossipSub as py-libp2p 0.8.1 runs it for otela, modelled (the library, not otela's code).

Each node keeps a mesh of ``D`` (6) of its connections per the library's parameters
(``D_lo`` 4, ``D_hi`` 12: ``otela/mesh/host.py``); one mesh serves both otela topics here.
A node forwards a message it sees first, and its validator accepts, to its mesh peers
(not back to the sender nor to the origin); duplicates cost bytes and a little CPU. Every
heartbeat (1 s) a node that saw messages in the last ``HISTORY`` heartbeats advertises
their ids (IHAVE) to ``D_LAZY`` connections outside its mesh, which ask (IWANT) for those
they lack: the repair path for a message a mesh link did not deliver. Message sizes:
the payload plus the signed envelope's fields (``RPC_OVERHEAD``).
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
RPC_OVERHEAD = 160  # from, seqno, topic, signature and key of a strictly signed message
MID_BYTES = 46  # a message id (seqno + origin peer id)


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


class Gossip:
    def __init__(self, net: Network, rng: random.Random,
                 connections: Callable[[int], set[int]],
                 alive: Callable[[int], bool],
                 validate: Callable[[int, int, Message], bool],
                 deliver: Callable[[int, Message], None]) -> None:
        self.net = net
        self.rng = rng
        self.connections = connections
        self.alive = alive
        self.validate = validate  # (node, forwarder, message): the topic validator
        self.deliver = deliver
        self.nodes: dict[int, GossipNode] = {}
        self._mid = 0
        self.duplicates = 0

    def node(self, index: int) -> GossipNode:
        state = self.nodes.get(index)
        if state is None:
            state = self.nodes[index] = GossipNode()
        return state

    # -- the mesh ------------------------------------------------------------------------

    def connected(self, a: int, b: int) -> None:
        """A new connection: each end grafts the other while its mesh is under ``D``."""
        na, nb = self.node(a), self.node(b)
        if (len(na.mesh) < D and len(nb.mesh) < D_HI) or (len(nb.mesh) < D and len(na.mesh) < D_HI):
            na.mesh.add(b)
            nb.mesh.add(a)

    def disconnected(self, a: int, b: int) -> None:
        for x, y in ((a, b), (b, a)):
            state = self.nodes.get(x)
            if state is not None and y in state.mesh:
                state.mesh.discard(y)
                if len(state.mesh) < D_LO:
                    self._top_up(x)

    def _top_up(self, index: int) -> None:
        state = self.node(index)
        spare = sorted(self.connections(index) - state.mesh)
        self.rng.shuffle(spare)
        for peer in spare[: D - len(state.mesh)]:
            if len(self.node(peer).mesh) < D_HI:
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
        size = len(message.data) + RPC_OVERHEAD
        for peer in sorted(self.node(index).mesh):
            if peer != sender and peer != message.origin:
                self.net.send(index, peer, size, "gossip", self.receive, peer, index, message)

    def receive(self, index: int, sender: int, message: Message) -> None:
        if not self.alive(index):
            return
        state = self.node(index)
        if message.mid in state.seen:
            self.duplicates += 1
            return
        self.net.charge(index, self.net.config.cpu_gossip_s)
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
        state.recent = [(t, m) for t, m in state.recent if now - t < HISTORY * HEARTBEAT_S]
        if len(state.seen) > 4096:
            state.seen = {mid: t for mid, t in state.seen.items() if now - t < SEEN_TTL_S}
        if not state.recent:
            state.beating = False
            return
        others = sorted(self.connections(index) - state.mesh)
        self.rng.shuffle(others)
        mids = [m for _, m in state.recent]
        for peer in others[:D_LAZY]:
            self.net.send(index, peer, 8 + MID_BYTES * len(mids), "ihave", self._ihave, peer,
                          index, mids)
        self.net.loop.after(HEARTBEAT_S, self._heartbeat, index)

    def _ihave(self, index: int, sender: int, messages: list[Message]) -> None:
        if not self.alive(index):
            return
        seen = self.node(index).seen
        wanted = [m for m in messages if m.mid not in seen]
        if wanted:
            self.net.send(index, sender, 8 + MID_BYTES * len(wanted), "iwant", self._iwant,
                          sender, index, wanted)

    def _iwant(self, index: int, asker: int, messages: list[Message]) -> None:
        for message in messages:
            self.net.send(index, asker, len(message.data) + RPC_OVERHEAD, "gossip",
                          self.receive, asker, index, message)

    def spare(self, index: int) -> Any:
        return self.nodes.get(index)

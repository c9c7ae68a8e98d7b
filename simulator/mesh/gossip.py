"""GossipSub as py-libp2p 0.8.1 runs it for otela, modelled (the library, not otela's code).

Each node keeps a mesh of ``D`` (6) of its connections per the library's parameters
(``D_lo`` 4, ``D_hi`` 12: ``otela/mesh/host.py``); one mesh serves both otela topics here.
A node forwards a message it sees first, and its validator accepts, to its mesh peers
(not back to the sender nor to the origin); duplicates cost bytes and a little CPU. Every
heartbeat (1 s) a node that saw messages in the last ``HISTORY`` heartbeats advertises
their ids (IHAVE) to ``D_LAZY`` connections outside its mesh, which ask (IWANT) for those
they lack: the repair path for a message a mesh link did not deliver.

``push="tree"`` is a what-if the daemon does not run (docs/scale.md): Plumtree's lazy push
(Leitao, Pereira, Rodrigues, "Epidemic Broadcast Trees", SRDS 2007) on GossipSub's mesh.
A node forwards a message eagerly only to the mesh peers it has not pruned; a duplicate
prunes the link it came on (both ends: a PRUNE back), so the eager links thin to a tree
that carries one copy per node; the pruned (lazy) mesh peers hear each message's id
once, ``LAZY_FLUSH_S`` after it came (the ``D_LAZY`` others at the heartbeat, as
GossipSub), and a node missing it asks (IWANT) and grafts the link back into the tree.

``push="choke"``, another what-if, is the choking proposed for GossipSub (episub; the
libp2p specs' "gossipsub v1.2 choke" discussions): a node keeps receiving whole messages
from only the ``CHOKE_KEEP`` mesh peers that delivered it the most messages first lately
(counts decayed every heartbeat; an id first heard in a choked peer's IHAVE counts for
it) and chokes the others, which then send it ids only, once, as the tree's lazy links;
it unchokes a peer that climbs back into its best ``CHOKE_KEEP``. It chokes only on
evidence (``CHOKE_EVIDENCE`` messages counted) and unchokes everyone when traffic goes
quiet: a quiet mesh floods as GossipSub does, a busy one is thinned.

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
CONTROL_BYTES = 24  # a PRUNE, GRAFT, CHOKE or UNCHOKE for one topic, alone or in an IWANT
PUSHES = ("mesh", "tree", "choke")
# Lazy push: ids go to the lazy mesh peers this long after the first of a batch (0: at
# the heartbeat, with GossipSub's IHAVEs to non-mesh peers, which stay there).
LAZY_FLUSH_S = 0.1
CHOKE_KEEP = 2  # choke push: mesh peers a node keeps sending it whole messages
CHOKE_EVIDENCE = 8.0  # ... once its decayed counts hold this many first deliveries
CHOKE_DECAY = 0.9  # ... each heartbeat (a window of ~10 s)


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
    # Mesh peers this node sends ids to instead of messages: links pruned from the tree
    # (tree push, both ends), or peers that choked this node (choke push).
    lazy: set[int] = field(default_factory=set)
    unadvertised: list[Message] = field(default_factory=list)  # lazy push: ids not yet sent
    flushed: list[Message] = field(default_factory=list)  # ... sent to lazy mesh peers only
    choked: set[int] = field(default_factory=set)  # choke push: mesh peers sending us ids
    firsts: dict[int, float] = field(default_factory=dict)  # peer -> decayed first deliveries


class Gossip:
    def __init__(self, net: Network, rng: random.Random,
                 connections: Callable[[int], set[int]],
                 alive: Callable[[int], bool],
                 validate: Callable[[int, int, Message], bool],
                 deliver: Callable[[int, Message], None], wire: Wire | None = None,
                 degree: tuple[int, int, int, int] = (D, D_LO, D_HI, D_LAZY),
                 push: str = "mesh") -> None:
        if push not in PUSHES:
            raise ValueError(f"push is one of {PUSHES}, not {push!r}")
        self.net = net
        self.wire = wire or Wire()
        self.tree = push == "tree"  # Plumtree's lazy push (the module's docstring)
        self.choke = push == "choke"  # choking (the module's docstring)
        self.lazy_ids = self.tree or self.choke  # each id advertised once
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
        self.prunes = self.grafts = 0  # tree push's thinnings and repairs

    def reset_counts(self) -> None:
        self.duplicates = self.firsts = self.payload_bytes = self.envelope_bytes = 0
        self.prunes = self.grafts = 0

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
                state.lazy.discard(y)
                state.choked.discard(y)
                state.firsts.pop(y, None)
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
        for peer in sorted(state.mesh - state.lazy):
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
            if self.tree and sender in state.mesh and sender not in state.lazy:
                # Plumtree: a second eager path to us; prune it (both ends lazy).
                state.lazy.add(sender)
                self.prunes += 1
                self.net.send(index, sender, self.wire.rpc + CONTROL_BYTES, "prune",
                              self._pruned, sender, index)
            return
        self.net.charge(index, self.net.config.cpu_gossip_s)
        self.firsts += 1
        if self.choke:
            state.firsts[sender] = state.firsts.get(sender, 0.0) + 1
        state.seen[message.mid] = self.net.loop.now
        if not self.validate(index, sender, message):
            return
        self._remember(index, message)
        self._forward(index, sender, message)
        self.deliver(index, message)

    def _pruned(self, index: int, by: int) -> None:
        state = self.nodes.get(index)
        if state is not None and by in state.mesh:
            state.lazy.add(by)

    def _remember(self, index: int, message: Message) -> None:
        state = self.node(index)
        state.recent.append((self.net.loop.now, message))
        if self.lazy_ids:
            state.unadvertised.append(message)
            if LAZY_FLUSH_S > 0 and len(state.unadvertised) == 1:
                self.net.loop.after(LAZY_FLUSH_S, self._flush_ids, index)
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
        targets = others[:self.d_lazy]
        if self.lazy_ids:  # each id once; to the lazy mesh peers too: the repair path
            self._advertise(index, sorted(state.lazy), state.unadvertised)  # (not flushed)
            mids = state.flushed + state.unadvertised
            state.flushed, state.unadvertised = [], []
        self._advertise(index, targets, mids)
        if self.choke:
            self._rechoke(index, state)
        self.net.loop.after(HEARTBEAT_S, self._heartbeat, index)

    def _advertise(self, index: int, targets: list[int], mids: list[Message]) -> None:
        for peer in targets if mids else ():
            self.net.send(index, peer, self.wire.rpc + IHAVE_BYTES + MID_BYTES * len(mids),
                          "ihave", self._ihave, peer, index, mids)

    def _flush_ids(self, index: int) -> None:
        """Lazy push's ids, ``LAZY_FLUSH_S`` after the first of a batch, to the mesh
        peers that get ids instead of messages (the others at the heartbeat)."""
        state = self.nodes.get(index)
        if state is None or not self.alive(index) or not state.unadvertised:
            return
        self._advertise(index, sorted(state.lazy), state.unadvertised)
        state.flushed.extend(state.unadvertised)
        state.unadvertised = []

    def _rechoke(self, index: int, state: GossipNode) -> None:
        """Keep whole messages from the ``CHOKE_KEEP`` mesh peers that lately delivered
        the most first and choke the rest, once the counts hold ``CHOKE_EVIDENCE``
        messages; below half that (traffic gone quiet) unchoke every peer: a quiet mesh
        floods, as GossipSub does."""
        scores = {peer: state.firsts.get(peer, 0.0) for peer in state.mesh}
        evidence = sum(scores.values())
        if evidence >= CHOKE_EVIDENCE and len(scores) > CHOKE_KEEP:
            ranked = sorted(scores, key=lambda p: (-scores[p], p in state.choked, p))
            keep = set(ranked[:CHOKE_KEEP])
        elif evidence < CHOKE_EVIDENCE / 2:
            keep = set(scores)
        else:
            keep = set(scores) - state.choked
        for peer in sorted(scores):
            choke = peer not in keep
            if choke != (peer in state.choked):
                (state.choked.add if choke else state.choked.discard)(peer)
                self.net.send(index, peer, self.wire.rpc + CONTROL_BYTES,
                              "choke" if choke else "unchoke", self._choked_by,
                              peer, index, choke)
        state.firsts = {peer: n * CHOKE_DECAY for peer, n in state.firsts.items()
                        if n > 0.01}

    def _choked_by(self, index: int, peer: int, choke: bool) -> None:
        state = self.nodes.get(index)
        if state is not None and peer in state.mesh:
            (state.lazy.add if choke else state.lazy.discard)(peer)

    def _ihave(self, index: int, sender: int, messages: list[Message]) -> None:
        if not self.alive(index):
            return
        state = self.node(index)
        wanted = [m for m in messages if m.mid not in state.seen]
        if wanted and self.choke and sender in state.choked:  # it had them before us
            state.firsts[sender] = state.firsts.get(sender, 0.0) + len(wanted)
        if wanted:
            graft = self.tree and sender in state.mesh and sender in state.lazy
            if graft:  # the tree missed us: this link carries messages eagerly again
                state.lazy.discard(sender)
                self.grafts += 1
            self.net.send(index, sender, self.wire.rpc + IWANT_BYTES + MID_BYTES * len(wanted)
                          + (CONTROL_BYTES if graft else 0),
                          "iwant", self._iwant, sender, index, wanted)

    def _iwant(self, index: int, asker: int, messages: list[Message]) -> None:
        if self.tree:  # a GRAFT rides with it (``_ihave``)
            self.node(index).lazy.discard(asker)
        # One RPC answers them all (py-libp2p's handle_iwant): one record, if any.
        for k, message in enumerate(messages):
            self._send_message(index, asker, message,
                               None if k == 0 else self.wire.message - self.wire.rpc)

    def spare(self, index: int) -> Any:
        return self.nodes.get(index)

"""Keep a bounded set of random connections, chosen from the registry replica.

Every registry record carries its node's libp2p addresses, and every node holds the full
registry, so the replica is already a complete, signed peer list: no separate discovery
protocol has to run before a node can pick peers. Each node keeps between ``low`` and
``high`` connections, topping up to ``target`` with peers sampled uniformly at random.
Random, bounded degree matters: when every node connects only to the bootstrap nodes,
py-libp2p's GossipSub meshes flap and lose a large share of messages (measured 28-59 %),
and the bootstrap nodes carry every connection.

Healing partitions: after a partition each side evicts the other, and nothing in normal
peering would ever contact an evicted peer again, so two large halves could stay apart.
Every ``reconcile_interval`` (2 s) a node therefore dials one random peer whose session
was evicted (within the retention window) and runs anti-entropy with it; if the peer is
alive, it learns of its eviction, rejoins under a new session, and the halves merge. The
first such dial after a heal decides how soon the halves agree: with 10 s, agreement came
1.8-2.7 s after the heal in ``benchmarks/chaos.py``'s 8-node partition (goal 2 s). A peer
that refuses a plain TCP connection (nothing listens: it is really gone) is skipped
without a libp2p dial, so dead members cost one refused connect per try.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

import multiaddr
import trio
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo

from otela.mesh.bootstrap import dial
from otela.mesh.listening import nothing_listens_at
from otela.registry.records import Lifecycle, NodeRecord
from otela.registry.store import Registry

log = logging.getLogger("otela.mesh")

DIAL_TIMEOUT_S = 5.0


def plan_step(connected: set[str], candidates: list[str], keep: set[str], low: int,
              target: int, high: int, rng: random.Random) -> tuple[list[str], list[str]]:
    """One peering step, sans I/O: (peers to dial, peers to trim). Dial up to ``target``
    only below ``low``; trim only the excess above ``high`` (``Peering.step`` says why).
    ``candidates``: peers we could connect to, in registry order; ``keep``: never trimmed.
    The mesh simulator calls this too."""
    if len(connected) < low:
        fresh = [p for p in candidates if p not in connected]
        rng.shuffle(fresh)
        return fresh[: target - len(connected)], []
    if len(connected) > high:
        extra = sorted(p for p in connected if p not in keep)
        rng.shuffle(extra)
        return [], extra[: len(connected) - high]
    return [], []


def reconcile_choice(evicted: list[str], rng: random.Random) -> str | None:
    """Which peer whose sessions were all evicted to dial now (healing partitions)."""
    return rng.choice(evicted) if evicted else None


def dialable(record: NodeRecord, own_peer_id: str) -> bool:
    """A member we may dial directly: not LEFT, not us, with an address, not behind a NAT
    (those are reached through relays, on demand)."""
    return not (record.state is Lifecycle.LEFT or record.peer_id == own_peer_id
                or not record.addrs or record.needs_relayed_path())


class Peering:
    def __init__(
        self,
        host: Any,
        registry: Registry,
        *,
        suspected: Callable[[], frozenset[str]] = frozenset,
        low: int = 4,
        target: int = 6,
        high: int = 16,
        interval: float = 2.0,
        reconcile: Callable[[ID], Awaitable[bool]] | None = None,
        reconcile_interval: float = 2.0,
        keep: Callable[[], set[str]] = set,
        on_trim: Callable[[str], Awaitable[None]] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.host = host
        self.registry = registry
        self.suspected = suspected
        self.low, self.target, self.high = low, target, high
        self.interval = interval
        self.rng = rng or random.Random()
        self.last_errors: dict[str, str] = {}
        self.reconcile = reconcile
        self.reconcile_interval = reconcile_interval
        self.keep = keep  # peer ids never trimmed (e.g. relays holding our reservations)
        self.on_trim = on_trim  # told before we close a connection on purpose

    def candidates(self) -> dict[ID, list[multiaddr.Multiaddr]]:
        """Peers we could connect to: registry members not LEFT, not us, not suspected."""
        me = self.host.get_id().to_base58()
        suspected = self.suspected()
        out: dict[ID, list[multiaddr.Multiaddr]] = {}
        for record in self.registry:
            if not dialable(record, me) or record.peer_id in suspected:
                continue
            try:
                out[ID.from_base58(record.peer_id)] = [multiaddr.Multiaddr(a) for a in record.addrs]
            except Exception:
                continue  # a record with an unusable address: skip it, never crash
        return out

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            if self.reconcile is not None:
                nursery.start_soon(self._reconcile_loop, self.reconcile)
            while True:
                await self.step()
                await trio.sleep(self.interval * self.rng.uniform(0.8, 1.2))

    def evicted_peers(self) -> dict[ID, list[multiaddr.Multiaddr]]:
        """Peers whose sessions were all evicted (still within retention): maybe alive."""
        live = {r.peer_id for r in self.registry if r.state is not Lifecycle.LEFT}
        out: dict[ID, list[multiaddr.Multiaddr]] = {}
        for record in self.registry:
            entry = self.registry.entry(record.session_id)
            if (entry is None or entry.evicted_by is None or record.peer_id in live
                    or not record.addrs):
                continue
            try:
                out[ID.from_base58(record.peer_id)] = [multiaddr.Multiaddr(a) for a in record.addrs]
            except Exception:
                continue
        return out

    async def _reconcile_loop(self, reconcile: Callable[[ID], Awaitable[bool]]) -> None:
        while True:
            await trio.sleep(self.reconcile_interval * self.rng.uniform(0.8, 1.2))
            evicted = {p.to_base58(): (p, addrs) for p, addrs in self.evicted_peers().items()}
            chosen = reconcile_choice(list(evicted), self.rng)
            if chosen is None:
                continue
            peer_id, addrs = evicted[chosen]
            if await nothing_listens_at(addrs):
                continue
            await self._dial(peer_id, addrs)
            if peer_id in self.host.get_connected_peers():
                await reconcile(peer_id)

    async def step(self) -> None:
        """Dial up to ``target`` only below ``low``; trim only the excess above ``high``.

        The wide band is what keeps an idle mesh still: if nodes dialled whenever they were
        below ``target`` and trimmed down to ``target``, one dial that pushes a peer over
        ``high`` would make it drop several connections, whose other ends then dial again,
        and so on; measured at 16 idle nodes: ~5 new connections per second, for ever, each
        costing a Noise handshake, identify and a GossipSub hello on both ends.
        ``high`` (16) sits well above twice ``target``: every dial adds a connection at both
        ends, so a federation whose joiners each dial ~``target`` peers settles at a mean
        degree near ``2 x target``. With ``high`` at 10 that mean forced trims for as long
        as nodes kept joining; at 128 nodes on 2 cores the trimmed peers' ``bye`` often
        went unanswered, each trim looked like a crash to the other end, and the probes
        of the "lost" neighbour (a fresh dial under load) timed out into suspicions.
        """
        connected = {p.to_base58(): p for p in self.host.get_connected_peers()}
        candidates = self.candidates() if len(connected) < self.low else {}
        by_name = {p.to_base58(): (p, addrs) for p, addrs in candidates.items()}
        dials, trims = plan_step(set(connected), list(by_name), self.keep(), self.low,
                                 self.target, self.high, self.rng)
        if dials:
            async with trio.open_nursery() as nursery:
                for name in dials:
                    nursery.start_soon(self._dial, *by_name[name])
        for name in trims:
            if self.on_trim is not None:
                await self.on_trim(name)
            try:
                await self.host.disconnect(connected[name])
            except Exception:
                log.debug("trimming connection to %s failed", name, exc_info=True)

    async def _dial(self, peer_id: ID, addrs: list[multiaddr.Multiaddr]) -> None:
        try:
            await dial(self.host, PeerInfo(peer_id, addrs), DIAL_TIMEOUT_S)
            self.last_errors.pop(peer_id.to_base58(), None)
        except trio.TooSlowError:
            self.last_errors[peer_id.to_base58()] = f"dial timed out after {DIAL_TIMEOUT_S:.0f}s"
        except Exception as exc:  # dial failures are normal (NAT, churn); remember why
            self.last_errors[peer_id.to_base58()] = str(exc)[:300]
            log.debug("dial %s failed: %s", peer_id, exc)

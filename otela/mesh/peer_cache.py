"""Remember a few live peers across restarts, and rejoin through them.

A node learns its peers from the registry, and the registry from its peers: a node
restarted with no ``--bootstrap`` (the bootstrap node itself, typically) comes back with
an empty replica and nobody to ask, while the others see only its old session, LEFT, and
never dial it. It would stay alone until a new node happened to join through it. So every
node keeps the addresses of up to ``KEEP`` live members in ``<home>/peers.json``
(rewritten now and then and at shutdown), and while it holds no connection at all it dials
them, one at a time in random order, until one answers and anti-entropy has run.

The file is a hint, never trusted: entries are addresses only (the peer proves its id in
the Noise handshake), and what a peer says still goes through the registry's checks.
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import multiaddr
import trio
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo

from otela.mesh.bootstrap import BACKOFF_INITIAL_S, CHECK_INTERVAL_S, dial, next_backoff
from otela.mesh.peering import dialable
from otela.registry.records import NodeRecord

log = logging.getLogger("otela.mesh")

FILE_NAME = "peers.json"
KEEP = 32
MAX_FILE_BYTES = 256 * 1024
SAVE_INTERVAL_S = 60.0


def chosen_peers(records: Iterable[NodeRecord], own_peer_id: str,
                 rng: random.Random) -> list[dict[str, object]]:
    """Up to ``KEEP`` live members with a direct address, at random: what to remember."""
    by_peer = {r.peer_id: list(r.addrs) for r in records if dialable(r, own_peer_id)}
    peers = sorted(by_peer)
    rng.shuffle(peers)
    return [{"peer_id": p, "addrs": by_peer[p]} for p in peers[:KEEP]]


def read(path: Path, own_peer_id: str) -> list[PeerInfo]:
    """The remembered peers; an unreadable or malformed file (or entry) is skipped."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            return []
        entries = json.loads(path.read_text())["peers"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    out = []
    for entry in entries if isinstance(entries, list) else []:
        try:
            if entry["peer_id"] == own_peer_id:
                continue
            out.append(PeerInfo(ID.from_base58(entry["peer_id"]),
                                [multiaddr.Multiaddr(a) for a in entry["addrs"]]))
        except Exception:  # any malformed entry: a hint we cannot use
            continue
    return out


def write(path: Path, peers: list[dict[str, object]]) -> None:
    """Replace the file atomically (a crash mid-write leaves the old one)."""
    if not peers:
        return  # alone: keep what we knew before
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({"peers": peers}))
    os.replace(temporary, path)


class PeerCache:
    def __init__(self, home: Path, own_peer_id: str,
                 records: Callable[[], Iterable[NodeRecord]]) -> None:
        self.path = home / FILE_NAME
        self.own_peer_id = own_peer_id
        self.records = records
        self.rng = random.Random()
        self.remembered = read(self.path, own_peer_id)  # as the last run left it

    def save(self) -> None:
        try:
            write(self.path, chosen_peers(self.records(), self.own_peer_id, self.rng))
        except OSError as exc:
            log.warning("cannot remember peers in %s: %s", self.path, exc)

    async def keep_saving(self) -> None:
        while True:
            await trio.sleep(SAVE_INTERVAL_S * self.rng.uniform(0.8, 1.2))
            self.save()

    async def rejoin(self, host: Any, isolated: Callable[[], bool],
                     sync: Callable[[ID], Awaitable[bool]]) -> None:
        """While we hold no connection, dial remembered peers until one takes us back."""
        delay = BACKOFF_INITIAL_S
        while self.remembered:
            if not isolated():
                delay = BACKOFF_INITIAL_S
                await trio.sleep(CHECK_INTERVAL_S)
                continue
            peers = list(self.remembered)
            self.rng.shuffle(peers)
            if await self._first_that_answers(host, peers, sync):
                continue
            sleep, delay = next_backoff(delay, self.rng)
            await trio.sleep(sleep)

    async def _first_that_answers(self, host: Any, peers: list[PeerInfo],
                                  sync: Callable[[ID], Awaitable[bool]]) -> bool:
        for peer in peers:
            try:
                await dial(host, peer)
            except Exception as exc:  # gone, moved, too slow: the next one may answer
                log.debug("remembered peer %s did not answer: %s", peer.peer_id, exc)
                continue
            log.info("rejoined through remembered peer %s", peer.peer_id)
            await sync(peer.peer_id)
            return True
        return False

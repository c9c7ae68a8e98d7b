"""What this node has seen of the network, kept for ``otela doctor`` and ``GET /v1/network``.

libp2p logs dial failures at a volume nobody reads (hundreds of lines per hole punch), then
forgets them. otela keeps, per peer, the few facts an operator needs to explain why a peer is
unreachable: when it was last in contact, its last dial errors, and whether a relayed
connection was upgraded to a direct one by hole punching. Bounded: ``MAX_ERRORS`` per peer,
``MAX_PEERS`` peers (oldest forgotten first).
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

MAX_ERRORS = 5
MAX_PEERS = 1024


@dataclass
class PeerLog:
    last_contact: float | None = None
    errors: deque[tuple[float, str, str]] = field(default_factory=lambda: deque(maxlen=MAX_ERRORS))
    relayed_since: float | None = None  # first seen reachable only through a relay
    direct_since: float | None = None  # first direct connection after a relayed one
    connection: str | None = None  # "direct" / "relayed" while connected

    def to_dict(self) -> dict[str, Any]:
        upgraded = None
        if self.relayed_since is not None and self.direct_since is not None:
            upgraded = round(self.direct_since - self.relayed_since, 3)
        return {
            "last_contact": self.last_contact,
            "connection": self.connection,
            "dial_errors": [
                {"at": at, "addr": addr, "error": err} for at, addr, err in self.errors
            ],
            "hole_punch": {
                "relayed_since": self.relayed_since,
                "upgraded_to_direct": self.direct_since is not None
                and self.relayed_since is not None,
                "upgrade_after_s": upgraded,
            },
        }


@dataclass
class BootstrapLog:
    addr: str
    peer_id: str
    failures: int = 0  # consecutive
    last_error: str | None = None
    last_error_at: float | None = None
    connected_at: float | None = None


class NetLog:
    def __init__(self) -> None:
        self._peers: OrderedDict[str, PeerLog] = OrderedDict()
        self.bootstrap: dict[str, BootstrapLog] = {}

    def bootstrap_attempt(self, addr: str, peer_id: str, error: str | None) -> None:
        """Record one dial of a configured bootstrap peer (``error`` None: it worked)."""
        entry = self.bootstrap.setdefault(addr, BootstrapLog(addr, peer_id))
        now = time.time()
        if error is None:
            entry.failures, entry.connected_at = 0, now
        else:
            entry.failures += 1
            entry.last_error, entry.last_error_at = error[:300], now
            self.dial_failed(peer_id, addr, error, now)

    def bootstrap_report(self, connected: set[str]) -> list[dict[str, Any]]:
        return [
            {
                "addr": b.addr,
                "peer_id": b.peer_id,
                "connected": b.peer_id in connected,
                "failures": b.failures,
                "last_error": b.last_error,
                "last_error_at": b.last_error_at,
                "connected_at": b.connected_at,
            }
            for b in self.bootstrap.values()
        ]

    def peer(self, peer_id: str) -> PeerLog:
        entry = self._peers.get(peer_id)
        if entry is None:
            entry = self._peers[peer_id] = PeerLog()
            while len(self._peers) > MAX_PEERS:
                self._peers.popitem(last=False)
        return entry

    def get(self, peer_id: str) -> PeerLog | None:
        return self._peers.get(peer_id)

    def dial_failed(self, peer_id: str, addr: str, error: str, now: float | None = None) -> None:
        self.peer(peer_id).errors.append((now or time.time(), addr, error[:300]))

    def observe_connections(self, peer_id: str, kinds: set[str], now: float) -> None:
        """Update from the live connection set of ``peer_id`` (``{"direct", "relayed"}``)."""
        entry = self.peer(peer_id)
        entry.last_contact = now
        if "direct" in kinds:
            if entry.relayed_since is not None and entry.direct_since is None:
                entry.direct_since = now
            entry.connection = "direct"
        elif "relayed" in kinds:
            if entry.relayed_since is None:
                entry.relayed_since = now
            entry.connection = "relayed"

    def disconnected(self, peer_id: str) -> None:
        entry = self._peers.get(peer_id)
        if entry is not None:
            entry.connection = None

    def peers(self) -> dict[str, PeerLog]:
        return dict(self._peers)

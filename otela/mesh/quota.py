"""Per-peer caps on the inbound libp2p streams a node holds open, one cap per protocol.

Every otela protocol is served one task per inbound stream, and an honest peer keeps one
or two streams of each open to us (one long-lived stream for the engine hop, one for
probes; anti-entropy opens one per exchange). A misbehaving member
opening thousands at once would otherwise get thousands of handler tasks (each waiting
up to its protocol's timeout), and Yamux does not limit how many a peer may open. A
stream over the peer's cap is reset at once, before any of its bytes is read: the cost
of a flood stays with the peer that sends it. Refusals are counted per protocol and
logged within a budget (``otela.logbudget``), never one line each.
"""

from __future__ import annotations

import logging
import weakref
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from libp2p.custom_types import TProtocol

from otela.logbudget import LogBudget

log = logging.getLogger("otela.mesh")

Handler = Callable[[Any], Awaitable[None]]

# Inbound streams one peer may hold open at once, per protocol (docs/security.md).
HTTP_STREAMS = 16  # /otela/http/2: one stream per caller, a second while one retires
SWIM_STREAMS = 8  # one probe channel per peer, reopened when it breaks
AE_STREAMS = 8  # anti-entropy: bootstrap, periodic and farewell exchanges may overlap
SMALL_STREAMS = 4  # admission, dial-back: one at a time when honest


class StreamQuota:
    """How many streams each peer holds open; pure bookkeeping, no I/O."""

    def __init__(self, per_peer: int) -> None:
        self.per_peer = per_peer
        self._open: Counter[str] = Counter()
        self.refused = 0

    def acquire(self, peer: str) -> bool:
        """Count one more open stream of ``peer``; ``False`` (nothing counted) if over."""
        if self._open[peer] >= self.per_peer:
            self.refused += 1
            return False
        self._open[peer] += 1
        return True

    def release(self, peer: str) -> None:
        self._open[peer] -= 1
        if self._open[peer] <= 0:
            del self._open[peer]  # only peers with open streams are remembered

    def open_streams(self, peer: str | None = None) -> int:
        return self._open[peer] if peer is not None else sum(self._open.values())

    def peers(self) -> int:
        return len(self._open)


class StreamQuotas:
    """One host's quotas, by protocol; ``set_handler`` installs a capped handler."""

    def __init__(self) -> None:
        self.by_protocol: dict[str, StreamQuota] = {}
        self._budget = LogBudget(burst=10, window=60.0)

    def guard(self, protocol: TProtocol, per_peer: int, handler: Handler) -> Handler:
        quota = self.by_protocol.setdefault(str(protocol), StreamQuota(per_peer))

        async def capped(stream: Any) -> None:
            peer = _peer(stream)
            if not quota.acquire(peer):
                self._refused(peer, protocol, quota)
                await _reset(stream)
                return
            try:
                await handler(stream)
            finally:
                quota.release(peer)

        return capped

    def _refused(self, peer: str, protocol: TProtocol, quota: StreamQuota) -> None:
        skipped = self._budget.take()
        if skipped is not None:
            log.warning("peer %s holds %d %s streams open already: refused another%s",
                        peer, quota.per_peer, protocol,
                        f" ({skipped} such refusals not logged)" if skipped else "")

    def report(self) -> dict[str, dict[str, int]]:
        """Per protocol: streams open now, peers holding them, refusals so far."""
        return {name: {"open": q.open_streams(), "peers": q.peers(), "refused": q.refused}
                for name, q in sorted(self.by_protocol.items())}


_QUOTAS: weakref.WeakKeyDictionary[Any, StreamQuotas] = weakref.WeakKeyDictionary()


def quotas_of(host: Any) -> StreamQuotas:
    """The quotas of ``host`` (every part installing a handler on it shares them)."""
    quotas = _QUOTAS.get(host)
    if quotas is None:
        quotas = _QUOTAS[host] = StreamQuotas()
    return quotas


def set_capped_handler(host: Any, protocol: TProtocol, handler: Handler,
                       per_peer: int) -> None:
    """``host.set_stream_handler`` with at most ``per_peer`` open streams per peer."""
    host.set_stream_handler(protocol, quotas_of(host).guard(protocol, per_peer, handler))


def _peer(stream: Any) -> str:
    try:
        return str(stream.muxed_conn.peer_id.to_base58())
    except Exception:
        return "?"


async def _reset(stream: Any) -> None:
    try:
        await stream.reset()
    except Exception:
        log.debug("resetting a refused stream failed", exc_info=True)

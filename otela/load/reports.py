"""Load reports as soft state, sent straight to the ingress nodes, at a bounded rate.

Responses carry load reports to the ingresses that use a node (``x-otela-load``); these
reports tell every ingress about the nodes it has not used lately. Only ingress nodes
route, so only they hear them: a serving node keeps one long-lived libp2p stream
(``/otela/load/1``) to each live ingress in the registry and writes a small frame on it
when its load changed. Nobody else receives or forwards anything.

Why not a GossipSub topic (the first design): every report then reached every node, and
each node forwarded it to its mesh degree (6) and gossiped its id; at 50 nodes that cost
each node ~15 KB/s while every node's load changed, 30x the goal of 0.5 KB/s, to tell
nodes that never route. Direct reports cost a serving node one frame per interval per
ingress, and an ingress the federation's report rate: ~0.2 KB/s at most.

Reports are not registry state: no lattice version, no signature of ours (the stream is
authenticated by the Noise handshake: the receiver knows the sending peer), no
anti-entropy, no tombstones. A report lives ``ttl`` seconds at the receiver unless
refreshed; a lost one costs nothing but staleness.

Rate, bounded per ingress rather than per node: a serving node reports at most once every
``max(min_interval, members * per_member_s)`` seconds, and only when its load changed (or,
while it is not zero, before its last report expires). With the defaults (2 s, 0.5 s) an
ingress of a 50-node federation hears at most two reports a second, whatever happens;
an idle federation sends none. ``benchmarks/convergence.py --load-reports`` measures it.

A report names the sender's session; the receiver drops it unless the registry says that
session belongs to the peer at the other end of the stream: a node cannot describe
another's load.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import orjson
import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from otela.load.source import LoadSource
from otela.mesh.framing import read_frame, write_frame
from otela.mesh.quota import SMALL_STREAMS, set_capped_handler
from otela.registry.records import Lifecycle, NodeRecord
from otela.registry.store import Registry
from otela.routing.load import NodeLoad, parse_load

log = logging.getLogger("otela.load")

LOAD_PROTOCOL = TProtocol("/otela/load/1")
MAX_REPORT_BYTES = 512
TTL_INTERVALS = 3  # a report expires after this many of its sender's intervals
SEND_TIMEOUT_S = 10.0  # connecting (perhaps through a relay), opening and writing


def interval_for(members: int, min_interval: float, per_member_s: float) -> float:
    """Seconds between one node's reports in a federation of ``members`` nodes."""
    return max(min_interval, members * per_member_s)


def changed(last: NodeLoad | None, now: NodeLoad) -> bool:
    """Whether ``now`` differs enough from the last report sent to say it again."""
    if last is None:
        return now.outstanding > 0 or (now.kv_usage or 0) > 0
    if last.outstanding != now.outstanding:
        return True
    return abs((last.kv_usage or 0.0) - (now.kv_usage or 0.0)) >= 0.05


def ingresses(registry: Iterable[NodeRecord], own_peer_id: str) -> dict[str, NodeRecord]:
    """The live ingress nodes a report goes to, by peer id (one per peer: its newest
    session), leaving out this node."""
    out: dict[str, NodeRecord] = {}
    for record in registry:
        if record.ingress and record.state is not Lifecycle.LEFT and \
                record.peer_id != own_peer_id:
            known = out.get(record.peer_id)
            if known is None or record.updated_at > known.updated_at:
                out[record.peer_id] = record
    return out


def encode(session: str, load: NodeLoad, ttl: float) -> bytes:
    return orjson.dumps({"s": session, "l": load.header().decode(), "t": round(ttl, 1)})


def decode(data: bytes) -> tuple[str, NodeLoad, float] | None:
    """A report's session, load and ttl; ``None`` for anything malformed."""
    if len(data) > MAX_REPORT_BYTES:
        return None
    try:
        fields = orjson.loads(data)
        session, text, ttl = str(fields["s"]), str(fields["l"]), float(fields["t"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None
    load = parse_load(text)
    if load is None or not 0 < ttl <= 3600:  # also refuses nan
        return None
    return session, load, ttl


class LoadReports:
    """Sends this node's load to the ingresses (while it serves) and, on an ingress, takes
    the reports of the others."""

    def __init__(self, host: Any, registry: Callable[[], Registry], source: LoadSource,
                 on_report: Callable[[str, NodeLoad, float], None],
                 session: Callable[[], str], serving: Callable[[], bool],
                 admitted: Callable[[ID], bool],
                 connect: Callable[[NodeRecord], Awaitable[None]], *, receive: bool,
                 min_interval: float = 2.0, per_member_s: float = 0.5) -> None:
        self.host = host
        self.registry = registry
        self.source = source
        self.on_report = on_report  # (session, load, ttl): an ingress's LoadBoard
        self.session = session
        self.serving = serving
        self.admitted = admitted
        self.connect = connect  # direct, else through a relay (otela.mesh.nat)
        self.receive = receive
        self.min_interval = min_interval
        self.per_member_s = per_member_s
        self.stats = {"published": 0, "sent": 0, "send_failures": 0, "received": 0,
                      "refused": 0, "bytes_sent": 0, "bytes_received": 0}
        self._own_peer_id = host.get_id().to_base58()
        self._outbound: dict[str, Any] = {}  # ingress peer id -> our open report stream
        # reporting peer id -> its open stream, and the scope its reader runs in
        self._inbound: dict[str, tuple[Any, trio.CancelScope]] = {}

    def install(self) -> None:
        if self.receive:
            set_capped_handler(self.host, LOAD_PROTOCOL, self._take, SMALL_STREAMS)

    def linked_peers(self) -> set[str]:
        """Peers at the other end of a report stream: peering must not trim them (an
        ingress is connected to every serving node, far more than the usual degree)."""
        return set(self._outbound) | set(self._inbound)

    async def run(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        last: NodeLoad | None = None
        last_at = -1e9
        # Start at a random phase so nodes started together do not report together.
        await trio.sleep(random.uniform(0, self.min_interval))
        while True:
            interval = interval_for(len(self.registry()), self.min_interval,
                                    self.per_member_s)
            await trio.sleep(self.min_interval)
            now = trio.current_time()
            if not self.serving() or now - last_at < interval:
                continue
            load = self.source.current()
            refresh = last is not None and last.outstanding > 0 and \
                now - last_at >= (TTL_INTERVALS - 1) * interval
            if changed(last, load) or refresh:
                await self.publish(load, TTL_INTERVALS * interval)
                last, last_at = load, now

    # -- sending -------------------------------------------------------------------

    async def publish(self, load: NodeLoad, ttl: float) -> None:
        """Send one report to every live ingress, concurrently; an unreachable one misses
        it (the next report, or the answers it gets from us, will tell it)."""
        targets = ingresses(self.registry(), self._own_peer_id)
        for gone in set(self._outbound) - set(targets):
            await _close(self._outbound.pop(gone))
        if not targets:
            return
        data = encode(self.session(), load, ttl)
        self.stats["published"] += 1
        async with trio.open_nursery() as nursery:
            for record in targets.values():
                nursery.start_soon(self._send, record, data)

    async def _send(self, record: NodeRecord, data: bytes) -> None:
        # A kept stream may have died with its connection; then try once on a fresh one.
        for fresh in (False, True):
            with trio.move_on_after(SEND_TIMEOUT_S):
                try:
                    stream = await self._stream(record, fresh)
                    await write_frame(stream, data)
                    self.stats["sent"] += 1
                    self.stats["bytes_sent"] += len(data)
                    return
                except Exception as exc:  # no route, reset, refused: all the same here
                    log.debug("load report to %s failed: %s", record.peer_id, exc)
            stream = self._outbound.pop(record.peer_id, None)
            if stream is not None:
                await _close(stream)
        self.stats["send_failures"] += 1

    async def _stream(self, record: NodeRecord, fresh: bool) -> Any:
        stream = None if fresh else self._outbound.get(record.peer_id)
        if stream is None:
            await self.connect(record)
            stream = await self.host.new_stream(ID.from_base58(record.peer_id),
                                                [LOAD_PROTOCOL])
            self._outbound[record.peer_id] = stream
        return stream

    # -- receiving -----------------------------------------------------------------

    async def _take(self, stream: Any) -> None:
        """One sender's stream, for as long as it lasts; one per peer (a newer one
        replaces the older, which the sender gave up on)."""
        peer = stream.muxed_conn.peer_id
        peer_id = peer.to_base58()
        if not self.admitted(peer):
            self.stats["refused"] += 1
            await _close(stream)
            return
        older = self._inbound.get(peer_id)
        scope = trio.CancelScope()
        self._inbound[peer_id] = (stream, scope)
        if older is not None:
            # Resetting the older stream did not wake its reader, which then held its task
            # (and a slot of the peer's stream quota) until the connection closed: after a
            # few replacements an honest sender could no longer report at all.
            older[1].cancel()
            await _close(older[0])
        try:
            with scope:
                await self._read(peer_id, stream)
        except Exception as exc:  # closed, reset or oversized (FrameError): stop reading
            log.debug("load report stream from %s ended: %s", peer_id, exc)
        finally:
            if self._inbound.get(peer_id, (None,))[0] is stream:
                del self._inbound[peer_id]
            await _close(stream)

    async def _read(self, peer_id: str, stream: Any) -> None:
        while True:
            data = await read_frame(stream, MAX_REPORT_BYTES)
            self.stats["bytes_received"] += len(data)
            report = self._check(peer_id, data)
            if report is None:
                self.stats["refused"] += 1
                continue
            self.stats["received"] += 1
            self.on_report(*report)

    def _check(self, peer_id: str, data: bytes) -> tuple[str, NodeLoad, float] | None:
        report = decode(data)
        if report is None:
            return None
        record = self.registry().get(report[0])
        if record is None or record.peer_id != peer_id:
            return None  # unknown yet, or not the sender's session
        return report


async def _close(stream: Any) -> None:
    try:
        await stream.reset()
    except Exception:
        log.debug("closing a load report stream failed", exc_info=True)

"""Load reports as soft state, sent straight to the ingress nodes, at a bounded rate.

Responses carry load reports to the ingresses that use a node (``x-otela-load``); these
reports tell every ingress about the nodes it has not used lately. Only ingress nodes
route, so only they hear them: a serving node POSTs a small report to each live ingress
in its replica (``/v1/load-reports`` on the ingress's HTTP port, where the data path
already reaches serving nodes) when its load changed. Nobody else receives or forwards
anything.

Why not libp2p: the first design put reports on a GossipSub topic every node joined;
each report then reached every node and each node forwarded it to its mesh peers (at 50
nodes, +15.6 KB/s per node while every node's load changed: 30x the goal of 0.5 KB/s, to
tell nodes that never route). A libp2p stream per (serving node, ingress) was measured
next: the reports were cheap, but the ingress became every node's neighbour, so the
failure detector's probes and GossipSub's gossip of 50 nodes converged on it: +2.4 KB/s
at the ingress, growing with the federation. A keep-alive HTTP connection carries
nothing while idle. The request is authenticated like the engine hop (``x-otela-hop``,
``otela.dataplane.hop_auth``: a member's pairwise MAC over the method, path and body).

Reports are not registry state: no lattice version, no anti-entropy, no tombstones. A
report lives ``ttl`` seconds at the receiver unless refreshed; a lost one costs nothing
but staleness.

Rate, bounded per ingress rather than per node: a serving node reports at most once every
``max(min_interval, members * per_member_s)`` seconds, and only when its load changed (or,
while it is not zero, before its last report expires). With the defaults (2 s, 0.5 s) an
ingress of a federation of any size hears at most about two reports a second; an idle
federation sends none. ``benchmarks/convergence.py --load-reports`` measures it.

A report names the sender's session; the receiver drops it unless the registry says that
session belongs to the member that signed the request: a node cannot describe another's
load.

Cache summaries ride on the same reports (``"c"``, ``otela.kvcache``): a node whose
engine publishes KV events sends each ingress what changed in its advertised blocks since
that ingress last took a report (or the whole set, the first time, after an answer of 409
``cache_resync`` or when the engine's cache started over). A node with pending changes
reports at the next interval even if its load did not change, and one that advertises
anything refreshes at least every ``TTL_INTERVALS - 1`` intervals, so an ingress's view is
at most one interval old and goes stale (ignored) when its node stops reporting.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable
from typing import Any

import httpx
import orjson
import trio

from otela.dataplane.errors import RequestError
from otela.dataplane.hop_auth import HOP_HEADER, HopRefused, HopSigner, HopVerifier
from otela.kvcache.index import CacheIndex, Summary
from otela.kvcache.wire import MAX_SUMMARY_BYTES, from_wire, to_wire
from otela.load.source import LoadSource
from otela.registry.records import Lifecycle, NodeRecord
from otela.registry.store import Registry
from otela.routing.load import NodeLoad, parse_load

log = logging.getLogger("otela.load")

PATH = "/v1/load-reports"
MAX_REPORT_BYTES = 512 + MAX_SUMMARY_BYTES  # a load report alone is < 200 bytes
CACHE_RESYNC = "cache_resync"  # the 409 an ingress answers when it needs a whole set
TTL_INTERVALS = 3  # a report expires after this many of its sender's intervals
SEND_TIMEOUT_S = 5.0


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


def encode(session: str, load: NodeLoad, ttl: float, cache: Summary | tuple[int, int]
           | None = None) -> bytes:
    """A report; ``cache``: a summary, or (epoch, seq) to say the receiver's is current."""
    fields: dict[str, Any] = {"s": session, "l": load.header().decode(), "t": round(ttl, 1)}
    if isinstance(cache, Summary):
        fields["c"] = to_wire(cache)
    elif cache is not None:
        fields["c"] = {"e": cache[0], "q": cache[1]}
    return orjson.dumps(fields)


def decode(data: bytes) -> tuple[str, NodeLoad, float,
                                        Summary | tuple[int, int] | None] | None:
    """A report's session, load, ttl and cache part (a summary, or (epoch, seq) when
    nothing changed); ``None`` for anything malformed."""
    if len(data) > MAX_REPORT_BYTES:
        return None
    try:
        fields = orjson.loads(data)
        session, text, ttl = str(fields["s"]), str(fields["l"]), float(fields["t"])
        raw_cache = fields.get("c")
        cache: Summary | tuple[int, int] | None = None
        if isinstance(raw_cache, dict) and set(raw_cache) == {"e", "q"}:
            epoch, seq = raw_cache["e"], raw_cache["q"]
            if not isinstance(epoch, int) or not isinstance(seq, int):
                return None
            cache = (epoch, seq)
        elif raw_cache is not None:
            cache = from_wire(raw_cache)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        return None
    load = parse_load(text)
    if load is None or not 0 < ttl <= 3600:  # also refuses nan
        return None
    return session, load, ttl, cache


class ReportSchedule:
    """When a serving node sends its next report, sans I/O (``LoadReports.run`` and the mesh
    simulator both ask it every ``min_interval``): at most once per ``interval_for`` the
    federation's size, and only when the load changed or, while it is not zero, before the
    last report expires."""

    def __init__(self, min_interval: float = 2.0, per_member_s: float = 0.5) -> None:
        self.min_interval = min_interval
        self.per_member_s = per_member_s
        self.last: NodeLoad | None = None
        self.last_at = -1e9

    def due(self, now: float, members: int, serving: bool,
            load: Callable[[], NodeLoad], cache_pending: bool = False,
            cache_held: bool = False) -> tuple[NodeLoad, float] | None:
        """(the load to report, its ttl) if a report is due now, else None.
        ``cache_pending``: an ingress's cache summary is behind; ``cache_held``: this node
        advertises cached blocks (so it refreshes like a loaded node)."""
        interval = interval_for(members, self.min_interval, self.per_member_s)
        if not serving or now - self.last_at < interval:
            return None
        current = load()
        refresh = self.last is not None and \
            (self.last.outstanding > 0 or cache_held) and \
            now - self.last_at >= (TTL_INTERVALS - 1) * interval
        if not (changed(self.last, current) or refresh or cache_pending):
            return None
        self.last, self.last_at = current, now
        return current, TTL_INTERVALS * interval


class LoadReports:
    """Sends this node's load to the ingresses while it serves (``run``) and, on an
    ingress, takes the others' reports (``take``, behind the ``/v1/load-reports`` route)."""

    def __init__(self, registry: Callable[[], Registry], source: LoadSource,
                 on_report: Callable[[str, NodeLoad, float], None],
                 session: Callable[[], str], serving: Callable[[], bool],
                 client: httpx.AsyncClient, signer: HopSigner, verifier: HopVerifier, *,
                 receive: bool, min_interval: float = 2.0, per_member_s: float = 0.5,
                 cache: CacheIndex | None = None,
                 on_cache: Callable[[str, Summary | tuple[int, int], float], bool]
                 | None = None) -> None:
        self.registry = registry
        self.source = source
        self.on_report = on_report  # (session, load, ttl): an ingress's LoadBoard
        self.session = session
        self.serving = serving
        self.client = client
        self.signer = signer
        self.verifier = verifier
        self.receive = receive
        self.min_interval = min_interval
        self.per_member_s = per_member_s
        # This node's engine's cache (sending), and where an ingress's board takes the
        # summaries (receiving: False when a delta does not apply to what it holds).
        self.cache = cache
        self.on_cache = on_cache
        self.cache_held: dict[str, tuple[int, int] | None] = {}  # per ingress peer id
        self.stats = {"published": 0, "sent": 0, "send_failures": 0, "received": 0,
                      "refused": 0, "bytes_sent": 0, "bytes_received": 0,
                      "cache_bytes_sent": 0, "cache_resyncs": 0}

    async def run(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        schedule = ReportSchedule(self.min_interval, self.per_member_s)
        # Start at a random phase so nodes started together do not report together.
        await trio.sleep(random.uniform(0, self.min_interval))
        while True:
            await trio.sleep(self.min_interval)
            due = schedule.due(trio.current_time(), len(self.registry()), self.serving(),
                               self.source.current, self._cache_pending(),
                               self.cache is not None and bool(self.cache.anchors))
            if due is not None:
                await self.publish(*due)

    def _cache_pending(self) -> bool:
        """Whether some ingress's view of our cache is behind."""
        cache = self.cache
        if cache is None or not cache.ready:
            return False
        current = (cache.epoch, cache.seq)
        targets = ingresses(self.registry(), self.signer.peer_id)
        return any(self.cache_held.get(peer) != current for peer in targets)

    # -- sending -------------------------------------------------------------------

    async def publish(self, load: NodeLoad, ttl: float) -> None:
        """Send one report to every live ingress, concurrently; one that does not take it
        misses it (the next report, or the answers it gets from us, will tell it)."""
        targets = ingresses(self.registry(), self.signer.peer_id)
        if not targets:
            return
        self.stats["published"] += 1
        session = self.session()
        for peer in [p for p in self.cache_held if p not in targets]:
            del self.cache_held[peer]  # an ingress gone: it holds nothing of ours
        async with trio.open_nursery() as nursery:
            for peer, record in targets.items():
                cache: Summary | tuple[int, int] | None = None
                sent = None
                if self.cache is not None and self.cache.ready:
                    held = self.cache_held.get(peer)
                    sent = (self.cache.epoch, self.cache.seq)
                    cache = self.cache.summary_for(held) or sent
                data = encode(session, load, ttl, cache)
                nursery.start_soon(self._send, record, data, sent)

    async def _send(self, record: NodeRecord, data: bytes,
                    cache_sent: tuple[int, int] | None = None) -> None:
        token = self.signer.token(record.peer_id, "POST", PATH, data)
        try:
            answer = await self.client.post(
                record.http_url.rstrip("/") + PATH, content=data, timeout=SEND_TIMEOUT_S,
                headers={HOP_HEADER: token, "content-type": "application/json"})
        except httpx.HTTPError as exc:  # unreachable, reset, timed out: all the same here
            log.debug("load report to %s failed: %s", record.peer_id, exc)
            self.stats["send_failures"] += 1
            return
        if answer.status_code == 409 and CACHE_RESYNC in answer.text:
            self.stats["cache_resyncs"] += 1  # it took the load, not our delta
            self.cache_held[record.peer_id] = None
            return
        if answer.status_code != 204:
            log.debug("load report to %s refused: %s %s", record.peer_id,
                      answer.status_code, answer.text[:200])
            self.stats["send_failures"] += 1
            return
        self.stats["sent"] += 1
        self.stats["bytes_sent"] += len(data)
        if cache_sent is not None:
            self.cache_held[record.peer_id] = cache_sent
            self.stats["cache_bytes_sent"] += len(data)

    # -- receiving -----------------------------------------------------------------

    def take(self, token: str | None, body: bytes) -> None:
        """One report from another member; raises ``RequestError`` (401/403 not a
        member's request, 400 malformed, 403 another node's session or not an ingress)."""
        if not self.receive:
            raise RequestError(403, "this node is not an ingress: it takes no load reports",
                               code="not_an_ingress")
        try:
            sender = self.verifier.verify(token, "POST", PATH, body)
        except HopRefused as refused:
            self.stats["refused"] += 1
            raise RequestError(refused.status, refused.message, code=refused.code) from None
        self.stats["bytes_received"] += len(body)
        report = decode(body)
        if report is None:
            self.stats["refused"] += 1
            raise RequestError(400, "a load report is {\"s\": session, \"l\": load, "
                               "\"t\": ttl seconds} in at most "
                               f"{MAX_REPORT_BYTES} bytes", code="invalid_load_report")
        record = self.registry().get(report[0])
        if record is None or record.peer_id != sender:
            self.stats["refused"] += 1
            raise RequestError(403, "the report's session is not the sender's (or not "
                               "known here yet)", code="not_your_session")
        self.stats["received"] += 1
        session, load, ttl, cache = report
        self.on_report(session, load, ttl)
        if cache is not None and self.on_cache is not None and \
                not self.on_cache(session, cache, ttl):
            raise RequestError(409, "this ingress does not hold the cache summary that "
                               "report's changes apply to: send the whole set",
                               code=CACHE_RESYNC)

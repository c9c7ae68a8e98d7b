"""Load reports as soft state on their own GossipSub topic, at a bounded rate.

Responses carry load reports to the ingresses that use a node (``x-otela-load``); this
topic tells every ingress about the nodes it has not used lately. Reports are not
registry state: no lattice version, no signature of ours (GossipSub signs each message
with the publisher's key), no anti-entropy, no tombstones. A report lives ``ttl``
seconds at the receivers unless refreshed; a lost one costs nothing but staleness.

Rate, bounded for the whole federation rather than per node: a serving node publishes at
most once every ``max(min_interval, members * per_member_s)`` seconds, and only when its
load changed (or, while it is not zero, before its last report expires). With the
defaults (2 s, 0.5 s) a 50-node federation carries at most two reports a second, whatever
happens, about 0.5 KB/s per node in the worst case (every node's load changing all the
time; ``benchmarks/convergence.py --load-reports`` measures it); an idle one carries none.

A report names the publisher's session; receivers drop it unless the registry says that
session belongs to the peer that signed the message: a node cannot describe another's
load.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any

import orjson
import trio
from libp2p.peer.id import ID

from otela.load.source import LoadSource
from otela.registry.store import Registry
from otela.routing.load import NodeLoad, parse_load

log = logging.getLogger("otela.load")

LOAD_TOPIC = "otela/load/1"
MAX_MESSAGE_BYTES = 512
TTL_INTERVALS = 3  # a report expires after this many of its publisher's intervals


def interval_for(members: int, min_interval: float, per_member_s: float) -> float:
    """Seconds between one node's reports in a federation of ``members`` nodes."""
    return max(min_interval, members * per_member_s)


def changed(last: NodeLoad | None, now: NodeLoad) -> bool:
    """Whether ``now`` differs enough from the last published report to say it again."""
    if last is None:
        return now.outstanding > 0 or (now.kv_usage or 0) > 0
    if last.outstanding != now.outstanding:
        return True
    return abs((last.kv_usage or 0.0) - (now.kv_usage or 0.0)) >= 0.05


class LoadGossip:
    def __init__(self, mesh: Any, registry: Callable[[], Registry], source: LoadSource,
                 on_report: Callable[[str, NodeLoad, float], None],
                 session: Callable[[], str], serving: Callable[[], bool],
                 admitted: Callable[[ID], bool], *, min_interval: float = 2.0,
                 per_member_s: float = 0.5) -> None:
        self.mesh = mesh
        self.registry = registry
        self.source = source
        self.on_report = on_report  # (session, load, ttl): an ingress's LoadBoard
        self.session = session
        self.serving = serving
        self.admitted = admitted
        self.min_interval = min_interval
        self.per_member_s = per_member_s
        self.stats = {"published": 0, "received": 0, "refused": 0, "bytes_sent": 0,
                      "bytes_received": 0}
        self._self_id = mesh.host.get_id()

    def install(self) -> None:
        self.mesh.pubsub.set_topic_validator(LOAD_TOPIC, self.validate, False)

    async def run(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        subscription = await self.mesh.pubsub.subscribe(LOAD_TOPIC)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._receive, subscription)
            nursery.start_soon(self._publish_loop)
            task_status.started()

    # -- publishing ----------------------------------------------------------------

    async def _publish_loop(self) -> None:
        last: NodeLoad | None = None
        last_at = -1e9
        # Start at a random phase so nodes started together do not publish together.
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

    async def publish(self, load: NodeLoad, ttl: float) -> None:
        data = orjson.dumps({"s": self.session(), "l": load.header().decode(),
                             "t": round(ttl, 1)})
        try:
            await self.mesh.pubsub.publish(LOAD_TOPIC, data)
        except Exception as exc:  # no peers yet: nothing to tell
            log.debug("load report not published: %s", exc)
            return
        self.stats["published"] += 1
        self.stats["bytes_sent"] += len(data)

    # -- receiving -----------------------------------------------------------------

    def validate(self, forwarder: ID, message: Any) -> bool:
        """Forward only well-formed reports from members, for their own session."""
        data = message.data or b""
        self.stats["bytes_received"] += len(data)
        if not self.admitted(forwarder) or self._read(message) is None:
            self.stats["refused"] += 1
            return False
        return True

    def _read(self, message: Any) -> tuple[str, NodeLoad, float] | None:
        data = message.data or b""
        if len(data) > MAX_MESSAGE_BYTES:
            return None
        try:
            fields = orjson.loads(data)
            session, text, ttl = str(fields["s"]), str(fields["l"]), float(fields["t"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return None
        record = self.registry().get(session)
        if record is None or record.peer_id != ID(message.from_id).to_base58():
            return None  # unknown yet, or not the signer's session
        load = parse_load(text)
        if load is None or not 0 < ttl <= 3600:
            return None
        return session, load, ttl

    async def _receive(self, subscription: Any) -> None:
        while True:
            message = await subscription.get()
            if ID(message.from_id) == self._self_id:
                continue
            report = self._read(message)
            if report is not None:
                self.stats["received"] += 1
                self.on_report(*report)

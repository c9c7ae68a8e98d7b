"""An ingress's view of which node holds which cached prefixes. Pure: times are passed in.

Two sources, one lookup:

- **Summaries** each serving node sends with its load reports (``otela.kvcache.index``):
  the engine's own account, eviction included, at most one report interval old. A summary
  not refreshed within its ``ttl`` is stale and ignored (the node stopped reporting).
- **Predictions**: the blocks of every request this ingress sent to a node, from the
  moment it sent it, because that node's summary will say so only an interval later and a
  conversation's next turn often comes sooner. A prediction lasts ``predict_ttl`` seconds
  at most, and ends as soon as a summary from that node arrives after the request ended
  (by then the engine's events say what really stayed cached).

``matches`` answers, for a request's anchors (deepest first), how many of its blocks each
node holds: one dictionary lookup per anchor whatever the federation's size, since the
board keeps an inverted index from fingerprint to nodes.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from otela.kvcache.hashing import Fingerprint
from otela.kvcache.index import Summary

SETTLE_S = 0.5  # after a request ends, how long its node's events take to reach a report
DEFAULT_PREDICT_TTL_S = 60.0


@dataclass(slots=True)
class NodeCache:
    epoch: int
    seq: int
    block_size: int
    algorithm: str
    received_at: float
    ttl: float
    anchors: set[Fingerprint] = field(default_factory=set)

    def fresh(self, now: float) -> bool:
        return now - self.received_at <= self.ttl


@dataclass(slots=True)
class _Prediction:
    expires_at: float
    settled_after: float = math.inf  # a summary received after this supersedes it


class CacheBoard:
    def __init__(self, predict_ttl: float = DEFAULT_PREDICT_TTL_S) -> None:
        self.predict_ttl = predict_ttl
        self.nodes: dict[str, NodeCache] = {}
        self._holders: dict[Fingerprint, set[str]] = {}
        self._predicted: dict[str, dict[Fingerprint, _Prediction]] = {}
        self._predicted_holders: dict[Fingerprint, set[str]] = {}
        self._hashings: Counter[tuple[str, int]] = Counter()  # nodes per (algorithm, size)
        self.stats = {"summaries": 0, "whole": 0, "resync": 0, "anchors": 0}

    # -- summaries ----------------------------------------------------------------

    def held(self, session: str) -> tuple[int, int] | None:
        node = self.nodes.get(session)
        return None if node is None else (node.epoch, node.seq)

    def take(self, session: str, summary: Summary, now: float, ttl: float) -> bool:
        """Apply a node's summary; ``False`` when it is a delta from a state this board
        does not hold (the node must send its whole set next)."""
        node = self.nodes.get(session)
        if summary.base is not None:
            if node is None or node.epoch != summary.epoch or node.seq != summary.base:
                self.stats["resync"] += 1
                return False
            for key in summary.removed:
                if key in node.anchors:
                    node.anchors.discard(key)
                    self._unindex(key, session)
            for key in summary.added:
                if key not in node.anchors:
                    node.anchors.add(key)
                    self._holders.setdefault(key, set()).add(session)
        else:
            self.stats["whole"] += 1
            if node is not None:
                self._hashings[(node.algorithm, node.block_size)] -= 1
                for key in node.anchors:
                    self._unindex(key, session)
            self._hashings[(summary.algorithm, summary.block_size)] += 1
            node = NodeCache(summary.epoch, summary.seq, summary.block_size,
                             summary.algorithm, now, ttl, set(summary.added))
            self.nodes[session] = node
            for key in node.anchors:
                self._holders.setdefault(key, set()).add(session)
        node.seq, node.received_at, node.ttl = summary.seq, now, ttl
        self.stats["summaries"] += 1
        self._settle(session, now)
        return True

    def touch(self, session: str, epoch: int, seq: int, now: float, ttl: float) -> bool:
        """A report that changed nothing refreshes the summary if it is the one held."""
        node = self.nodes.get(session)
        if node is None or (node.epoch, node.seq) != (epoch, seq):
            return False
        node.received_at, node.ttl = now, ttl
        self._settle(session, now)
        return True

    def forget(self, session: str) -> None:
        node = self.nodes.pop(session, None)
        if node is not None:
            self._hashings[(node.algorithm, node.block_size)] -= 1
            for key in node.anchors:
                self._unindex(key, session)
        for key in self._predicted.pop(session, {}):
            self._unpredict(key, session)

    def prune(self, live: Collection[str]) -> None:
        for session in [s for s in {*self.nodes, *self._predicted} if s not in live]:
            self.forget(session)

    def _unindex(self, key: Fingerprint, session: str) -> None:
        holders = self._holders.get(key)
        if holders is not None:
            holders.discard(session)
            if not holders:
                del self._holders[key]

    # -- predictions ----------------------------------------------------------------

    def predict(self, session: str, keys: Iterable[Fingerprint], now: float) -> None:
        """A request whose blocks are ``keys`` was sent to ``session``."""
        mine = self._predicted.setdefault(session, {})
        expires = now + self.predict_ttl
        for key in keys:
            mine[key] = _Prediction(expires)
            self._predicted_holders.setdefault(key, set()).add(session)

    def ended(self, session: str, keys: Iterable[Fingerprint], now: float) -> None:
        """That request is over: the node's next summary says what stayed cached."""
        mine = self._predicted.get(session)
        if mine:
            for key in keys:
                prediction = mine.get(key)
                if prediction is not None:
                    prediction.settled_after = now + SETTLE_S

    def _settle(self, session: str, now: float) -> None:
        mine = self._predicted.get(session)
        if mine:
            for key in [k for k, p in mine.items() if p.settled_after <= now]:
                del mine[key]
                self._unpredict(key, session)

    def _unpredict(self, key: Fingerprint, session: str) -> None:
        holders = self._predicted_holders.get(key)
        if holders is not None:
            holders.discard(session)
            if not holders:
                del self._predicted_holders[key]

    def expire(self, now: float) -> None:
        """Drop predictions past their ttl (the router's sweep calls it)."""
        for session, mine in list(self._predicted.items()):
            for key in [k for k, p in mine.items() if p.expires_at <= now]:
                del mine[key]
                self._unpredict(key, session)
            if not mine:
                del self._predicted[session]

    # -- to data-path workers (--workers) -------------------------------------------------

    def export(self, now: float, sent: dict[str, tuple[int, int, float]] | None = None
               ) -> dict[str, Any]:
        """The nodes' summaries for a data-path worker's board (``absorb``): all of them
        (``sent`` None: a worker starting), or only those whose summary or freshness
        changed since ``sent`` was last updated here (a push to every worker)."""
        nodes: dict[str, dict[str, Any]] = {}
        for session, node in self.nodes.items():
            known = None if sent is None else sent.get(session)
            state = {"e": node.epoch, "q": node.seq, "age": now - node.received_at,
                     "ttl": node.ttl}
            if known is None or known[:2] != (node.epoch, node.seq):
                nodes[session] = {**state, "z": node.block_size, "h": node.algorithm,
                                  "a": list(node.anchors)}
            elif known[2] != node.received_at:
                nodes[session] = state  # refreshed, unchanged
            if sent is not None:
                sent[session] = (node.epoch, node.seq, node.received_at)
        if sent is not None:
            for session in [s for s in sent if s not in self.nodes]:
                del sent[session]
        return {"nodes": nodes, "live": list(self.nodes)}

    def absorb(self, exported: dict[str, Any], now: float) -> None:
        """Take what ``export`` gave (in a worker): whole summaries, refreshes, and the
        nodes the control process still holds."""
        for session, state in exported.get("nodes", {}).items():
            received = now - float(state["age"])
            if "a" in state:
                self.take(session, Summary(int(state["e"]), int(state["q"]), None,
                                           tuple(state["a"]), (), int(state["z"]),
                                           str(state["h"])), received, float(state["ttl"]))
            else:
                self.touch(session, int(state["e"]), int(state["q"]), received,
                           float(state["ttl"]))
        live = set(exported.get("live", ()))
        for session in [s for s in self.nodes if s not in live]:
            self.forget(session)

    # -- lookups ----------------------------------------------------------------------

    def hashings(self) -> set[tuple[str, int]]:
        """The (algorithm, block size) pairs nodes hash with: usually one."""
        return {pair for pair, nodes in self._hashings.items() if nodes > 0}

    def hashing_of(self, session: str, now: float) -> tuple[str, int] | None:
        node = self.nodes.get(session)
        if node is None or not node.fresh(now):
            return None
        return node.algorithm, node.block_size

    def matches(self, anchors: Sequence[tuple[int, Fingerprint]], now: float,
                hashing: tuple[str, int]) -> dict[str, int]:
        """For anchors ``(depth, fingerprint)`` of one request hashed as ``hashing``,
        deepest first: the deepest depth each node holds (fresh summaries hashed the
        same way, and this ingress's own predictions)."""
        found: dict[str, int] = {}
        nodes = self.nodes
        for depth, key in anchors:
            for session in self._holders.get(key, ()):
                if session not in found:
                    node = nodes[session]
                    if node.fresh(now) and (node.algorithm, node.block_size) == hashing:
                        found[session] = depth
            for session in self._predicted_holders.get(key, ()):
                if session not in found:
                    prediction = self._predicted[session][key]
                    if prediction.expires_at > now:
                        found[session] = depth
        return found

    def report(self, now: float) -> dict[str, dict[str, object]]:
        """Per node: what the board holds (``/v1/routing``)."""
        return {session: {"epoch": n.epoch, "seq": n.seq, "anchors": len(n.anchors),
                          "block_size": n.block_size, "algorithm": n.algorithm,
                          "age_s": round(now - n.received_at, 3), "fresh": n.fresh(now),
                          "predicted": len(self._predicted.get(session, {}))}
                for session, n in self.nodes.items()}

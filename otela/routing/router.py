"""The ingress side of routing: pick a serving node, send it the request, and try another
only when the request provably never reached an engine.

Which node: ``policy.py`` (pure). How to reach it: ``otela.dataplane.upstream``. What
counts as "never reached": ``NotDelivered`` alone, so no request is ever executed twice;
a failure after delivery is a 502 (``upstream_failed``), silence past the first-byte
timeout a 504 (``upstream_timeout``).
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from otela.dataplane.errors import (
    NotDelivered,
    RequestError,
    UpstreamFailed,
    UpstreamTimeout,
    clip,
)
from otela.dataplane.headers import Headers
from otela.dataplane.upstream import Reply, Upstreams
from otela.registry.records import NodeRecord
from otela.registry.store import Registry
from otela.routing.policy import candidates_for, pick_random

log = logging.getLogger("otela.routing")

MAX_ATTEMPTS = 3


@dataclass
class Routed:
    """A request on its way back: the reply, the node that answers, and what it took."""

    reply: Reply
    node: NodeRecord
    path_kind: str  # "local", "http" or "libp2p"
    attempts: int


class Router:
    def __init__(
        self,
        registry: Registry,
        upstreams: Upstreams,
        first_byte_timeout: float,
        rng: random.Random | None = None,
        suspected: Callable[[], frozenset[str]] = frozenset,
    ) -> None:
        self.registry = registry
        self.upstreams = upstreams
        self.first_byte_timeout = first_byte_timeout
        self.rng = rng or random.Random()
        self.suspected = suspected  # peers the failure detector currently suspects
        self.retries = 0  # attempts after a first one that was not delivered
        # Requests this router has running on each session (load-aware routing reads it;
        # with data-path workers the control process adds up every worker's).
        self.busy: Counter[str] = Counter()

    def release(self, routed: Routed) -> None:
        """``routed``'s response is over (sent, failed, or its client left)."""
        session = routed.node.session_id
        self.busy[session] -= 1
        if self.busy[session] <= 0:
            del self.busy[session]

    async def route(self, model_id: str, path: str, body: bytes, headers: Headers) -> Routed:
        """Send ``body`` to ``path`` on a node serving ``model_id``; raises ``RequestError``
        (404/503 no node, 502 unreachable or failed, 504 timed out)."""
        candidates = candidates_for(self.registry, model_id, self.suspected())
        tried: list[str] = []
        while len(tried) < MAX_ATTEMPTS:
            node = pick_random(candidates, self.rng, exclude=tried)
            if node is None:
                break
            if tried:
                self.retries += 1
            tried.append(node.session_id)
            try:
                reply = await self.upstreams.send(node, path, body, headers,
                                                  self.first_byte_timeout)
            except NotDelivered as exc:
                log.warning("node %s did not take the request, trying another: %s",
                            node.session_id, exc)
                continue
            except UpstreamTimeout:
                raise RequestError(
                    504, f"The serving engine accepted the request but sent nothing for "
                    f"{self.first_byte_timeout:.0f} s.", code="upstream_timeout") from None
            except UpstreamFailed as exc:
                raise RequestError(
                    502, f"The node serving the request failed before it answered ({exc}); "
                    "it may have run, so it was not retried.", code="upstream_failed") from None
            self.busy[node.session_id] += 1
            return Routed(reply, node, self.upstreams.path_kind(node), len(tried))
        raise RequestError(
            502,
            f"All {len(tried)} candidate node(s) for `{clip(model_id)}` were unreachable.",
            code="all_nodes_unreachable",
        )

"""The ingress side of routing: pick a serving node and forward, trying another on failure.

Only failures where the request provably never reached an engine (connection refused or
timed out) are retried, so no request is ever executed twice; transparent retry of
failed responses comes with the retry policies of a later issue.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Callable, Mapping

import httpx
from fastapi.responses import Response

from otela.api.errors import APIError, clip
from otela.dataplane.hop_auth import HOP_HEADER, HopSigner
from otela.registry.records import NodeRecord
from otela.registry.store import Registry
from otela.routing.forward import (
    DEFAULT_FIRST_BYTE_TIMEOUT_S,
    HeaderList,
    UpstreamUnreachable,
    forward,
    forwarded_headers,
)
from otela.routing.p2p import forward_p2p
from otela.routing.policy import candidates_for, pick_random
from otela.transport.client import EngineStreamClient

log = logging.getLogger("otela.routing")

MAX_ATTEMPTS = 3
ENGINE_PROXY_PREFIX = "/v1/engine"


class Router:
    def __init__(
        self,
        registry: Registry,
        client: httpx.AsyncClient,
        self_session: Callable[[], str],
        local_engine_url: str | None,
        rng: random.Random | None = None,
        suspected: Callable[[], frozenset[str]] = frozenset,
        p2p: EngineStreamClient | None = None,
        hop_signer: HopSigner | None = None,
        first_byte_timeout: float = DEFAULT_FIRST_BYTE_TIMEOUT_S,
    ) -> None:
        self.registry = registry
        self.client = client
        self.self_session = self_session  # ours changes if we rejoin after an eviction
        self.local_engine_url = local_engine_url
        self.rng = rng or random.Random()
        self.suspected = suspected  # peers the failure detector currently suspects
        self.p2p = p2p  # HTTP over libp2p, for targets plain HTTP cannot reach (behind NAT)
        self.hop_signer = hop_signer  # proves our membership to other nodes' engine hops
        self.first_byte_timeout = first_byte_timeout

    def over_libp2p(self, node: NodeRecord) -> bool:
        """Whether ``node`` must be reached through libp2p (relay or hole punch), not HTTP."""
        return (
            self.p2p is not None
            and node.session_id != self.self_session()
            and node.needs_relayed_path()
        )

    def target_url(self, node: NodeRecord, path: str) -> str:
        """Where to send ``path`` for ``node``: our own engine directly, others via their node."""
        if node.session_id == self.self_session() and self.local_engine_url:
            return f"{self.local_engine_url}{path}"
        return f"{node.http_url}{ENGINE_PROXY_PREFIX}{path}"

    def _with_hop_token(self, node: NodeRecord, path: str, body: bytes,
                        headers: HeaderList) -> HeaderList:
        """``headers`` plus our membership token when ``path`` goes to another node's
        engine hop (our own engine needs none)."""
        if self.hop_signer is None or (
            node.session_id == self.self_session() and self.local_engine_url
        ):
            return headers
        token = self.hop_signer.token(node.peer_id, "POST", ENGINE_PROXY_PREFIX + path, body)
        return [*headers, (HOP_HEADER.encode(), token.encode())]

    async def route(
        self, model_id: str, path: str, body: bytes, incoming_headers: Mapping[str, str]
    ) -> Response:
        candidates = candidates_for(self.registry, model_id, self.suspected())
        request_id = incoming_headers.get("x-otela-request-id") or uuid.uuid4().hex
        headers = forwarded_headers(incoming_headers, {"x-otela-request-id": request_id})
        tried: list[str] = []
        while len(tried) < MAX_ATTEMPTS:
            node = pick_random(candidates, self.rng, exclude=tried)
            if node is None:
                break
            tried.append(node.session_id)
            served_by = {
                "x-otela-request-id": request_id,
                "x-otela-session-id": node.session_id,
                "x-otela-peer-id": node.peer_id,
                "x-otela-provider-id": node.provider_id,
            }
            try:
                if self.over_libp2p(node):
                    assert self.p2p is not None
                    return await forward_p2p(self.p2p, node, path, body, headers, served_by,
                                             self.first_byte_timeout)
                return await forward(
                    self.client, self.target_url(node, path), body,
                    self._with_hop_token(node, path, body, headers), served_by,
                    self.first_byte_timeout,
                )
            except UpstreamUnreachable as exc:
                log.warning("node %s unreachable, trying another: %s", node.session_id, exc)
        raise APIError(
            502,
            f"All {len(tried)} candidate node(s) for `{clip(model_id)}` were unreachable.",
            code="all_nodes_unreachable",
        )

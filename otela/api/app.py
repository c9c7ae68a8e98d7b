"""The node's HTTP API (FastAPI, served by hypercorn on trio).

- OpenAI-compatible routing on any node: ``POST /v1/chat/completions``,
  ``POST /v1/completions``, ``GET /v1/models`` (aggregated over the federation).
- Read-only inspection: ``GET /v1/health``, ``/v1/registry/nodes``, ``/v1/registry/models``.
  No endpoint writes registry state: records change only through signed gossip.
- ``POST /v1/engine/v1/...``: the hop ingress nodes use to reach this node's own engine.
  It never re-routes, so a request cannot bounce between nodes.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import Response

from otela import __version__
from otela.api.errors import (
    APIError,
    clip,
    error_response,
    install_error_handlers,
    read_json_object,
    require_model,
)
from otela.dataplane.hop_auth import HOP_HEADER, HopRefused, HopVerifier
from otela.registry.records import NodeRecord
from otela.registry.store import Registry
from otela.routing.forward import (
    NOT_DELIVERED_HEADER,
    UpstreamUnreachable,
    forward,
    forwarded_headers,
)
from otela.routing.router import Router

_PEER_ID = re.compile(r"^[1-9A-HJ-NP-Za-km-z]{20,128}$")  # base58
# Engine paths the node relays for its peers; anything else (engine admin APIs) stays private.
ENGINE_PATHS = frozenset({"v1/chat/completions", "v1/completions", "v1/embeddings"})


class NodeView(Protocol):
    """What the HTTP layer needs from the running node."""

    registry: Registry
    router: Router
    client: httpx.AsyncClient
    hop_verifier: HopVerifier  # who may use our engine hop: members only

    def health(self) -> dict[str, Any]: ...

    def network(self, peer: str | None = None) -> dict[str, Any]:
        """Connectivity facts and verdicts (``otela.netreport``), optionally for one peer."""
        ...

    def serving_engine_url(self) -> str | None:
        """The local engine's URL while this node is SERVING, else ``None``."""
        ...


def _session_summary(record: NodeRecord, model_id: str) -> dict[str, Any]:
    model = next((m for m in record.models if m.id == model_id), None)
    return {
        "session_id": record.session_id,
        "peer_id": record.peer_id,
        "provider_id": record.provider_id,
        "state": record.state.name,
        "http_url": record.http_url,
        "hardware": record.hardware.to_dict(),
        "engine": record.engine,
        "model": model.to_dict() if model else None,
        "slurm": None if record.slurm is None else record.slurm.to_dict(),
    }


def create_app(node: NodeView) -> FastAPI:
    app = FastAPI(
        title="otela node",
        version=__version__,
        description="OpenAI-compatible routing and read-only registry inspection.",
    )
    install_error_handlers(app)

    @app.get("/v1/health")
    async def health() -> dict[str, Any]:
        return node.health()

    @app.get("/v1/network")
    async def network(peer: str | None = None) -> dict[str, Any]:
        """Read-only: addresses, reachability, relays, contacts, dial errors, verdicts."""
        if peer is not None and not _PEER_ID.match(peer):
            raise APIError(400, f"not a peer id: {clip(peer)!r}", code="invalid_peer_id",
                           param="peer")
        return node.network(peer)

    @app.get("/v1/registry/nodes")
    async def registry_nodes() -> dict[str, Any]:
        nodes = []
        for record in node.registry.snapshot():
            entry = node.registry.entry(record.session_id)
            nodes.append({
                **record.to_dict(),
                "evicted_by": entry.evicted_by if entry else None,
                "received_at": node.registry.received_at.get(record.session_id),
            })
        return {"nodes": nodes, "count": len(nodes)}

    @app.get("/v1/registry/models")
    async def registry_models() -> dict[str, Any]:
        return {
            "models": [
                {
                    "id": entry.model_id,
                    "serving_count": len(entry.serving()),
                    "sessions": [_session_summary(r, entry.model_id) for r in entry.sessions],
                }
                for entry in node.registry.models()
            ]
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        data = []
        for entry in node.registry.models():
            serving = entry.serving()
            if not serving:
                continue
            contexts = [
                m.max_context
                for r in serving
                for m in r.models
                if m.id == entry.model_id and m.max_context
            ]
            data.append(
                {
                    "id": entry.model_id,
                    "object": "model",
                    "created": 0,
                    "owned_by": ",".join(sorted({r.provider_id for r in serving})),
                    "max_model_len": max(contexts) if contexts else None,
                    "serving_nodes": len(serving),
                }
            )
        return {"object": "list", "data": data}

    async def route(request: Request, path: str) -> Response:
        body = await read_json_object(request)
        model = require_model(body)
        return await node.router.route(model, path, await request.body(), request.headers)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await route(request, "/v1/chat/completions")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await route(request, "/v1/completions")

    @app.post("/v1/engine/{path:path}")
    async def engine_proxy(path: str, request: Request) -> Response:
        raw = await request.body()
        try:
            node.hop_verifier.verify(request.headers.get(HOP_HEADER), "POST",
                                     request.url.path, raw)
        except HopRefused as refused:
            # Never ran: the calling node may try another (e.g. one that already knows it).
            return error_response(refused.status, refused.message, code=refused.code,
                                  headers={NOT_DELIVERED_HEADER: "1"})
        if path not in ENGINE_PATHS:
            raise APIError(404, f"/{clip(path)} is not relayed to engines", code="not_found")
        engine_url = node.serving_engine_url()
        if engine_url is None:
            # Draining or not yet ready: the request never ran, so the ingress may try
            # another node instead of failing it.
            return error_response(
                503,
                "this node is not serving",
                code="node_not_serving",
                headers={NOT_DELIVERED_HEADER: "1"},
            )
        await read_json_object(request)  # reject malformed bodies here, not in the engine
        try:
            return await forward(node.client, f"{engine_url}/{path}", raw,
                                 forwarded_headers(request.headers, {}), {},
                                 node.router.first_byte_timeout)
        except UpstreamUnreachable as exc:
            return error_response(
                502,
                f"engine unreachable: {exc}",
                code="engine_unreachable",
                headers={NOT_DELIVERED_HEADER: "1"},
            )

    return app

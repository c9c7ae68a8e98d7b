"""The node's HTTP API for everything but the request path (FastAPI, run in process by
``otela.dataplane.asgi``; the routed OpenAI requests and the engine hop are handled
natively, ``inference.py`` and ``hop.py``).

- ``GET /v1/models``, ``GET /v1/models/{id}``: models served anywhere in the federation.
- Read-only inspection: ``GET /v1/health``, ``/v1/network``, ``/v1/registry/nodes``,
  ``/v1/registry/models``. No endpoint writes registry state: records change only through
  signed gossip.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

from fastapi import FastAPI

from otela import __version__
from otela.api.errors import install_error_handlers
from otela.dataplane.errors import RequestError, clip
from otela.registry.records import NodeRecord
from otela.registry.store import ModelEntry, Registry

_PEER_ID = re.compile(r"^[1-9A-HJ-NP-Za-km-z]{20,128}$")  # base58


class NodeView(Protocol):
    """What the HTTP layer needs from the running node."""

    registry: Registry

    def health(self) -> dict[str, Any]: ...

    def network(self, peer: str | None = None) -> dict[str, Any]:
        """Connectivity facts and verdicts (``otela.netreport``), optionally for one peer."""
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


def _model_object(entry: ModelEntry) -> dict[str, Any]:
    """A model in the OpenAI ``/v1/models`` shape, plus what the federation knows of it."""
    serving = entry.serving()
    contexts = [m.max_context for r in serving for m in r.models
                if m.id == entry.model_id and m.max_context]
    return {
        "id": entry.model_id,
        "object": "model",
        "created": 0,
        "owned_by": ",".join(sorted({r.provider_id for r in serving})),
        "max_model_len": max(contexts) if contexts else None,
        "serving_nodes": len(serving),
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
            raise RequestError(400, f"not a peer id: {clip(peer)!r}", code="invalid_peer_id",
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
        data = [_model_object(entry) for entry in node.registry.models() if entry.serving()]
        return {"object": "list", "data": data}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        entry = node.registry.model(model_id)
        if entry is None or not entry.serving():
            raise RequestError(404, f"The model `{clip(model_id)}` is not served in this "
                               "federation.", code="model_not_found", param="model")
        return _model_object(entry)

    return app

"""The node's HTTP API for everything but the request path (FastAPI, run in process by
``otela.dataplane.asgi``; the routed OpenAI requests and the engine hop are handled
natively, ``inference.py`` and ``hop.py``).

- ``GET /v1/models``, ``GET /v1/models/{id}``: models served anywhere in the federation.
- Read-only inspection: ``GET /v1/health``, ``/v1/network``, ``/v1/registry/nodes``,
  ``/v1/registry/models``. No endpoint writes registry state: records change only through
  signed gossip.

Who may read each is chosen, not accidental: the ingress service installs an audience
(``visibility.py``) that tells strangers, key holders and the admin apart, and each
endpoint asks it (``[ingress] visibility``, docs/security.md); ``/v1/health`` answers its
liveness part to anyone. Without the ingress service everything is public, as before.

Listings are paged (``limit``, ``after``: the last id of the previous page) and
``/v1/models`` is computed once per registry change and caller scope: no request, keyed or
not, costs more than a page of bounded entries (records are at most 16 KiB, model objects
list at most 32 values per field), however many members announce however much.
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from fastapi import Depends, FastAPI, Query, Request

from otela import __version__
from otela.api import visibility
from otela.api.errors import install_error_handlers
from otela.dataplane.errors import RequestError, clip
from otela.registry.records import NodeRecord, display_state
from otela.registry.store import Registry
from otela.routing.ask import PROVIDERS_HEADER, REQUIRE_HEADER
from otela.routing.catalog import catalog, model_object, usable_nodes
from otela.routing.constraints import Clause, ConstraintError, parse
from otela.routing.trust import TrustError, TrustSet, parse_providers

_PEER_ID = re.compile(r"^[1-9A-HJ-NP-Za-km-z]{20,128}$")  # base58
MAX_PAGE = 1000
NODES_PAGE = 100  # /v1/registry/nodes entries per page by default
MODELS_PAGE = 100  # /v1/registry/models entries per page by default
CATALOG_PAGE = 1000  # /v1/models entries per page by default (clients expect one page)
SESSIONS_LISTED = 100  # sessions per model in /v1/registry/models
_CATALOGS_KEPT = 64  # /v1/models results kept per registry generation (caller scopes)
CATALOG_FRESH_S = 1.0  # /v1/models may be this stale
# What /v1/health tells a caller who may not see the rest: is the node up, and serving.
LIVENESS_FIELDS = ("status", "version", "state", "display_state", "registry_warming")


def _page(items: Sequence[Any], key: Callable[[Any], str], after: str | None, limit: int
          ) -> tuple[list[Any], bool]:
    """The ``limit`` items after ``after`` (by ``key``, ascending), and whether more follow."""
    start = 0
    if after is not None:
        start = next((i for i, item in enumerate(items) if key(item) > after), len(items))
    page = list(items[start:start + limit])
    return page, start + limit < len(items)


class _CatalogCache:
    """``/v1/models`` results per caller scope (trust set, requirements, allowed models):
    anonymous callers all share one. Recomputed when the registry changed, at most every
    ``CATALOG_FRESH_S`` (a catalog of 10,000 members announcing all they may takes ~190 ms
    to build, and a large federation changes every few seconds)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.generation = -1
        self.clock = clock
        self.computed_at = -CATALOG_FRESH_S
        self._results: OrderedDict[Any, list[dict[str, Any]]] = OrderedDict()

    def get(self, generation: int, scope: Any, compute: Callable[[], list[dict[str, Any]]]
            ) -> list[dict[str, Any]]:
        now = self.clock()
        if generation != self.generation and now - self.computed_at >= CATALOG_FRESH_S:
            self.generation, self._results = generation, OrderedDict()
            self.computed_at = now
        result = self._results.get(scope)
        if result is None:
            result = self._results[scope] = compute()
            if len(self._results) > _CATALOGS_KEPT:
                self._results.popitem(last=False)
        return result


class NodeView(Protocol):
    """What the HTTP layer needs from the running node."""

    registry: Registry

    def health(self) -> dict[str, Any]: ...

    def registry_warming(self) -> bool:
        """The replica is still catching up after the node's start (``routing.hold``)."""
        ...

    def network(self, peer: str | None = None) -> dict[str, Any]:
        """Connectivity facts and verdicts (``otela.netreport``), optionally for one peer."""
        ...

    def catalog_scope(self, authorization: str | None) -> tuple[TrustSet, frozenset[str] | None]:
        """The trust set and the models (``None``: all) ``/v1/models`` shows this caller
        (narrowed by their API key with the ingress service)."""
        ...


def _catalog_filter(request: Request, base: TrustSet) -> tuple[TrustSet, tuple[Clause, ...]]:
    """``/v1/models`` narrowed like a request: ``X-Otela-Providers``/``?providers=`` and
    ``X-Otela-Require``/``?require=``; 400 naming a bad one. ``base``: the caller's
    starting trust set (``NodeView.catalog_scope``)."""
    providers = request.query_params.get("providers") or \
        request.headers.get(PROVIDERS_HEADER.decode())
    require = request.query_params.get("require") or \
        request.headers.get(REQUIRE_HEADER.decode())
    trust = base
    try:
        if providers is not None:
            trust = trust.narrowed(parse_providers(providers, "providers"), "providers")
        clauses = parse(require) if require else ()
    except (TrustError, ConstraintError) as exc:
        raise RequestError(400, str(exc), code="invalid_routing_request",
                           param="require" if isinstance(exc, ConstraintError)
                           else "providers") from None
    return trust, clauses


def _session_summary(record: NodeRecord, model_id: str) -> dict[str, Any]:
    model = next((m for m in record.models if m.id == model_id), None)
    return {
        "session_id": record.session_id,
        "peer_id": record.peer_id,
        "provider_id": record.provider_id,
        "state": record.state.name,
        "display_state": display_state(record),
        "http_url": record.http_url,
        "hardware": record.hardware.to_dict(),
        "engine": record.engine,
        "model": model.to_dict() if model else None,
        "slurm": None if record.slurm is None else record.slurm.to_dict(),
    }


def _gate(endpoint: str) -> Callable[[Request], None]:
    """A dependency refusing callers who may not see ``endpoint`` (``visibility``)."""
    def check(request: Request) -> None:
        visibility.require(visibility.audience_of(request.app), endpoint,
                           request.headers.get("authorization"))
    return check


def _catalog_credential(request: Request) -> str | None:
    """The credential that narrows ``/v1/models``: the caller's API key; none for the
    admin, who sees the whole catalog (the admin token is not an API key)."""
    authorization = request.headers.get("authorization")
    audience = visibility.audience_of(request.app)
    if authorization is not None and audience is not None \
            and audience.caller(authorization)[0] == visibility.ADMIN:
        return None
    return authorization


def create_app(node: NodeView) -> FastAPI:
    app = FastAPI(
        title="otela node",
        version=__version__,
        description="OpenAI-compatible routing and read-only registry inspection.",
    )
    install_error_handlers(app)

    @app.get("/v1/health")
    async def health(request: Request) -> dict[str, Any]:
        """Everything to those who may see it; liveness (``LIVENESS_FIELDS``) to anyone."""
        report = node.health()
        if visibility.allowed(visibility.audience_of(request.app), "health",
                              request.headers.get("authorization")):
            return report
        audience = visibility.audience_of(request.app)
        assert audience is not None  # allowed() says yes to everyone without one
        # Which views need a credential here, so that a page (the dashboard) asks for
        # what it may see instead of collecting refusals.
        return {**{name: report.get(name) for name in LIVENESS_FIELDS},
                "visibility": {name: audience.required(name)
                               for name in ("health", "registry", "network")}}

    @app.get("/v1/network", dependencies=[Depends(_gate("network"))])
    async def network(peer: str | None = None) -> dict[str, Any]:
        """Read-only: addresses, reachability, relays, contacts, dial errors, verdicts."""
        if peer is not None and not _PEER_ID.match(peer):
            raise RequestError(400, f"not a peer id: {clip(peer)!r}", code="invalid_peer_id",
                           param="peer")
        return node.network(peer)

    def listed(record: NodeRecord) -> dict[str, Any]:
        entry = node.registry.entry(record.session_id)
        return {
            **record.to_dict(),
            "display_state": display_state(record),
            "evicted_by": entry.evicted_by if entry else None,
            "received_at": node.registry.received_at.get(record.session_id),
        }

    @app.get("/v1/registry/nodes", dependencies=[Depends(_gate("registry"))])
    async def registry_nodes(limit: int = Query(NODES_PAGE, ge=1, le=MAX_PAGE),
                             after: str | None = None) -> dict[str, Any]:
        """A page of the registry's sessions, by session id; ``next_after`` names the next
        page's ``after`` while more follow."""
        records, more = _page(node.registry.snapshot(), lambda r: r.session_id, after, limit)
        nodes = [listed(record) for record in records]
        return {"nodes": nodes, "count": len(nodes), "total": len(node.registry),
                "next_after": nodes[-1]["session_id"] if more else None}

    @app.get("/v1/registry/nodes/{session_id}", dependencies=[Depends(_gate("registry"))])
    async def registry_node(session_id: str) -> dict[str, Any]:
        """One session's entry: what a script waiting for one node asks, without the
        whole registry (a 128-entry listing costs its node ~20 ms of CPU to build and
        encode, one entry 0.1 ms)."""
        record = node.registry.get(session_id)
        if record is None:
            raise RequestError(404, f"no session {clip(session_id)!r} in this node's "
                               "registry", code="session_not_found", param="session_id")
        return listed(record)

    @app.get("/v1/registry/models", dependencies=[Depends(_gate("registry"))])
    async def registry_models(limit: int = Query(MODELS_PAGE, ge=1, le=MAX_PAGE),
                              after: str | None = None) -> dict[str, Any]:
        """A page of model ids with the sessions listing them (at most ``SESSIONS_LISTED``
        each; ``sessions_total`` says how many)."""
        entries, more = _page(node.registry.models(), lambda m: m.model_id, after, limit)
        return {
            "models": [
                {
                    "id": entry.model_id,
                    "serving_count": len(entry.serving()),
                    "sessions_total": len(entry.sessions),
                    "sessions": [_session_summary(r, entry.model_id)
                                 for r in entry.sessions[:SESSIONS_LISTED]],
                }
                for entry in entries
            ],
            "next_after": entries[-1].model_id if more else None,
        }

    catalogs = _CatalogCache()

    @app.get("/v1/models", dependencies=[Depends(_gate("models"))])
    async def models(request: Request, limit: int = Query(CATALOG_PAGE, ge=1, le=MAX_PAGE),
                     after: str | None = None) -> dict[str, Any]:
        """Models the caller could use now; ``?providers=a,b`` and ``?require=...`` (or
        the routing headers) narrow it as they would a request. OpenAI's list shape, with
        its paging fields (``has_more``, ``first_id``, ``last_id``)."""
        base, allowed = node.catalog_scope(_catalog_credential(request))
        trust, clauses = _catalog_filter(request, base)

        def compute() -> list[dict[str, Any]]:
            listed = catalog(node.registry, trust, clauses)
            return listed if allowed is None else [m for m in listed if m["id"] in allowed]

        scope = (trust.providers, tuple(c.text for c in clauses), allowed)
        everything = catalogs.get(node.registry.generation, scope, compute)
        page, more = _page(everything, lambda m: m["id"], after, limit)
        listing = {"object": "list", "data": page, "has_more": more,
                   "first_id": page[0]["id"] if page else None,
                   "last_id": page[-1]["id"] if page else None}
        if node.registry_warming():  # just started: models may be missing for a moment
            listing["registry_warming"] = True
        return listing

    @app.get("/v1/models/{model_id:path}", dependencies=[Depends(_gate("models"))])
    async def model(model_id: str, request: Request) -> dict[str, Any]:
        base, allowed = node.catalog_scope(_catalog_credential(request))
        trust, clauses = _catalog_filter(request, base)
        entry = node.registry.model(model_id)
        nodes = usable_nodes(entry, trust, clauses) if entry is not None else ()
        if entry is None or not nodes or (allowed is not None and model_id not in allowed):
            raise RequestError(404, f"The model `{clip(model_id)}` is not served in this "
                               "federation" + ("" if entry is None or not entry.serving()
                                               else " by a node you may use") + ".",
                               code="model_not_found", param="model")
        return model_object(entry, nodes)

    return app

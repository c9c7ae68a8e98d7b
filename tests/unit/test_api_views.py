"""The node's read-only views stay cheap whatever members announce: listings are paged,
model objects bounded, and ``/v1/models`` computed once per registry change and scope."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import httpx
import trio

from otela.api.app import CATALOG_FRESH_S, create_app
from otela.registry.records import GPU, Hardware, Lifecycle, ModelInfo
from otela.registry.store import Registry
from otela.routing.catalog import MAX_LISTED, catalog
from otela.routing.trust import ANY, TrustSet

from .registry_helpers import entry

NOW = 1000.0


class View:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.app = create_app(self)  # type: ignore[arg-type]

    def health(self) -> dict[str, Any]:
        return {}

    def network(self, peer: str | None = None) -> dict[str, Any]:
        return {}

    def catalog_scope(self, authorization: str | None) -> tuple[TrustSet, frozenset[str] | None]:
        return ANY, None

    def registry_warming(self) -> bool:
        return False


def get(view: View, path: str, **params: Any) -> Any:
    async def go() -> Any:
        transport = httpx.ASGITransport(app=view.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://node") as client:
            response = await client.get(path, params=params)
            assert response.status_code == 200, response.text
            return response.json()

    return trio.run(go)


def federation(nodes: int, models_each: int = 1) -> Registry:
    registry = Registry()
    for i in range(nodes):
        e = entry(f"n{i}", 1, Lifecycle.SERVING, updated_at=NOW,
                  models=tuple(f"model-{(i + j) % 700}" for j in range(models_each)))
        record = e.record.__class__(**{
            **{f: getattr(e.record, f) for f in e.record.__slots__},
            "provider_id": f"provider-{i}",
            "hardware": Hardware(gpus=(GPU(f"gpu-{i}", 1),)),
            "models": tuple(ModelInfo(m.id, max_context=100 + i) for m in e.record.models)})
        registry.apply(dataclasses.replace(e, record=record), NOW)
    return registry


def test_registry_listings_come_in_pages_that_cover_everything_once():
    view = View(federation(450))
    seen: list[str] = []
    after = None
    pages = 0
    while True:
        page = get(view, "/v1/registry/nodes", **({"after": after} if after else {}))
        assert len(page["nodes"]) <= 100 and page["total"] == 450
        seen += [n["session_id"] for n in page["nodes"]]
        pages += 1
        after = page["next_after"]
        if after is None:
            break
    assert pages == 5 and seen == sorted(seen) and len(set(seen)) == 450
    assert len(get(view, "/v1/registry/nodes", limit=1000)["nodes"]) == 450
    models = get(view, "/v1/registry/models", limit=10)
    assert len(models["models"]) == 10 and models["next_after"] == models["models"][-1]["id"]


def test_a_model_object_lists_a_bounded_number_of_values():
    one_model = Registry()
    for i in range(100):
        e = entry(f"p{i}", 1, Lifecycle.SERVING, updated_at=NOW, models=("m",))
        record = e.record.__class__(**{**{f: getattr(e.record, f) for f in e.record.__slots__},
                                       "provider_id": f"provider-{i:03d}"})
        one_model.apply(dataclasses.replace(e, record=record), NOW)
    (model,) = get(View(one_model), "/v1/models")["data"]
    assert len(model["otela"]["providers"]) == MAX_LISTED
    assert model["otela"]["providers_total"] == 100 and model["serving_nodes"] == 100


def test_the_catalog_is_paged_in_openais_shape_and_computed_once_per_change(monkeypatch):
    import otela.api.app as app_module

    computed = []

    def counted(*args: Any) -> list[dict[str, Any]]:
        computed.append(1)
        return catalog(*args)

    monkeypatch.setattr(app_module, "catalog", counted)
    view = View(federation(300, models_each=3))
    first = get(view, "/v1/models", limit=100)
    assert first["has_more"] and len(first["data"]) == 100
    assert first["first_id"] == first["data"][0]["id"]
    second = get(view, "/v1/models", limit=100, after=first["last_id"])
    assert second["data"][0]["id"] > first["last_id"]
    everything = get(view, "/v1/models")
    assert not everything["has_more"]
    assert len(everything["data"]) == len({m for r in view.registry for m in
                                           (x.id for x in r.models)})
    assert len(computed) == 1  # three anonymous requests, one registry generation
    view.registry.apply(entry("late", 1, Lifecycle.SERVING, updated_at=NOW, models=("zz",)),
                        NOW)
    assert get(view, "/v1/models")["last_id"] != "zz"  # at most a second stale...
    time.sleep(CATALOG_FRESH_S)
    assert get(view, "/v1/models")["last_id"] == "zz" and len(computed) == 2  # ...not more

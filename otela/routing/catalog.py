"""The model catalog as a caller may use it: ``/v1/models`` filtered by trust and
requirements like a request would be, with the values each model is served with (so a
client can see which requirements it could state). Pure.

Every list in a model object holds at most ``MAX_LISTED`` values (``*_total`` says how many
there were): members choose what they announce, and no anonymous ``/v1/models`` may cost
more than a bound however many distinct names they choose."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from otela.registry.records import NodeRecord
from otela.registry.store import ModelEntry, Registry
from otela.routing.constraints import Clause, model_of, select
from otela.routing.trust import TrustSet

MAX_LISTED = 32


def _listed(values: set[Any]) -> list[Any]:
    return sorted(values)[:MAX_LISTED]


def usable_nodes(entry: ModelEntry, trust: TrustSet, clauses: Sequence[Clause]
                 ) -> tuple[NodeRecord, ...]:
    nodes = tuple(r for r in entry.serving() if trust.allows(r.provider_id))
    if clauses and nodes:
        nodes, _ = select(clauses, nodes, entry.model_id)
    return nodes


def model_object(entry: ModelEntry, nodes: Sequence[NodeRecord]) -> dict[str, Any]:
    """A model in the OpenAI ``/v1/models`` shape, plus what the federation knows of it:
    providers, how many nodes, and the values requirements can select on."""
    infos = [m for r in nodes if (m := model_of(r, entry.model_id)) is not None]
    contexts = {m.max_context for m in infos if m.max_context}
    providers = {r.provider_id for r in nodes}
    return {
        "id": entry.model_id,
        "object": "model",
        "created": 0,
        "owned_by": ",".join(_listed(providers)),
        "max_model_len": max(contexts) if contexts else None,
        "serving_nodes": len(nodes),
        "otela": {
            "providers": _listed(providers),
            "providers_total": len(providers),
            "gpu": _listed({g.name for r in nodes for g in r.hardware.gpus}),
            "engine": _listed({r.engine for r in nodes if r.engine}),
            "max_context": _listed(contexts),
            "quantization": _listed({m.quantization or "none" for m in infos}),
            "dtype": _listed({m.dtype for m in infos if m.dtype}),
            "tensor_parallel": _listed({m.tensor_parallel or 1 for m in infos}),
        },
    }


def catalog(registry: Registry, trust: TrustSet, clauses: Sequence[Clause]
            ) -> list[dict[str, Any]]:
    """Every model at least one usable node serves."""
    out = []
    for entry in registry.models():
        nodes = usable_nodes(entry, trust, clauses)
        if nodes:
            out.append(model_object(entry, nodes))
    return out

"""The model catalog as a caller may use it: ``/v1/models`` filtered by trust and
requirements like a request would be, with the values each model is served with (so a
client can see which requirements it could state). Pure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from otela.registry.records import NodeRecord
from otela.registry.store import ModelEntry, Registry
from otela.routing.constraints import Clause, model_of, select
from otela.routing.trust import TrustSet


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
    contexts = sorted({m.max_context for m in infos if m.max_context})
    return {
        "id": entry.model_id,
        "object": "model",
        "created": 0,
        "owned_by": ",".join(sorted({r.provider_id for r in nodes})),
        "max_model_len": contexts[-1] if contexts else None,
        "serving_nodes": len(nodes),
        "otela": {
            "providers": sorted({r.provider_id for r in nodes}),
            "gpu": sorted({g.name for r in nodes for g in r.hardware.gpus}),
            "engine": sorted({r.engine for r in nodes if r.engine}),
            "max_context": contexts,
            "quantization": sorted({m.quantization or "none" for m in infos}),
            "dtype": sorted({m.dtype for m in infos if m.dtype}),
            "tensor_parallel": sorted({m.tensor_parallel or 1 for m in infos}),
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

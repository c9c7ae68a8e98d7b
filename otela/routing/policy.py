"""Candidate selection, pure: which sessions may serve a request, and which one does.

Kept free of I/O so policies (random today; trust filters, round robin and load-aware
ones later) are testable on plain records.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence

from otela.api.errors import APIError, clip
from otela.registry.records import NodeRecord
from otela.registry.store import Registry


def candidates_for(
    registry: Registry, model_id: str, suspected: Collection[str] = frozenset()
) -> tuple[NodeRecord, ...]:
    """SERVING sessions for ``model_id`` on peers not under suspicion; 404 if no live node
    lists the model, 503 if none can serve it now."""
    serving = registry.serving_candidates(model_id)  # the hot path: one cached lookup
    if serving and suspected:
        serving = tuple(r for r in serving if r.peer_id not in suspected)
    if serving:
        return serving
    entry = registry.model(model_id)
    if entry is None:
        raise APIError(
            404,
            f"The model `{clip(model_id)}` does not exist in this federation.",
            code="model_not_found",
            param="model",
        )
    if registry.serving_candidates(model_id):
        raise APIError(
            503,
            f"Every node serving `{clip(model_id)}` is suspected unreachable right now; "
            "retry later.",
            code="no_serving_node",
        )
    raise APIError(
        503,
        f"No node is serving `{clip(model_id)}` right now "
        f"({len(entry.sessions)} known, none SERVING); retry later.",
        code="no_serving_node",
    )


def pick_random(
    candidates: Sequence[NodeRecord],
    rng: random.Random,
    exclude: Collection[str] = (),
) -> NodeRecord | None:
    """A uniformly random candidate whose session is not in ``exclude`` (paper §3.4 default)."""
    remaining = [c for c in candidates if c.session_id not in exclude]
    return rng.choice(remaining) if remaining else None

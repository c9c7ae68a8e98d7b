"""Which nodes may serve a request: a chain of filters over the registry, each with its
own answer when nothing passes it. Pure.

1. SERVING sessions listing the model (none known: 404 ``model_not_found``; none
   serving: 503 ``no_serving_node``);
2. of a trusted provider (none: 503 ``no_trusted_node``, naming the trust set applied and
   never the untrusted nodes);
3. not suspected by the failure detector, unless all of them are: then all of them
   (Envoy's "panic mode"). A suspicion is a hint that may be stale or second-hand (after
   a partition heals, the other side's suspicions of this side's nodes arrive a moment
   before the suspects' refutations, and at an ingress they once suspected every
   candidate: a certain 503); a suspect that is really gone fails at the connection,
   before anything is sent, and the next candidate is tried;
4. meeting every requirement (none: 503 ``no_matching_node``, naming the clause that
   excluded the last of them);
5. not ejected by this ingress for failing (``ejection``; never all of them).

Trust comes before everything a node could influence, so no later step (a policy, a
retry, a fallback) can ever see an untrusted node.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from otela.dataplane.errors import RequestError, clip
from otela.registry.records import NodeRecord
from otela.registry.store import Registry
from otela.routing.constraints import Clause, select
from otela.routing.trust import ANY, TrustSet


def eligible(
    registry: Registry,
    model_id: str,
    *,
    trust: TrustSet = ANY,
    clauses: Sequence[Clause] = (),
    suspected: Collection[str] = frozenset(),
    ejected: Callable[[Collection[str]], Collection[str]] | None = None,
) -> tuple[NodeRecord, ...]:
    """The nodes a request for ``model_id`` may go to, or the ``RequestError`` that says
    why there are none."""
    serving = registry.serving_candidates(model_id)  # the hot path: one cached lookup
    if not serving:
        _none_serving(registry, model_id)
    if trust.providers is not None:
        serving = tuple(r for r in serving if r.provider_id in trust.providers)
        if not serving:
            raise RequestError(
                503, f"No node of a trusted provider serves `{clip(model_id)}` right now "
                f"(trust set applied: {clip(trust.describe(), 300)}).",
                code="no_trusted_node")
    if suspected:
        serving = tuple(r for r in serving if r.peer_id not in suspected) or serving
    if clauses:
        serving, excluded_by = select(clauses, serving, model_id)
        if excluded_by is not None:
            raise RequestError(
                503, f"No node serving `{clip(model_id)}` meets the requirement "
                f"`{excluded_by.text}`.", code="no_matching_node", param="X-Otela-Require")
    if ejected is not None and len(serving) > 1:
        out = ejected([r.session_id for r in serving])
        if out and len(out) < len(serving):  # (the ejection policy never asks for all)
            serving = tuple(r for r in serving if r.session_id not in out)
    return serving


def _none_serving(registry: Registry, model_id: str) -> None:
    entry = registry.model(model_id)
    if entry is None:
        raise RequestError(
            404, f"The model `{clip(model_id)}` does not exist in this federation.",
            code="model_not_found", param="model")
    raise RequestError(
        503, f"No node is serving `{clip(model_id)}` right now ({len(entry.sessions)} known, "
        "none SERVING); retry later.", code="no_serving_node")

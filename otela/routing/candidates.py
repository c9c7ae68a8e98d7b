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

Each filter's answer is remembered (``TupleMemo``) for the tuple it was given and what it
filtered by: the registry hands out the same tuple of a model's SERVING sessions until one
of them changes, so at 1,000 nodes a request does not rescan them all
(``benchmarks/routing_decision.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Sequence
from typing import TypeVar, cast

from otela.dataplane.errors import RequestError, clip
from otela.registry.records import NodeRecord
from otela.registry.store import Registry
from otela.routing.constraints import Clause, select
from otela.routing.trust import ANY, TrustSet

Nodes = tuple[NodeRecord, ...]
T = TypeVar("T")


class TupleMemo:
    """Answers worked out from a tuple of nodes, per tuple (by identity: the tuple is
    kept, so its id is not reused while remembered) and per question (a filter and what
    it filtered by; the router also keeps where each session is and the rendezvous tree
    here). Bounded: cleared when full, which costs one recomputation of each."""

    def __init__(self, size: int = 512) -> None:
        self.size = size
        self._answers: dict[tuple[int, Hashable], tuple[Nodes, object]] = {}

    def get(self, nodes: Nodes, key: Hashable, compute: Callable[[], T]) -> T:
        slot = (id(nodes), key)
        known = self._answers.get(slot)
        if known is not None and known[0] is nodes:
            return cast(T, known[1])
        answer = compute()
        if len(self._answers) >= self.size:
            self._answers.clear()
        self._answers[slot] = (nodes, answer)
        return answer


def eligible(
    registry: Registry,
    model_id: str,
    *,
    trust: TrustSet = ANY,
    clauses: Sequence[Clause] = (),
    suspected: Collection[str] = frozenset(),
    ejected: Callable[[Collection[str]], Collection[str]] | None = None,
    memo: TupleMemo | None = None,
) -> Nodes:
    """The nodes a request for ``model_id`` may go to, or the ``RequestError`` that says
    why there are none. ``ejected`` is asked only when it may leave some out (a caller
    with no ejection in force passes None); ``memo`` remembers the filters' answers."""
    serving = registry.serving_candidates(model_id)  # the hot path: one cached lookup
    if not serving:
        _none_serving(registry, model_id)
    if trust.providers is not None:
        providers = trust.providers
        serving = _filtered(memo, serving, ("trust", providers), lambda nodes: tuple(
            r for r in nodes if r.provider_id in providers))
        if not serving:
            raise RequestError(
                503, f"No node of a trusted provider serves `{clip(model_id)}` right now "
                f"(trust set applied: {clip(trust.describe(), 300)}).",
                code="no_trusted_node")
    if suspected:
        out = suspected if isinstance(suspected, frozenset) else frozenset(suspected)
        serving = _filtered(memo, serving, ("suspected", out), lambda nodes: tuple(
            r for r in nodes if r.peer_id not in out) or nodes)
    if clauses:
        key = ("clauses", model_id, tuple(clauses))
        if memo is None:
            serving, excluded_by = select(clauses, serving, model_id)
        else:
            before = serving
            serving, excluded_by = memo.get(
                before, key, lambda: select(clauses, before, model_id))
        if excluded_by is not None:
            raise RequestError(
                503, f"No node serving `{clip(model_id)}` meets the requirement "
                f"`{excluded_by.text}`.", code="no_matching_node", param="X-Otela-Require")
    if ejected is not None and len(serving) > 1:
        ejecting = ejected([r.session_id for r in serving])
        if ejecting and len(ejecting) < len(serving):  # (it never asks for all of them)
            serving = tuple(r for r in serving if r.session_id not in ejecting)
    return serving


def _filtered(memo: TupleMemo | None, nodes: Nodes, key: Hashable,
              keep: Callable[[Nodes], Nodes]) -> Nodes:
    if memo is None:
        return keep(nodes)
    return memo.get(nodes, key, lambda: keep(nodes))


def _none_serving(registry: Registry, model_id: str) -> None:
    entry = registry.model(model_id)
    if entry is None:
        raise RequestError(
            404, f"The model `{clip(model_id)}` does not exist in this federation.",
            code="model_not_found", param="model")
    raise RequestError(
        503, f"No node is serving `{clip(model_id)}` right now ({len(entry.sessions)} known, "
        "none SERVING); retry later.", code="no_serving_node")

"""The ``cache_aware`` policy: send a request where the longest prefix of it is already
in the engine's KV cache, unless that node is too busy.

What a node holds comes from the engines themselves (``otela.kvcache``): their KV events
become summaries on the load reports, and this ingress adds its own recent dispatches
(predictions) until the summaries catch up. The request's blocks are hashed as the node's
engine hashes them, from the prompt's token ids (the model's tokenizer and chat template
at the ingress, ``otela.kvcache.tokenize``).

The rule, in order:

1. **Cache, within a load bound.** Among the candidates whose fresh summary (or this
   ingress's prediction) holds some of the request's blocks, the one holding the most
   wins (a tie: the less loaded), unless its load per unit of capacity, with this request,
   would exceed ``--cache-balance`` (1.5) times the mean: then **load wins** and the next
   holder is tried. This is prefix affinity's bounded load applied to what is really
   cached, without prefix affinity's floor of 2 requests (which let one node take every
   chat of a small federation, since they all share a system prompt cached there first):
   a hot prefix spreads over as many nodes as its load needs, each of them comes to cache
   it, and the busiest node stays within about the factor of the mean.
2. **Otherwise today's policy** (among the nodes within the bound, when load won):
   ``prefix_affinity`` on the request's ``user`` (its
   session, for clients that send one) or its prompt's first characters. So a
   conversation's first turn and a node without KV events route as before, and a
   session's later turns find its cache where the first landed.

Trust, constraints, suspicion and ejection have already chosen the candidates.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from otela.kvcache.anchors import anchor_depths
from otela.kvcache.board import CacheBoard
from otela.kvcache.hashing import BlockHasher, Fingerprint
from otela.kvcache.tokenize import Tokenizers
from otela.routing.policies import (
    Candidate,
    Pick,
    PrefixAffinity,
    having,
    mean_relative_load,
)

Anchors = list[tuple[int, Fingerprint]]  # (depth, fingerprint), deepest first


@dataclass
class CacheContext:
    """What the policy reads: the board of summaries, the tokenizers, the clock."""

    board: CacheBoard
    tokenizers: Tokenizers
    clock: Callable[[], float]
    balance: float = 1.5  # --cache-balance
    hashers: dict[tuple[str, int], BlockHasher] = field(default_factory=dict)
    stats: Counter[str] = field(default_factory=Counter)

    def hasher(self, hashing: tuple[str, int]) -> BlockHasher:
        hasher = self.hashers.get(hashing)
        if hasher is None:
            hasher = self.hashers[hashing] = BlockHasher(*hashing)
        return hasher


class CacheAware:
    name = "cache_aware"
    uses_affinity_key = True
    uses_body = True

    def __init__(self, context: CacheContext | None = None,
                 affinity_balance: float = 2.0) -> None:
        self.context = context
        self.balance = context.balance if context is not None else affinity_balance
        self.fallback = PrefixAffinity(affinity_balance)

    # -- the request's blocks ---------------------------------------------------------

    def _anchors(self, request: Pick, hashing: tuple[str, int]) -> Anchors | None:
        """The request's anchors hashed as ``hashing``, computed once per request."""
        memo = request.memo
        key = ("anchors", hashing)
        if key in memo:
            cached: Anchors | None = memo[key]
            return cached
        assert self.context is not None
        tokens = memo.get("tokens", False)
        if tokens is False:
            tokens = None
            tokenizer = self.context.tokenizers.for_model(request.model)
            if tokenizer is not None and request.body is not None:
                tokens = tokenizer.prompt_ids(request.body)
            memo["tokens"] = tokens
            self.context.stats["tokenized" if tokens is not None else "untokenized"] += 1
        anchors: Anchors | None = None
        if tokens:
            chain = self.context.hasher(hashing).chain(tokens)
            anchors = [(d, chain[d - 1]) for d in anchor_depths(len(chain))]
        memo[key] = anchors
        return anchors

    def _held(self, request: Pick, now: float) -> dict[str, int]:
        """Blocks of the request each node holds (session: depth)."""
        assert self.context is not None
        board = self.context.board
        found: dict[str, int] = {}
        for hashing in board.hashings():
            anchors = self._anchors(request, hashing)
            if anchors:
                for session, depth in board.matches(anchors, now, hashing).items():
                    if depth > found.get(session, 0):
                        found[session] = depth
        return found

    # -- the policy -----------------------------------------------------------------

    def pick(self, candidates: Sequence[Candidate], request: Pick, rng: random.Random
             ) -> Candidate:
        if self.context is None or len(candidates) == 1 or request.body is None:
            return self.fallback.pick(candidates, request, rng)
        held = self._held(request, self.context.clock())
        if held:
            # The holders among the candidates: looked up (a view), not scanned.
            holders = having(candidates, held)
            if holders:
                bound = math.ceil(self.balance * mean_relative_load(candidates, rng))
                holders.sort(key=lambda c: (-held[c.record.session_id], c.relative_load))
                for candidate in holders:
                    if candidate.relative_load + 1 <= bound:
                        self.context.stats["cache_hit_routed"] += 1
                        return candidate
                self.context.stats["load_won"] += 1
                # and the fallback keeps to the bound too (prefix affinity's own is looser)
                return self.fallback.pick_within(candidates, request, rng, bound)
        self.context.stats["fallback"] += 1
        return self.fallback.pick(candidates, request, rng)

    def on_start(self, node: Candidate, request: Pick) -> None:
        keys = self._node_keys(node, request)
        if keys:
            assert self.context is not None
            self.context.board.predict(node.session, keys, self.context.clock())

    def on_end(self, node: Candidate, request: Pick, outcome: str) -> None:
        keys = self._node_keys(node, request)
        if keys:
            assert self.context is not None
            self.context.board.ended(node.session, keys, self.context.clock())

    def _node_keys(self, node: Candidate, request: Pick) -> list[Fingerprint] | None:
        """The request's anchors as ``node`` hashes blocks (None: it sends no summary)."""
        if self.context is None or request.body is None:
            return None
        hashing = self.context.board.hashing_of(node.session, self.context.clock())
        if hashing is None:
            return None
        anchors = self._anchors(request, hashing)
        return [key for _depth, key in anchors] if anchors else None

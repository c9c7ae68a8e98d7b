"""Routing policies: which of the eligible nodes gets a request. Pure: a policy sees
numbers (load estimates, capacity weights, an affinity key) and a random source, never
the network, so every rule is property-testable.

Built in:

- ``random``: uniform, the paper's default (§3.4). Blind to load.
- ``round_robin``: each candidate in turn. Blind to load and speed.
- ``weighted``: random, proportional to capacity (GPU memory bandwidth). Blind to load.
- ``least_in_flight``: the lowest load per unit of capacity (ties: random). Reacts to a
  slow node at once; with several ingresses acting on the same stale reports they can
  all pick the same node at once (herding).
- ``power_of_two``: two random candidates, the less loaded wins (Mitzenmacher's "power of
  two choices"): almost all of least-loaded's benefit, and no herding.
- ``cache_aware``: where the longest prefix of the request is already in the engine's KV
  cache, as the engines' own KV events say, within prefix affinity's load bound; else
  ``prefix_affinity`` (``otela.routing.cache_aware``).
- ``prefix_affinity``: the same key (the request's ``user`` field, else the first
  characters of its prompt) goes to the same node, so repeated prefixes hit a warm KV
  cache: rendezvous hashing (consistent: a node joining or leaving moves only its share
  of keys) with bounded load (Mirrokni et al.): a node that would be above ``balance``
  times the mean load (``--affinity-balance``, 2) is skipped for the key's next choice.

Plugins implement ``Policy`` and register under the entry point group
``otela.routing_policies`` (docs/routing.md has an example).
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Collection, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, overload, runtime_checkable

from otela.registry.records import NodeRecord
from otela.routing.rendezvous import FLAT_MAX, Tree, hash64, score, session_hash

if TYPE_CHECKING:
    from otela.routing.cache_aware import CacheContext

log = logging.getLogger("otela.routing")

ENTRY_POINT_GROUP = "otela.routing_policies"
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Candidate:
    """One eligible node as a policy sees it."""

    record: NodeRecord
    load: float  # estimated requests outstanding at the node (otela.routing.load)
    capacity: float  # relative serving capacity, > 0

    @property
    def session(self) -> str:
        return self.record.session_id

    @property
    def relative_load(self) -> float:
        return self.load / self.capacity


class CandidateView(Sequence[Candidate]):
    """The eligible nodes as a policy sees them, each made a ``Candidate`` (its load
    estimate and capacity) only when the policy first looks at it, and once. At 1,000
    nodes making them all cost ~2.5 ms a request, while ``power_of_two`` looks at two and
    ``cache_aware`` at the few holding the request's prefix plus a sample for the mean
    load (``benchmarks/routing_decision.py``). A policy that iterates gets them all, as
    from a list, in the same order."""

    __slots__ = ("_all", "_made", "_make", "_mean", "_memo", "records")

    def __init__(self, records: Sequence[NodeRecord], make: Callable[[NodeRecord], Candidate],
                 memo: Memo | None = None, mean_load: Callable[[], float] | None = None
                 ) -> None:
        self.records = records
        self._make = make
        self._made: dict[int, Candidate] = {}
        self._all: list[Candidate] | None = None  # once a policy has iterated: every one
        # What is worked out once per candidate set (where each session is, the rendezvous
        # tree) and kept across requests while the set is the same (the router's).
        self._memo = memo
        self._mean = mean_load  # the mean load, as ``mean_relative_load``, kept a moment

    def __len__(self) -> int:
        return len(self.records)

    @overload
    def __getitem__(self, index: int) -> Candidate: ...

    @overload
    def __getitem__(self, index: slice) -> list[Candidate]: ...

    def __getitem__(self, index: int | slice) -> Candidate | list[Candidate]:
        if self._all is not None:
            return self._all[index]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self.records)))]
        if index < 0:
            index += len(self.records)
        made = self._made.get(index)
        if made is None:
            made = self._made[index] = self._make(self.records[index])
        return made

    def __iter__(self) -> Iterator[Candidate]:
        if self._all is None:
            made, make = self._made, self._make
            self._all = [made.get(i) or make(r) for i, r in enumerate(self.records)]
        return iter(self._all)

    def shared(self, name: Hashable, build: Callable[[Sequence[NodeRecord]], T]) -> T:
        """``build(records)``, worked out once per candidate set where the router keeps
        it."""
        if self._memo is None:
            return build(self.records)
        records = self.records
        return self._memo(name, lambda: build(records))

    def having(self, sessions: Collection[str]) -> list[Candidate]:
        """The candidates whose session is one of ``sessions``: looked up, not scanned,
        beyond ``LOAD_SAMPLE`` (below, a policy reads them all anyway)."""
        if len(self.records) <= LOAD_SAMPLE:
            return [c for c in self if c.session in sessions]
        positions = self.shared("positions", lambda records: {
            r.session_id: i for i, r in enumerate(records)})
        return [self[i] for s in sessions if (i := positions.get(s)) is not None]

    def mean_load(self, rng: random.Random) -> float:
        if self._mean is not None and len(self.records) > LOAD_SAMPLE:
            return self._mean()
        return sampled_mean_load(self, rng)


Memo = Callable[[Hashable, Callable[[], Any]], Any]
LOAD_SAMPLE = 32  # beyond this many candidates, the mean load is estimated from a sample


def having(candidates: Sequence[Candidate], sessions: Collection[str]) -> list[Candidate]:
    """The candidates whose session is one of ``sessions`` (a view looks them up)."""
    if isinstance(candidates, CandidateView):
        return candidates.having(sessions)
    return [c for c in candidates if c.session in sessions]


def mean_relative_load(candidates: Sequence[Candidate], rng: random.Random) -> float:
    """The mean load per unit of capacity with the request being placed counted: exact up
    to ``LOAD_SAMPLE`` candidates, estimated from as many random ones beyond (the load
    bounds are rules of thumb; reading every node's load would cost more than the
    decision), which the router keeps for a moment (``Router.choose``)."""
    if isinstance(candidates, CandidateView):
        return candidates.mean_load(rng)
    return sampled_mean_load(candidates, rng)


def sampled_mean_load(candidates: Sequence[Candidate], rng: random.Random) -> float:
    sample = candidates if len(candidates) <= LOAD_SAMPLE else \
        rng.choices(candidates, k=LOAD_SAMPLE)
    return sum(c.relative_load for c in sample) / len(sample) + 1 / len(candidates)


def tree_of(candidates: Sequence[Candidate]) -> Tree:
    """The candidates' rendezvous tree (kept per candidate set by a view)."""
    if isinstance(candidates, CandidateView):
        return candidates.shared("rendezvous", lambda records: Tree(
            [r.session_id for r in records]))
    return Tree([c.session for c in candidates])


@dataclass(frozen=True, slots=True)
class Pick:
    """What a policy knows about the request it places."""

    model: str
    affinity_key: str | None = None  # for prefix_affinity; None: none given
    stream: bool = False
    # The request's body, for policies that read its prompt (``uses_body``), and what
    # they worked out from it, kept across the request's attempts.
    body: Mapping[str, Any] | None = None
    memo: dict[Any, Any] = field(default_factory=dict, compare=False)


@runtime_checkable
class Policy(Protocol):
    """A routing policy. ``pick`` chooses among the candidates (never empty) and may keep
    state; ``on_start``/``on_end`` say a request was sent to a node and is over, with
    its outcome (``"ok"``, ``"client_error"``, ``"failed"``, ``"not_delivered"``).
    Candidates have already passed trust, constraints, suspicion and ejection: a policy
    cannot send a request anywhere it may not go."""

    name: str
    uses_affinity_key: bool

    def pick(self, candidates: Sequence[Candidate], request: Pick, rng: random.Random
             ) -> Candidate: ...

    def on_start(self, node: Candidate, request: Pick) -> None: ...

    def on_end(self, node: Candidate, request: Pick, outcome: str) -> None: ...


class _Base:
    name = "base"
    uses_affinity_key = False

    def on_start(self, node: Candidate, request: Pick) -> None:
        pass

    def on_end(self, node: Candidate, request: Pick, outcome: str) -> None:
        pass


class RandomPolicy(_Base):
    name = "random"

    def pick(self, candidates: Sequence[Candidate], request: Pick, rng: random.Random
             ) -> Candidate:
        return candidates[rng.randrange(len(candidates))]


class RoundRobin(_Base):
    name = "round_robin"

    def __init__(self) -> None:
        self._next: dict[str, int] = {}  # per model

    def pick(self, candidates: Sequence[Candidate], request: Pick, rng: random.Random
             ) -> Candidate:
        turn = self._next.get(request.model, rng.randrange(1 << 16))
        self._next[request.model] = turn + 1
        ordered = sorted(candidates, key=lambda c: c.session)  # stable as the list changes
        return ordered[turn % len(ordered)]


class Weighted(_Base):
    name = "weighted"

    def pick(self, candidates: Sequence[Candidate], request: Pick, rng: random.Random
             ) -> Candidate:
        return rng.choices(candidates, weights=[c.capacity for c in candidates])[0]


class LeastInFlight(_Base):
    name = "least_in_flight"

    def pick(self, candidates: Sequence[Candidate], request: Pick, rng: random.Random
             ) -> Candidate:
        lowest = min(c.relative_load for c in candidates)
        tied = [c for c in candidates if c.relative_load <= lowest]
        return tied[rng.randrange(len(tied))]


class PowerOfTwo(_Base):
    name = "power_of_two"

    def pick(self, candidates: Sequence[Candidate], request: Pick, rng: random.Random
             ) -> Candidate:
        if len(candidates) == 1:
            return candidates[0]
        first, second = rng.sample(range(len(candidates)), 2)
        a, b = candidates[first], candidates[second]
        # A tie goes to the first drawn, at random: a tie to the larger capacity gave a node
        # that claims a large capacity every request of an idle federation (both loads 0).
        return b if b.relative_load < a.relative_load else a


class PrefixAffinity(_Base):
    name = "prefix_affinity"
    uses_affinity_key = True

    def __init__(self, balance: float = 2.0) -> None:
        # A key's node is skipped once its load would exceed ``balance`` times the mean.
        # Lower: evener load, fewer warm-cache hits (benchmarks/routing.py: 1.5 kept 88 %
        # of repeated prefixes on their node, 2.0 kept 98 % with the busiest node at
        # 1.36x the mean).
        self.balance = balance

    def pick(self, candidates: Sequence[Candidate], request: Pick, rng: random.Random
             ) -> Candidate:
        return self.pick_within(candidates, request, rng)

    def pick_within(self, candidates: Sequence[Candidate], request: Pick,
                    rng: random.Random, bound: int | None = None) -> Candidate:
        """The key's first node whose load, with this request, stays within ``bound``
        (default: ``balance`` times the mean, at least 2); the least loaded of those
        ranked when none does."""
        if request.affinity_key is None or len(candidates) == 1:
            return PowerOfTwo().pick(candidates, request, rng)
        key = hash64(request.affinity_key.encode("utf-8", "surrogatepass"))
        # Bounded load: the mean includes the request being placed, so an idle
        # federation always admits the first choice. The bound is at least 2: loads are
        # partly reported, and one stale count (an engine's metrics polled while the
        # user's previous request ran) must not move a user off an otherwise idle node.
        if bound is None:
            bound = max(2, math.ceil(self.balance * mean_relative_load(candidates, rng)))
        if len(candidates) <= FLAT_MAX:
            ranked = sorted(candidates, key=lambda c: _score(key, c), reverse=True)
        else:  # a tree: the nodes of the key's first leaves, not all of them
            ranked = []
            for leaf in tree_of(candidates).leaves(key):
                members = sorted((candidates[i] for i in leaf),
                                 key=lambda c: _score(key, c), reverse=True)
                for candidate in members:
                    if candidate.relative_load + 1 <= bound:
                        return candidate
                ranked += members
                if len(ranked) >= FLAT_MAX:
                    break
        for candidate in ranked:
            if candidate.relative_load + 1 <= bound:
                return candidate
        return min(ranked, key=lambda c: c.relative_load)


def _score(key: int, candidate: Candidate) -> float:
    """Rendezvous (highest random weight) score, weighted by capacity: a node with twice
    the capacity wins about twice the keys (``otela.routing.rendezvous``)."""
    return score(key, session_hash(candidate.session), candidate.capacity)


def provider_share(candidates: Sequence[Candidate], rng: random.Random
                   ) -> Sequence[Candidate]:
    """The candidates of one provider, chosen so that providers, not nodes, share the
    requests (``--balance-providers``): two random providers, the one with the lower load
    per unit of capacity wins (a tie: the first drawn). A provider running ten nodes then
    gets what one running one does, unless the one is busier."""
    by_provider: dict[str, list[Candidate]] = {}
    for candidate in candidates:
        by_provider.setdefault(candidate.record.provider_id, []).append(candidate)
    if len(by_provider) < 2:
        return candidates
    first, second = rng.sample(sorted(by_provider), 2)

    def load(provider: str) -> float:
        group = by_provider[provider]
        return sum(c.load for c in group) / sum(c.capacity for c in group)

    return by_provider[second if load(second) < load(first) else first]


BUILT_IN: dict[str, Callable[[], Policy]] = {
    p.name: p for p in (RandomPolicy, RoundRobin, Weighted, LeastInFlight, PowerOfTwo,
                        PrefixAffinity)
}


class UnknownPolicy(ValueError):
    pass


CACHE_AWARE = "cache_aware"  # built in too: otela.routing.cache_aware, given a context


def available() -> list[str]:
    """Policy names: built-in ones, then installed plugins."""
    built_in = {*BUILT_IN, CACHE_AWARE}
    return sorted(built_in) + sorted(
        ep.name for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name not in built_in)


def load_policy(name: str, affinity_balance: float = 2.0,
                cache: CacheContext | None = None) -> Policy:
    """A new instance of the policy called ``name``: built in, or from a plugin's entry
    point (a class or factory taking no arguments); ``UnknownPolicy`` otherwise.
    ``cache``: what ``cache_aware`` reads (without it, it is ``prefix_affinity``)."""
    if name == PrefixAffinity.name:
        return PrefixAffinity(affinity_balance)
    if name == CACHE_AWARE:
        from otela.routing.cache_aware import CacheAware  # it builds on this module

        return CacheAware(cache, affinity_balance)  # its own bound: cache.balance
    if name in BUILT_IN:
        return BUILT_IN[name]()
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            try:
                policy = ep.load()()
            except Exception as exc:  # a plugin's bug must read as a bad setting
                raise UnknownPolicy(f"plugin {name!r} ({ep.value}) failed to load: "
                                    f"{type(exc).__name__}: {exc}") from exc
            if not isinstance(policy, Policy):
                raise UnknownPolicy(f"plugin {name!r} ({ep.value}) does not implement "
                                    "pick / on_start / on_end")
            return policy
    raise UnknownPolicy(f"unknown routing policy {name!r} (available: "
                        f"{', '.join(available())})")

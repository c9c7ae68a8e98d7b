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

import hashlib
import logging
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from otela.registry.records import NodeRecord

if TYPE_CHECKING:
    from otela.routing.cache_aware import CacheContext

log = logging.getLogger("otela.routing")

ENTRY_POINT_GROUP = "otela.routing_policies"


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
        if request.affinity_key is None or len(candidates) == 1:
            return PowerOfTwo().pick(candidates, request, rng)
        key = _hash64(request.affinity_key.encode("utf-8", "surrogatepass"))
        ranked = sorted(candidates, key=lambda c: _score(key, c), reverse=True)
        # Bounded load: the mean includes the request being placed, so an idle
        # federation always admits the first choice. The bound is at least 2: loads are
        # partly reported, and one stale count (an engine's metrics polled while the
        # user's previous request ran) must not move a user off an otherwise idle node.
        total = sum(c.relative_load for c in candidates) + 1
        bound = max(2, math.ceil(self.balance * total / len(candidates)))
        for candidate in ranked:
            if candidate.relative_load + 1 <= bound:
                return candidate
        return min(ranked, key=lambda c: c.relative_load)


def _hash64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


_SESSION_HASH: dict[str, int] = {}


def _score(key: int, candidate: Candidate) -> float:
    """Rendezvous (highest random weight) score, weighted by capacity: a node with twice
    the capacity wins about twice the keys (-w / ln(u), Schindelhauer & Schomaker)."""
    session = candidate.session
    salt = _SESSION_HASH.get(session)
    if salt is None:
        if len(_SESSION_HASH) > 65536:
            _SESSION_HASH.clear()
        salt = _SESSION_HASH[session] = _hash64(session.encode())
    mixed = _mix64(key ^ salt)
    unit = (mixed + 1) / (2**64 + 1)  # in (0, 1)
    return -candidate.capacity / math.log(unit)


def _mix64(x: int) -> int:
    """SplitMix64's finalizer: a fast, well-spread 64-bit mix."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


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

"""Routing in a large federation: a request makes only the candidates its policy looks at
(``CandidateView``), the filters' answers are kept per registry tuple (``TupleMemo``),
and ``prefix_affinity`` beyond ``FLAT_MAX`` candidates ranks a tree of them
(``otela.routing.rendezvous``) and stays consistent and even."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter

from otela.registry.crdt import Entry, tiebreak_of
from otela.registry.records import Lifecycle, NodeRecord
from otela.registry.store import Registry
from otela.routing.ask import Ask
from otela.routing.candidates import TupleMemo, eligible
from otela.routing.ejection import Ejections
from otela.routing.load import NodeLoad
from otela.routing.policies import (
    Candidate,
    CandidateView,
    Pick,
    PrefixAffinity,
    having,
    tree_of,
)
from otela.routing.rendezvous import FLAT_MAX
from otela.routing.router import Router, routing_settings
from otela.routing.trust import ANY

from .registry_helpers import record

NOW = 1000.0


def records(n: int, offset: int = 0) -> tuple[NodeRecord, ...]:
    return tuple(record(f"n{i}", 1, Lifecycle.SERVING, provider="ab"[i % 2])
                 for i in range(offset, offset + n))


def counting_view(nodes: tuple[NodeRecord, ...], loads: dict[str, float] | None = None
                  ) -> tuple[CandidateView, list[str]]:
    made: list[str] = []
    memo = TupleMemo()

    def make(r: NodeRecord) -> Candidate:
        made.append(r.session_id)
        return Candidate(r, (loads or {}).get(r.session_id, 0.0), 1.0)

    return CandidateView(nodes, make, lambda key, build: memo.get(nodes, key, build)), made


def test_a_view_makes_each_candidate_once_and_only_when_looked_at():
    nodes = records(10)
    view, made = counting_view(nodes)
    assert len(view) == 10 and not made
    assert view[3].session == nodes[3].session_id and view[-1].record is nodes[9]
    assert view[3] is view[3] and made == [nodes[3].session_id, nodes[9].session_id]
    assert [c.record for c in view] == list(nodes)  # iterating: all, in order
    assert [c.record for c in view[2:4]] == list(nodes[2:4])
    assert len(made) == 10  # none made twice
    wanted = {nodes[1].session_id, nodes[7].session_id, "not-a-candidate"}
    assert {c.session for c in having(view, wanted)} == wanted - {"not-a-candidate"}
    assert having([Candidate(nodes[1], 0, 1)], wanted)[0].record is nodes[1]  # a plain list


def test_filters_answer_the_same_tuple_until_the_registry_changes():
    registry = Registry()
    for r in records(6):
        entry = Entry(r.session_id, r.state, 1, r.updated_at, tiebreak_of(r.session_id.encode()),
                      r)
        object.__setattr__(entry, "proof", entry)
        registry.apply(entry, NOW)
    memo = TupleMemo()
    trust = ANY.narrowed(frozenset({"a"}), "test")
    suspected = frozenset({records(1, offset=0)[0].peer_id})
    first = eligible(registry, "m", trust=trust, suspected=suspected, memo=memo)
    again = eligible(registry, "m", trust=trust, suspected=set(suspected), memo=memo)
    assert first is again  # remembered: no rescan
    assert first == eligible(registry, "m", trust=trust, suspected=suspected)  # same answer
    assert {r.provider_id for r in first} == {"a"} and len(first) == 2
    gone = first[0]
    down = dataclasses.replace(gone, state=Lifecycle.DOWN, version=2)
    entry = Entry(gone.session_id, Lifecycle.DOWN, 2, NOW, tiebreak_of(b"x"), down)
    object.__setattr__(entry, "proof", entry)
    registry.apply(entry, NOW)
    after = eligible(registry, "m", trust=trust, suspected=suspected, memo=memo)
    assert gone not in after and len(after) == 1  # a new registry tuple: a new answer


def test_ejections_are_looked_at_only_while_one_is_in_force():
    ejections = Ejections(consecutive=1, base=10.0)
    assert not ejections.any_in_force(NOW)
    assert ejections.failure("s1", NOW)
    assert ejections.any_in_force(NOW + 9.9) and not ejections.any_in_force(NOW + 10.0)


def keys_to_nodes(policy: PrefixAffinity, nodes: tuple[NodeRecord, ...], keys: list[str]
                  ) -> dict[str, str]:
    view, _ = counting_view(nodes)
    rng = random.Random(1)
    return {k: policy.pick(view, Pick("m", k), rng).session for k in keys}


def test_prefix_affinity_beyond_flat_max_is_consistent_and_even():
    policy = PrefixAffinity()
    nodes = records(300)
    assert len(nodes) > FLAT_MAX
    keys = [f"user-{i}" for i in range(6000)]
    homes = keys_to_nodes(policy, nodes, keys)
    assert homes == keys_to_nodes(policy, nodes, keys)  # the same key, the same node
    spread = Counter(homes.values())
    assert len(spread) > 280 and max(spread.values()) < 3.5 * len(keys) / len(nodes)
    # A node leaving moves its own keys, and (the tree's weights change on its path) about
    # as many of its neighbours' again, nothing like a rehash; one joining takes its share.
    share = len(keys) / len(nodes)
    leaving = nodes[17].session_id
    without = keys_to_nodes(policy, tuple(r for r in nodes if r.session_id != leaving), keys)
    assert all(without[k] != leaving for k in keys)
    others_moved = sum(1 for k in keys if homes[k] != leaving and without[k] != homes[k])
    assert others_moved <= 3 * share
    joined = records(1, offset=300)
    more = keys_to_nodes(policy, nodes + joined, keys)
    moved = [k for k in keys if more[k] != homes[k]]
    taken = sum(1 for k in moved if more[k] == joined[0].session_id)
    assert taken > share / 3 and len(moved) <= 4 * share


def test_prefix_affinity_in_a_tree_keeps_the_load_bound():
    policy = PrefixAffinity(balance=2.0)
    nodes = records(200)
    first = keys_to_nodes(policy, nodes, ["hot"])["hot"]
    loads = {first: 50.0}  # the key's node is far above twice the mean
    view, _ = counting_view(nodes, loads)
    chosen = policy.pick(view, Pick("m", "hot"), random.Random(1))
    assert chosen.session != first and chosen.load == 0.0
    everyone = {r.session_id: 50.0 for r in nodes}  # all over the bound: the least loaded
    everyone[nodes[5].session_id] = 49.0
    view, made = counting_view(nodes, everyone)
    assert policy.pick_within(view, Pick("m", "hot"), random.Random(1), bound=2).load \
        <= 50.0 and len(made) <= FLAT_MAX + 40  # looked at a bounded number, not all
    assert len(tree_of(view).root) > 1


def test_a_large_federation_makes_few_candidates_per_request():
    """At 1,000 nodes power_of_two looks at two, prefix_affinity at one leaf of its tree
    (and a sample for the mean load, kept a moment), not at every node."""
    registry = Registry()
    nodes = records(1000)
    for r in nodes:
        entry = Entry(r.session_id, r.state, 1, r.updated_at, tiebreak_of(r.session_id.encode()),
                      r)
        object.__setattr__(entry, "proof", entry)
        registry.apply(entry, NOW)
    router = Router(registry, _NoSelf(), routing_settings(),  # type: ignore[arg-type]
                    rng=random.Random(3), clock=lambda: NOW)
    for r in nodes:
        router.loads.report(r.session_id, NodeLoad(in_flight=1), NOW)
    made = Counter[str]()
    build = router._candidate

    def counted(record: NodeRecord, now: float, pick: Pick, own: str | None) -> Candidate:
        made[record.session_id] += 1
        return build(record, now, pick, own)

    router._candidate = counted  # type: ignore[method-assign]
    ask = Ask(ANY, body=b"{}")
    for name, most in (("power_of_two", 2), ("random", 1), ("prefix_affinity", 40)):
        policy = router.policy_for(name)
        for i in range(20):
            made.clear()
            router.choose(router.nodes_for("m", ask, NOW), policy, Pick("m", f"k{i}"), NOW)
            # (the first prefix_affinity request also samples the mean load)
            assert sum(made.values()) <= most + (32 if i == 0 else 0), name


class _NoSelf:
    def self_session(self) -> None:
        return None

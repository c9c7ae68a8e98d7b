import random
from collections import Counter

import pytest

from otela.api.errors import APIError
from otela.registry.records import Lifecycle
from otela.registry.store import Registry
from otela.routing.policy import candidates_for, pick_random

from .registry_helpers import entry, record, sid

NOW = 1000.0


def node(session, state):
    return record(session, 1, state)


def test_unknown_model_is_404():
    with pytest.raises(APIError) as err:
        candidates_for(Registry(), "ghost")
    assert err.value.status == 404
    assert err.value.code == "model_not_found"


def test_known_model_without_serving_node_is_503():
    reg = Registry()
    reg.apply(entry("a", 1, Lifecycle.DOWN), NOW)
    with pytest.raises(APIError) as err:
        candidates_for(reg, "m")
    assert err.value.status == 503


def test_only_serving_nodes_are_candidates():
    reg = Registry()
    for s, state in [("a", Lifecycle.SERVING), ("b", Lifecycle.DOWN), ("c", Lifecycle.SERVING)]:
        reg.apply(entry(s, 1, state), NOW)
    assert {r.session_id for r in candidates_for(reg, "m")} == {sid("a"), sid("c")}


def test_random_pick_is_uniform_and_respects_exclusions():
    cands = [node(s, Lifecycle.SERVING) for s in "abcd"]
    rng = random.Random(1)
    counts = Counter(pick_random(cands, rng).session_id for _ in range(4000))
    assert set(counts) == {sid(s) for s in "abcd"}
    assert all(800 < c < 1200 for c in counts.values())
    abc = {sid(s) for s in "abc"}
    assert {pick_random(cands, rng, exclude=abc).session_id for _ in range(20)} == {sid("d")}
    assert pick_random(cands, rng, exclude={sid(s) for s in "abcd"}) is None

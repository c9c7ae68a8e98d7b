"""Property tests (hypothesis) of the registry CRDT and its anti-entropy exchange."""

from __future__ import annotations

import contextlib
import functools
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from otela.registry import antientropy
from otela.registry.crdt import GCPolicy, GMap, Rejected, Superseded, join
from otela.registry.records import Lifecycle
from otela.registry.session import epoch_of
from otela.registry.store import Registry

from .registry_helpers import entry

NOW = 10_000.0

entries = st.builds(
    entry,
    session=st.sampled_from(["a", "b", "c", "d", "e"]),
    version=st.integers(min_value=0, max_value=6),
    state=st.sampled_from(list(Lifecycle)),
    salt=st.sampled_from(["", "x"]),
    updated_at=st.just(NOW),
)
same_key = st.builds(
    entry, session=st.just("k"), version=st.integers(0, 6),
    state=st.sampled_from(list(Lifecycle)), salt=st.sampled_from(["", "x", "y"]),
)


@settings(max_examples=2000)
@given(same_key, same_key, same_key)
def test_join_is_commutative_associative_idempotent(a, b, c):
    assert join(a, b) == join(b, a)
    assert join(join(a, b), c).rank() == join(a, join(b, c)).rank()
    assert join(a, a) is a


def state_of(gmap: GMap) -> dict[str, tuple]:
    return {e.key: e.rank() for e in gmap}


@settings(max_examples=1500)
@given(st.lists(entries, max_size=40), st.randoms(use_true_random=False))
def test_any_order_with_duplicates_converges(updates, rnd):
    reference = GMap()
    for u in updates:
        reference.merge(u, NOW)
    shuffled = updates + [rnd.choice(updates) for _ in range(len(updates) // 2)] if updates else []
    rnd.shuffle(shuffled)
    other = GMap()
    for u in shuffled:
        other.merge(u, NOW)
    assert state_of(other) == state_of(reference)
    assert other.digest_root() == reference.digest_root()


@settings(max_examples=1500)
@given(st.lists(entries, max_size=40))
def test_lifecycle_never_regresses(updates):
    gmap = GMap()
    seen: dict[str, tuple] = {}
    for u in updates:
        gmap.merge(u, NOW)
        now = gmap.get(u.key).rank()
        assert now >= seen.get(u.key, now)
        seen[u.key] = now


def _exchange(initiator: Registry, responder: Registry) -> None:
    """One anti-entropy exchange, run in-process; proofs are the entries themselves."""
    apply_i = functools.partial(_apply_all, initiator)
    apply_r = functools.partial(_apply_all, responder)
    answer = antientropy.answer_opening(responder, antientropy.opening(initiator))
    request = antientropy.digests(initiator, answer)
    if request is None:
        return
    reply = antientropy.answer_digests(responder, request)
    apply_i(reply["entries"])
    apply_r(antientropy.entries(initiator, reply["want"])["entries"])


def _apply_all(registry: Registry, proofs) -> None:
    for proof in proofs:
        with contextlib.suppress(Superseded):  # an older session of a peer: refused
            registry.apply(proof, NOW)


@settings(max_examples=1000, deadline=None)
@given(st.lists(entries, min_size=1, max_size=60), st.randoms(use_true_random=False))
def test_five_replicas_with_lost_and_duplicated_deltas_converge_after_anti_entropy(updates, rnd):
    replicas = [Registry() for _ in range(5)]
    for u in updates:
        owner = replicas[hash(u.key) % 5]  # the owner always holds its own change
        owner.apply(u, NOW)
        for replica in replicas:  # gossip: the delta reaches others 0, 1 or 2 times
            for _ in range(rnd.choice([0, 0, 1, 1, 2])):
                replica.apply(u, NOW)
    reference = GMap()
    for u in updates:
        reference.merge(u, NOW)
    # Anti-entropy rounds with random partners, then a sweep so every pair has met.
    for _ in range(10):
        a, b = rnd.sample(replicas, 2)
        _exchange(a, b)
    for a in replicas:
        for b in replicas:
            if a is not b:
                _exchange(a, b)
    for replica in replicas:
        assert state_of(replica.map) == state_of(reference)
        assert replica.map.digest_root() == reference.digest_root()


@settings(max_examples=1000)
@given(st.lists(entries, min_size=1, max_size=30), st.floats(0, 1000))
def test_a_compacted_left_entry_is_never_resurrected(updates, replay_delay):
    policy = GCPolicy(retention=50, horizon=100)
    gmap = GMap(policy)
    for u in updates:
        gmap.merge(u, NOW)
    left_keys = {e.key for e in gmap if e.state is Lifecycle.LEFT}
    later = NOW + policy.horizon + 1 + replay_delay
    gmap.compact(later)
    for u in updates:  # every old delta replayed after compaction
        with contextlib.suppress(Rejected):
            gmap.merge(u, later)
    assert not left_keys & {e.key for e in gmap}


def test_equal_replicas_stop_after_one_round_trip():
    a, b = Registry(), Registry()
    for r in (a, b):
        for i in range(100):
            r.apply(entry(f"s{i}", 1, Lifecycle.SERVING), NOW)
    answer = antientropy.answer_opening(b, antientropy.opening(a))
    assert answer["kind"] == "ae-same"
    assert antientropy.digests(a, answer) is None


def test_a_joiner_receives_everything_in_one_exchange():
    big, joiner = Registry(), Registry()
    rnd = random.Random(3)
    for i in range(500):
        big.apply(entry(f"s{i}", rnd.randint(1, 5), rnd.choice(list(Lifecycle))), NOW)
    joiner.apply(entry("mine", 1, Lifecycle.JOIN), NOW)
    _exchange(joiner, big)
    assert state_of(joiner.map) == state_of(big.map)


def test_a_joiner_larger_than_one_batch_converges_over_several_exchanges(monkeypatch):
    monkeypatch.setattr(antientropy, "MAX_ENTRIES_PER_MESSAGE", 40)
    big, joiner = Registry(), Registry()
    for i in range(150):
        big.apply(entry(f"s{i}", 1, Lifecycle.SERVING), NOW)
    rounds = 0
    while state_of(joiner.map) != state_of(big.map):
        before = len(joiner.map)
        _exchange(joiner, big)
        rounds += 1
        assert len(joiner.map) - before <= 40  # never more than one batch per message
        assert rounds < 10
    assert rounds == 4


# Several sessions of one peer: the map keeps one per peer, whatever arrives in what order.
PEER_OF = {"a": "p1", "b": "p1", "c": "p1", "d": "p2", "e": "p2"}
shared_peers = st.builds(
    lambda session, **kw: entry(session, peer_id=PEER_OF[session], **kw),
    session=st.sampled_from(sorted(PEER_OF)),
    version=st.integers(min_value=0, max_value=4),
    state=st.sampled_from(list(Lifecycle)),
    salt=st.sampled_from(["", "x"]),
    updated_at=st.just(NOW),
)


def _merge_all(gmap: GMap, updates) -> None:
    for u in updates:
        with contextlib.suppress(Superseded):
            gmap.merge(u, NOW)


@settings(max_examples=1500)
@given(st.lists(shared_peers, max_size=40), st.randoms(use_true_random=False))
def test_one_session_per_peer_whatever_the_order(updates, rnd):
    reference = GMap()
    _merge_all(reference, updates)
    shuffled = updates + [rnd.choice(updates) for _ in range(len(updates) // 2)] if updates else []
    rnd.shuffle(shuffled)
    other = GMap()
    _merge_all(other, shuffled)
    assert state_of(other) == state_of(reference)
    assert other.digest_root() == reference.digest_root()
    peers = [e.record.peer_id for e in other]
    assert len(peers) == len(set(peers))  # one entry per peer
    for peer in set(PEER_OF.values()):  # and it is the greatest of that peer's entries
        mine = [u for u in updates if u.record.peer_id == peer]
        if mine:
            best = max(mine, key=lambda u: (epoch_of(u.key), u.key, u.rank()))
            assert other.get(best.key).rank() == best.rank()


@settings(max_examples=500, deadline=None)
@given(st.lists(shared_peers, min_size=1, max_size=40), st.randoms(use_true_random=False))
def test_replicas_with_superseded_sessions_converge_after_anti_entropy(updates, rnd):
    replicas = [Registry() for _ in range(4)]
    for u in updates:
        for i, replica in enumerate(replicas):  # the first stands for the owner: it has all
            for _ in range(1 if i == 0 else rnd.choice([0, 1, 1, 2])):
                with contextlib.suppress(Superseded):
                    replica.apply(u, NOW)
    reference = GMap()
    _merge_all(reference, updates)
    for a in replicas:
        for b in replicas:
            if a is not b:
                _exchange(a, b)
    for replica in replicas:
        assert state_of(replica.map) == state_of(reference)
        assert len(replica) == len(reference)  # views follow: superseded sessions hidden


def _fresh_root(gmap: GMap) -> bytes:
    import hashlib
    return hashlib.blake2b(b"".join(gmap.bucket_hashes()), digest_size=len(gmap.digest_root())
                           ).digest()


@settings(max_examples=500)
@given(st.lists(entries, min_size=1, max_size=30), st.floats(0, 200))
def test_the_cached_root_follows_every_merge_supersession_and_compaction(updates, later):
    """The root is cached between changes: asked after each step, it must equal a root
    computed afresh from the buckets, or anti-entropy would compare stale summaries."""
    gmap = GMap(GCPolicy(retention=50, horizon=100))
    for u in updates:
        with contextlib.suppress(Superseded):
            gmap.merge(u, NOW)
        assert gmap.digest_root() == _fresh_root(gmap)
    gmap.compact(NOW + later)
    assert gmap.digest_root() == _fresh_root(gmap)

import itertools
import random

from otela.registry.records import GPU, Hardware, Lifecycle, ModelInfo, NodeRecord
from otela.registry.store import Registry


def record(session: str, version: int, state: Lifecycle = Lifecycle.JOIN, models=("m",)):
    return NodeRecord(
        session_id=session,
        peer_id=f"peer-{session}",
        provider_id="p",
        state=state,
        version=version,
        http_url=f"http://{session}",
        models=tuple(ModelInfo(m) for m in models),
    )


def test_newer_version_wins_and_older_is_ignored():
    reg = Registry()
    assert reg.merge(record("a", 2, Lifecycle.SERVING))
    assert not reg.merge(record("a", 1, Lifecycle.JOIN))
    assert reg.get("a").state is Lifecycle.SERVING
    assert reg.merge(record("a", 3, Lifecycle.DOWN))
    assert reg.get("a").state is Lifecycle.DOWN


def test_merge_is_idempotent():
    reg = Registry()
    r = record("a", 1)
    assert reg.merge(r)
    assert not reg.merge(r)
    assert len(reg) == 1


def test_any_delivery_order_converges_to_the_same_state():
    updates = [
        record(s, v, state)
        for s in ("a", "b", "c")
        for v, state in enumerate((Lifecycle.JOIN, Lifecycle.SERVING, Lifecycle.DOWN), start=1)
    ]
    rng = random.Random(7)
    expected = None
    for _ in range(50):
        shuffled = updates + rng.sample(updates, 4)  # duplicates too
        rng.shuffle(shuffled)
        reg = Registry()
        for u in shuffled:
            reg.merge(u)
        state = [(r.session_id, r.version, r.state) for r in reg.snapshot()]
        expected = expected or state
        assert state == expected
    assert all(s is Lifecycle.DOWN for _, _, s in expected)


def test_model_view_lists_sessions_and_routing_sees_only_serving():
    reg = Registry()
    reg.merge(record("a", 2, Lifecycle.SERVING, models=("m1", "m2")))
    reg.merge(record("b", 2, Lifecycle.DOWN, models=("m1",)))
    reg.merge(record("c", 1, Lifecycle.JOIN, models=()))
    assert [e.model_id for e in reg.models()] == ["m1", "m2"]
    assert {r.session_id for r in reg.model("m1").sessions} == {"a", "b"}
    assert [r.session_id for r in reg.serving_candidates("m1")] == ["a"]
    assert reg.serving_candidates("unknown") == ()


def test_left_sessions_leave_the_model_view():
    reg = Registry()
    reg.merge(record("a", 2, Lifecycle.SERVING))
    reg.merge(record("a", 3, Lifecycle.LEFT))
    assert reg.model("m") is None
    assert reg.get("a").state is Lifecycle.LEFT  # still in the node view


def test_signed_form_travels_with_the_winning_record():
    reg = Registry()
    reg.merge(record("a", 1), signed={"sig": 1})
    reg.merge(record("a", 2), signed={"sig": 2})
    reg.merge(record("a", 1), signed={"sig": "stale"})
    assert reg.signed_snapshot() == [{"sig": 2}]


def test_record_dict_round_trip():
    r = NodeRecord(
        session_id="s", peer_id="p", provider_id="prov", state=Lifecycle.SERVING, version=4,
        http_url="http://h:1", addrs=("/ip4/1.2.3.4/tcp/1",),
        hardware=Hardware(8, 1 << 30, (GPU("H100", 80 << 30),)),
        models=(ModelInfo("m", 8192),), ingress=True, engine="vllm", updated_at=12.5,
    )
    assert NodeRecord.from_dict(r.to_dict()) == r


def test_lifecycle_is_strictly_ordered():
    assert list(Lifecycle) == sorted(Lifecycle)
    for a, b in itertools.pairwise(["JOIN", "SERVING", "DOWN", "LEFT"]):
        assert Lifecycle.parse(a) < Lifecycle.parse(b)

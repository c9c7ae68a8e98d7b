"""Load reports (otela.load.reports): who gets them, what a receiver accepts, the rate."""

from __future__ import annotations

from dataclasses import replace

import pytest
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from otela.dataplane.errors import RequestError
from otela.dataplane.hop_auth import HopSigner, HopVerifier
from otela.load.reports import (
    MAX_REPORT_BYTES,
    PATH,
    LoadReports,
    changed,
    decode,
    encode,
    ingresses,
    interval_for,
)
from otela.registry.records import Lifecycle, NodeRecord
from otela.routing.load import NodeLoad
from tests.unit.registry_helpers import record


def test_reports_go_to_live_ingresses_only_one_per_peer_never_to_ourselves() -> None:
    plain = record("plain")
    gateway = replace(record("gw", peer_id="peer-gw"), ingress=True, updated_at=10.0)
    restarted = replace(record("gw2", peer_id="peer-gw"), ingress=True, updated_at=20.0)
    gone = replace(record("gone", state=Lifecycle.LEFT), ingress=True)
    down = replace(record("down", state=Lifecycle.DOWN), ingress=True)
    me = replace(record("me"), ingress=True)
    targets = ingresses([plain, gateway, restarted, gone, down, me], own_peer_id="peer-me")
    assert set(targets) == {"peer-gw", "peer-down"}
    assert targets["peer-gw"] is restarted  # the newest session's addresses


def test_a_report_round_trips_and_anything_malformed_is_dropped() -> None:
    load = NodeLoad(in_flight=3, running=2, waiting=1, kv_usage=0.25, capacity=1.5)
    session, back, ttl, cache = decode(encode("s1", load, 6.0)) or ("", None, 0.0, None)
    assert (session, back, ttl) == ("s1", load, 6.0) and cache is None
    for bad in (b"", b"not json", b"[]", b'{"s": "s1", "l": "f=1"}',
                b'{"s": "s1", "l": "f=1", "t": 0}', b'{"s": "s1", "l": "f=1", "t": 1e9}',
                b'{"s": "s1", "l": "f=1", "t": NaN}', b'{"s": "s1", "l": "f=x", "t": 1}',
                b'{"s": "' + b"x" * MAX_REPORT_BYTES + b'", "l": "f=1", "t": 1}'):
        assert decode(bad) is None, bad


def test_the_rate_is_bounded_per_ingress_and_only_changes_are_said() -> None:
    assert interval_for(3, 2.0, 0.5) == 2.0
    assert interval_for(50, 2.0, 0.5) == 25.0  # 50 nodes: two reports a second in all
    assert not changed(None, NodeLoad())  # an idle node says nothing
    assert changed(None, NodeLoad(in_flight=1))
    assert not changed(NodeLoad(in_flight=1, kv_usage=0.30), NodeLoad(in_flight=1,
                                                                       kv_usage=0.32))
    assert changed(NodeLoad(in_flight=1, kv_usage=0.30), NodeLoad(in_flight=1, kv_usage=0.4))
    assert changed(NodeLoad(in_flight=1), NodeLoad(in_flight=2))


class Member:
    def __init__(self) -> None:
        keys = create_new_key_pair()
        self.seed = keys.private_key.to_bytes()
        self.peer_id = ID.from_pubkey(keys.public_key).to_base58()


def receiver(registry: list[NodeRecord], members: set[str], ingress: Member,
             receive: bool = True) -> tuple[LoadReports, list[tuple[str, NodeLoad, float]]]:
    taken: list[tuple[str, NodeLoad, float]] = []
    by_session = {r.session_id: r for r in registry}
    view = type("View", (), {"get": lambda self, s: by_session.get(s),
                             "__iter__": lambda self: iter(registry),
                             "__len__": lambda self: len(registry)})()
    reports = LoadReports(
        lambda: view, None, lambda *r: taken.append(r),  # type: ignore[arg-type]
        session=lambda: "mine", serving=lambda: False, client=None,  # type: ignore[arg-type]
        signer=HopSigner(ingress.seed, ingress.peer_id),
        verifier=HopVerifier(ingress.seed, ingress.peer_id, members.__contains__),
        receive=receive)
    return reports, taken


def refused(reports: LoadReports, token: str | None, body: bytes) -> tuple[int, str | None]:
    with pytest.raises(RequestError) as err:
        reports.take(token, body)
    return err.value.status, err.value.code


def test_an_ingress_takes_a_members_reports_about_itself_only() -> None:
    ingress, sender, other, outsider = Member(), Member(), Member(), Member()
    own = record("own", peer_id=sender.peer_id)
    theirs = record("theirs", peer_id=other.peer_id)
    members = {ingress.peer_id, sender.peer_id, other.peer_id}
    reports, taken = receiver([own, theirs], members, ingress)
    signer = HopSigner(sender.seed, sender.peer_id)

    def signed(body: bytes, path: str = PATH) -> str:
        return signer.token(ingress.peer_id, "POST", path, body)

    load = NodeLoad(in_flight=2)
    body = encode(own.session_id, load, 6.0)
    first = signed(body)
    reports.take(first, body)
    assert taken == [(own.session_id, load, 6.0)]

    lie = encode(theirs.session_id, NodeLoad(in_flight=9), 6.0)  # another node's load
    assert refused(reports, signed(lie), lie) == (403, "not_your_session")
    assert refused(reports, signed(b"garbage"), b"garbage") == (400, "invalid_load_report")
    assert refused(reports, None, body)[0] == 401  # no token: not a member's request
    assert refused(reports, first, body)[0] == 401  # a replayed token
    assert refused(reports, signed(body, "/v1/engine/x"), body)[0] == 401  # for another path
    stranger = HopSigner(outsider.seed, outsider.peer_id)
    assert refused(reports, stranger.token(ingress.peer_id, "POST", PATH, body), body) \
        == (403, "not_a_member")
    assert taken == [(own.session_id, load, 6.0)]  # nothing refused got through
    assert reports.stats["received"] == 1 and reports.stats["refused"] == 6


def test_a_node_that_is_not_an_ingress_takes_no_reports() -> None:
    node, sender = Member(), Member()
    own = record("own", peer_id=sender.peer_id)
    reports, taken = receiver([own], {node.peer_id, sender.peer_id}, node, receive=False)
    body = encode(own.session_id, NodeLoad(in_flight=1), 6.0)
    token = HopSigner(sender.seed, sender.peer_id).token(node.peer_id, "POST", PATH, body)
    assert refused(reports, token, body) == (403, "not_an_ingress") and taken == []


def test_a_cache_summary_rides_on_a_report_and_a_delta_it_cannot_apply_asks_for_all(
) -> None:
    from otela.kvcache.board import CacheBoard
    from otela.kvcache.events import Batch, Stored
    from otela.kvcache.hashing import BlockHasher
    from otela.kvcache.index import CacheIndex

    ingress, sender = Member(), Member()
    own = record("own", peer_id=sender.peer_id)
    reports, taken = receiver([own], {ingress.peer_id, sender.peer_id}, ingress)
    board = CacheBoard()
    reports.on_cache = lambda session, cache, ttl: board.take(session, cache, 0.0, ttl) \
        if not isinstance(cache, tuple) else board.touch(session, *cache, 0.0, ttl)
    signer = HopSigner(sender.seed, sender.peer_id)
    index = CacheIndex()
    tokens = list(range(64))
    index.apply(Batch(0, (Stored(tuple(BlockHasher("sha256", 16).chain(tokens)), None,
                                 tuple(tokens), 16, True),)))
    whole = index.summary_for(None)
    assert whole is not None
    body = encode(own.session_id, NodeLoad(in_flight=1), 6.0, whole)
    reports.take(signer.token(ingress.peer_id, "POST", PATH, body), body)
    assert board.held(own.session_id) == (index.epoch, index.seq)
    assert len(board.nodes[own.session_id].anchors) == 3  # depths 1, 2 and 4
    current = encode(own.session_id, NodeLoad(in_flight=1), 6.0, (index.epoch, index.seq))
    reports.take(signer.token(ingress.peer_id, "POST", PATH, current), current)
    # a delta from a state the ingress never had: the load is taken, the delta is not
    wrong = encode(own.session_id, NodeLoad(in_flight=2), 6.0,
                   (index.epoch + 1, index.seq))
    assert refused(reports, signer.token(ingress.peer_id, "POST", PATH, wrong), wrong) == \
        (409, "cache_resync")
    assert taken[-1] == (own.session_id, NodeLoad(in_flight=2), 6.0)

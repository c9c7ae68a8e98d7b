"""The failure detector's member list follows the registry's journal of changes
(``Registry.changes_since``) and must end exactly where a re-read of every record ends:
same members, same sessions, same addresses, a rejoin starting afresh either way."""

from __future__ import annotations

import contextlib

from hypothesis import given, settings
from hypothesis import strategies as st

from otela.liveness.events import EventLog
from otela.liveness.members import MemberList
from otela.liveness.rtt import RoundTrips
from otela.liveness.table import LivenessTable, Status
from otela.registry import store
from otela.registry.crdt import Rejected
from otela.registry.records import Lifecycle
from otela.registry.store import Registry

from .registry_helpers import entry, sid

PEERS = ["a", "b", "c", "me"]
PEER_IDS = [f"peer-{p}" for p in PEERS]
DAY = 24 * 3600.0
STATES = [Lifecycle.JOIN, Lifecycle.SERVING, Lifecycle.DOWN, Lifecycle.LEFT]


def member_list() -> MemberList:
    return MemberList("peer-me", LivenessTable("peer-me", 6.0),
                      RoundTrips(floor=1.0, ceiling=3.0), EventLog(clock=lambda: 0.0))


def outcome(members: MemberList) -> tuple[object, ...]:
    table = members.table
    return ({p: (m.status, m.incarnation) for p, m in table.members.items()},
            members.sessions, members.peers, members.known,
            {p for p in PEER_IDS if members.round_trips.smoothed(p) is not None},
            {p for p in PEER_IDS if members.events.suspected_since(p) is not None})


# one step: (peer, session number, state, version, whether to sync and suspect every
# member then, whether the registry's GC runs a day later then: LEFT leaves the views)
step = st.tuples(st.sampled_from(PEERS), st.integers(0, 2), st.sampled_from(STATES),
                 st.integers(1, 3), st.booleans(), st.booleans())


@settings(max_examples=300, deadline=None)
@given(st.lists(step, max_size=40))
def test_following_the_journal_ends_where_a_reread_ends(steps: list[tuple]) -> None:
    registry = Registry()
    following, rereading = member_list(), member_list()
    for now, (peer, session, state, version, suspect, collect) in enumerate(steps):
        # a peer's later sessions sort after its earlier ones (a restart or a rejoin)
        e = entry(f"{peer}-{session}", version, state, updated_at=1000.0 + now,
                  peer_id=f"peer-{peer}")
        with contextlib.suppress(Rejected):  # an older session than the peer's: refused
            registry.apply(e, 1000.0 + now)
        if suspect:
            for members, records in ((following, registry), (rereading, list(registry))):
                members.sync(records, registry.generation, float(now))
                for member in list(members.table.members):
                    members.table.probe_failed(member, float(now))
                    members.round_trips.observe(member, 0.1)
                    members.events.record(member, "suspected", "")
        if collect:
            registry.maintain(1000.0 + now + DAY + 1)
    following.sync(registry, registry.generation, 99.0)
    rereading.sync(list(registry), registry.generation, 99.0)
    assert outcome(following) == outcome(rereading)


def test_the_journal_names_what_changed_and_admits_when_it_cannot_reach_back(
        monkeypatch) -> None:
    registry = Registry()
    start = registry.generation
    for name in ("x", "y", "x"):
        registry.apply(entry(name, 1 if name == "y" else registry.generation + 1,
                             Lifecycle.SERVING), 1000.0)
    x, y = entry("x").key, entry("y").key
    assert registry.changes_since(start) == [y, x]  # each once, by its last change
    assert registry.changes_since(registry.generation) == []
    monkeypatch.setattr(store, "JOURNAL_LENGTH", 2)
    short = Registry()
    for i in range(3):
        short.apply(entry(f"s{i}", 1, Lifecycle.SERVING), 1000.0)
    assert short.changes_since(0) is None  # three changes, two remembered: re-read
    assert short.changes_since(1) is not None


def test_a_member_list_behind_the_journal_rereads_and_still_tracks_a_rejoin(
        monkeypatch) -> None:
    monkeypatch.setattr(store, "JOURNAL_LENGTH", 2)
    registry = Registry()
    registry.apply(entry("a-0", 1, Lifecycle.SERVING, peer_id="peer-a"), 1000.0)
    members = member_list()
    members.sync(registry, registry.generation, 0.0)
    members.table.probe_failed("peer-a", 1.0)
    assert members.table.members["peer-a"].status is Status.SUSPECT
    for i in range(3):  # more changes than the journal holds, a rejoin of a among them
        registry.apply(entry(f"b{i}", 1, Lifecycle.SERVING, peer_id=f"peer-b{i}"), 1001.0 + i)
    later = next(f"a-{i}" for i in range(1, 99) if sid(f"a-{i}", "peer-a") > sid("a-0", "peer-a"))
    registry.apply(entry(later, 1, Lifecycle.SERVING, peer_id="peer-a"), 1005.0)
    registry.apply(entry("c-0", 1, Lifecycle.SERVING, peer_id="peer-c"), 1006.0)
    registry.apply(entry("c-0", 2, Lifecycle.SERVING, peer_id="peer-c"), 1007.0)
    members.sync(registry, registry.generation, 2.0)
    assert set(members.table.members) == {"peer-a", "peer-b0", "peer-b1", "peer-b2", "peer-c"}
    assert members.table.members["peer-a"].status is Status.ALIVE  # its new session


def test_a_verifier_pick_kept_per_suspect_follows_membership_changes() -> None:
    """``should_verify`` keeps its pick per suspect until a member comes or goes: each
    answer must equal a fresh table's with the same members and the same suspicion."""
    def suspected(members: set[str]) -> LivenessTable:
        table = LivenessTable("me", 6.0)
        table.sync_members(members, 0.0)
        for peer in sorted(members):
            table.probe_failed(peer, 1.0)
            table.members[peer].suspecters.discard("me")  # heard of, not seen first-hand
        return table

    members = {f"p{i}" for i in range(6)}
    kept = suspected(members)
    answers = set()
    for extra in range(40):  # members join one by one; the picks move
        for peer in sorted(members):
            answer = kept.should_verify(peer)
            assert answer == suspected(members).should_verify(peer)
            answers.add(answer)
        newcomer = f"q{extra}"
        members.add(newcomer)
        kept.add_member(newcomer, 2.0)
        kept.probe_failed(newcomer, 2.0)
        kept.members[newcomer].suspecters.discard("me")
    assert answers == {True, False}  # both answers occurred: the check can fail

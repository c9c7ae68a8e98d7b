"""The failure detector's pure state machine."""

import hashlib
import math

import pytest

from otela.liveness.table import HEARSAY_CHECK_TIMEOUTS, LivenessTable, Status, Update


def table(*peers: str, timeout: float = 5.0) -> LivenessTable:
    t = LivenessTable("me", suspicion_timeout=timeout)
    t.sync_members(set(peers) | {"me"}, now=0.0)
    return t


def test_members_follow_the_registry_and_exclude_ourselves():
    t = table("a", "b")
    assert set(t.members) == {"a", "b"}
    t.sync_members({"b", "c"}, now=1.0)
    assert set(t.members) == {"b", "c"}


def test_failed_probes_suspect_and_the_timeout_confirms():
    t = table("a", "b", timeout=5.0)
    assert t.probe_failed("a", now=10.0)
    assert not t.probe_failed("a", now=11.0)  # already suspected by us: no new news
    assert t.suspected() == {"a"}
    # A lone suspicion waits max_multiplier (4) x the timeout: 20 s.
    assert t.expired_suspicions(now=29.9) == []
    assert t.expired_suspicions(now=30.0) == ["a"]
    assert t.members["a"].status is Status.CONFIRMED
    assert t.due_evictions(now=30.0) == ["a"]  # the only suspecter signs at once
    assert t.due_evictions(now=39.9) == []
    assert t.due_evictions(now=40.0) == ["a"]  # again, if no eviction landed meanwhile


def test_one_eviction_per_confirmed_suspect_not_one_per_member():
    """Every member holding the suspicion confirms it; only first-hand suspecters sign,
    in a rank order all agree on, so one death floods one eviction, not N."""
    members = ["a", "me", "s1", "s2", "bystander"]
    tables = {}
    for who in ["me", "s1", "s2", "bystander"]:
        t = LivenessTable(who, suspicion_timeout=5.0, eviction_stagger=1.0)
        t.sync_members(set(members), now=0.0)
        for suspecter in ["me", "s1", "s2"]:
            t.apply(Update("a", Status.SUSPECT, 0, by=suspecter), now=0.0)
        if who != "bystander":
            t.probe_failed("a", now=0.0)
        assert t.expired_suspicions(now=20.0) == ["a"]
        tables[who] = t
    first = [who for who, t in tables.items() if t.due_evictions(now=20.0) == ["a"]]
    assert len(first) == 1 and first[0] != "bystander"
    delays = sorted(t.members["a"].evict_at - 20.0 for who, t in tables.items()
                    if who not in first)
    assert delays == [1.0, 2.0, 10.0]  # the other suspecters one stagger apart; backup last


def test_confirmation_heard_from_others_makes_us_only_a_backup_evicter():
    t = table("a", "b", timeout=5.0)
    assert t.apply(Update("a", Status.SUSPECT, 0, by="b"), now=0.5)
    assert t.apply(Update("a", Status.CONFIRMED, 0), now=1.0)
    assert t.due_evictions(now=10.9) == []
    assert t.due_evictions(now=11.0) == ["a"]


def test_a_confirmation_heard_first_does_not_hold_back_a_first_hand_suspecter():
    """A member that only heard of the suspicion may confirm a moment before we do; we
    suspected first-hand and rank first, so we still sign at once, not after the backup."""
    t = table("a", "b", timeout=5.0)
    t.probe_failed("a", now=0.0)
    assert t.apply(Update("a", Status.CONFIRMED, 0), now=19.9)
    assert t.due_evictions(now=19.9) == ["a"]


def test_a_published_suspicion_is_verified_by_the_same_few_members_everywhere():
    """A crash seen by one neighbour only: a constant number of members, the same at every
    node, probe the suspect first-hand, so its confirmations do not depend on who happened
    to be connected to it."""
    members = ["dead", "bootstrap", *(f"n{i}" for i in range(30))]
    verifiers = set()
    for who in members[1:]:
        t = LivenessTable(who, suspicion_timeout=5.0, expected_confirmations=3)
        t.sync_members(set(members), now=0.0)
        assert not t.should_verify("dead")  # nobody suspects it yet
        t.apply(Update("dead", Status.SUSPECT, 0, by="bootstrap"), now=1.0)
        if t.should_verify("dead"):
            verifiers.add(who)
            t.probe_failed("dead", now=2.0)
            assert not t.should_verify("dead")  # our voice is in: nothing left to check
    assert 3 <= len(verifiers) <= 4  # 4 picked; the bootstrap suspects already
    assert "bootstrap" not in verifiers


def test_independent_suspicions_shorten_the_grace_period():
    """Lifeguard: a node every neighbour lost is evicted after the base timeout; one only
    a single (perhaps overloaded) member suspects gets several times longer to refute."""
    t = table("a", "b", "c", "d", timeout=5.0)
    t.probe_failed("a", now=0.0)
    assert t.timeout_for(t.members["a"]) == 20.0
    assert t.apply(Update("a", Status.SUSPECT, 0, by="b"), now=0.5)
    assert not t.apply(Update("a", Status.SUSPECT, 0, by="b"), now=0.6)  # same voice again
    one_more = t.timeout_for(t.members["a"])
    assert 5.0 < one_more < 20.0
    t.apply(Update("a", Status.SUSPECT, 0, by="c"), now=0.7)
    t.apply(Update("a", Status.SUSPECT, 0, by="d"), now=0.8)
    assert t.timeout_for(t.members["a"]) == 5.0
    assert t.expired_suspicions(now=4.9) == []
    assert t.expired_suspicions(now=5.0) == ["a"]


def test_small_federations_need_only_the_confirmations_they_can_give():
    """Three nodes: only the two survivors can suspect a crashed third, so one
    confirmation is all there can be; waiting for three held a crash for 2.5 x the
    timeout (LEFT 17.5 s after SIGKILL with the 6 s default)."""
    t = table("a", "b", timeout=5.0)
    t.probe_failed("a", now=0.0)
    assert t.required_confirmations(t.members["a"]) == 1
    assert t.timeout_for(t.members["a"]) == 20.0  # still a lone suspicion
    t.apply(Update("a", Status.SUSPECT, 0, by="b"), now=1.0)
    assert t.timeout_for(t.members["a"]) == 5.0
    assert t.expired_suspicions(now=4.9) == []
    assert t.expired_suspicions(now=5.0) == ["a"]
    # A member that is itself suspected (and has not voted) cannot confirm anything.
    five = table("a", "b", "c", "d", timeout=5.0)
    five.probe_failed("c", now=0.0)
    five.probe_failed("d", now=0.0)
    five.probe_failed("a", now=0.0)
    assert five.required_confirmations(five.members["a"]) == 1  # only b is left to ask
    five.apply(Update("a", Status.SUSPECT, 0, by="c"), now=0.0)  # a suspect voted before
    assert five.required_confirmations(five.members["a"]) == 2
    # Two nodes: nobody else could ever confirm, so the suspicion is all the evidence.
    pair = table("a", timeout=5.0)
    pair.probe_failed("a", now=0.0)
    assert pair.required_confirmations(pair.members["a"]) == 0
    assert pair.timeout_for(pair.members["a"]) == 5.0
    # Enough members: three confirmations, as before.
    large = table(*[f"p{i}" for i in range(9)], timeout=5.0)
    large.probe_failed("p0", now=0.0)
    large.apply(Update("p0", Status.SUSPECT, 0, by="p1"), now=0.0)
    assert large.required_confirmations(large.members["p0"]) == 3
    assert 5.0 < large.timeout_for(large.members["p0"]) < 20.0


def test_a_published_suspicion_waits_the_base_timeout_at_any_size():
    """Published on the liveness topic, the suspicion reached the suspect in one delivery
    and its refutation would come back in one: its minimum grace does not grow with log N
    (at 64 nodes it had been 1.8 x the timeout, LEFT 13.4 s after SIGKILL), it grows with
    the measured gossip lag instead. Lone and unpublished suspicions keep the log N
    growth."""
    peers = [f"p{i}" for i in range(127)]
    t = table(*peers, timeout=5.0)
    for suspecter in ["p1", "p2", "p3", "p4"]:
        t.apply(Update("p0", Status.SUSPECT, 0, by=suspecter), now=0.0)
    assert t.timeout_for(t.members["p0"]) == pytest.approx(5.0 * math.log10(128))
    t.published_elsewhere("p0", 0)
    assert t.timeout_for(t.members["p0"]) == 5.0
    t.observe_dissemination_delay(1.5)  # gossip runs late: the refutation would too
    assert t.timeout_for(t.members["p0"]) == 8.0
    t.scale_timeouts(2.0)  # and an unhealthy node waits longer still
    assert t.timeout_for(t.members["p0"]) == 13.0
    # A lone published suspicion (a dropped connection) still waits the longest.
    t.probe_failed("p5", now=0.0)
    t.published_elsewhere("p5", 0)
    assert t.timeout_for(t.members["p5"]) == pytest.approx(4 * 10.0 * math.log10(128))
    # A suspicion published for an older incarnation does not count for a newer one.
    t.apply(Update("p6", Status.SUSPECT, 1, by="p1"), now=0.0)
    for suspecter in ["p2", "p3", "p4"]:
        t.apply(Update("p6", Status.SUSPECT, 1, by=suspecter), now=0.0)
    t.published_elsewhere("p6", 0)
    assert t.timeout_for(t.members["p6"]) == pytest.approx(10.0 * math.log10(128))


def test_the_next_deadline_is_the_first_grace_or_eviction_still_to_come():
    t = table("a", "b", "c", timeout=5.0)
    assert t.next_deadline(now=0.0) is None
    t.probe_failed("a", now=0.0)  # lone: 20 s
    t.apply(Update("b", Status.SUSPECT, 0, by="c"), now=1.0)
    t.probe_failed("b", now=1.0)  # two of the two voices there can be: 5 s
    assert t.next_deadline(now=1.0) == 6.0
    assert t.expired_suspicions(now=6.0) == ["b"]
    # b is confirmed: we rank among its two suspecters, so sign at 6 s or one stagger on.
    evict_at = t.members["b"].evict_at
    assert evict_at in (6.0, 7.0)
    assert t.next_deadline(now=6.0) == (7.0 if evict_at == 7.0 else 20.0)
    assert t.next_deadline(now=20.0) is None  # past moments are left to the next period


def test_our_own_failed_probe_confirms_someone_elses_suspicion():
    t = table("a", "b")
    t.apply(Update("a", Status.SUSPECT, 0, by="b"), now=0.0)
    assert t.probe_failed("a", now=1.0)  # our independent voice is news worth spreading
    assert t.members["a"].suspecters == {"b", "me"}
    assert t.piggyback()[0] == Update("a", Status.SUSPECT, 0, by="me")


def test_only_a_proven_higher_incarnation_refutes():
    t = table("a")
    t.probe_failed("a", now=0.0)
    assert not t.apply(Update("a", Status.ALIVE, 1), now=1.0, proof_valid=False)
    assert not t.apply(Update("a", Status.ALIVE, 0, b"sig"), now=1.0, proof_valid=True)
    assert t.apply(Update("a", Status.ALIVE, 1, b"sig"), now=1.0, proof_valid=True)
    assert t.suspected() == frozenset()
    assert not t.apply(Update("a", Status.SUSPECT, 0), now=2.0)  # stale suspicion


def test_hearing_our_own_suspicion_raises_our_incarnation():
    t = table("a")
    t.apply(Update("me", Status.SUSPECT, 0), now=1.0)
    assert t.refute_needed and t.incarnation == 1
    update = t.announce_alive(b"proof")
    assert update == Update("me", Status.ALIVE, 1, b"proof") and not t.refute_needed


def test_recent_contact_counts_as_alive_evidence():
    t = table("a")
    t.heard_from("a", now=10.0)
    assert t.heard_recently("a", now=12.0, window=3.0)
    assert not t.heard_recently("a", now=14.0, window=3.0)


def test_news_is_piggybacked_a_bounded_number_of_times():
    t = table(*[f"p{i}" for i in range(14)])  # 14 members: budget ceil(3 * log2(16)) = 12
    t.probe_failed("p1", now=0.0)
    sends = 0
    while t.piggyback():
        sends += 1
        assert sends < 100
    assert sends == 12


def test_a_confirmation_is_taken_only_for_a_suspicion_we_hold():
    """Confirmations are unsigned: one heard of a member we hold alive (anyone may say it)
    would put it out of routing with no eviction ever to follow (evictions need signed
    suspicions, otela.registry.evidence)."""
    t = table("a", "b")
    assert not t.apply(Update("a", Status.CONFIRMED, 0), now=1.0)
    assert t.members["a"].status is Status.ALIVE and t.suspected() == frozenset()


def test_a_confirmed_member_that_proves_it_is_alive_is_back():
    """Its eviction may never come (it needs independent signed suspicions): a signed
    refutation at a higher incarnation lifts the confirmation, and no eviction is due."""
    t = table("a")
    t.probe_failed("a", now=0.0)
    assert t.expired_suspicions(now=100.0) == ["a"]
    assert not t.apply(Update("a", Status.ALIVE, 0, b"sig"), now=101.0, proof_valid=True)
    assert t.apply(Update("a", Status.ALIVE, 5, b"sig"), now=101.0, proof_valid=True)
    assert t.members["a"].status is Status.ALIVE and t.suspected() == frozenset()
    assert t.due_evictions(now=1000.0) == []
    t.sync_members({"me"}, now=1001.0)  # gone from the registry
    t.sync_members({"me", "a"}, now=1002.0)  # rejoined under a new session
    assert t.members["a"].status is Status.ALIVE


def test_our_suspicions_are_signed_and_kept_as_the_evidence_of_an_eviction():
    t = table("a", "b")
    t.sign_suspicion = lambda peer, incarnation: f"{peer}@{incarnation}".encode()
    t.probe_failed("a", now=0.0)
    assert t.piggyback()[0] == Update("a", Status.SUSPECT, 0, b"a@0", by="me")
    t.apply(Update("a", Status.SUSPECT, 0, b"b's", by="b"), now=0.5)
    assert sorted(t.evidence_of("a")) == [("b", 0, b"b's"), ("me", 0, b"a@0")]
    t.apply(Update("a", Status.SUSPECT, 1, b"b's again", by="b"), now=0.6)  # newer news
    assert t.evidence_of("a") == [("b", 1, b"b's again")]


def test_only_strongly_evidenced_suspicions_are_published_and_only_once():
    """A lone suspicion of a still-connected (slow) peer spreads on probes only; a
    dropped connection or a second independent suspecter makes it worth telling everyone."""
    t = table("slow", "crashed", "b")
    t.probe_failed("slow", now=0.0)
    assert t.suspicion_to_publish("slow", connection_lost=False) is None
    t.apply(Update("slow", Status.SUSPECT, 0, by="b"), now=0.5)  # corroborated
    assert t.suspicion_to_publish("slow", connection_lost=False) == Update(
        "slow", Status.SUSPECT, 0, by="me")
    assert t.suspicion_to_publish("slow", connection_lost=False) is None  # once

    t.probe_failed("crashed", now=0.0)
    assert t.suspicion_to_publish("crashed", connection_lost=True) is not None

    t.apply(Update("b", Status.SUSPECT, 0, by="slow"), now=1.0)  # not our own suspicion
    assert t.suspicion_to_publish("b", connection_lost=True) is None


def test_a_suspicion_someone_else_published_is_not_published_again():
    t = table("a", "b")
    t.published_elsewhere("a", 0)
    t.probe_failed("a", now=0.0)
    assert t.suspicion_to_publish("a", connection_lost=True) is None


def test_an_eviction_lacking_a_signer_publishes_once_more_and_rides_on_probes_again():
    """Our published suspicion's one topic delivery can miss the verifiers (GossipSub's
    mesh flaps around a hub): when the eviction is refused for want of a second signer,
    it goes on the topic once more and back onto our probes, every time it is refused."""
    t = table("a", "b")
    t.probe_failed("a", now=0.0)
    assert t.suspicion_to_publish("a", connection_lost=True) is not None
    assert t.piggyback(limit=8) and t.piggyback(limit=8)
    while t.piggyback(limit=8):  # its retransmissions run out
        pass
    ours = Update("a", Status.SUSPECT, 0, by="me")
    assert t.suspicion_to_publish("a", False, corroborate=True) == ours  # once more
    assert t.piggyback(limit=8) == [ours]
    assert t.suspicion_to_publish("a", False, corroborate=True) is None  # not a third time
    assert t.piggyback(limit=8) == [ours]  # but on probes, again


def test_larger_federations_give_a_suspect_longer_to_refute():
    small = table(*[f"p{i}" for i in range(8)], timeout=5.0)
    large = table(*[f"p{i}" for i in range(127)], timeout=5.0)
    for t in (small, large):
        for suspecter in ["p1", "p2", "p3", "p4"]:
            t.apply(Update("p0", Status.SUSPECT, 0, by=suspecter), now=0.0)
    assert small.timeout_for(small.members["p0"]) == 5.0
    assert large.timeout_for(large.members["p0"]) == pytest.approx(5.0 * math.log10(128))


def test_many_simultaneous_suspects_put_on_the_eviction_brake():
    """More than 10 % of members (and more than 3) suspected at once is an overload, a
    partition or our own trouble, not independent crashes."""
    t = table(*[f"p{i}" for i in range(40)])
    for i in range(4):
        t.probe_failed(f"p{i}", now=0.0)
    assert not t.braking()  # 4 is not more than 10 % of 40
    t.probe_failed("p4", now=0.0)
    assert t.braking()
    small = table("a", "b", "c")  # a few members: the floor keeps the brake off
    for peer in ("a", "b", "c"):
        small.probe_failed(peer, now=0.0)
    assert not small.braking()


def test_while_braking_one_eviction_at_a_time_the_same_at_every_node():
    peers = [f"p{i}" for i in range(20)]
    first, second = table(*peers, timeout=5.0), table(*peers, timeout=5.0)
    for i in range(6):  # suspected in opposite orders at the two nodes
        first.probe_failed(f"p{i}", now=float(i))
        second.probe_failed(f"p{5 - i}", now=float(i))
    after_all = 5.0 + first.timeout_for(first.members["p5"])  # lone suspicions
    chosen = first.expired_suspicions(now=after_all)
    assert len(chosen) == 1 and second.expired_suspicions(now=after_all) == chosen
    assert len(first.suspected()) == 6  # the others stay suspected (out of routing)
    # Nothing more while the confirmed one awaits its eviction...
    assert first.expired_suspicions(now=after_all + 60.0) == []
    # ...nor within a timeout of a confirmation, even one heard from another node.
    first.sync_members(set(peers) - set(chosen), now=after_all + 60.0)  # eviction landed
    heard = sorted(first.suspected())[-1]
    assert first.apply(Update(heard, Status.CONFIRMED, 0), now=after_all + 60.0)
    first.sync_members(set(peers) - set(chosen) - {heard}, now=after_all + 61.0)
    assert first.expired_suspicions(now=after_all + 64.9) == []
    (then,) = first.expired_suspicions(now=after_all + 65.0)
    assert then not in (*chosen, heard)
    # Evictions landing and refutations lift the brake; a timeout later (the last
    # refutations may be a moment behind the first), what still remains expired is
    # confirmed at once.
    first.sync_members(set(peers) - set(chosen) - {heard, then}, now=after_all + 66.0)
    still = sorted(first.suspected())
    for peer in still[:1]:
        assert first.apply(Update(peer, Status.ALIVE, 1, proof=b"sig"), now=after_all + 66.0,
                           proof_valid=True)
    assert not first.braking()
    assert first.expired_suspicions(now=after_all + 66.1) == []
    assert sorted(first.expired_suspicions(now=after_all + 70.1)) == still[1:]


def test_a_peer_back_under_a_new_session_is_not_struck_by_its_old_confirmation():
    """A live node evicted by mistake rejoins under a new session; news about its old
    session (suspicions, confirmations) still circulates and must not evict the new one."""
    t = table("a", "b")
    t.probe_failed("a", now=0.0)
    assert t.expired_suspicions(now=100.0) == ["a"]
    t.new_session("a", now=101.0)  # the old session's eviction and a new one, in place
    assert t.members["a"].status is Status.ALIVE
    assert not t.apply(Update("a", Status.CONFIRMED, 0), now=101.5)
    assert not t.apply(Update("a", Status.SUSPECT, 0, by="b"), now=101.5)
    # The same when the eviction arrives first and the rejoin later.
    t.probe_failed("b", now=0.0)
    t.expired_suspicions(now=100.0)
    t.sync_members({"a"}, now=102.0)
    t.sync_members({"a", "b"}, now=103.0)
    assert not t.apply(Update("b", Status.CONFIRMED, 0), now=103.5)
    assert t.members["b"].status is Status.ALIVE
    assert t.apply(Update("b", Status.SUSPECT, 1, by="a"), now=104.0)  # new news still counts


def test_while_braking_suspicions_are_not_published():
    t = table(*[f"p{i}" for i in range(20)])
    for i in range(5):
        t.probe_failed(f"p{i}", now=0.0)
    assert t.braking()
    assert t.suspicion_to_publish("p0", connection_lost=True) is None


def test_eviction_waits_grow_with_how_late_gossip_arrives():
    """When gossip runs late, another suspecter's eviction takes longer to reach us: the
    next in rank, and the backups, wait for it instead of signing their own."""
    members = ["a", "me", "s1"]
    t = LivenessTable("me", suspicion_timeout=5.0, eviction_stagger=1.0)
    t.sync_members(set(members), now=0.0)
    t.apply(Update("a", Status.SUSPECT, 0, by="s1"), now=0.0)
    t.probe_failed("a", now=0.0)
    rank = sorted(["me", "s1"],
                  key=lambda p: hashlib.sha256(f"{p}|a".encode()).digest()).index("me")
    assert t.eviction_delay(t.members["a"]) == rank * 1.0
    assert t.backup_delay() == 10.0
    t.dissemination_delay = 30.0
    assert t.eviction_delay(t.members["a"]) == rank * 61.0
    assert t.backup_delay() == 130.0


def test_while_braking_nothing_is_confirmed_before_the_agreed_head_expires():
    """Nodes agree on the order (a hash), not on when each suspicion expires."""
    peers = [f"p{i}" for i in range(20)]
    t = table(*peers)
    order = sorted(peers[:6], key=lambda p: hashlib.sha256(f"brake|{p}@0".encode()).digest())
    head, rest = order[0], order[1:]
    for peer in rest:
        t.probe_failed(peer, now=0.0)
    t.probe_failed(head, now=10.0)
    lone = t.timeout_for(t.members[head])
    assert t.expired_suspicions(now=lone) == []  # the others expired, the head has not
    assert t.expired_suspicions(now=10.0 + lone) == [head]


def test_a_further_signer_of_a_confirmed_suspicion_adds_its_evidence():
    """An eviction needs two signers: a confirmed member's evidence must still grow."""
    table = LivenessTable("me", 6.0)
    table.sync_members({"a", "b", "c"}, 0.0)
    table.apply(Update("a", Status.SUSPECT, 0, b"proof-b", by="b"), 0.0)
    table.apply(Update("a", Status.CONFIRMED, 0), 1.0)
    assert table.members["a"].status is Status.CONFIRMED and table.unvouched("a")
    assert table.apply(Update("a", Status.SUSPECT, 0, b"proof-c", by="c"), 2.0)
    assert {by for by, _, _ in table.evidence_of("a")} == {"b", "c"}
    assert not table.apply(Update("a", Status.SUSPECT, 0, b"proof-c", by="c"), 3.0)
    assert table.members["a"].status is Status.CONFIRMED
    # Our own failed probe adds our voice to the confirmed suspicion.
    table.sign_suspicion = lambda peer, incarnation: b"proof-me"
    assert table.probe_failed("a", 4.0) and not table.unvouched("a")
    assert not table.probe_failed("a", 5.0)


def test_a_node_cut_off_from_most_members_confirms_and_signs_nothing():
    """The smaller side of a partition suspects the members it probes on the larger side;
    under the brake alone it evicted them, live as they were, two signers at a time."""
    peers = [f"p{i}" for i in range(19)]
    t = table(*peers, timeout=5.0)
    t.sign_suspicion = lambda peer, incarnation: b"ours"
    heard = "p18"  # a confirmation of one suspect reaches us from another cut-off node
    for peer in peers[:3]:
        t.probe_failed(peer, now=0.0)
    t.apply(Update(heard, Status.SUSPECT, 0, b"s", by="p17"), now=0.0)
    assert t.apply(Update(heard, Status.CONFIRMED, 0), now=0.0)
    assert t.observe_reach(True) == 0 and t.cut_off
    for now in (30.0, 100.0, 1000.0):
        assert t.expired_suspicions(now=now) == [] and t.due_evictions(now=now) == []
    assert t.next_deadline(now=1000.0) is None or t.due_evictions(now=2000.0) == []
    # Reachable again: what the cut produced is dropped, not confirmed.
    assert t.observe_reach(False) == 4
    assert t.suspected() == frozenset() and t.suspicion_of("p0") is None
    assert t.expired_suspicions(now=2000.0) == [] and t.due_evictions(now=2000.0) == []
    assert all(m.status is Status.ALIVE for m in t.members.values())
    assert t.observe_reach(False) == 0  # not cut off before: nothing to drop
    # A member that really died is suspected afresh by whoever probes it.
    assert t.probe_failed("p0", now=2001.0) and t.suspected() == {"p0"}


def test_the_member_ids_follow_membership():
    t = table("a", "b", "c")
    assert sorted(t.member_ids()) == ["a", "b", "c"]
    t.sync_members({"me", "d"}, now=1.0)
    assert t.member_ids() == ("d",)
    assert table().member_ids() == ()


def test_a_suspicion_waits_for_a_reach_sample_taken_after_it_began():
    """The caller's sample must be all newer than the suspicion before it may be
    confirmed or its eviction signed: a verdict taken before says nothing of the cut that
    may have raised it, and one not taken yet may come after the grace ran out."""
    t = table("p0", "p1", "p2", "p3")
    t.reach_taken_since = 5.0  # the sample was taken from t=5 on
    assert t.probe_failed("p0", now=10.0)
    assert t.newest_unhealthy_at() == 10.0
    assert t.expired_suspicions(now=1000.0) == []  # grace long over; the sample predates it
    t.reach_taken_since = 11.0  # sampled again since
    assert t.expired_suspicions(now=1000.0) == ["p0"]
    # A confirmation heard from others waits the same way.
    assert t.probe_failed("p1", now=1001.0)
    assert t.apply(Update("p1", Status.CONFIRMED, 0), now=1002.0)
    assert t.due_evictions(now=5000.0) == ["p0"]
    t.reach_taken_since = 1001.5
    assert t.due_evictions(now=5001.0) == ["p1"]


def test_a_suspicion_held_on_others_word_for_long_is_probed_first_hand_once():
    """A second-hand suspicion whose suspecter dropped it may never reach its suspect:
    after ``HEARSAY_CHECK_TIMEOUTS`` base timeouts we probe the suspect ourselves (our
    probe carries the suspicion), once per suspicion; never while braking or cut off,
    where our failed probe would add the second signature an eviction across a cut
    lacks, and never for a suspicion of our own."""
    t = table(*[f"p{i}" for i in range(40)], timeout=5.0)
    age = HEARSAY_CHECK_TIMEOUTS * 5.0
    assert t.apply(Update("p1", Status.SUSPECT, 0, b"s", by="p2"), now=0.0)
    assert t.probe_failed("p3", now=0.0)  # ours: we probe it anyway
    assert t.stale_hearsay(now=age - 0.1) == []
    assert t.stale_hearsay(now=age) == ["p1"]
    assert t.stale_hearsay(now=age + 1.0) == []  # once
    # Refuted, then suspected again: a new suspicion, checked again in its turn.
    assert t.apply(Update("p1", Status.ALIVE, 1), now=20.0, proof_valid=True)
    assert t.apply(Update("p1", Status.SUSPECT, 1, b"s", by="p2"), now=21.0)
    t.observe_reach(True)
    assert t.stale_hearsay(now=21.0 + age) == []  # cut off
    t.cut_off = False
    for i in range(4, 10):  # more suspects than the brake allows
        t.apply(Update(f"p{i}", Status.SUSPECT, 0, b"s", by="p2"), now=21.0)
    assert t.braking()
    assert t.stale_hearsay(now=21.0 + age) == []
    for i in range(4, 10):
        t.apply(Update(f"p{i}", Status.ALIVE, 1), now=22.0, proof_valid=True)
    assert t.stale_hearsay(now=21.0 + age) == ["p1"]


def test_a_message_to_a_suspect_carries_our_suspicion_of_it():
    """Lifeguard's buddy system: the news budget may have run out while the suspect was
    unreachable; the suspicion still goes to the suspect itself, which can refute."""
    t = table(*[f"p{i}" for i in range(6)])
    t.sign_suspicion = lambda peer, incarnation: f"{peer}@{incarnation}".encode()
    t.probe_failed("p1", now=0.0)
    while t.piggyback():
        pass  # the budget runs out
    assert t.suspicion_of("p1") == Update("p1", Status.SUSPECT, 0, b"p1@0", by="me")
    assert t.suspicion_of("p2") is None  # alive
    t.apply(Update("p3", Status.SUSPECT, 0, b"by p4", by="p4"), now=0.0)
    assert t.suspicion_of("p3") == Update("p3", Status.SUSPECT, 0, b"by p4", by="p4")


def test_an_old_suspicion_of_us_sends_our_refutation_again():
    """A member that missed our refutation still holds the suspicion and shows it to us
    (buddy system): our refutation rides again, or the suspicion ran to an eviction."""
    t = table(*[f"p{i}" for i in range(6)])
    t.apply(Update("me", Status.SUSPECT, 0), now=0.0)
    alive = t.announce_alive(b"proof")
    while t.piggyback():
        pass
    assert not t.apply(Update("me", Status.SUSPECT, 0), now=5.0)
    assert t.incarnation == 1 and not t.refute_needed  # not outbid again: already above it
    assert t.piggyback() == [alive]


def test_a_cut_off_node_spreads_no_suspicion_but_still_shows_a_suspect_its_own():
    """What a cut-off node suspects is the cut's doing: spread, it outlived the cut and
    struck live members of the larger side after the heal."""
    t = table(*[f"p{i}" for i in range(8)])
    t.sign_suspicion = lambda peer, incarnation: b"ours"
    t.probe_failed("p1", now=0.0)
    t.observe_reach(True)
    assert t.piggyback() == []  # queued before the cut-off: withdrawn
    t.probe_failed("p2", now=1.0)
    t.apply(Update("p3", Status.SUSPECT, 0, b"theirs", by="p4"), now=1.0)
    assert t.piggyback() == []
    assert t.suspicion_to_publish("p2", connection_lost=True) is None
    assert t.suspicion_of("p2") == Update("p2", Status.SUSPECT, 0, b"ours", by="me")
    t.apply(Update("me", Status.SUSPECT, 0), now=2.0)  # our own refutation still goes out
    assert [u.status for u in t.piggyback()] == [] and t.refute_needed
    assert [u.status for u in (t.announce_alive(b"proof"), *t.piggyback())] == [
        Status.ALIVE, Status.ALIVE]

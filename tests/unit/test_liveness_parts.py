"""The failure detector's parts on a fake clock: the probe loop against a fake transport
(probe, indirect probe) and a fake node, local health, news, and the member list. The
same parts run over real libp2p in tests/integration/test_failure_detection.py."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

import pytest
import trio
import trio.testing
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from otela.liveness.events import EventLog
from otela.liveness.health import LocalHealth, pressure_floor
from otela.liveness.members import MemberList
from otela.liveness.news import OLD_SUSPICION_S, News, alive_payload, verify_alive
from otela.liveness.prober import DetectorConfig, Prober
from otela.liveness.rtt import RoundTrips
from otela.liveness.table import LivenessTable, Status, Update
from otela.liveness.watch import NeighbourWatch
from otela.mesh.listening import ConnectAnswer
from otela.registry import evidence
from otela.registry.records import Lifecycle, NodeRecord

from .registry_helpers import record

CONFIG = DetectorConfig(probe_interval=1.0, probe_timeout=1.0, stale_window=3.0,
                        suspicion_timeout=6.0)


class FakeTransport:
    """Peers in ``alive`` ack; ``helpers_blind`` helpers answer that they cannot reach the
    target; ``helpers_mute`` do not answer at all."""

    def __init__(self) -> None:
        self.alive: set[str] = set()
        self.helpers_blind: set[str] = set()
        self.helpers_mute: set[str] = set()
        self.refusing: set[str] = set()  # their addresses refuse connections: crashed
        self.probes: list[str] = []
        self.connects: list[str] = []  # plain TCP connects (reachability checks)

    async def probe(self, peer: str, timeout: float) -> bool:
        self.probes.append(peer)
        if peer in self.alive:
            return True
        await trio.sleep(timeout)
        return False

    async def probe_via(self, helper: str, target: str, timeout: float) -> bool | None:
        if helper in self.helpers_mute:
            await trio.sleep(timeout)
            return None
        return helper not in self.helpers_blind and target in self.alive

    async def turned_away(self, peer: str) -> bool:
        return peer in self.refusing

    async def reachability(self, peer: str) -> ConnectAnswer:
        self.connects.append(peer)
        if peer in self.alive:
            return "accepted"
        return "refused" if peer in self.refusing else "unknown"


class FakeNode:
    def __init__(self, peers: list[str]) -> None:
        self.registry = [record(p, 1, Lifecycle.SERVING, peer_id=p) for p in peers]
        self.gen = 1
        self.links = set(peers)
        self.evicted: list[tuple[str, str]] = []
        self.refuse_evictions = False  # as a replica does without a second signer
        self.addresses: dict[str, tuple[str, ...]] = {}

    def records(self) -> Iterable[NodeRecord]:
        return self.registry

    def generation(self) -> int:
        return self.gen

    def connected(self) -> set[str]:
        return set(self.links)

    def gossip_lag(self) -> float:
        return 0.0

    def learn_addresses(self, peers: dict[str, tuple[str, ...]],
                        touched: Collection[str] | None = None) -> None:
        self.addresses = dict(peers)

    async def evict(self, peer_id: str, reason: str) -> list[str]:
        self.evicted.append((peer_id, reason))
        if self.refuse_evictions:
            return []
        return [r.session_id for r in self.registry if r.peer_id == peer_id]


class Detector:
    """The parts wired as ``FailureDetector`` wires them, minus libp2p."""

    def __init__(self, peers: list[str], self_id: str = "me") -> None:
        self.stats: dict[str, int] = {k: 0 for k in (
            "probes", "suspected", "withheld", "evicted", "refuted", "brake_engaged",
            "cut_off_entered", "unwatched_checks", "unwatched_unreachable")}
        self.table = LivenessTable(self_id, CONFIG.suspicion_timeout,
                                   eviction_stagger=CONFIG.probe_interval)
        self.watch = NeighbourWatch()
        self.events = EventLog(clock=trio.current_time)
        self.health = LocalHealth(CONFIG.max_local_health, CONFIG.stale_window,
                                  CONFIG.probe_interval, on_change=self.table.scale_timeouts)
        self.rtt = RoundTrips(floor=CONFIG.probe_timeout, ceiling=CONFIG.stale_window)
        keys = create_new_key_pair()
        self.news = News(self_id, self.table, self.watch, self.health, self.events,
                         keys.private_key.sign, self.stats)
        self.members = MemberList(self_id, self.table, self.rtt, self.events)
        self.transport = FakeTransport()
        self.node = FakeNode(peers)
        self.prober = Prober(self_id, CONFIG, self.table, self.watch, self.health, self.news,
                             self.events, self.members, self.rtt, self.transport, self.node,
                             trio.current_time, self.stats,
                             host_pressure=lambda: None)  # not this machine's real load

    def event_kinds(self, peer: str) -> list[str]:
        return [e["event"] for e in self.events.events if e["peer_id"] == peer]


def run_for(seconds: float, detector: Detector) -> None:
    async def main() -> None:
        with trio.move_on_after(seconds):
            await detector.prober.run()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_period_that_raises_is_counted_and_detection_goes_on():
    d = Detector(["a", "b"])
    d.transport.alive = {"a", "b"}
    calls = [0]
    plain_probe = d.transport.probe

    async def flaky_probe(peer: str, timeout: float) -> bool:
        calls[0] += 1
        if calls[0] <= 3:
            raise KeyError("peer ID is expired")  # as py-libp2p's peerstore once did
        return await plain_probe(peer, timeout)

    d.transport.probe = flaky_probe  # type: ignore[method-assign]
    run_for(30, d)
    assert d.stats["period_errors"] == 3
    assert d.stats["probes"] >= 20 and d.node.evicted == []


def test_peers_that_ack_are_never_suspected():
    d = Detector(["a", "b", "c"])
    d.transport.alive = {"a", "b", "c"}
    run_for(60, d)
    assert d.table.suspected() == frozenset() and d.node.evicted == []
    assert set(d.transport.probes) == {"a", "b", "c"}
    assert d.stats["probes"] >= 50  # one per period
    assert d.node.addresses.keys() == {"a", "b", "c"}  # handed over for the peerstore


def test_a_helper_that_reaches_the_target_keeps_it_alive():
    d = Detector(["a", "b"])
    d.transport.alive = {"a", "b"}  # b reaches a...
    d.transport.probe = _never  # type: ignore[method-assign]  # ...though we cannot

    async def go() -> str:
        d.members.sync(d.node.records(), 1, trio.current_time())
        d.watch.observe({"a", "b"}, {"a", "b"}, {"a", "b"}, trio.current_time())
        return await d.prober.round("a")

    assert trio.run(go, clock=trio.testing.MockClock(autojump_threshold=0)) == "acked"
    assert d.table.suspected() == frozenset()


async def _never(peer: str, timeout: float) -> bool:
    await trio.sleep(timeout)
    return False


def test_a_dead_peer_is_suspected_confirmed_and_evicted():
    d = Detector(["a", "b", "c"])
    d.transport.alive = {"b", "c"}
    d.transport.helpers_blind = {"b", "c"}  # they answer, but cannot reach a either
    run_for(60, d)
    assert "a" in d.table.members and d.table.members["a"].status is Status.CONFIRMED
    assert [peer for peer, _ in d.node.evicted][:1] == ["a"]
    assert d.event_kinds("a")[:3] == ["suspected", "confirmed", "evicted"]
    assert d.stats["evicted"] >= 1 and d.health.score == 0


def test_an_eviction_refused_for_want_of_a_second_signer_publishes_our_suspicion():
    """A partition left one other member (b) on our side, and b does not watch a: our
    lone suspicion rides on probes only, the replica refuses the eviction (one signer of
    the two it needs), and without asking b to look, a stayed in routing for good. The
    refusal publishes our signed suspicion once, which the chosen verifiers probe."""
    d = Detector(["a", "b"])
    d.transport.alive = {"b"}
    d.transport.helpers_blind = {"b"}
    d.node.refuse_evictions = True
    published: list[list] = []

    async def main() -> None:
        async def collect() -> None:
            while True:
                await d.news.pending.wait()
                published.extend(d.news.take_broadcasts())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(collect)
            with trio.move_on_after(60):
                await d.prober.run()
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert d.node.evicted and d.node.evicted[0][0] == "a"
    suspicions = [u for u in published if u[0] == "a" and u[1] == "suspect"]
    assert len(suspicions) == 1 and suspicions[0][4] == "me"  # once, signed by us
    assert "corroborating" in d.event_kinds("a")


def test_a_member_confirmed_on_anothers_word_is_probed_first_hand_when_eviction_is_refused():
    """The other half of a partition's fix: b's signed suspicion of a reached us, we are
    not connected to a (nobody on our side watches it), and our timer confirmed it on b's
    word alone. Our eviction is refused (one signer); we must probe a ourselves, and our
    failed probe adds the second signature the eviction needs."""
    d = Detector(["a", "b"])
    d.node.links = {"b"}
    d.transport.alive = {"b"}
    d.transport.helpers_blind = {"b"}
    d.node.refuse_evictions = True
    d.table.sign_suspicion = lambda peer, incarnation: b"my proof"
    d.table.sync_members({"a", "b"}, 0.0)
    assert d.table.apply(Update("a", Status.SUSPECT, 0, b"b's proof", by="b"), 0.0)

    async def main() -> None:
        with trio.move_on_after(60):
            await d.prober.run()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert d.node.evicted and d.node.evicted[0][0] == "a"
    assert d.table.members["a"].status is Status.CONFIRMED
    assert "a" in d.transport.probes  # looked at it first-hand
    assert {by for by, _, _ in d.table.evidence_of("a")} == {"b", "me"}
    assert not d.table.unvouched("a")
    assert "verifying" in d.event_kinds("a")


def test_a_suspicion_says_how_saturated_our_host_was():
    d = Detector(["a", "b", "c"])
    d.transport.alive = {"b", "c"}
    d.transport.helpers_blind = {"b", "c"}
    d.prober.host_pressure = lambda: 87.4
    run_for(40, d)  # at 87 % the node probes and waits x4 (next test)
    raised = [e["detail"] for e in d.events.events if e["event"] == "suspected"]
    assert raised and raised[0].endswith("; host CPU pressure 87 %")
    d = Detector(["a", "b", "c"])  # a kernel without pressure information: nothing added
    d.transport.alive = {"b", "c"}
    d.transport.helpers_blind = {"b", "c"}
    d.prober.host_pressure = lambda: None
    run_for(10, d)
    raised = [e["detail"] for e in d.events.events if e["event"] == "suspected"]
    assert raised and "pressure" not in raised[0]


def test_a_grace_period_is_acted_on_when_it_runs_out_not_at_the_next_period():
    """Between probe rounds the loop wakes when a suspicion's grace runs out (and when
    an eviction it signs falls due): checking only at the end of each period added up
    to a period to every eviction."""
    d = Detector(["a", "b"])
    d.node.links = {"b"}  # a is gone (not probed here); b answers
    d.transport.alive = {"b"}

    async def main() -> None:
        d.members.sync(d.node.records(), d.node.gen, trio.current_time())
        d.table.apply(Update("a", Status.SUSPECT, 0, by="b"), now=-0.4)
        d.table.probe_failed("a", now=-0.4)  # both voices there can be: the 6 s grace
        with trio.move_on_after(12):
            await d.prober.run()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    first: dict[str, float] = {}
    for e in d.events.events:
        if e["peer_id"] == "a":
            first.setdefault(e["event"], e["at"])
    assert first["confirmed"] == pytest.approx(5.6)  # periods end at 6.0
    # Signed at once by the first-ranked suspecter, one stagger later by the second.
    assert first["evicted"] - first["confirmed"] in (pytest.approx(0.0), pytest.approx(1.0))
    assert d.health.score == 0 and d.health.late_at is None  # no wake-up counted as late


def test_a_peer_heard_from_recently_is_not_suspected():
    d = Detector(["a", "b"])
    d.transport.helpers_blind = {"b"}

    async def go() -> str:
        d.members.sync(d.node.records(), 1, trio.current_time())
        d.watch.observe({"a", "b"}, {"a", "b"}, {"a", "b"}, trio.current_time())
        d.table.heard_from("a", trio.current_time())  # it forwarded us gossip just now
        return await d.prober.round("a")

    assert trio.run(go, clock=trio.testing.MockClock(autojump_threshold=0)) == "silent"
    assert d.table.suspected() == frozenset()


def test_a_lost_neighbour_is_suspected_when_its_contact_window_runs_out():
    """Direct and indirect probes of a lost neighbour failed at 2.2 s, but it was heard
    from at 0 s: rather than probing it again a period later, the round waits for its
    3 s window to run out and suspects it then, unless it is heard from meanwhile. A
    neighbour still connected to us is not waited for (it gets another probe)."""

    def run_round(lost: bool, heard_at: float | None) -> tuple[str, float]:
        d = Detector(["a", "b"])
        d.transport.alive = {"b"}
        d.transport.helpers_blind = {"b"}

        async def go() -> tuple[str, float]:
            d.members.sync(d.node.records(), 1, trio.current_time())  # a heard at 0 s
            d.watch.observe({"a", "b"}, {"a", "b"}, {"a", "b"}, trio.current_time())
            if lost:
                d.watch.observe({"b"}, {"a", "b"}, {"a", "b"}, trio.current_time())
            await trio.sleep(1.2)
            outcome = ""
            async with trio.open_nursery() as nursery:
                if heard_at is not None:
                    async def hear() -> None:
                        await trio.sleep(heard_at - trio.current_time())
                        d.table.heard_from("a", trio.current_time())
                    nursery.start_soon(hear)
                outcome = await d.prober.round("a")  # its probes fail at 2.2 s
            return outcome, trio.current_time()

        return trio.run(go, clock=trio.testing.MockClock(autojump_threshold=0))

    outcome, at = run_round(lost=True, heard_at=None)
    assert outcome == "suspected" and at == pytest.approx(3.0, abs=0.01)
    assert run_round(lost=True, heard_at=2.5)[0] == "silent"  # it spoke meanwhile
    outcome, at = run_round(lost=False, heard_at=None)
    assert outcome == "silent" and at == pytest.approx(2.2)


def test_a_lost_neighbour_that_refuses_connections_is_suspected_at_once():
    """Its connection dropped and a new one is refused at every address: nothing listens
    there, so the round does not wait for its contact window (heard from 0.5 s ago). A
    lost neighbour that was merely silent (frozen, partitioned) still gets the window,
    and so does a connected one whatever its dials say."""

    def run_round(lost: bool, refusing: bool) -> tuple[str, float, str, list[str]]:
        d = Detector(["a", "b"])
        d.transport.alive = {"b"}
        d.transport.helpers_blind = {"b"}
        if refusing:
            d.transport.refusing = {"a"}

        async def go() -> tuple[str, float]:
            d.members.sync(d.node.records(), 1, trio.current_time())
            d.watch.observe({"a", "b"}, {"a", "b"}, {"a", "b"}, trio.current_time())
            await trio.sleep(0.5)
            d.table.heard_from("a", trio.current_time())
            if lost:
                d.node.links = {"b"}
                d.watch.observe({"b"}, {"a", "b"}, {"a", "b"}, trio.current_time())
            return await d.prober.round("a"), trio.current_time()

        outcome, at = trio.run(go, clock=trio.testing.MockClock(autojump_threshold=0))
        suspected = [e["detail"] for e in d.events.events if e["event"] == "suspected"]
        return outcome, at, suspected[0] if suspected else "", d.transport.probes

    outcome, at, why, probes = run_round(lost=True, refusing=True)
    # No libp2p dial waited out: the refusal answers the direct probe at once.
    assert outcome == "suspected" and at == pytest.approx(0.5, abs=0.01)
    assert "refused" in why and probes == []
    outcome, at, _, probes = run_round(lost=True, refusing=False)
    assert probes == ["a"]
    assert outcome == "silent" and at == pytest.approx(1.5, abs=0.01)  # heard 1 s ago
    assert run_round(lost=False, refusing=True)[0] == "silent"  # connected: not asked


def test_a_member_nobody_on_our_side_watches_is_found_and_evicted():
    """A partition put a's neighbours on the other side: we hold no connection to it and
    nobody publishes a suspicion of it. Our occasional TCP connect to an unwatched member
    goes unanswered, the full probe round fails (our neighbour b cannot reach it either),
    and it is evicted; c, also unwatched but reachable, only gets connects."""
    d = Detector(["a", "b", "c"])
    d.node.links = {"b"}
    d.transport.alive = {"b", "c"}
    d.transport.helpers_blind = {"b"}
    run_for(60, d)
    assert {peer for peer, _ in d.node.evicted} == {"a"}  # (the fake registry keeps it)
    assert d.event_kinds("a")[:3] == ["unreachable", "suspected", "confirmed"]
    assert d.event_kinds("c") == [] and "c" not in d.transport.probes
    assert {"a", "c"} <= set(d.transport.connects)
    assert d.stats["unwatched_unreachable"] >= 1


def test_unwatched_members_are_checked_rarely_and_neighbours_never():
    d = Detector(["a", "b", "c"])
    d.node.links = {"a"}
    d.transport.alive = {"a", "b", "c"}
    run_for(60.5, d)
    assert d.node.evicted == [] and d.table.suspected() == frozenset()
    # one connect every UNWATCHED_CHECK_PERIODS (10) periods, taking b and c in turn
    assert sorted(d.transport.connects) == ["b", "b", "b", "c", "c", "c"]
    assert set(d.transport.probes) == {"a"}
    full = Detector(["a", "b"])
    full.transport.alive = {"a", "b"}
    run_for(30, full)
    assert full.transport.connects == []  # everyone is a neighbour: nothing to check


def test_a_node_cut_off_from_most_members_knows_it_before_any_grace_runs_out():
    """Five of six members out of reach (a partition; the sixth, f, is on our side): the
    first suspicion's own period asks every member, so the node is cut off before that
    grace runs out, however slowly its probe rounds go, and evicts no one; once the five
    answer again it notices within a period and drops what the cut made it suspect."""
    d = Detector(["a", "b", "c", "d", "e", "f"])
    d.transport.alive, d.transport.helpers_mute = {"f"}, {"a", "b", "c", "d", "e"}
    seen: dict[str, float] = {}

    async def go() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(d.prober.run)
            while not d.table.suspected():
                await trio.sleep(0.05)
            seen["suspected"] = trio.current_time()
            while not d.table.cut_off:
                await trio.sleep(0.05)
            seen["cut off"] = trio.current_time()
            await trio.sleep(120)
            seen["suspects at the heal"] = len(d.table.suspected())
            d.transport.alive, d.transport.helpers_mute = set("abcdef"), set()
            healed = trio.current_time()
            while d.table.cut_off:
                await trio.sleep(0.05)
            seen["noticed"] = trio.current_time() - healed
            nursery.cancel_scope.cancel()

    trio.run(go, clock=trio.testing.MockClock(autojump_threshold=0))
    assert seen["cut off"] - seen["suspected"] < d.table.suspicion_timeout
    assert d.node.evicted == [] and d.stats["cut_off_entered"] == 1
    assert seen["suspects at the heal"] >= 3  # suspected, never confirmed
    assert seen["noticed"] <= 2 * CONFIG.probe_interval + CONFIG.stale_window
    assert d.table.suspected() == frozenset()


def test_a_lagging_node_accuses_nobody_and_evicts_nobody():
    d = Detector(["a"])

    async def go() -> str:
        d.members.sync(d.node.records(), 1, trio.current_time())
        d.watch.observe({"a"}, {"a"}, {"a"}, trio.current_time())
        await trio.sleep(10)
        d.health.slept(asked=1.0, took=2.0, now=trio.current_time())  # our loop woke late
        return await d.prober.round("a")

    assert trio.run(go, clock=trio.testing.MockClock(autojump_threshold=0)) == "silent"
    assert d.stats["withheld"] == 1 and d.table.suspected() == frozenset()


def test_a_node_with_nobody_to_ask_leaves_a_slow_peer_to_the_others():
    """A node that just joined holds one connection, to its bootstrap peer, which a join
    wave keeps too busy to answer: with no helper to ask, it cannot tell slow from dead,
    so it raises no suspicion while other members (who watch that peer and can ask each
    other) are alive. One that refuses connections is still suspected, and so is the
    only other member of a federation of two."""

    def run(peers: list[str], refusing: bool) -> Detector:
        d = Detector(peers)
        d.node.links = {"a"}  # our only connection; b and c are known from the registry
        d.transport.alive = set(peers) - {"a"}  # and answer when we connect to them
        if refusing:
            async def drop() -> None:  # its connection drops and its port refuses
                await trio.sleep(2.5)
                d.node.links = set()
                d.transport.refusing = {"a"}

            async def main() -> None:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(drop)
                    with trio.move_on_after(60):
                        await d.prober.run()
                    nursery.cancel_scope.cancel()

            trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
        else:
            run_for(60, d)
        return d

    d = run(["a", "b", "c"], refusing=False)
    assert d.table.suspected() == frozenset() and d.node.evicted == []
    assert d.stats["withheld"] >= 10 and d.stats["probes"] >= 10
    d = run(["a", "b", "c"], refusing=True)
    assert [peer for peer, _ in d.node.evicted][:1] == ["a"]
    d = run(["a"], refusing=False)
    assert [peer for peer, _ in d.node.evicted][:1] == ["a"]


def test_mute_helpers_make_a_node_doubt_itself_and_slow_down():
    d = Detector(["a", "b", "c"])
    d.transport.helpers_mute = {"b", "c"}

    async def go() -> None:
        d.members.sync(d.node.records(), 1, trio.current_time())
        d.watch.observe({"a", "b", "c"}, {"a", "b", "c"}, {"a", "b", "c"},
                        trio.current_time())
        await d.prober.round("a")

    trio.run(go, clock=trio.testing.MockClock(autojump_threshold=0))
    assert d.health.score == 1
    assert d.table.suspicion_timeout == 2 * CONFIG.suspicion_timeout  # scaled by health


def test_an_unhealthy_node_probes_less_often():
    healthy, unhealthy = Detector(["a"]), Detector(["a"])
    for d in (healthy, unhealthy):
        d.transport.alive = {"a"}
    unhealthy.health.score = 3  # probes every 4 periods' worth of time
    unhealthy.prober.health.better = lambda: None  # type: ignore[method-assign]
    run_for(40, healthy)
    run_for(40, unhealthy)
    assert healthy.stats["probes"] >= 3 * unhealthy.stats["probes"]


def test_local_health_is_bounded_and_scales_the_table():
    scaled: list[int] = []
    health = LocalHealth(maximum=2, stale_window=3.0, probe_interval=1.0,
                         on_change=scaled.append)
    for _ in range(5):
        health.worse()
    assert health.score == 2 and health.multiplier == 3 and scaled[-1] == 3
    health.better()
    health.better()
    health.better()
    assert health.score == 0
    health.slept(asked=1.0, took=1.4, now=10.0)
    assert not health.lagging(10.0)  # late by less than half a period: fine
    health.slept(asked=1.0, took=1.6, now=10.0)
    assert health.lagging(12.9) and not health.lagging(13.1)


def test_a_saturated_host_raises_the_multiplier_until_the_pressure_falls():
    assert [pressure_floor(p, 8) for p in (None, 0.0, 80.0, 85.0, 90.0, 99.0, 100.0, 130.0)] \
        == [0, 0, 0, 2, 4, 8, 8, 8]
    scaled: list[int] = []
    health = LocalHealth(maximum=8, stale_window=3.0, probe_interval=1.0,
                         on_change=scaled.append)
    health.worse()
    health.observe_host(50.0)  # busy, not saturated: our own evidence decides
    assert health.multiplier == 2 and scaled == [2]
    health.observe_host(90.0)
    assert health.multiplier == 5 and scaled[-1] == 5 and health.score == 1
    health.worse()  # our own score rises underneath the floor, and is kept
    health.observe_host(40.0)
    assert health.multiplier == 3 and scaled[-1] == 3


def test_on_a_saturated_host_a_node_probes_less_and_waits_longer_but_still_evicts():
    """Every peer looks slow from a saturated host, and probing is part of its load: the
    node probes at a ninth of the rate and gives a suspect nine times the grace. A peer
    that is really dead is still evicted, only later."""
    def dead_a(pressure: float | None) -> Detector:
        d = Detector(["a", "b", "c"])
        d.transport.alive = {"b", "c"}
        d.transport.helpers_blind = {"b", "c"}
        d.prober.host_pressure = lambda: pressure
        return d

    quiet, saturated = dead_a(20.0), dead_a(99.5)
    run_for(60, quiet)
    run_for(60, saturated)
    assert quiet.stats["probes"] >= 5 * saturated.stats["probes"] > 0
    assert saturated.table.suspicion_timeout == 9 * quiet.table.suspicion_timeout
    assert [p for p, _ in quiet.node.evicted][:1] == ["a"]
    assert saturated.node.evicted == [] and "a" in saturated.table.suspected()
    run_for(600, saturated := dead_a(99.5))
    assert [p for p, _ in saturated.node.evicted][:1] == ["a"]


# -- news -------------------------------------------------------------------------------


class Keyed:
    def __init__(self) -> None:
        keys = create_new_key_pair()
        self.sign = keys.private_key.sign
        self.peer_id = ID.from_pubkey(keys.public_key).to_base58()


def news_for(me: Keyed, peers: list[str], sessions: dict[str, str] | None = None,
             wall: Callable[[], float] = lambda: 1000.0
             ) -> tuple[News, LivenessTable, EventLog, dict]:
    stats = {"refuted": 0}
    table = LivenessTable(me.peer_id, 6.0)
    table.sync_members(set(peers), 0.0)
    events = EventLog(clock=lambda: 0.0)
    health = LocalHealth(8, 3.0, 1.0, on_change=table.scale_timeouts)
    news = News(me.peer_id, table, NeighbourWatch(), health, events, me.sign, stats,
                (sessions or {}).get, wall)
    return news, table, events, stats


SESSION = "0" * 40


def suspicion(by: Keyed, suspect: str, incarnation: int = 0, session: str = SESSION
              ) -> list:
    """A news item: ``by``'s signed suspicion of ``suspect``."""
    statement = evidence.sign(by.sign, by.peer_id, suspect, session, incarnation, 1000.0)
    return [suspect, "suspect", incarnation, statement.pack_proof(), by.peer_id]


def test_a_suspicion_of_another_member_counts_only_with_its_suspecters_signature():
    me, peer, liar, honest = Keyed(), Keyed(), Keyed(), Keyed()
    news, table, _, stats = news_for(me, [peer.peer_id, liar.peer_id, honest.peer_id],
                                     {peer.peer_id: SESSION})
    news.apply([peer.peer_id, "suspect", 0, None, liar.peer_id], 1.0, "x")  # unsigned
    forged = suspicion(liar, peer.peer_id)
    forged[4] = honest.peer_id  # liar's signature, claimed to be honest's statement
    news.apply(forged, 1.0, "x")
    news.apply(suspicion(liar, peer.peer_id, session="1" * 40), 1.0, "x")  # another session
    assert table.suspected() == frozenset() and stats["unsigned_suspicions"] == 3
    news.apply(suspicion(honest, peer.peer_id), 1.0, "x")
    assert table.suspected() == {peer.peer_id}
    assert [by for by, _, _ in table.evidence_of(peer.peer_id)] == [honest.peer_id]


def test_only_the_peers_own_signature_refutes_a_suspicion():
    me, peer, forger = Keyed(), Keyed(), Keyed()
    news, table, events, stats = news_for(me, [peer.peer_id])
    news.apply(suspicion(forger, peer.peer_id), 1.0, "x")
    assert peer.peer_id in table.suspected()
    forged = forger.sign(alive_payload(peer.peer_id, 1))
    news.apply([peer.peer_id, "alive", 1, forged, None], 2.0, "x")
    assert peer.peer_id in table.suspected()  # a forged refutation changes nothing
    genuine = peer.sign(alive_payload(peer.peer_id, 1))
    assert verify_alive(Update(peer.peer_id, Status.ALIVE, 1, genuine))
    news.apply([peer.peer_id, "alive", 1, genuine, None], 3.0, "x")
    assert table.suspected() == frozenset() and stats["refuted"] == 1
    assert [e["event"] for e in events.events] == ["suspected", "refuted"]


def test_a_published_suspicion_of_us_is_refuted_loudly_with_a_signed_alive():
    me, peer = Keyed(), Keyed()
    news, _table, _, _ = news_for(me, [peer.peer_id])

    async def go() -> list:
        news.receive([[me.peer_id, "suspect", 0, None, peer.peer_id]], 1.0, peer.peer_id,
                     published=True)
        assert news.pending.is_set()
        return news.take_broadcasts()

    published = trio.run(go)
    assert len(published) == 1
    peer_id, status, incarnation, proof, _ = published[0]
    assert (peer_id, status, incarnation) == (me.peer_id, "alive", 1)
    assert verify_alive(Update(peer_id, Status.ALIVE, incarnation, proof))


def test_a_quiet_suspicion_of_us_is_refuted_on_probes_only():
    me, peer = Keyed(), Keyed()
    news, _table, _, _ = news_for(me, [peer.peer_id])

    async def go() -> tuple[list, list]:
        news.receive([[me.peer_id, "suspect", 0, None, peer.peer_id]], 1.0, peer.peer_id)
        return news.take_broadcasts(), news.piggyback()

    published, piggybacked = trio.run(go)
    assert published == []
    assert any(u[0] == me.peer_id and u[1] == "alive" for u in piggybacked)


def test_around_a_cut_a_quiet_suspicion_of_us_is_refuted_loudly_too():
    """While cut off, and for the first refutation after, a suspicion heard on a probe is
    refuted on the liveness topic: the other side of the cut may hold it (its news budget
    ran out during the cut), and a refutation on probes alone reached suspecters too late
    (300 simulated nodes, 84 cut off for 60 s: ~50 live nodes evicted after the heal)."""
    me, peer = Keyed(), Keyed()
    news, table, _, _ = news_for(me, [peer.peer_id])

    def refuted_on_the_topic(incarnation: int) -> bool:
        async def go() -> list:
            news.receive([[me.peer_id, "suspect", incarnation, None, peer.peer_id]], 1.0,
                         peer.peer_id)
            return news.take_broadcasts()
        return [u[:3] for u in trio.run(go)] == [[me.peer_id, "alive", incarnation + 1]]

    table.observe_reach(True)
    assert refuted_on_the_topic(0)  # cut off: loudly
    table.observe_reach(False)
    assert table.refute_loudly
    assert refuted_on_the_topic(1)  # the first after the cut: loudly
    assert not table.refute_loudly
    assert not refuted_on_the_topic(2)  # then on probes only, as before the cut


def test_an_old_suspicion_of_us_is_refuted_loudly_a_fresh_one_on_probes():
    """A suspicion signed ``OLD_SUSPICION_S`` ago (its statement says when) has been
    passing from member to member all that while, and a refutation on probes trails it:
    it is published (300 simulated nodes, 112 cut off for 60 s: suspicions made on the cut
    side struck live members in waves of 100-200 holders for 97 s after the heal). A fresh
    false alarm stays on probes, as each costs every node a message when published."""
    me, suspecter, relay = Keyed(), Keyed(), Keyed()
    clock = [1000.0]
    news, table, _, _ = news_for(me, [suspecter.peer_id, relay.peer_id],
                                 wall=lambda: clock[0])

    def refuted_on_the_topic(incarnation: int) -> bool:
        async def go() -> list:
            news.receive([suspicion(suspecter, me.peer_id, incarnation)], 1.0, relay.peer_id)
            return news.take_broadcasts()
        published = trio.run(go)
        assert table.incarnation == incarnation + 1  # refuted either way
        return [u[:3] for u in published] == [[me.peer_id, "alive", incarnation + 1]]

    clock[0] = 1000.0 + OLD_SUSPICION_S - 0.1
    assert not refuted_on_the_topic(0)
    clock[0] = 1000.0 + OLD_SUSPICION_S
    assert refuted_on_the_topic(1)


def test_a_suspicion_we_refuted_long_ago_gets_our_refutation_published_again_now_and_then():
    """An old suspicion still passed on ``OLD_SUSPICION_S`` after we refuted it means our
    refutation missed members, and each that takes it up passes it on: the refutation we
    made is published again, signed as it was, at most every ``OLD_SUSPICION_S``. Copies
    that arrive soon after the refutation are the epidemic it is still overtaking."""
    me, peer = Keyed(), Keyed()
    news, table, _, _ = news_for(me, [peer.peer_id])

    def told_old_suspicion(at: float) -> list:
        async def go() -> list:
            news.receive([[me.peer_id, "suspect", 0, None, peer.peer_id]], at, peer.peer_id)
            return news.take_broadcasts()
        return trio.run(go)

    assert told_old_suspicion(1.0) == []  # refuted on probes
    assert table.incarnation == 1
    assert told_old_suspicion(2.0) == []  # soon after: the refutation is on its way
    republished = told_old_suspicion(1.0 + OLD_SUSPICION_S)
    assert [u[:3] for u in republished] == [[me.peer_id, "alive", 1]]
    assert verify_alive(Update(me.peer_id, Status.ALIVE, 1, republished[0][3]))
    assert told_old_suspicion(1.0 + OLD_SUSPICION_S * 1.5) == []
    assert len(told_old_suspicion(1.0 + OLD_SUSPICION_S * 2)) == 1
    assert table.incarnation == 1  # an old suspicion never raises it again


def test_a_published_suspicion_is_verified_first_hand():
    me, suspect, other = Keyed(), Keyed(), Keyed()
    news, _table, events, _ = news_for(me, [suspect.peer_id, other.peer_id])
    news.watch.observe({other.peer_id}, {suspect.peer_id, other.peer_id},
                       {suspect.peer_id, other.peer_id}, 0.0)
    news.apply(suspicion(other, suspect.peer_id), 1.0, other.peer_id, published=True)
    # With three members every one is among the verifiers: probe it next, connected or not.
    assert news.watch.next_target(2.0) == suspect.peer_id
    assert "verifying" in [e["event"] for e in events.events]


def test_a_published_suspicion_that_reaches_a_verifier_only_on_a_probe_is_verified():
    """GossipSub delivers a publication to its mesh only, and a mesh around one hub flaps
    (py-libp2p B2): a node of three that missed the hub's published suspicion never
    probed the killed node, whose eviction then waited ~40 s for a second signer. The
    suspicion also rides on the hub's probes, marked as published."""
    me, suspect, hub = Keyed(), Keyed(), Keyed()
    peers = [suspect.peer_id, me.peer_id]
    hub_news, hub_table, _, _ = news_for(hub, peers, {suspect.peer_id: SESSION})
    hub_table.sign_suspicion = lambda peer, incarnation: evidence.sign(
        hub.sign, hub.peer_id, peer, SESSION, incarnation, 1000.0).pack_proof()
    hub_table.probe_failed(suspect.peer_id, 1.0)
    assert hub_news.publish_suspicion(suspect.peer_id, connection_lost=True)
    items = hub_news.piggyback()
    marks = hub_news.published_among(items)
    assert [items[i][:3] for i in marks] == [[suspect.peer_id, "suspect", 0]]

    def verified(marks: object) -> bool:
        news, _table, events, _ = news_for(me, [suspect.peer_id, hub.peer_id],
                                           {suspect.peer_id: SESSION})
        news.receive(items, 2.0, hub.peer_id, marks=marks)
        assert suspect.peer_id in news.table.suspected()
        return "verifying" in [e["event"] for e in events.events]

    assert verified(marks)
    # Unmarked (a lone suspicion of a slow peer) it only spreads; marks that are not a
    # short list of indices are ignored, never an error.
    for garbage in (None, [], "0", {"0": 1}, [True], [-1], [10**9], [0.0], list(range(999))):
        assert not verified(garbage), garbage


def test_garbage_news_is_ignored():
    me = Keyed()
    news, table, _, _ = news_for(me, ["p"])
    for item in (None, [], ["p"], ["p", "nonsense", 0, None, None], ["p", "alive", "x", 1, 2]):
        news.apply(item, 1.0, "x")
    assert table.suspected() == frozenset()


def test_news_that_is_not_a_list_is_dropped_and_counted():
    """A map, number or string where the list of news belongs crashed the node
    (``TypeError`` looping over it, on the liveness topic's receiving task)."""
    me, peer = Keyed(), Keyed()
    news, table, _, stats = news_for(me, [peer.peer_id])
    for items in (7, 1.5, {"a": 1}, "suspect", b"x", True,
                  [[peer.peer_id, "suspect", 0, None, "x"]] * 1000):
        news.receive(items, 1.0, "x", published=True)
    assert stats["malformed_news"] == 7
    assert table.suspected() == frozenset()


def test_incarnations_that_cannot_be_encoded_are_ignored():
    """inf/nan raised OverflowError/ValueError out of ``apply``; 2**64 - 1 was accepted and
    a suspicion of us at it made our refutation 2**64, which msgpack cannot encode: every
    probe and ack we sent afterwards failed."""
    import msgpack

    me, peer = Keyed(), Keyed()
    news, table, _, _ = news_for(me, [peer.peer_id])
    for incarnation in (float("inf"), float("nan"), 2**63, 2**64 - 1, -1, 1e300, "3",
                        2**63 - 1):  # a suspicion at the top could never be refuted
        news.apply([me.peer_id, "suspect", incarnation, None, peer.peer_id], 1.0, "x")
        news.apply([peer.peer_id, "suspect", incarnation, None, "x"], 1.0, "x")
    assert table.incarnation == 0 and table.suspected() == frozenset()
    news.apply([me.peer_id, "suspect", 2**63 - 2, None, peer.peer_id], 1.0, "x")
    assert table.incarnation == 2**63 - 1
    msgpack.packb({"u": news.piggyback()})  # still encodable
    # ... and our refutation at the top is accepted by others.
    other_news, other_table, _, _ = news_for(peer, [me.peer_id])
    other_news.apply(suspicion(Keyed(), me.peer_id, 2**63 - 2), 1.0, "x")
    assert me.peer_id in other_table.suspected()
    alive = [me.peer_id, "alive", 2**63 - 1, me.sign(alive_payload(me.peer_id, 2**63 - 1)),
             None]
    other_news.apply(alive, 2.0, "x")
    assert other_table.suspected() == frozenset()


def test_published_suspicions_of_strangers_or_made_up_incarnations_are_not_kept():
    me, peer = Keyed(), Keyed()
    news, table, _, _ = news_for(me, [peer.peer_id])
    for i in range(5000):
        news.apply([f"stranger-{i}", "suspect", i, None, "x"], 1.0, "x", published=True)
        news.apply([peer.peer_id, "suspect", i, None, "x"], 1.0, "x", published=True)
    assert len(table.published) <= 4 * len(table.members) + 65


# -- the member list --------------------------------------------------------------------


def test_members_follow_the_registry_and_a_rejoin_starts_afresh():
    table = LivenessTable("me", 6.0)
    events = EventLog(clock=lambda: 0.0)
    members = MemberList("me", table, RoundTrips(floor=1.0, ceiling=3.0), events)
    first = [record("a", 1, Lifecycle.SERVING, peer_id="a"),
             record("b", 1, Lifecycle.LEFT, peer_id="b"),
             record("me", 1, Lifecycle.SERVING, peer_id="me")]
    assert members.sync(first, 1, 0.0) == {"a": ()}
    assert members.sync(first, 1, 1.0) is None  # unchanged registry: no work
    assert set(table.members) == {"a"}
    table.probe_failed("a", 2.0)
    assert "a" in table.suspected()
    rejoined = [*first, record("a2", 1, Lifecycle.SERVING, peer_id="a")]
    members.sync(rejoined, 2, 3.0)
    assert table.members["a"].status is Status.ALIVE  # a new session starts afresh


def test_a_peer_whose_addresses_expired_is_asked_at_its_registry_addresses() -> None:
    # host.connect stores a dialled peer's addresses with a 120 s TTL, and py-libp2p's
    # peerstore raises once they expire: the check that a dropped neighbour's addresses
    # refuse connections raised out of the detector and stopped a node of a 128-node
    # federation. The registry's addresses are put back instead; with none known, no
    # verdict.
    import multiaddr
    from libp2p.peer.peerstore import PeerStore

    from otela.liveness.detector import _SwimTransport

    class Host:
        def __init__(self) -> None:
            self.store = PeerStore()

        def get_peerstore(self) -> PeerStore:
            return self.store

    refusing = multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/1")
    peer = ID.from_pubkey(create_new_key_pair().public_key)
    host = Host()
    host.store.add_addrs(peer, [refusing], ttl=120)
    host.store.peer_data_map[peer].last_identified -= 600  # dialled 10 minutes ago
    unknown = ID.from_pubkey(create_new_key_pair().public_key).to_base58()
    registry = {peer.to_base58(): [refusing]}
    transport = _SwimTransport(channels=None, host=host,  # type: ignore[arg-type]
                               addresses_of=lambda p: registry.get(p, []))

    async def ask() -> list[bool]:
        return [await transport.turned_away(peer.to_base58()),
                await transport.turned_away(unknown)]

    assert trio.run(ask) == [True, False]
    assert host.store.addrs(peer) == [refusing]  # back in the peerstore, for dials too


def test_a_suspect_hears_our_suspicion_in_our_next_message_and_refutes_in_its_answer():
    """The buddy system end to end with real signatures: the suspicion's news budget ran
    out while the suspect was unreachable (a partition); the first probe that reaches it
    carries the suspicion anyway, and its ack carries the refutation back."""
    me, suspect, other = Keyed(), Keyed(), Keyed()
    ours, table, _, _ = news_for(me, [suspect.peer_id, other.peer_id],
                                 {suspect.peer_id: SESSION})
    theirs, their_table, _, _ = news_for(suspect, [me.peer_id, other.peer_id])
    ours.apply(suspicion(other, suspect.peer_id), 1.0, "x")
    while ours.piggyback():
        pass  # budget spent while the suspect was unreachable
    assert ours.piggyback(to=other.peer_id) == []  # only the suspect is shown it
    probe = ours.piggyback(to=suspect.peer_id)
    assert [item[:3] for item in probe] == [[suspect.peer_id, "suspect", 0]]
    theirs.receive(probe, 2.0, me.peer_id)
    ack = theirs.piggyback(to=me.peer_id)
    ours.receive(ack, 2.1, suspect.peer_id)
    assert table.suspected() == frozenset() and their_table.incarnation == 1
    # A member that missed that refutation shows its old suspicion again: the answer
    # carries the refutation again, without outbidding anything more.
    while theirs.piggyback():
        pass
    theirs.receive([suspicion(other, suspect.peer_id)], 3.0, other.peer_id)
    again = theirs.piggyback(to=other.peer_id)
    assert [item[:3] for item in again] == [[suspect.peer_id, "alive", 1]]

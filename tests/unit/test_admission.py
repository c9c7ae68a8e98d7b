"""The ingress queue (``otela.routing.admission``) on trio's virtual clock: waiting for
room, priority order on release, deadlines with Retry-After, clients that leave, a full
queue, and the class and wait a request may ask for."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import trio
import trio.testing

from otela.dataplane.errors import RequestError
from otela.metrics import Registry
from otela.routing.admission import AdmissionQueue, Flow, QueueSettings, flow_of

SETTINGS = QueueSettings(("interactive", "default", "batch"), "default", timeout=30,
                         max_timeout=600, depth=100, starvation_s=10)


class Slots:
    """A model's room: ``total`` requests at once; ``running`` now."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.running = 0

    def fits(self, reserved: int) -> bool:
        return self.running + reserved < self.total


def test_requests_wait_for_room_and_go_in_class_order() -> None:
    queue = AdmissionQueue(SETTINGS, Registry())
    slots = Slots(1)
    slots.running = 1
    order: list[str] = []

    async def client(name: str, klass: int, delay: float) -> None:
        await trio.sleep(delay)
        await queue.wait_turn("m", klass, Flow(name, 1, name, 1), 10, 30, slots.fits)
        slots.running += 1
        order.append(name)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client, "bulk", 2, 0)
            nursery.start_soon(client, "normal", 1, 0.01)
            nursery.start_soon(client, "urgent", 0, 0.02)
            await trio.sleep(1)
            assert order == [] and queue.waiting() == {
                "m": {"interactive": 1, "default": 1, "batch": 1}}
            for _ in range(3):  # one request ends at a time
                slots.running -= 1
                queue.released()
                await trio.sleep(0.5)
        assert order == ["urgent", "normal", "bulk"]

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_deadline_gives_429_with_retry_after_and_a_leaving_client_is_dropped() -> None:
    metrics = Registry()
    queue = AdmissionQueue(SETTINGS, metrics)
    full = Slots(0)

    async def main() -> None:
        with pytest.raises(RequestError) as caught:
            await queue.wait_turn("m", 1, Flow(), 10, 5, full.fits)
        assert caught.value.status == 429 and caught.value.code == "queue_timeout"
        assert int((caught.value.headers or {})["Retry-After"]) >= 1
        with trio.move_on_after(1):  # the client hangs up: the handler is cancelled
            await queue.wait_turn("m", 1, Flow(), 10, 30, full.fits)
        assert queue.waiting() == {}

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    text = metrics.render().decode()
    assert 'otela_queue_requests_total{model="m",priority="default",outcome="timeout"} 1' \
        in text
    assert 'otela_queue_requests_total{model="m",priority="default",outcome="left"} 1' in text
    assert 'otela_queue_requests{model="m",priority="default"} 0' in text


def test_a_full_queue_refuses_at_once() -> None:
    queue = AdmissionQueue(QueueSettings(("default",), "default", 30, 600, 2, 10), Registry())
    full = Slots(0)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(2):
                nursery.start_soon(lambda: queue.wait_turn("m", 0, Flow(), 1, 30, full.fits))
            await trio.sleep(0.1)
            with pytest.raises(RequestError) as caught:
                await queue.wait_turn("m", 0, Flow(), 1, 30, full.fits)
            assert caught.value.status == 429 and caught.value.code == "queue_full"
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_granted_request_that_leaves_before_it_is_sent_frees_its_place() -> None:
    queue = AdmissionQueue(SETTINGS, Registry())
    slots = Slots(1)
    slots.running = 1

    async def main() -> None:
        got: list[str] = []

        async def client(name: str) -> None:
            await queue.wait_turn("m", 1, Flow(name, 1, name, 1), 10, 30, slots.fits)
            got.append(name)

        async with trio.open_nursery() as nursery:
            first = trio.CancelScope()

            async def leaver() -> None:
                with first:
                    await client("first")

            nursery.start_soon(leaver)
            await trio.sleep(0.01)
            nursery.start_soon(client, "second")
            await trio.sleep(0.01)
            slots.running = 0
            first.cancel()  # the client of "first" hangs up, and before its handler
            queue.dispatch("m")  # runs again "first" is granted (reserved): its place
            # must go to "second" rather than stay reserved for nobody
        assert got == ["second"]
        assert queue.reserved == {}

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_the_class_and_wait_a_request_may_ask_for() -> None:
    queue = AdmissionQueue(SETTINGS, Registry())
    assert queue.class_of(None) == 1
    assert queue.class_of("Interactive") == 0
    assert queue.class_of("interactive", best_allowed="default") == 1  # the key's best
    assert queue.class_of("batch", best_allowed="default") == 2
    with pytest.raises(RequestError) as caught:
        queue.class_of("vip")
    assert caught.value.status == 400 and caught.value.code == "invalid_priority"
    assert queue.timeout_of(None) == 30
    assert queue.timeout_of("5") == 5
    assert queue.timeout_of("99999") == 600
    assert queue.timeout_of("100", key_max=60) == 60
    with pytest.raises(RequestError):
        queue.timeout_of("soon")
    with pytest.raises(ValueError):
        QueueSettings(("a", "b"), "c", 1, 1, 1, 1)


def test_keys_map_to_team_and_key_shares() -> None:
    assert flow_of(None) == Flow()
    assert flow_of(SimpleNamespace(id="k1", team=None, weight=2.0)) == \
        Flow("key:k1", 2.0, "k1", 1.0)
    assert flow_of(SimpleNamespace(id="k1", team="lab", team_weight=3.0, weight=2.0)) == \
        Flow("team:lab", 3.0, "k1", 2.0)


def test_a_nodes_room_keeps_a_reserve_for_the_best_class() -> None:
    from otela.routing.load import NodeLoad, parse_load

    node = NodeLoad(in_flight=0, slots=20)
    assert node.room(17) == 3 and node.room(17, held_back=0.1) == 1  # 2 slots held back
    assert node.room(19, held_back=0.1) == 0
    assert NodeLoad(slots=2).room(1, held_back=0.1) == 1  # a tenth of 2 rounds down to 0
    assert NodeLoad(slots=4, kv_usage=0.99).room(0) == 0  # its KV cache is full
    assert NodeLoad().room(1_000) == float("inf")  # declares no limit
    assert parse_load(NodeLoad(in_flight=3, slots=64).header()) == NodeLoad(3, slots=64)
    assert AdmissionQueue(SETTINGS).held_back(0) == 0
    reserved = AdmissionQueue(QueueSettings(("a", "b"), "b", 1, 1, 1, 1, reserve=0.25))
    assert reserved.held_back(0) == 0 and reserved.held_back(1) == 0.25


def test_the_routers_room_counts_requests_in_flight_and_granted_ones() -> None:
    import types

    from otela.config import NodeConfig
    from otela.registry.records import Lifecycle
    from otela.registry.store import Registry as Replica
    from otela.routing.ask import Ask
    from otela.routing.load import NodeLoad
    from otela.routing.router import Router, routing_settings
    from otela.routing.trust import ANY
    from tests.unit.registry_helpers import entry

    replica = Replica()
    sessions = []
    for name in ("a", "b"):
        made = entry(name, state=Lifecycle.SERVING)
        replica.apply(made, 1000.0)
        sessions.append(made.key)
    router = Router(replica, types.SimpleNamespace(self_session=lambda: "us"),
                    routing_settings(NodeConfig()), own_load=lambda: None,
                    clock=lambda: 1000.0)
    ask = Ask(ANY)
    assert router.room("m", ask)  # nothing declares a concurrency: always room
    for session in sessions:
        router.loads.report(session, NodeLoad(in_flight=0, slots=2), 1000.0)
    router.busy[sessions[0]] = 2  # full
    router.busy[sessions[1]] = 1  # one slot left
    assert router.room("m", ask) and router.room("m", ask, reserved=0)
    assert not router.room("m", ask, reserved=1)  # that slot is granted already
    router.loads.report(sessions[1], NodeLoad(in_flight=2, slots=2), 1000.0)
    assert not router.room("m", ask)  # its report says other ingresses filled it
    assert router.room("other-model", ask)  # no node serves it: routing says why


def test_many_waiters_cost_one_room_check_per_poll_not_one_each() -> None:
    """A full model with 40 waiters (two groups: the same nodes and share of their slots):
    the queue polls room once per POLL_S for all of them, one check per group, instead
    of every waiter checking every waiter's room on every wake-up (which had a busy
    ingress spend an eighth of its time here, and its interactive requests waiting on
    it). When room frees, they still go in order, one per free slot."""
    from otela.routing.admission import POLL_S

    queue = AdmissionQueue(SETTINGS, Registry())
    slots = Slots(1)
    slots.running = 1
    checks = 0
    order: list[int] = []

    def fits(reserved: int) -> bool:
        nonlocal checks
        checks += 1
        return slots.fits(reserved)

    arrivals: list[int] = []

    async def client(number: int) -> None:
        arrivals.append(number)  # wait_turn queues it before its first checkpoint
        await queue.wait_turn("m", 1, Flow("t", 1, f"k{number % 2}", 1), 10, 30, fits,
                              group=("default", number % 2))
        slots.running += 1
        order.append(number)

    async def main() -> None:
        nonlocal checks
        async with trio.open_nursery() as nursery:
            for number in range(40):
                nursery.start_soon(client, number)
            await trio.sleep(1)  # everyone queued and polled for a while
            checks = 0
            await trio.sleep(10 * POLL_S)
            assert checks <= 2 * 11, checks  # one check per group per poll
            for _ in range(40):
                slots.running -= 1
                queue.released()
                await trio.sleep(0.01)
        assert sorted(order) == list(range(40))
        for key in (0, 1):  # each key's requests in arrival order
            assert [n for n in order if n % 2 == key] == [n for n in arrivals if n % 2 == key]
        assert all(a % 2 != b % 2 for a, b in itertools.pairwise(order)), order  # alternate

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))

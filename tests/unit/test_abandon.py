"""Giving up on a node that fails while a request waits on it (otela.routing.abandon)."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from otela.registry.records import Lifecycle
from otela.registry.store import Registry
from otela.routing.abandon import (
    POLL_S,
    FailedWhileWaiting,
    NodeWatch,
    failed_sessions,
    unless_failed,
)

from .registry_helpers import entry, sid


def test_failed_sessions_are_the_suspected_the_no_longer_serving_and_the_unknown() -> None:
    registry = Registry()
    for name, state in (("up", Lifecycle.SERVING), ("frozen", Lifecycle.SERVING),
                        ("down", Lifecycle.DOWN), ("left", Lifecycle.LEFT)):
        registry.apply(entry(name, 2, state), 1000.0)
    waited = [sid(n) for n in ("up", "frozen", "down", "left", "unknown")]
    assert failed_sessions(waited, registry, {"peer-frozen"}) == waited[1:]


def test_only_requests_on_a_failed_node_are_woken_and_the_watch_forgets_the_finished() -> None:
    watch = NodeWatch()
    with watch.waiting_on("a") as on_a, watch.waiting_on("b") as on_b:
        assert watch.someone_waits.is_set() and sorted(watch.waited_on()) == ["a", "b"]
        watch.notice({"a", "c"})
        assert on_a.is_set() and not on_b.is_set()
        with watch.waiting_on("a") as again:  # a new wait on a failed node starts afresh
            assert not again.is_set()
    assert watch.waited_on() == [] and not watch.someone_waits.is_set()


def test_unless_failed_returns_raises_and_gives_up() -> None:
    trio.run(_unless_failed_cases)


async def _unless_failed_cases() -> None:
    async def answer() -> str:
        return "reply"

    async def breaks() -> str:
        raise ValueError("broken")

    async def hangs() -> str:
        await trio.sleep_forever()
        raise AssertionError

    event = trio.Event()
    assert await unless_failed(event, answer) == "reply"
    with pytest.raises(ValueError, match="broken"):  # as it is, not in an exception group
        await unless_failed(event, breaks)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _set_later(event))
        with pytest.raises(FailedWhileWaiting):
            await unless_failed(event, hangs)
    with trio.move_on_after(0.1) as outer:  # the caller's own cancellation stays its own
        await unless_failed(trio.Event(), hangs)
    assert outer.cancelled_caught


async def _set_later(event: trio.Event) -> None:
    await trio.sleep(0.05)
    event.set()


def test_the_watch_polls_only_while_someone_waits() -> None:
    trio.run(_polls_only_while_someone_waits)


async def _polls_only_while_someone_waits() -> None:
    watch = NodeWatch()
    asked: list[list[str]] = []

    def failed(sessions: list[str]) -> list[str]:
        asked.append(sorted(sessions))
        return ["x"]

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch.run, failed)
        await trio.sleep(3 * POLL_S)
        assert asked == []  # idle: never polled
        with watch.waiting_on("x") as on_x:
            with trio.fail_after(3 * POLL_S):
                await on_x.wait()
        polls = len(asked)
        await trio.sleep(3 * POLL_S)
        assert len(asked) <= polls + 1 and asked[0] == ["x"]
        nursery.cancel_scope.cancel()


def test_a_guarded_wait_is_cancelled_when_its_node_fails_and_another_could_take_it() -> None:
    async def main() -> None:
        watch = NodeWatch()
        answered = []

        async def wait_on(session: str, give_up: bool, answer_after: float) -> None:
            with watch.guard(session, lambda: give_up) as guard:
                await trio.sleep(answer_after)
                answered.append(session)
            assert guard.failed == (session == "failing"), session

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait_on, "failing", True, 10.0)
            nursery.start_soon(wait_on, "kept", False, 2.0)  # nobody else: it waits on
            nursery.start_soon(wait_on, "fine", True, 1.0)
            await trio.sleep(0.5)
            assert sorted(watch.waited_on()) == ["failing", "fine", "kept"]
            watch.notice({"failing", "kept"})
        assert sorted(answered) == ["fine", "kept"]
        assert watch.waited_on() == [] and not watch.someone_waits.is_set()
        assert trio.current_time() == pytest.approx(2.0)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))

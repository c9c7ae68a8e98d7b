"""The ingress's waiting room for scale to zero (``otela.routing.hold``), in process: a
held request is routed once a node serves, or gets 503 with Retry-After."""

from __future__ import annotations

import pytest
import trio

from otela.dataplane.errors import RequestError
from otela.metrics import Registry as Metrics
from otela.registry.records import Lifecycle
from otela.registry.store import Registry
from otela.routing.hold import HoldRoom, route_or_hold
from tests.unit.registry_helpers import entry

NOW = 1000.0
EMPTY = Registry()  # a replica in which nothing serves


def in_trio(test):
    """Run an async test under trio (the project has no pytest plugin for it)."""
    def run() -> None:
        trio.run(test)
    run.__name__ = test.__name__
    return run


def no_node(model: str) -> RequestError:
    return RequestError(404, f"no {model}", code="model_not_found")


@in_trio
async def test_a_held_request_is_routed_once_a_node_serves():
    registry, metrics = Registry(), Metrics()
    room = HoldRoom(["cold-*"], timeout=10, capacity=4, registry=lambda: registry,
                    metrics=metrics)
    calls = []

    async def route() -> str:
        calls.append(trio.current_time())
        if not registry.serving_candidates("cold-a"):
            raise no_node("cold-a")
        return "routed"

    async def serve_later() -> None:
        await trio.sleep(0.5)
        assert room.held.values[("cold-a",)] == 1
        assert b'otela_held_requests{model="cold-a"} 1' in metrics.render()
        registry.apply(entry("n", 2, Lifecycle.SERVING, models=("cold-a",)), NOW)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_later)
        assert await route_or_hold(room, "cold-a", route) == "routed"
    assert len(calls) == 2 and calls[1] - calls[0] >= 0.5
    assert room.held.values[("cold-a",)] == 0
    assert room.outcomes.values[("cold-a", "served")] == 1


@in_trio
async def test_a_held_request_times_out_with_retry_after():
    room = HoldRoom(["cold-*"], timeout=0.3, capacity=4, registry=lambda: EMPTY)

    async def route() -> str:
        raise no_node("cold-b")

    with pytest.raises(RequestError) as info:
        await route_or_hold(room, "cold-b", route)
    assert info.value.status == 503 and info.value.code == "no_serving_node"
    assert info.value.headers["Retry-After"] == "1"
    assert room.outcomes.values[("cold-b", "timeout")] == 1


@in_trio
async def test_other_models_and_other_errors_are_not_held():
    room = HoldRoom(["cold-*"], timeout=10, capacity=4, registry=lambda: EMPTY)

    async def missing() -> str:
        raise no_node("warm")

    async def refused() -> str:
        raise RequestError(503, "untrusted", code="no_trusted_node")

    with trio.fail_after(1), pytest.raises(RequestError) as info:
        await route_or_hold(room, "warm", missing)
    assert info.value.status == 404
    with trio.fail_after(1), pytest.raises(RequestError) as info:
        await route_or_hold(room, "cold-c", refused)
    assert info.value.code == "no_trusted_node"
    with trio.fail_after(1), pytest.raises(RequestError):
        await route_or_hold(None, "cold-c", missing)


@in_trio
async def test_the_waiting_room_is_bounded():
    room = HoldRoom(["*"], timeout=5, capacity=2, registry=lambda: EMPTY)
    results: list[int] = []

    async def route() -> str:
        raise no_node("m")

    async def one() -> None:
        try:
            await route_or_hold(room, "m", route)
        except RequestError as exc:
            results.append(exc.status)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one)
        nursery.start_soon(one)
        await trio.sleep(0.2)
        with pytest.raises(RequestError) as info:
            await route_or_hold(room, "m", route)
        assert "2 requests already wait" in info.value.message
        assert room.outcomes.values[("m", "full")] == 1
        nursery.cancel_scope.cancel()

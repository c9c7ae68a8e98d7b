"""Scale to zero at the ingress: a request for a model that no node serves yet waits for
one instead of failing at once.

With ``--hold-models GLOB,...`` a request whose model matches, and for which routing finds
no serving node (404 ``model_not_found`` or 503 ``no_serving_node``), is held: it waits
until a node serves the model (then it is routed as usual) or ``--hold-timeout`` passes
(then 503 ``no_serving_node`` with ``Retry-After``). At most ``--hold-queue`` requests wait
at once per process; more get the 503 at once. The fleet controller (``otela fleet run``)
reads ``otela_held_requests{model}`` from ``/metrics`` and starts a replica; nothing else
is needed between them.

A held request polls the local registry replica (one dictionary lookup every
``POLL_S``), so it is answered within that of the node's SERVING reaching this ingress.
The module sits beside the router rather than in it: routing stays the pure question of
who serves now, and only ``InferenceRoutes`` calls ``route_or_hold``.

**A warming replica.** An ingress that has just (re)started knows no model until its
replica has caught up with a peer; until then a model it does not know may well be served,
so "does not exist" (404) would be a lie. While the node is warming (``Warmup``), such a
request waits for the replica to catch up, at most ``WARM_WAIT_S``, and is then routed as
usual; if the replica is still warming it gets 503 ``registry_warming`` with
``Retry-After``, never a 404.
"""

from __future__ import annotations

import fnmatch
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

import trio

from otela.dataplane.errors import RequestError, clip
from otela.dataplane.exchange import Exchange
from otela.metrics import Histogram, Registry
from otela.registry.store import Registry as RegistryReplica

if TYPE_CHECKING:
    from otela.config import NodeConfig

POLL_S = 0.1
HOLDABLE = frozenset({"model_not_found", "no_serving_node"})
WARM_WAIT_S = 5.0  # a request for an unknown model waits this long for a warming replica

T = TypeVar("T")


class HoldRoom:
    def __init__(self, patterns: Sequence[str], timeout: float, capacity: int,
                 registry: Callable[[], RegistryReplica],
                 metrics: Registry | None = None) -> None:
        self.patterns = tuple(patterns)
        self.timeout = timeout
        self.capacity = capacity
        # The replica to look in, asked each time: a data-path worker's is replaced by a
        # new one whenever the control process sends a snapshot.
        self.registry = registry
        self.waiting = 0
        metrics = metrics or Registry()
        self.held = metrics.gauge(
            "otela_held_requests", "Requests waiting at this ingress for a first node to "
            "serve their model (--hold-models: scale to zero).", ("model",))
        self.outcomes = metrics.counter(
            "otela_held_requests_total", "Held requests by how their wait ended: served, "
            "timeout, full (refused: the waiting room was full).", ("model", "outcome"))

    def holds(self, model: str) -> bool:
        return any(fnmatch.fnmatchcase(model, p) for p in self.patterns)

    async def wait(self, model: str) -> None:
        """Return once a node serves ``model``; ``RequestError`` 503 when the wait times
        out or too many requests wait already."""
        retry = str(max(1, math.ceil(min(self.timeout, 30.0))))
        if self.waiting >= self.capacity:
            self.outcomes.inc(model, "full")
            raise RequestError(
                503, f"No node serves `{clip(model)}` yet and {self.waiting} requests "
                "already wait for one here; retry later.", code="no_serving_node",
                headers={"Retry-After": retry})
        self.waiting += 1
        self.held.inc(model)
        try:
            with trio.move_on_after(self.timeout):
                while not self.registry().serving_candidates(model):
                    await trio.sleep(POLL_S)
                self.outcomes.inc(model, "served")
                return
            self.outcomes.inc(model, "timeout")
            raise RequestError(
                503, f"No node served `{clip(model)}` within {self.timeout:g}s; a replica "
                "may still be starting: retry later.", code="no_serving_node",
                headers={"Retry-After": retry})
        finally:
            self.waiting -= 1
            # (a series at zero stays: with data-path workers the control process adds up
            # the workers' series, and one that vanished would keep its last sum there)
            self.held.inc(model, by=-1)


class Warmup:
    """Whether this node's replica is still catching up after its start: until it has
    completed an exchange with a peer (``caught_up``), for at most ``deadline_s`` from its
    start (a node whose peers are all gone is warm once that has passed)."""

    def __init__(self, caught_up: Callable[[], bool], deadline_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.caught_up = caught_up
        self.clock = clock
        self._ends = clock() + deadline_s
        self._warm = deadline_s <= 0

    def warming(self) -> bool:
        if not self._warm and (self.caught_up() or self.clock() >= self._ends):
            self._warm = True  # once warm, warm for good: a later partition is not a start
        return not self._warm


async def route_or_hold(hold: HoldRoom | None, model: str,
                        route: Callable[[], Awaitable[T]],
                        warming: Callable[[], bool] | None = None) -> T:
    """``route()``, or, when no node serves a model ``hold`` holds, ``route()`` again once
    one does; a model unknown while the replica is ``warming``: ``route()`` again once it
    is warm (module docstring)."""
    try:
        return await route()
    except RequestError as error:
        if error.code == "model_not_found" and warming is not None and warming():
            return await _after_warmup(model, route, warming)
        if hold is None or error.code not in HOLDABLE or not hold.holds(model):
            raise
    await hold.wait(model)
    return await route()


async def _after_warmup(model: str, route: Callable[[], Awaitable[T]],
                        warming: Callable[[], bool]) -> T:
    with trio.move_on_after(WARM_WAIT_S):
        while warming():
            await trio.sleep(POLL_S)
            try:
                return await route()
            except RequestError as error:
                if error.code != "model_not_found":
                    raise
    if warming():
        raise RequestError(
            503, f"This ingress has just started and is still learning the federation's "
            f"models; `{clip(model)}` may be served: retry shortly.",
            code="registry_warming", headers={"Retry-After": "2"})
    return await route()


class ModelFirstByte:
    """``otela_model_first_byte_seconds{model}``: time to first byte per model (the
    fleet controller's TTFT signal for autoscaling). Only answered requests count, so
    the models are the federation's, not whatever clients send."""

    def __init__(self, metrics: Registry) -> None:
        self.histogram: Histogram = metrics.histogram(
            "otela_model_first_byte_seconds", "Time from a request's arrival to the first "
            "response byte from the engine, by model.", labels=("model",))

    def finished(self, exchange: Exchange) -> None:
        first = exchange.first_byte
        if first is not None and exchange.model and exchange.node_peer:
            self.histogram.observe(first, exchange.model)


def hold_room(config: NodeConfig, registry: Callable[[], RegistryReplica], metrics: Registry
              ) -> HoldRoom | None:
    """The node's waiting room, if ``--hold-models`` names any model."""
    if not config.hold_models:
        return None
    return HoldRoom(config.hold_models, config.hold_timeout, config.hold_queue, registry,
                    metrics)

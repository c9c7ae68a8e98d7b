"""The ingress queue: a request is dispatched only when a node it may use has room;
otherwise it waits, in its priority class and its team's and key's fair share
(``otela.routing.fairshare``), until room frees, its deadline passes (429 with
``Retry-After``) or its client leaves (dropped at once: the HTTP server cancels it).

**Room.** A node has room while its outstanding requests, as this ingress estimates them
(``Router.room``), are fewer than the concurrency it declares (``--max-concurrency``, or
read from the engine command's ``--max-num-seqs``/``--max-running-requests``) and its
engine's KV cache is not full. A node that declares no concurrency always has room: the
queue never holds a request for it, and costs nothing where no node declares one.

**Choosing the class and the deadline.** ``X-Otela-Priority: <class>`` (or the body's
``otela.priority``) picks the class, at most the best one the caller's API key allows (a
request asking for more is served in the key's best class). ``X-Otela-Queue-Timeout:
<seconds>`` (``otela.queue_timeout``) bounds the wait, at most the key's or the ingress's
maximum. The answer names what was applied in ``x-otela-priority``.

**Dispatching.** Whenever a request ends, and every ``POLL_S`` while requests wait
(load reports and new nodes change the room too), waiting requests are granted in the
fair share's order for as long as room remains. A granted request is counted against the
room until it is sent (``reserved``), which happens without a pause in between.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from otela.dataplane.errors import RequestError, clip
from otela.metrics import Registry
from otela.routing.fairshare import FairShare, Waiter

if TYPE_CHECKING:
    from otela.config import NodeConfig

POLL_S = 0.1
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                300.0, 3600.0)
OUTPUT_ESTIMATE = 256  # tokens a request without max_tokens is assumed to generate
BYTES_PER_TOKEN = 4  # a prompt's tokens, estimated from its body's length
TYPICAL_WEIGHT = 0.2  # of a request's tokens in its model's moving average


@dataclass(frozen=True)
class QueueSettings:
    classes: tuple[str, ...]  # best first
    default_class: str
    timeout: float  # a request's wait, unless it asks otherwise
    max_timeout: float  # the most it may ask for (an API key may lower it)
    depth: int  # waiting requests per model; more are refused at once (429)
    starvation_s: float  # a lower class waiting this long gets a share (fairshare)
    reserve: float = 0.0  # of each node's slots (rounded down) only the best class uses

    def __post_init__(self) -> None:
        if not self.classes or len(set(self.classes)) != len(self.classes):
            raise ValueError("priority classes must be distinct names, at least one")
        if self.default_class not in self.classes:
            raise ValueError(f"the default priority {self.default_class!r} is not one of "
                             f"the classes ({', '.join(self.classes)})")


@dataclass(frozen=True)
class Flow:
    """Whose share a request is charged to: its team (or its key alone), and its key."""

    team: str = ""
    team_weight: float = 1.0
    key: str = ""
    key_weight: float = 1.0


ANONYMOUS = Flow()


def flow_of(key: Any) -> Flow:
    """The share an API key's requests are charged to: its team's (``team``,
    ``team_weight``) and, within it, its own (``id``, ``weight``); a key without a team is
    a team of its own. ``None`` (no key: open access) is one anonymous flow."""
    if key is None:
        return ANONYMOUS
    team = getattr(key, "team", None)
    weight = float(getattr(key, "weight", None) or 1.0)
    if not team:
        return Flow(f"key:{key.id}", weight, key.id, 1.0)
    return Flow(f"team:{team}", float(getattr(key, "team_weight", None) or 1.0), key.id,
                weight)


class QueueTimeout(RequestError):
    pass


class AdmissionQueue:
    def __init__(self, settings: QueueSettings, metrics: Registry | None = None,
                 clock: Callable[[], float] = trio.current_time) -> None:
        self.settings = settings
        self.clock = clock
        self.index = {name: i for i, name in enumerate(settings.classes)}
        self.default = self.index[settings.default_class]
        self.shares: dict[str, FairShare] = {}
        self.reserved: dict[str, int] = {}  # granted, not yet sent, per model
        self._dispatched_at: dict[str, float] = {}  # the last dispatch per model
        self.waits: deque[float] = deque(maxlen=64)  # recent waits, for Retry-After
        self.typical: dict[str, float] = {}  # tokens a request of the model uses, lately
        metrics = metrics or Registry()
        self.waiting_gauge = metrics.gauge(
            "otela_queue_requests", "Requests waiting at this ingress for room on a node "
            "serving their model, by priority class.", ("model", "priority"))
        self.outcomes = metrics.counter(
            "otela_queue_requests_total", "Requests that waited in the ingress queue, by "
            "how the wait ended: dispatched, timeout (429), left (the client hung up), "
            "full (refused: the queue was full).", ("model", "priority", "outcome"))
        self.wait_seconds = metrics.histogram(
            "otela_queue_wait_seconds", "Time requests waited in the ingress queue before "
            "dispatch (requests that never waited are not counted).", WAIT_BUCKETS,
            ("model", "priority"))

    # -- what a request asks for ---------------------------------------------------------

    def class_of(self, asked: str | None, best_allowed: str | None = None) -> int:
        """The class index for a request asking ``asked`` (``None``: the default), never
        better than ``best_allowed`` (an API key's); 400 for an unknown class."""
        klass = self.default
        if asked is not None:
            found = self.index.get(asked.strip().lower())
            if found is None:
                raise RequestError(
                    400, f"Unknown priority class {clip(asked)!r}; this ingress has "
                    f"{', '.join(self.settings.classes)}.", code="invalid_priority",
                    param="X-Otela-Priority")
            klass = found
        if best_allowed is not None:
            klass = max(klass, self.index.get(best_allowed, self.default))
        return klass

    def timeout_of(self, asked: str | None, key_max: float | None = None) -> float:
        """How long a request may wait: ``asked`` seconds (``None``: the default), at
        most the ingress's and the key's maximum; 400 when it is not a number."""
        limit = self.settings.max_timeout if key_max is None else min(
            key_max, self.settings.max_timeout)
        if asked is None:
            return min(self.settings.timeout, limit)
        try:
            seconds = float(asked)
        except ValueError:
            seconds = math.nan
        if not math.isfinite(seconds) or seconds < 0:
            raise RequestError(400, "X-Otela-Queue-Timeout is a number of seconds, at "
                               "least 0", code="invalid_queue_timeout",
                               param="X-Otela-Queue-Timeout")
        return min(seconds, limit)

    # -- waiting ----------------------------------------------------------------------------

    def held_back(self, klass: int) -> float:
        """The share of each node's slots a request of ``klass`` may not take: the
        reserve, for every class but the best."""
        return self.settings.reserve if klass > 0 else 0.0

    def idle(self, model: str) -> bool:
        """Nothing waits for ``model``: a request that fits goes at once."""
        share = self.shares.get(model)
        return share is None or not len(share)

    async def wait_turn(self, model: str, klass: int, flow: Flow, cost: float,
                        timeout: float, fits: Callable[[int], bool],
                        group: Hashable | None = None) -> Waiter:
        """Wait until dispatched (``fits(reserved)``: a node has room beyond the requests
        already granted), return the charged waiter (``settle`` it when the request ends);
        ``RequestError`` 429 when the wait times out or the queue is full. Requests of one
        ``group`` fit or not together (``fairshare.Waiter.group``).

        A waiter is dispatched by the queue, not by itself: when a request ends
        (``released``), when one arrives, and, since room also changes without either
        (other ingresses' load reports, a node joining), by one poll of the model every
        ``POLL_S`` however many wait. A waiter only sleeps until it is woken or polls."""
        share = self.shares.get(model)
        if share is None:
            share = self.shares[model] = FairShare(len(self.settings.classes),
                                                    self.settings.starvation_s)
        name = self.settings.classes[klass]
        if len(share) >= self.settings.depth:
            self.outcomes.inc(model, name, "full")
            raise RequestError(
                429, f"{len(share)} requests already wait for `{clip(model)}` here; retry "
                "later.", code="queue_full", headers={"Retry-After": self._retry_after()})
        waiter = Waiter(klass, flow.team, flow.team_weight, flow.key, flow.key_weight, cost,
                        self.clock(), lambda: fits(self.reserved.get(model, 0)), group=group,
                        wake=trio.Event())
        share.push(waiter)
        self.waiting_gauge.inc(model, name)
        arrived = waiter.arrived
        outcome = "left"
        try:
            with trio.move_on_after(timeout):
                self.dispatch(model)  # it, or one it now goes after, may fit at once
                while waiter.queued:
                    with trio.move_on_after(POLL_S):
                        await waiter.wake.wait()
                    if waiter.queued and self.clock() - self._dispatched_at.get(
                            model, -math.inf) >= POLL_S:
                        self.dispatch(model)
            if waiter.queued:
                outcome = "timeout"
                raise QueueTimeout(
                    429, f"No node serving `{clip(model)}` had room within {timeout:g}s "
                    f"(priority {name}); retry later.", code="queue_timeout",
                    headers={"Retry-After": self._retry_after()})
            outcome = "dispatched"
            waited = self.clock() - arrived
            self.wait_seconds.observe(waited, model, name)
            self.waits.append(waited)
            return waiter
        finally:
            self.waiting_gauge.inc(model, name, by=-1)
            self.outcomes.inc(model, name, outcome)
            if waiter.queued:
                share.remove(waiter)
            elif outcome != "dispatched":  # granted, then cancelled before it was sent
                self._unreserve(model)
                self.dispatch(model)
            else:
                self._unreserve(model)  # sent right after this returns: counted there
            if not len(share):
                share.forget_idle()

    def dispatch(self, model: str) -> None:
        """Grant waiting requests of ``model`` while a node has room for them."""
        share = self.shares.get(model)
        if share is None or not len(share):
            return
        now = self._dispatched_at[model] = self.clock()
        while True:
            waiter = share.take(now)
            if waiter is None:
                break
            self.reserved[model] = self.reserved.get(model, 0) + 1
            if waiter.wake is not None:
                waiter.wake.set()

    def released(self) -> None:
        """A request ended somewhere: room may have freed for any model that waits."""
        for model, share in self.shares.items():
            if len(share):
                self.dispatch(model)

    def estimate(self, model: str, prompt_bytes: int, max_tokens: int | None) -> float:
        """A request's tokens before it runs, charged to its share when it is dispatched
        and corrected when it ends: what the model's requests have used lately (at least
        its prompt, estimated from its body's length), at most its prompt and its
        ``max_tokens``. Close estimates matter: a share carries each running request's
        charge until it ends, and a charge far above what requests use keeps a heavier
        team's running requests looking expensive for as long as they run."""
        prompt = prompt_bytes / BYTES_PER_TOKEN
        typical = self.typical.get(model)
        cost = max(prompt, typical) if typical is not None else prompt + OUTPUT_ESTIMATE
        return min(cost, prompt + max_tokens) if max_tokens else cost

    def settle(self, model: str, waiter: Waiter, used_tokens: int) -> None:
        """Charge ``waiter``'s share what it used instead of its estimate."""
        share = self.shares.get(model)
        if share is not None:
            share.settle(waiter, used_tokens)
        if used_tokens > 0:
            typical = self.typical.get(model)
            self.typical[model] = used_tokens if typical is None else \
                typical + TYPICAL_WEIGHT * (used_tokens - typical)

    def waiting(self) -> dict[str, dict[str, int]]:
        """Waiting requests per model and class (for ``/v1/network`` and the dashboard)."""
        return {model: {name: share.waiting(i) for i, name in
                        enumerate(self.settings.classes) if share.waiting(i)}
                for model, share in self.shares.items() if len(share)}

    def _unreserve(self, model: str) -> None:
        left = self.reserved.get(model, 0) - 1
        if left > 0:
            self.reserved[model] = left
        else:
            self.reserved.pop(model, None)

    def _retry_after(self) -> str:
        """Seconds a refused client should wait: about the median recent wait."""
        if not self.waits:
            return "1"
        ordered = sorted(self.waits)
        return str(max(1, min(60, math.ceil(ordered[len(ordered) // 2]))))


def admission_queue(config: NodeConfig, metrics: Registry) -> AdmissionQueue:
    """The ingress queue of ``config``'s ``[routing]`` settings; ``ValueError`` when the
    default class is not one of the classes."""
    return AdmissionQueue(QueueSettings(
        tuple(config.priority_classes), config.default_priority, config.queue_timeout,
        config.queue_max_timeout, config.queue_depth, config.starvation_after,
        config.priority_reserve), metrics)

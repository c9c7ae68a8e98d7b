"""Give up on a node that fails while a request waits for its answer (``--retry-broken``).

A request sent to a node that then freezes or is cut off waits for an answer that comes
late or never: TCP neither resets nor delivers, and after a partition heals the request
may sit in the kernel's retransmission backoff for tens of seconds more. Without
``--retry-broken`` it must wait (it may be running, and nothing runs twice). With it the
operator accepts that a non-streaming request may run twice, so once the failure detector
suspects the node, or the registry no longer lists it as serving, a request still waiting
for its first byte is given up there and sent to another node.

Requests register the node they wait on; whoever holds the node's state (the daemon's
failure detector, a data-path worker's copy of it) calls ``notice`` with the suspects, and
the daemon polls only while someone waits, so an idle node does no work for this.

The router waits in ``NodeWatch.guard``: a cancel scope that ``notice`` cancels, so a
request pays a registration and a scope, not a nursery and a task (``--retry-broken`` is
on by default: every non-streaming request waits this way).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Iterator
from contextlib import contextmanager
from typing import TypeVar

import trio

from otela.registry.records import Lifecycle
from otela.registry.store import Registry

T = TypeVar("T")

POLL_S = 0.5  # how often the daemon compares waiting requests with the suspects


class FailedWhileWaiting(Exception):
    """The node the request waited on was suspected or left serving before answering."""


class NodeWatch:
    """Requests waiting on each node, woken when the node is suspected or stops serving."""

    def __init__(self) -> None:
        self._failed: dict[str, trio.Event] = {}  # session id -> set once it fails
        # session id -> requests waiting in scopes, streams watched
        self._guards: dict[str, list[Guard | Watcher]] = {}
        self._waiting: Counter[str] = Counter()
        self.someone_waits = trio.Event()
        self.abandoned = 0  # requests given up on a failed node (each then sent elsewhere)

    @contextmanager
    def waiting_on(self, session_id: str) -> Iterator[trio.Event]:
        """While in the block, the returned event is set if ``session_id`` fails."""
        event = self._failed.get(session_id)
        if event is None or event.is_set():
            event = self._failed[session_id] = trio.Event()
        self._waiting[session_id] += 1
        self.someone_waits.set()
        try:
            yield event
        finally:
            self._waiting[session_id] -= 1
            if self._waiting[session_id] <= 0:
                del self._waiting[session_id]
                if self._failed.get(session_id) is event:
                    del self._failed[session_id]
                if not self._waiting:
                    self.someone_waits = trio.Event()

    def guard(self, session_id: str, give_up: Callable[[], bool]) -> Guard:
        """``with watch.guard(session, give_up) as guard: await send()``: the send is
        cancelled if ``session`` fails meanwhile and ``give_up()`` then agrees (another
        node could take the request); ``guard.failed`` says so afterwards."""
        return Guard(self, session_id, give_up)

    def watching(self, session_id: str, on_failure: Callable[[], None],
                 confirm: Callable[[], bool] = lambda: True) -> Watcher:
        """``with watch.watching(session, on_failure, confirm):`` calls ``on_failure()``
        once if ``session`` fails while in the block and ``confirm()`` agrees (a stream
        being relayed: the ingress closes its connection to a node that froze mid-answer,
        and continues the stream elsewhere, ``otela.dataplane.migration``; ``confirm``
        tells a node that is gone from one that is draining, whose streams finish)."""
        return Watcher(self, session_id, on_failure, confirm)

    def _enter(self, guard: Guard | Watcher) -> None:
        self._guards.setdefault(guard.session_id, []).append(guard)
        self._waiting[guard.session_id] += 1
        self.someone_waits.set()

    def _leave(self, guard: Guard | Watcher) -> None:
        session_id = guard.session_id
        guards = self._guards.get(session_id)
        if guards is not None:
            guards.remove(guard)
            if not guards:
                del self._guards[session_id]
        self._waiting[session_id] -= 1
        if self._waiting[session_id] <= 0:
            del self._waiting[session_id]
            self._failed.pop(session_id, None)
            if not self._waiting:
                self.someone_waits = trio.Event()

    def notice(self, failed: Collection[str]) -> None:
        """Wake the requests waiting on any session in ``failed``."""
        for session_id in [p for p in self._waiting if p in failed]:
            event = self._failed.get(session_id)
            if event is not None:
                event.set()
            for guard in list(self._guards.get(session_id, ())):
                guard.session_failed()

    def waited_on(self) -> list[str]:
        return list(self._waiting)

    async def run(self, failed: Callable[[list[str]], Collection[str]]) -> None:
        """Poll ``failed`` (given the sessions waited on) while any request waits; never
        otherwise."""
        while True:
            await self.someone_waits.wait()
            while self._waiting:
                self.notice(failed(self.waited_on()))
                await trio.sleep(POLL_S)


class Guard:
    """One request waiting on a node (``NodeWatch.guard``); a class, not a generator
    context manager: it is on every non-streaming request's path."""

    __slots__ = ("give_up", "noticed", "scope", "session_id", "watch")

    def __init__(self, watch: NodeWatch, session_id: str, give_up: Callable[[], bool]) -> None:
        self.watch = watch
        self.session_id = session_id
        self.give_up = give_up
        self.scope = trio.CancelScope()
        self.noticed = False  # the node failed while we waited (and we gave up on it)

    def session_failed(self) -> None:
        if not self.noticed and self.give_up():
            self.noticed = True
            self.scope.cancel()

    @property
    def failed(self) -> bool:
        """The wait was given up because the node failed."""
        return self.noticed and self.scope.cancelled_caught

    def __enter__(self) -> Guard:
        self.watch._enter(self)
        self.scope.__enter__()
        return self

    def __exit__(self, *exc: object) -> bool:
        try:
            return bool(self.scope.__exit__(*exc))  # type: ignore[arg-type]
        finally:
            self.watch._leave(self)


class Watcher:
    """One stream watched on a node (``NodeWatch.watching``)."""

    __slots__ = ("confirm", "on_failure", "session_id", "triggered", "watch")

    def __init__(self, watch: NodeWatch, session_id: str, on_failure: Callable[[], None],
                 confirm: Callable[[], bool]) -> None:
        self.watch = watch
        self.session_id = session_id
        self.on_failure = on_failure
        self.confirm = confirm
        self.triggered = False

    def session_failed(self) -> None:
        if not self.triggered and self.confirm():  # unconfirmed: asked again next poll
            self.triggered = True
            self.on_failure()

    def __enter__(self) -> Watcher:
        self.watch._enter(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.watch._leave(self)


async def unless_failed(event: trio.Event, send: Callable[[], Awaitable[T]],
                        give_up: Callable[[], bool] = lambda: True) -> T:
    """Await ``send()``; if ``event`` is set first and ``give_up()`` then agrees, cancel it
    and raise ``FailedWhileWaiting``. Its own errors are raised as they are (not in a
    group). ``give_up`` says whether another node could take the request: if none could,
    waiting on a node that may yet answer (a suspicion can be wrong, a node thaws) beats
    certain failure, and the request waits as it would without ``--retry-broken``."""
    async with trio.open_nursery() as nursery:
        async def cancel_on_failure() -> None:
            await event.wait()
            if give_up():
                nursery.cancel_scope.cancel()

        nursery.start_soon(cancel_on_failure)
        try:
            result = await send()
        except BaseException as exc:  # kept out of the nursery, which would group it
            error: BaseException | None = exc
        else:
            error = None
        nursery.cancel_scope.cancel()
    if error is None:
        return result
    if isinstance(error, trio.Cancelled) and event.is_set():
        raise FailedWhileWaiting from None
    raise error


def failed_sessions(sessions: list[str], registry: Registry,
                    suspected: Collection[str]) -> list[str]:
    """Of ``sessions``, those whose node is suspected or that no longer serve (DOWN, LEFT,
    evicted, or gone from the registry)."""
    failed = []
    for session_id in sessions:
        record = registry.get(session_id)
        if record is None or record.state is not Lifecycle.SERVING \
                or record.peer_id in suspected:
            failed.append(session_id)
    return failed

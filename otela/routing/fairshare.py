"""Who goes next when a model's nodes are full: priority classes, then weighted fair
shares of tokens between teams, then between a team's keys. Pure: no clock, no I/O.

**Classes.** A request belongs to one priority class (``interactive`` > ``default`` >
``batch`` unless configured otherwise). The highest class with a waiting request that
fits goes first. So that a lower class never waits forever behind a steady stream of
higher ones, a class whose oldest request has waited longer than ``starvation_s`` gets
every ``STARVATION_TURN``-th dispatch while it does: at most one dispatch in that many
goes to a lower class out of order, and a starving class still advances.

**Fair shares.** Inside a class, teams share by weight and, inside a team, keys share by
weight, in tokens (a request's cost is its estimated prompt plus output tokens, corrected
to what it used once it is over). Each flow (a team, or a key within its team) keeps a
virtual time: the tokens charged to it divided by its weight. The flow with the least
virtual time that has a request waiting goes next, so over any stretch in which two flows
both wait they are served in proportion to their weights. A flow that had nothing waiting
starts again at the least virtual time among those waiting (it banks no credit from idle
time: a team that was quiet for an hour does not then monopolise the model for an hour).
This is the rule of start-time fair queueing and of Linux's CFS, applied twice.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

STARVATION_TURN = 10  # every 10th dispatch goes to a starving lower class
MIN_WEIGHT = 1e-3


@dataclass(eq=False)
class Waiter:
    """One queued request, as the fair share sees it."""

    klass: int  # 0 = the highest class
    team: str
    team_weight: float
    key: str
    key_weight: float
    cost: float  # estimated tokens
    arrived: float
    fits: Callable[[], bool] = lambda: True  # a node it may use has room now
    queued: bool = True  # False once dispatched or removed
    # Waiters of one group fit or do not fit together (the same nodes, the same share of
    # their slots): one room check answers for all of them in a dispatch. None: its own.
    group: Hashable | None = None
    wake: Any = None  # the caller's: how it tells the waiter it was dispatched


@dataclass
class _Flow:
    weight: float
    vtime: float = 0.0
    waiting: int = 0


@dataclass
class _Team(_Flow):
    keys: dict[str, _Flow] = field(default_factory=dict)
    queues: dict[str, deque[Waiter]] = field(default_factory=dict)


class _ClassQueue:
    """One class's waiters: teams, their keys, and each key's requests in arrival order."""

    def __init__(self) -> None:
        self.teams: dict[str, _Team] = {}
        self.count = 0

    def push(self, waiter: Waiter) -> None:
        team = self.teams.get(waiter.team)
        if team is None:
            team = self.teams[waiter.team] = _Team(max(waiter.team_weight, MIN_WEIGHT))
        team.weight = max(waiter.team_weight, MIN_WEIGHT)  # the latest word on the weight
        if team.waiting == 0:
            team.vtime = max(team.vtime, self._floor(self.teams.values(), team))
        key = team.keys.get(waiter.key)
        if key is None:
            key = team.keys[waiter.key] = _Flow(max(waiter.key_weight, MIN_WEIGHT))
        key.weight = max(waiter.key_weight, MIN_WEIGHT)
        if key.waiting == 0:
            key.vtime = max(key.vtime, self._floor(team.keys.values(), key))
        team.queues.setdefault(waiter.key, deque()).append(waiter)
        team.waiting += 1
        key.waiting += 1
        self.count += 1

    @staticmethod
    def _floor(flows: Iterable[_Flow], newcomer: _Flow | None = None) -> float:
        """The least virtual time among the flows with requests waiting (0 if none)."""
        times = [f.vtime for f in flows if f is not newcomer and f.waiting]
        return min(times) if times else 0.0

    def remove(self, waiter: Waiter) -> None:
        team = self.teams[waiter.team]
        queue = team.queues[waiter.key]
        queue.remove(waiter)
        self._left(team, waiter)

    def _left(self, team: _Team, waiter: Waiter) -> None:
        team.waiting -= 1
        team.keys[waiter.key].waiting -= 1
        self.count -= 1
        if not team.queues[waiter.key]:
            del team.queues[waiter.key]

    def oldest(self) -> float | None:
        heads = [q[0].arrived for t in self.teams.values() for q in t.queues.values()]
        return min(heads) if heads else None

    def take(self, fitting: dict[Hashable, bool]) -> Waiter | None:
        """The next waiter that fits, by team then key virtual time; charged, not queued.
        ``fitting``: the answers of room checks so far in this dispatch, by group."""
        for team in sorted((t for t in self.teams.values() if t.waiting),
                           key=lambda t: t.vtime):
            for key_name in sorted(team.queues, key=lambda k: team.keys[k].vtime):
                queue = team.queues[key_name]
                for waiter in queue:  # the key's oldest that fits (usually the first)
                    if _fits(waiter, fitting):
                        queue.remove(waiter)
                        self._left(team, waiter)
                        team.vtime += waiter.cost / team.weight
                        key = team.keys[key_name]
                        key.vtime += waiter.cost / key.weight
                        waiter.queued = False
                        return waiter
        return None

    def settle(self, team_name: str, key_name: str, extra_tokens: float) -> None:
        """Correct a charge by what the request used beyond (or short of) its estimate."""
        team = self.teams.get(team_name)
        if team is None:
            return
        team.vtime += extra_tokens / team.weight  # (virtual times are only compared)
        key = team.keys.get(key_name)
        if key is not None:
            key.vtime += extra_tokens / key.weight

    def forget_idle(self) -> None:
        """Drop flows with nothing waiting whose virtual time no longer matters: at or
        behind the least of those waiting, they would restart there anyway. Keeps memory
        bounded by the flows that wait (and those still ahead of them). With nothing
        waiting at all there is no contention to be fair about: every flow starts afresh."""
        if not self.count:
            self.teams.clear()
            return
        floor = self._floor(self.teams.values())
        for name in [n for n, t in self.teams.items() if not t.waiting and t.vtime <= floor]:
            del self.teams[name]
        for team in self.teams.values():
            key_floor = self._floor(team.keys.values())
            for name in [n for n, k in team.keys.items()
                         if not k.waiting and k.vtime <= key_floor]:
                del team.keys[name]


def _fits(waiter: Waiter, fitting: dict[Hashable, bool]) -> bool:
    """Whether ``waiter`` fits now: asked once per group in a dispatch (a full model with
    many waiters would otherwise check the same nodes once per waiter)."""
    if waiter.group is None:
        return waiter.fits()
    known = fitting.get(waiter.group)
    if known is None:
        known = fitting[waiter.group] = waiter.fits()
    return known


class FairShare:
    """One model's queue: the waiters of every class (module docstring)."""

    def __init__(self, classes: int, starvation_s: float) -> None:
        self.classes = [_ClassQueue() for _ in range(classes)]
        self.starvation_s = starvation_s
        self._passed_over = 0  # dispatches in a row while a lower class starved

    def __len__(self) -> int:
        return sum(c.count for c in self.classes)

    def waiting(self, klass: int) -> int:
        return self.classes[klass].count

    def push(self, waiter: Waiter) -> None:
        self.classes[waiter.klass].push(waiter)

    def remove(self, waiter: Waiter) -> None:
        """Take out a waiter that leaves without being dispatched (deadline, client
        gone); a no-op if it was dispatched meanwhile."""
        if waiter.queued:
            waiter.queued = False
            self.classes[waiter.klass].remove(waiter)

    def take(self, now: float) -> Waiter | None:
        """The next request to dispatch, or ``None`` if none waiting fits now."""
        fitting: dict[Hashable, bool] = {}
        starving = self._starving(now)
        if starving is not None and self._passed_over >= STARVATION_TURN - 1:
            waiter = self.classes[starving].take(fitting)
            if waiter is not None:
                self._passed_over = 0
                return waiter
        for index, queue in enumerate(self.classes):
            if queue.count:
                waiter = queue.take(fitting)
                if waiter is not None:
                    if starving is not None and index < starving:
                        self._passed_over += 1
                    elif starving is None or index == starving:
                        self._passed_over = 0
                    return waiter
        return None

    def _starving(self, now: float) -> int | None:
        """The highest class below the top whose oldest request has waited too long."""
        for index in range(1, len(self.classes)):
            oldest = self.classes[index].oldest()
            if oldest is not None and now - oldest > self.starvation_s:
                return index
        return None

    def settle(self, waiter: Waiter, used_tokens: float) -> None:
        self.classes[waiter.klass].settle(waiter.team, waiter.key, used_tokens - waiter.cost)

    def forget_idle(self) -> None:
        for queue in self.classes:
            queue.forget_idle()

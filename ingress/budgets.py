"""Budgets in tokens or money, per day, per month or for good: what each account used in
its period, and whether a request may start. Pure: the caller passes the time.

An **account** is a key (``("key", id)``) or a team (``("team", name)``); a request counts
towards its key's account and, when the key has a team, the team's. Periods are calendar
periods in UTC: a daily budget is fresh at 00:00 UTC, a monthly one on the 1st. The
``Ledger`` keeps every account's use in each period window (lifetime, this month, today),
so a budget can change its period without a recount, and starts a window afresh when its
period turns. A row that another ingress wrote just before midnight and that this one
reads just after counts towards the new day: off by at most one refresh interval's
requests, on the side of the user.

A request reserves what it may use at most (``Reservation``) until it is over, as before
for lifetime token budgets (``ingress.access``): a budget is overshot by at most the last
admitted request's own use. Where several ingress processes share a database, each admits
only from its ``Lease`` of a budget, a share handed out by ``lease_grant`` through the
database (``ingress.leases``), so that together they overshoot it by less than one
request's reservation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from otela.dataplane.errors import RequestError

PERIODS = ("lifetime", "month", "day")
Account = tuple[str, str]  # ("key", key id) or ("team", team name)


def period_start(period: str, now: float) -> float:
    """When the ``period`` holding ``now`` began (UTC); 0 for ``lifetime``."""
    if period == "lifetime":
        return 0.0
    moment = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0,
                                                      microsecond=0)
    if period == "month":
        moment = moment.replace(day=1)
    return moment.timestamp()


def period_end(period: str, now: float) -> float | None:
    """When the ``period`` holding ``now`` ends (a budget's reset); None for lifetime."""
    if period == "lifetime":
        return None
    start = datetime.fromtimestamp(period_start(period, now), UTC)
    if period == "day":
        return start.timestamp() + 86400.0
    year, month = (start.year + 1, 1) if start.month == 12 else (start.year, start.month + 1)
    return start.replace(year=year, month=month).timestamp()


@dataclass(frozen=True)
class Budget:
    """At most ``tokens`` (prompt + completion) and/or ``spend`` (money, at the prices
    set) per ``period``."""

    tokens: int | None = None
    spend: float | None = None
    period: str = "lifetime"

    def __bool__(self) -> bool:
        return self.tokens is not None or self.spend is not None


@dataclass
class Spent:
    tokens: int = 0
    spend: float = 0.0


_WINDOW = {"lifetime": 0, "month": 1, "day": 2}  # a window's place in an account's list


@dataclass
class Ledger:
    """What each account used in each period window, as this ingress knows it: per
    account a list of three ``Spent`` (lifetime, this month, today), so recording a
    request is one dictionary lookup (it runs on every keyed request)."""

    now: float = 0.0
    accounts: dict[Account, list[Spent]] = field(default_factory=dict)
    month_start: float = 0.0
    day_start: float = 0.0
    _next_turn: float = 0.0

    def __post_init__(self) -> None:
        self.month_start = period_start("month", self.now)
        self.day_start = period_start("day", self.now)
        self._next_turn = period_end("day", self.now) or 0.0

    @classmethod
    def from_totals(cls, totals: Iterable[tuple[str, str | None, dict[str, tuple[int, float]]]],
                    now: float) -> Ledger:
        """A ledger from the usage table's sums per (key, team) and period window
        (``ingress.usage.window_totals``), whose windows began at this ledger's starts."""
        ledger = cls(now)
        for key_id, team, windows in totals:
            accounts: tuple[Account, ...] = (("key", key_id),) if not team else (
                ("key", key_id), ("team", team))
            for account in accounts:
                mine = ledger._windows(account)
                for period, (tokens, spend) in windows.items():
                    mine[_WINDOW[period]].tokens += tokens
                    mine[_WINDOW[period]].spend += spend
        return ledger

    def _windows(self, account: Account) -> list[Spent]:
        windows = self.accounts.get(account)
        if windows is None:
            windows = self.accounts[account] = [Spent(), Spent(), Spent()]
        return windows

    def turn(self, now: float) -> None:
        """Start the windows whose period has turned since we last looked afresh."""
        if now < self._next_turn:
            return
        month, day = period_start("month", now), period_start("day", now)
        for windows in self.accounts.values():
            if month > self.month_start:
                windows[1] = Spent()
            if day > self.day_start:
                windows[2] = Spent()
        self.month_start, self.day_start = max(month, self.month_start), max(day, self.day_start)
        self._next_turn = period_end("day", now) or 0.0

    def add(self, account: Account, tokens: int, spend: float, now: float,
            finished_at: float | None = None) -> None:
        """``account`` used this; ``finished_at`` (default now) decides which windows
        it falls in (a row read late still belongs to the day it was served)."""
        if now >= self._next_turn:
            self.turn(now)
        windows = self.accounts.get(account)
        if windows is None:
            windows = self.accounts[account] = [Spent(), Spent(), Spent()]
        when = now if finished_at is None else finished_at
        for index, start in ((0, 0.0), (1, self.month_start), (2, self.day_start)):
            if when >= start:
                spent = windows[index]
                spent.tokens += tokens
                spent.spend += spend

    def spent(self, account: Account, period: str, now: float) -> Spent:
        if now >= self._next_turn:
            self.turn(now)
        windows = self.accounts.get(account)
        return Spent() if windows is None else windows[_WINDOW[period]]


@dataclass
class Reservation:
    """What the requests in flight here may still use, per account."""

    held: dict[Account, Spent] = field(default_factory=dict)

    def hold(self, account: Account, tokens: int, spend: float) -> None:
        spent = self.held.get(account)
        if spent is None:
            spent = self.held[account] = Spent()
        spent.tokens += tokens
        spent.spend += spend

    def release(self, account: Account, tokens: int, spend: float) -> None:
        spent = self.held.get(account)
        if spent is None:
            return
        spent.tokens -= tokens
        spent.spend -= spend
        if spent.tokens <= 0 and spent.spend <= 1e-12:
            del self.held[account]

    def of(self, account: Account) -> Spent:
        return self.held.get(account) or Spent()


def refusal(budget: Budget, spent: Spent, held: Spent, whose: str, now: float
            ) -> RequestError | None:
    """Why a request of an account with ``budget`` may not start now, if it may not:
    403 ``budget_exceeded`` when the period's budget is used up (with when it resets),
    429 ``budget_reserved`` when the rest is held by requests in flight. On the request
    path: the messages are made only for a refusal."""
    for kind, limit, used, reserved in (
            ("token", budget.tokens, spent.tokens, held.tokens),
            ("spend", budget.spend, spent.spend, held.spend)):
        if limit is None or used + reserved < limit:
            continue
        label = {"lifetime": "", "month": "monthly ", "day": "daily "}[budget.period]
        shown = f"{limit:g}" if kind == "spend" else str(limit)
        if used >= limit:
            end = period_end(budget.period, now)
            resets = "" if end is None else " It resets at " + datetime.fromtimestamp(
                end, UTC).strftime("%Y-%m-%dT%H:%MZ") + "."
            return RequestError(403, f"{whose} {label}{kind} budget ({shown}) is used up."
                                + resets, code="budget_exceeded")
        return RequestError(
            429, f"The rest of {whose[0].lower() + whose[1:]} {label}{kind} budget "
            f"({shown}) is reserved by requests in flight; retry when they have "
            "finished.", code="budget_reserved", headers={"Retry-After": "1"})
    return None


def over(budget: Budget, spent: Spent) -> bool:
    """Whether ``spent`` has used ``budget`` up (a key's status: ``over budget``)."""
    return bool(budget) and (
        (budget.tokens is not None and spent.tokens >= budget.tokens)
        or (budget.spend is not None and spent.spend >= budget.spend))


# -- leases: shares of a budget handed out through the database (``ingress.leases``) -----

# A take hands out this fraction of what is left of a budget (at least what the request
# waiting for it needs): far from the end an ingress takes a database round trip rarely,
# near it the shares shrink with the rest, down to one request's reservation.
LEASE_FRACTION = 0.25


def lease_grant(budget: Budget, committed: Spent, need: Spent,
                fraction: float = LEASE_FRACTION) -> Spent | None:
    """What a take hands out of ``budget`` when ``committed`` (what was used in the period
    window before any lease, plus every lease still counted) is already spoken for, to an
    ingress that needs ``need`` more to admit its waiting request (0: a top-up); None when
    nothing is left in one of the budget's measures.

    The share is ``fraction`` of the rest, at least ``need``: so only the take that finds
    the rest smaller than its need hands out more than the rest, and after it nothing is
    left for anyone. The budget is thereby overshot by less than one request's
    reservation, whatever the number of ingress nodes. A measure the budget does not
    limit is granted nothing (it is not counted)."""
    tokens = 0
    spend = 0.0
    if budget.tokens is not None:
        left = budget.tokens - committed.tokens
        if left <= 0:
            return None
        tokens = max(need.tokens, math.ceil(left * fraction))
    if budget.spend is not None:
        left_spend = budget.spend - committed.spend
        if left_spend <= 1e-12:
            return None
        spend = max(need.spend, left_spend * fraction)
    return Spent(tokens, spend)


@dataclass
class Lease:
    """This ingress's share of one account's budget in one period window, as granted by
    the database (cumulative over the window), and what it has used of it: requests over
    (``used``), and those in flight (the account's ``Reservation``, passed in). A measure
    the budget does not limit is None: nothing to check."""

    budget: Budget  # as when taken: a top-up or the next window's take asks for it
    window: float  # the period window's start (``period_start``)
    tokens: int | None
    spend: float | None
    valid_until: float  # monotonic: past it the lease may have been taken back
    share_tokens: int = 0  # the last take's share: a top-up is asked for below half
    share_spend: float = 0.0
    used_tokens: int = 0
    used_spend: float = 0.0
    last_used: float = 0.0  # monotonic; an idle lease is given back

    def fits(self, budget: Budget, window: float, mono: float) -> bool:
        """Whether this lease may admit requests under ``budget`` in ``window`` now."""
        return (mono < self.valid_until and window == self.window
                and budget.period == self.budget.period
                and (self.tokens is None) == (budget.tokens is None)
                and (self.spend is None) == (budget.spend is None))

    @property
    def period(self) -> str:
        return self.budget.period

    def room(self, held: Spent) -> Spent:
        """What is left to admit requests from (may be negative: nothing)."""
        return Spent(0 if self.tokens is None else self.tokens - self.used_tokens - held.tokens,
                     0.0 if self.spend is None else self.spend - self.used_spend - held.spend)

    def shortfall(self, held: Spent, tokens: int, spend: float) -> Spent | None:
        """How much more a request reserving ``tokens`` and ``spend`` needs than is left
        (None: it fits)."""
        room = self.room(held)
        short_tokens = 0 if self.tokens is None else max(0, tokens - room.tokens)
        short_spend = 0.0 if self.spend is None else max(0.0, spend - room.spend)
        if short_tokens == 0 and short_spend <= 1e-12:
            return None
        return Spent(short_tokens, short_spend)

    def low(self, held: Spent) -> bool:
        """Whether less than half the last share is left: time to top up, before a
        request has to wait for it."""
        room = self.room(held)
        return (self.tokens is not None and room.tokens * 2 < self.share_tokens) or (
            self.spend is not None and room.spend * 2 < self.share_spend)

    def unused(self, held: Spent) -> Spent:
        """What may be given back: granted but neither used nor held."""
        room = self.room(held)
        return Spent(max(0, room.tokens), max(0.0, room.spend))

    def shrink(self, back: Spent) -> None:
        """``back`` was given back (``unused``)."""
        if self.tokens is not None:
            self.tokens -= back.tokens
        if self.spend is not None:
            self.spend -= back.spend

    def add(self, granted: Spent, mono: float, valid_until: float) -> None:
        """A take granted this much more (``valid_until``: by the database's lease)."""
        if self.tokens is not None:
            self.tokens += granted.tokens
        if self.spend is not None:
            self.spend += granted.spend
        self.share_tokens, self.share_spend = granted.tokens, granted.spend
        self.valid_until = max(self.valid_until, valid_until)
        self.last_used = max(self.last_used, mono)


# An idle lease is given back once it holds more than this part of what is left of the
# budget as this ingress knows it (so that near the end the others can have it), and in
# any case after ``LEASE_IDLE_MAX_S``: a key used now and then keeps its share (no wait
# for a take) while the budget is far from spent.
LEASE_IDLE_S = 2.0
LEASE_IDLE_MAX_S = 600.0
LEASE_IDLE_PART = 0.5


def give_back_idle(lease: Lease, held: Spent, spent: Spent, mono: float) -> bool:
    """Whether this ingress should give back ``lease`` now: idle (no request admitted
    from it for ``LEASE_IDLE_S``, none in flight), and either idle for long or holding
    much of what is left of its budget (``spent``: the period's use, as this ingress
    knows it)."""
    idle = mono - lease.last_used
    if idle < LEASE_IDLE_S or held.tokens > 0 or held.spend > 1e-12:
        return False
    if idle >= LEASE_IDLE_MAX_S:
        return True
    unused = lease.unused(held)
    budget = lease.budget
    return (budget.tokens is not None
            and unused.tokens > LEASE_IDLE_PART * (budget.tokens - spent.tokens)) or (
        budget.spend is not None
        and unused.spend > LEASE_IDLE_PART * (budget.spend - spent.spend))

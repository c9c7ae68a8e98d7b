"""Who may use this ingress: the API key check, limits and budgets on the request path,
from an in-memory copy of the keys that a background task keeps fresh.

The request path never waits for the database: ``admit`` looks the key's hash up in a
dict, checks it (``ingress.keys.check``), takes a slot from its limits
(``ingress.limits``) and returns a ``Grant``; ``finished`` gives the slot back and charges
the tokens used.

**Budgets are reserved, then settled** (``ingress.budgets``). A key's budget and its
team's (tokens and/or money, per day, month or lifetime) are both checked: the tighter
wins. A request under a budget reserves, at admission, what it may use at most: its
``max_tokens`` (``DEFAULT_RESERVE`` when it sets none) plus its body's length in bytes (a
bound on its prompt's tokens: a token covers at least a byte of text), and for a money
budget those tokens at the model's highest price (a model without a price is refused to
a key or team with a money budget: its use could not be counted). A request is admitted
only while each account's used plus reserved amount is below its budget; on completion
the reservation is replaced by what the engine reported. Requests in flight at once
therefore cannot each spend the same remainder: on one ingress process a budget is
overshot by at most the last admitted request's own use; a remainder held by requests in
flight is a 429 ``budget_reserved`` until they finish. On PostgreSQL (several ingress
nodes) a request must also fit in this ingress's lease of each budget
(``ingress.leases``): when it does not, the request is refused with a 429 at once (this
gate is synchronous) and a background task takes more through the database; a lease
running low is topped up before it runs out, so the common case waits for nothing.

``run`` refreshes the copy every ``refresh_interval`` (1 s): keys changed
since the last refresh (so a revocation anywhere takes effect here within about a second;
the promise is 5 s), the tokens each key has used (budgets), and the keyed requests other
ingress nodes sharing the database served (charged to the buckets here, so a key's limits
hold across nodes); and it renews this ingress's leases, and gives back idle ones.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import trio

from ingress import keystore, leases, prices, usage
from ingress.budgets import (
    Account,
    Budget,
    Lease,
    Ledger,
    Reservation,
    Spent,
    give_back_idle,
    period_start,
    refusal,
)
from ingress.database import Database
from ingress.internal_auth import InternalCredentials
from ingress.keys import ApiKey, bearer, check, hash_secret
from ingress.keystore import Team
from ingress.limits import KeyLimits, limits_for
from ingress.prices import PriceList
from ingress.standing import Standing, standing_of
from otela.config.schema import default_of
from otela.dataplane.errors import RequestError

log = logging.getLogger("otela.ingress.access")

# Others' rows may commit out of order (PostgreSQL: a row's recorded_at is its statement's
# time, its commit comes later): look back this far on the database's clock, skip ids
# seen. A transaction that takes longer than this between insert and commit is missed.
_LOOKBACK_S = 5.0
_NOT_ADMITTED = frozenset({401, 403, 429})  # refused where they were: took no slot
_HEADER_MEMO_MAX = 4096  # Authorization headers whose secret hash is remembered
# Tokens a request that sets no max_tokens reserves against its key's budget until it is
# over (docs/ingress.md#limits).
DEFAULT_RESERVE = 1024
# After a take found nothing left of a budget, the next is made no sooner than this: near
# a budget's end the ingress nodes pass what is left between them (each gives back what
# its lease cannot use), one round per take, so a round must be short; but a budget that
# is spent must not cost a transaction per refused request.
_DRY_S = 0.1


@dataclass(frozen=True)
class KeyBudgets:
    """A key's budgets as its requests check them, worked out once per key change: each
    (account, budget, how an error names it), the accounts, whether any is in money."""

    checks: tuple[tuple[Account, Budget, str], ...]
    accounts: tuple[Account, ...]
    money: bool


@dataclass
class Grant:
    """A request admitted under ``key``: the routing trust set and what to charge."""

    key: ApiKey
    limits: KeyLimits
    reserved: int = 0  # budget tokens held for this request (budgeted accounts only)
    reserved_spend: float = 0.0  # and money
    team_limits: KeyLimits | None = None  # its team's limits, shared by the team's keys
    charged: tuple[Account, ...] = ()  # the accounts its use is recorded in: key, team
    budgeted: tuple[Account, ...] = ()  # the budgeted accounts holding the reservation
    model: str = ""  # to price what it used (budgeted requests only)

    @property
    def providers(self) -> frozenset[str] | None:
        return self.key.providers


class Access:
    def __init__(self, db: Database, ingress_id: str, refresh_interval: float = 1.0,
                 priority_classes: Sequence[str] | None = None,
                 default_priority: str | None = None, lease_budgets: bool | None = None,
                 lease_ttl: float = leases.LEASE_TTL_S) -> None:
        self.db = db
        # The ingress's priority classes, best first (``[routing] priority_classes``): a
        # key's and its team's best class compare on them (``tighter_class``).
        classes = list(priority_classes or default_of("priority_classes"))
        self.class_rank = {name: rank for rank, name in enumerate(classes)}
        self.default_rank = self.class_rank.get(
            default_priority or default_of("default_priority"), 0)
        self.ingress_id = ingress_id
        self.refresh_interval = refresh_interval
        self.by_hash: dict[str, ApiKey] = {}
        # Authorization header -> its key: a client on a keep-alive connection sends the
        # same header every time, and parsing and hashing it again was most of the
        # check's cost. Emptied whenever a key changes (``remember``) and when full; only
        # headers of usable keys go in, so strangers cannot grow it.
        self._key_of: dict[bytes | None, ApiKey] = {}
        self._grants: dict[str, Grant] = {}  # one per key (it holds no per-request state)
        self.by_id: dict[str, ApiKey] = {}
        self.teams: dict[str, Team] = {}  # weights and budgets; a team not listed: 1, none
        self.prices = PriceList()  # usage rows' spend (``ingress.prices``), as last read
        self.limits: dict[str, KeyLimits] = {}
        self.team_limits: dict[str, KeyLimits] = {}  # teams with limits of their own
        # Every key's and team's use per period window: at load, plus what this process
        # served and what others wrote since; and what requests in flight here hold.
        self.ledger = Ledger(time.time())
        self.reservation = Reservation()
        self._budgets: dict[str, KeyBudgets] = {}  # per key: its and its team's budgets
        # Budget leases (``ingress.leases``): on PostgreSQL, where several ingress nodes
        # share the database, a budgeted request is admitted only from this ingress's
        # share of the budget; on SQLite (one ingress process) the ledger is exact.
        self.lease_budgets = db.dialect == "postgresql" if lease_budgets is None \
            else lease_budgets
        self.lease_ttl = lease_ttl
        self.leases: dict[Account, Lease] = {}
        self._wanted: dict[Account, tuple[Budget, Spent]] = {}  # takes to make: the need
        self._lease_wake: trio.Event | None = None  # set when ``_wanted`` gains one
        # Set when the round of takes that includes the wants asked for so far is over
        # (``lease_taken``: a request refused for want of a lease waits for it once).
        self._round_over = trio.Event()
        self._dry_until: dict[Account, float] = {}  # monotonic: the last take found none
        self._forgotten_day = 0.0  # the day whose earlier windows were removed
        self._keys_seen_at = 0.0
        self._others_after = 0.0  # database clock; set by ``load``
        self._others_seen: dict[str, float] = {}
        self.refreshes = 0
        self.refresh_failures = 0
        self.last_refresh_ok = True  # /v1/health's database_status
        # The batch runner's tokens (``ingress.internal_auth``); None: none accepted.
        self.internal: InternalCredentials | None = None

    # -- the request path --------------------------------------------------------------

    # Every line here runs on every request: the request path's cost is counted in
    # microseconds (docs/performance.md#the-ingress-service), hence the fast paths.

    def authenticate(self, authorization: bytes | None) -> ApiKey:
        """The key named by an ``Authorization`` header (or an ``x-api-key``, given as
        ``Bearer <key>``: ``otela.dataplane.headers.credential``), usable now; else the
        401."""
        key = self._key_of.get(authorization)
        if key is not None and (key.expires_at is None or time.time() < key.expires_at):
            return key
        token = bearer(authorization)
        key = None if token is None else self.by_hash.get(hash_secret(token))
        if key is None and token is not None and self.internal is not None:
            key = self._acting_for(token)
        check(key, None, time.time(), 0)
        assert key is not None
        if len(self._key_of) >= _HEADER_MEMO_MAX:
            self._key_of.clear()
        self._key_of[authorization] = key
        return key

    def _acting_for(self, token: bytes) -> ApiKey | None:
        """The key a batch runner's token acts for (``ingress.internal_auth``), unless
        revoked: as with its own secret, a revoked key is unknown."""
        assert self.internal is not None
        key_id = self.internal.key_id(token)
        key = None if key_id is None else self.by_id.get(key_id)
        return key if key is not None and key.revoked_at is None else None

    def screen(self, authorization: bytes | None) -> None:
        """What can be refused before a request's body is read: the key (401), its budget
        (403) and its limits (429); raises the error, takes nothing."""
        key = self.authenticate(authorization)
        budgets = self._budgets.get(key.id)
        if budgets is not None:
            self._check_budgets(budgets.checks, time.time())
        limits = self.limits.get(key.id)
        if limits is not None:
            limits.check(time.monotonic())
        team_limits = self._team_limits(key)
        if team_limits is not None:
            team_limits.check(time.monotonic())

    def _team_limits(self, key: ApiKey) -> KeyLimits | None:
        """The limits of ``key``'s team, shared by all its keys, if it has any."""
        if not key.team:
            return None
        limits = self.team_limits.get(key.team)
        if limits is None:
            team = self.teams.get(key.team)
            if team is None or not team.limited:
                return None
            limits = self.team_limits[key.team] = limits_for(
                team.rpm, team.tpm, team.max_concurrent, f"Team {team.name[:100]}")
        return limits

    def _check_budgets(self, budgets: tuple[tuple[Account, Budget, str], ...],
                       now: float) -> None:
        for account, budget, whose in budgets:
            error = refusal(budget, self.ledger.spent(account, budget.period, now),
                            self.reservation.of(account), whose, now)
            if error is not None:
                raise error

    def used(self, key_id: str) -> int:
        """A key's tokens used over its life, as this process knows now."""
        return self.ledger.spent(("key", key_id), "lifetime", time.time()).tokens

    def standing(self, key: ApiKey) -> Standing:
        """``key``'s standing as this process knows it now (its use in its budget's
        period, whether it or its team is over budget): the rule every view applies
        (``ingress.standing``), on this process's ledger instead of the database."""
        return standing_of(key, self.ledger, self.teams, time.time())

    def admit(self, key: ApiKey, model: str, max_tokens: int | None = None,
              prompt_bound: int = 0) -> Grant:
        """``key`` may ask for ``model`` now (raises 403/429 otherwise); takes a slot and,
        under a budget, reserves ``max_tokens`` (``DEFAULT_RESERVE``) plus
        ``prompt_bound`` of it (see the module docstring)."""
        key_id = key.id
        budgets = self._budgets.get(key_id)
        if key.models is not None:
            check(key, model, time.time(), 0)
        reserve_spend = 0.0
        reserve = 0
        if budgets is not None:
            now = time.time()
            self._check_budgets(budgets.checks, now)
            prompt_reserve = max(0, prompt_bound)
            output_reserve = max_tokens if max_tokens is not None and max_tokens > 0 \
                else DEFAULT_RESERVE
            reserve = prompt_reserve + output_reserve
            if budgets.money:
                highest = self.prices.highest(model)
                if highest is None:
                    raise RequestError(
                        403, f"The model `{model[:200]}` has no price, and this API key "
                        "has a budget in money: its use could not be counted.",
                        code="model_unpriced", param="model")
                reserve_spend = highest.spend(prompt_reserve, output_reserve)
            if self.lease_budgets:
                self._check_leases(budgets.checks, reserve, reserve_spend)
        team_limits = self._team_limits(key)
        grant = self._grants.get(key_id)
        if grant is None or grant.key is not key or grant.team_limits is not team_limits:
            limits = self.limits.get(key_id)
            if limits is None:
                limits = self.limits[key_id] = limits_for(key.rpm, key.tpm, key.max_concurrent)
            charged: tuple[Account, ...] = (("key", key_id),) if not key.team else (
                ("key", key_id), ("team", key.team))
            grant = self._grants[key_id] = Grant(key, limits, team_limits=team_limits,
                                                 charged=charged)
        mono = time.monotonic()
        if team_limits is None:
            grant.limits.admit(mono)
        else:  # both or neither: a team refusal must not take the key's slot
            team_limits.check(mono)
            grant.limits.admit(mono)
            team_limits.admit(mono)
        if budgets is None:
            return grant
        for account in budgets.accounts:
            self.reservation.hold(account, reserve, reserve_spend)
        # Its own grant: it carries the reservation.
        return Grant(key, grant.limits, reserve, reserve_spend, team_limits, grant.charged,
                     budgets.accounts, model)

    def finished(self, grant: Grant, tokens: int, prompt_tokens: int = 0,
                 provider: str = "") -> None:
        """A request admitted here is over: it used ``tokens`` (``prompt_tokens`` of them
        its prompt's), served by ``provider``."""
        mono = time.monotonic()
        grant.limits.finished(tokens, mono)
        if grant.team_limits is not None:
            grant.team_limits.finished(tokens, mono)
        for account in grant.budgeted:
            self.reservation.release(account, grant.reserved, grant.reserved_spend)
        if tokens:
            now = time.time()
            spend = 0.0
            if grant.budgeted:  # priced only where a budget counts money or tokens
                spend = self.prices.spend(grant.model, provider, prompt_tokens,
                                          tokens - prompt_tokens) or 0.0
            for account in grant.charged:
                self.ledger.add(account, tokens, spend, now)
            if self.leases:  # what it held of its lease is now used
                for account in grant.budgeted:
                    lease = self.leases.get(account)
                    if lease is not None:
                        lease.used_tokens += tokens
                        lease.used_spend += spend

    # -- budget leases (``ingress.leases``) ---------------------------------------------

    def _window(self, period: str) -> float:
        """The start of ``period``'s current window, as the ledger last turned it."""
        if period == "lifetime":
            return 0.0
        return self.ledger.month_start if period == "month" else self.ledger.day_start

    def _check_leases(self, checks: tuple[tuple[Account, Budget, str], ...], tokens: int,
                      spend: float) -> None:
        """A budgeted request may start only if this ingress's lease of each of its
        budgets covers its reservation (on top of what requests in flight here hold);
        otherwise a take is asked of the background task and the request is refused
        with a 429 to retry (``admit`` is synchronous: it cannot wait for the database).
        A lease running low is topped up before it runs out."""
        mono = time.monotonic()
        for account, budget, whose in checks:
            lease = self.leases.get(account)
            held = self.reservation.of(account)
            if lease is not None and lease.fits(budget, self._window(budget.period), mono):
                short = lease.shortfall(held, tokens, spend)
                if short is None:
                    lease.last_used = mono
                    if lease.low(Spent(held.tokens + tokens, held.spend + spend)):
                        self._want(account, budget, Spent())
                    continue
            else:
                short = Spent(tokens + held.tokens, spend + held.spend)
            self._want(account, budget, short)
            raise RequestError(
                429, f"The rest of {whose[0].lower() + whose[1:]} budget is being shared "
                "out between ingress nodes; retry in a second.", code="budget_reserved",
                headers={"Retry-After": "1"})

    async def lease_taken(self, timeout: float) -> bool:
        """Wait, at most ``timeout`` seconds, until the takes of budget leases asked for so
        far are made; ``False`` at once where nothing was asked (no leases here, or a
        refusal for another reason). The request path calls it after a 429
        ``budget_reserved`` and asks again once: so an account's first request on an
        ingress, or one that finds the lease run down, waits for the database's answer
        (milliseconds) instead of being refused."""
        if not self.lease_budgets or not self._wanted:
            return False
        with trio.move_on_after(timeout):
            await self._round_over.wait()
            return True
        return False

    def _want(self, account: Account, budget: Budget, need: Spent) -> None:
        old = self._wanted.get(account)
        if old is not None:
            need = Spent(max(need.tokens, old[1].tokens), max(need.spend, old[1].spend))
        self._wanted[account] = (budget, need)
        if self._lease_wake is not None:
            self._lease_wake.set()

    async def _keep_leases(self) -> None:
        """Make the takes the request path asked for, one at a time, in a worker thread;
        an account whose last take found nothing left is not asked again for ``_DRY_S``
        (its use reaches the ledger within a refresh: then a 403)."""
        while True:
            if not self._wanted:
                self._lease_wake = trio.Event()
                await self._lease_wake.wait()
            wanted, self._wanted = self._wanted, {}
            over, self._round_over = self._round_over, trio.Event()
            try:
                for account, (budget, need) in wanted.items():
                    if self._dry_until.get(account, 0.0) <= time.monotonic():
                        await self._take(account, budget, need)
            finally:
                over.set()
            await trio.sleep(0.002)  # gather the next requests' wants: one take each

    async def _take(self, account: Account, budget: Budget, need: Spent) -> None:
        window = self._window(budget.period)
        started = time.monotonic()
        try:
            granted = await self.db.in_thread(
                leases.take, self.db, self.ingress_id, account, budget, window, need,
                time.time(), self.lease_ttl)
        except Exception as exc:  # the database is away: requests keep getting 429
            log.warning("ingress: could not take a budget lease (%s)", exc)
            granted = None
        if granted is None:
            self._dry_until[account] = time.monotonic() + _DRY_S
            if need.tokens > 0 or need.spend > 1e-12:  # a request waited: this is stranded
                await self._give_back(account)
            return
        self._dry_until.pop(account, None)
        valid_until = started + self.lease_ttl - self._lease_margin()
        lease = self.leases.get(account)
        if lease is None or not lease.fits(budget, window, started):
            # A new window (the old one's rest belongs to a period that is over), a budget
            # of another kind, or a lease that lapsed (it may have been taken back: what
            # it had left must not be used): afresh. The take asked for what the
            # requests in flight hold (``_check_leases``).
            lease = self.leases[account] = Lease(
                budget, window, None if budget.tokens is None else 0,
                None if budget.spend is None else 0.0, valid_until, last_used=started)
        lease.budget = budget
        lease.add(granted, started, valid_until)

    async def _give_back(self, account: Account) -> None:
        """Free what this ingress's lease of ``account`` has left (neither used nor held
        by requests in flight), here and in the database at once: when nothing is left
        to take (too little for the request that asked, it may do for another ingress's),
        when the lease is idle, when the ingress stops. The lease itself stays: the
        requests in flight settle against it, and a take adds to it again."""
        lease = self.leases.get(account)
        if lease is None:
            return
        unused = lease.unused(self.reservation.of(account))
        if unused.tokens <= 0 and unused.spend <= 1e-12:
            return
        lease.shrink(unused)
        try:
            await self.db.in_thread(leases.give_back, self.db, self.ingress_id, account,
                                    lease.period, lease.window, unused)
        except Exception as exc:  # it stays spoken for until it expires
            log.warning("ingress: could not give back a budget lease (%s)", exc)

    def _lease_margin(self) -> float:
        return min(leases.LEASE_MARGIN_S, self.lease_ttl / 6)

    async def _tend_leases(self) -> None:
        """At every refresh: renew this ingress's leases (one whose row is gone was taken
        back: it is not extended, and lapses), take the next window's share of those whose
        window ended, and give back idle ones (``give_back_idle``). A lease taken while
        the renewal ran is not among those renewed, and needs not be: its take set its
        expiry."""
        started = time.monotonic()
        wall = time.time()
        if self._forgotten_day != period_start("day", wall):
            await self.db.in_thread(leases.forget_ended, self.db,
                                    period_start("month", wall), period_start("day", wall))
            self._forgotten_day = period_start("day", wall)
        if not self.leases:
            return
        kept = await self.db.in_thread(leases.renew, self.db, self.ingress_id,
                                       self.lease_ttl)
        valid_until = started + self.lease_ttl - self._lease_margin()
        self.ledger.turn(wall)  # the windows the request path and the takes use
        for account, lease in list(self.leases.items()):
            held = self.reservation.of(account)
            if self._window(lease.period) != lease.window:
                del self.leases[account]
                if held.tokens > 0 or started - lease.last_used < leases.LEASE_TTL_S:
                    self._want(account, lease.budget, Spent(held.tokens, held.spend))
            else:
                if (account, lease.period, lease.window) in kept:
                    lease.valid_until = max(lease.valid_until, valid_until)
                if give_back_idle(lease, held,
                                  self.ledger.spent(account, lease.period, wall), started):
                    await self._give_back(account)

    async def _give_back_all(self) -> None:
        """This ingress stops: what its leases hold unused is free for the others."""
        for account in list(self.leases):
            await self._give_back(account)
        self.leases.clear()

    def team_of(self, key_id: str | None) -> str | None:
        """A key's team now (a usage row's ``team``)."""
        key = None if key_id is None else self.by_id.get(key_id)
        return None if key is None else key.team

    def user_of(self, key_id: str | None) -> str | None:
        """A key's single sign-on user now (a usage row's ``user_id``)."""
        key = None if key_id is None else self.by_id.get(key_id)
        return None if key is None else key.user_id

    # -- keeping the copy fresh --------------------------------------------------------

    def load(self) -> None:
        """The first full read (blocking; at start, before the port opens): every key and
        team, and what each has used in each period window, from one consistent read of
        the usage table."""
        started = time.time()
        self._take_teams(keystore.teams(self.db))
        self.prices = prices.price_list(self.db)
        self.remember(keystore.changed_since(self.db, 0.0))
        self._keys_seen_at = started
        after = self.db.now() - _LOOKBACK_S
        totals, recent = usage.totals_and_recent(self.db, after, started)
        self.ledger = Ledger.from_totals(totals, started)
        self._others_after = after
        self._others_seen = {row_id: recorded for row_id, ingress, recorded in recent
                             if ingress != self.ingress_id}

    def _take_teams(self, teams: dict[str, Team]) -> bool:
        """Take the teams table as read; whether anything changed. A team's limits keep
        what was used, at the new rates (or go, with the team's last limit)."""
        if teams == self.teams:
            return False
        self.teams = teams
        for name, limits in list(self.team_limits.items()):
            team = teams.get(name)
            if team is None or not team.limited:
                del self.team_limits[name]
            else:
                limits.reconfigure(team.rpm, team.tpm, team.max_concurrent)
        return True

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                if self.lease_budgets:
                    nursery.start_soon(self._keep_leases)
                task_status.started()
                while True:
                    await trio.sleep(self.refresh_interval)
                    if not await self.refresh_now() or not self.lease_budgets:
                        continue
                    try:
                        await self._tend_leases()
                    except Exception as exc:  # the database is away: serve from the copy
                        self._refresh_failed(exc)
        finally:
            if self.leases:
                with trio.move_on_after(5.0) as scope:
                    scope.shield = True
                    try:
                        await self._give_back_all()
                    except Exception as exc:  # they expire instead
                        log.warning("ingress: could not give back budget leases (%s)", exc)

    async def refresh_now(self) -> bool:
        """``refresh`` in a worker thread, now (the periodic one, or a change made through
        this node's admin API); False, counted and logged, if the database failed: the
        copy serves meanwhile."""
        try:
            await self.db.in_thread(self.refresh)
        except Exception as exc:  # the database is away: serve from the copy
            self._refresh_failed(exc)
            return False
        return True

    def _refresh_failed(self, exc: Exception) -> None:
        self.refresh_failures += 1
        self.last_refresh_ok = False
        log.warning("ingress: could not refresh keys and usage (%s)", exc)

    def refresh(self) -> None:
        """What changed since the last refresh: keys, and the rows other ingress processes
        wrote (O(new rows), never a scan of the whole usage table)."""
        started = time.time()
        changed = keystore.changed_since(self.db, self._keys_seen_at - 1.0)
        self.prices = prices.price_list(self.db)  # a few rows: read whole, not diffed
        if self._take_teams(keystore.teams(self.db)):
            # Every key again, as stored: ``by_id`` holds them narrowed by their team's
            # old settings (a team's list of models may have grown).
            changed = keystore.changed_since(self.db, 0.0)
        db_now = self.db.now()
        others = usage.recent_by_others(self.db, self.ingress_id, self._others_after)
        self.remember(changed)
        self._keys_seen_at = started
        self._take_others(others, db_now)
        self.refreshes += 1
        self.last_refresh_ok = True

    def remember(self, changed: list[ApiKey]) -> None:
        """Take these keys as they now are (a refresh, or a change made through this node)."""
        if changed:
            self._key_of.clear()
        for key in changed:
            if key.team:  # held to its team's settings, as the teams table says now
                key = self._in_team(key)
            old = self.by_id.get(key.id)
            if old is not None:
                self.by_hash.pop(old.secret_hash, None)
            self.by_id[key.id] = key
            if key.revoked_at is None:
                self.by_hash[key.secret_hash] = key
            limits = self.limits.get(key.id)
            if limits is not None:
                limits.reconfigure(key.rpm, key.tpm, key.max_concurrent)
            budgets = self._key_budgets(key)
            if budgets is None:
                self._budgets.pop(key.id, None)
            else:
                self._budgets[key.id] = budgets

    def _in_team(self, key: ApiKey) -> ApiKey:
        """``key`` as its team holds it: the team's weight, the models and providers both
        allow (a key narrows its team's lists, never widens them), and the tighter of
        their best priority classes."""
        team = self.teams.get(key.team or "")
        if team is None:
            return replace(key, team_weight=1.0)
        return replace(key, team_weight=team.weight,
                       models=_narrowest(key.models, team.models),
                       providers=_narrowest(key.providers, team.providers),
                       priority=self.tighter_class(key.priority, team.priority))

    def tighter_class(self, mine: str | None, theirs: str | None) -> str | None:
        """The tighter of two best allowed priority classes (a key's, its team's): the one
        further down the ingress's list. None allows any class; a class this ingress does
        not have counts as its default class, as the queue reads it
        (``otela.routing.admission.AdmissionQueue.class_of``)."""
        if mine is None or theirs is None:
            return theirs if mine is None else mine
        rank = self.class_rank.get
        return theirs if rank(theirs, self.default_rank) > rank(mine, self.default_rank) \
            else mine

    def _key_budgets(self, key: ApiKey) -> KeyBudgets | None:
        """The budgeted accounts of ``key``'s requests (its own, its team's), if any."""
        found: list[tuple[Account, Budget, str]] = []
        if key.budget:
            found.append((("key", key.id), key.budget, "This API key's"))
        team = self.teams.get(key.team) if key.team else None
        if team is not None and team.budget:
            found.append((("team", team.name), team.budget, f"Team {team.name[:100]}'s"))
        if not found:
            return None
        return KeyBudgets(tuple(found), tuple(account for account, _, _ in found),
                          any(budget.spend is not None for _, budget, _ in found))

    def _take_others(self, rows: list[usage.OtherRow], db_now: float) -> None:
        """Others' rows count towards budgets (all) and this node's buckets (those that
        were admitted there), each once. The next scan starts ``_LOOKBACK_S`` before
        ``db_now`` (the database's clock when this scan began): whether or not anyone
        else writes, each scan reads only the last seconds' rows."""
        now = time.monotonic()
        wall = time.time()
        for row in rows:
            if row.id in self._others_seen:
                continue
            self._others_seen[row.id] = row.recorded_at
            if row.tokens:
                self.ledger.add(("key", row.key_id), row.tokens, row.spend, wall,
                                row.finished_at)
                if row.team:
                    self.ledger.add(("team", row.team), row.tokens, row.spend, wall,
                                    row.finished_at)
            if row.status in _NOT_ADMITTED:
                continue
            limits = self.limits.get(row.key_id)
            if limits is not None:
                limits.charge(1, row.tokens, now)
            team_limits = self.team_limits.get(row.team) if row.team else None
            if team_limits is not None:
                team_limits.charge(1, row.tokens, now)
        self._others_after = max(self._others_after, db_now - _LOOKBACK_S)
        horizon = self._others_after
        self._others_seen = {k: t for k, t in self._others_seen.items() if t > horizon}


def _narrowest(mine: frozenset[str] | None, theirs: frozenset[str] | None
               ) -> frozenset[str] | None:
    """What both lists allow (None allows everything)."""
    if mine is None:
        return theirs
    return mine if theirs is None else mine & theirs

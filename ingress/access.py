"""Who may use this ingress: the API key check, limits and budgets on the request path,
from an in-memory copy of the keys that a background task keeps fresh.

The request path never waits for the database: ``admit`` looks the key's hash up in a
dict, checks it (``ingress.keys.check``), takes a slot from its limits
(``ingress.limits``) and returns a ``Grant``; ``finished`` gives the slot back and charges
the tokens used.

**Budgets are reserved, then settled.** A request of a key with a token budget reserves,
at admission, what it may use at most: its ``max_tokens`` (``DEFAULT_RESERVE`` when it
sets none) plus its body's length in bytes (a bound on its prompt's tokens: a token covers
at least a byte of text). A request is admitted only while the key's used plus reserved
tokens are below its budget; on completion the reservation is replaced by the tokens the
engine reported. Requests in flight at once therefore cannot each spend the same
remainder: on one ingress process a budget is overshot by at most the last admitted
request's own tokens (its prompt and, when it set ``max_tokens``, at most that many
generated); a remainder held by requests in flight is a 429 ``budget_reserved`` until
they finish.

``run`` refreshes the copy every ``refresh_interval`` (1 s): keys changed
since the last refresh (so a revocation anywhere takes effect here within about a second;
the promise is 5 s), the tokens each key has used (budgets), and the keyed requests other
ingress nodes sharing the database served (charged to the buckets here, so a key's limits
hold across nodes).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Any

import trio

from ingress import keystore, prices, usage
from ingress.database import Database
from ingress.internal_auth import InternalCredentials
from ingress.keys import ApiKey, bearer, check, hash_secret
from ingress.limits import KeyLimits, limits_for
from ingress.prices import PriceList
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


@dataclass
class Grant:
    """A request admitted under ``key``: the routing trust set and what to charge."""

    key: ApiKey
    limits: KeyLimits
    reserved: int = 0  # budget tokens held for this request (budgeted keys only)

    @property
    def providers(self) -> frozenset[str] | None:
        return self.key.providers


class Access:
    def __init__(self, db: Database, ingress_id: str, refresh_interval: float = 1.0) -> None:
        self.db = db
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
        self.team_weights: dict[str, float] = {}  # fair sharing: a team not listed weighs 1
        self.prices = PriceList()  # usage rows' spend (``ingress.prices``), as last read
        self.limits: dict[str, KeyLimits] = {}
        self.used_tokens: dict[str, int] = {}  # at load, plus what others wrote since
        self.used_here: dict[str, int] = {}  # by this process since load
        self.reserved: dict[str, int] = {}  # budget tokens held by requests in flight here
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
        if key.budget_tokens is not None:
            check(key, None, time.time(), self.used(key.id))
            self._check_reserved(key)
        limits = self.limits.get(key.id)
        if limits is not None:
            limits.check(time.monotonic())

    def _check_reserved(self, key: ApiKey) -> None:
        """The rest of the budget is held by this key's requests in flight: 429, as for a
        rate (it comes back when they finish, unlike a budget used up, 403)."""
        assert key.budget_tokens is not None
        if self.committed(key.id) >= key.budget_tokens:
            raise RequestError(
                429, f"The rest of this API key's token budget ({key.budget_tokens}) is "
                "reserved by its requests in flight; retry when they have finished.",
                code="budget_reserved", headers={"Retry-After": "1"})

    def committed(self, key_id: str) -> int:
        """A key's tokens used (everywhere, as last read) and reserved (in flight here)."""
        return self.used_tokens.get(key_id, 0) + self.used_here.get(key_id, 0) + \
            self.reserved.get(key_id, 0)

    def used(self, key_id: str) -> int:
        """A key's tokens used, as this process knows now (``/v1/me``): the database's
        total at the last refresh plus what this process served since."""
        return self.used_tokens.get(key_id, 0) + self.used_here.get(key_id, 0)

    def admit(self, key: ApiKey, model: str, max_tokens: int | None = None,
              prompt_bound: int = 0) -> Grant:
        """``key`` may ask for ``model`` now (raises 403/429 otherwise); takes a slot and,
        for a key with a budget, reserves ``max_tokens`` (``DEFAULT_RESERVE``) plus
        ``prompt_bound`` of it."""
        key_id = key.id
        if key.models is not None or key.budget_tokens is not None:
            check(key, model, time.time(), self.used(key_id))
            if key.budget_tokens is not None:
                self._check_reserved(key)
        grant = self._grants.get(key_id)
        if grant is None or grant.key is not key:
            limits = self.limits.get(key_id)
            if limits is None:
                limits = self.limits[key_id] = limits_for(key.rpm, key.tpm, key.max_concurrent)
            grant = self._grants[key_id] = Grant(key, limits)
        grant.limits.admit(time.monotonic())
        if key.budget_tokens is None:
            return grant
        reserve = max(0, prompt_bound) + (
            max_tokens if max_tokens is not None and max_tokens > 0 else DEFAULT_RESERVE)
        self.reserved[key_id] = self.reserved.get(key_id, 0) + reserve
        return Grant(key, grant.limits, reserve)  # its own: it carries the reservation

    def finished(self, grant: Grant, tokens: int) -> None:
        grant.limits.finished(tokens, time.monotonic())
        if grant.reserved:
            key_id = grant.key.id
            left = self.reserved.get(key_id, 0) - grant.reserved
            if left > 0:
                self.reserved[key_id] = left
            else:
                self.reserved.pop(key_id, None)
        if tokens:
            key_id = grant.key.id
            self.used_here[key_id] = self.used_here.get(key_id, 0) + tokens

    def team_of(self, key_id: str | None) -> str | None:
        """A key's team now (a usage row's ``team``)."""
        key = None if key_id is None else self.by_id.get(key_id)
        return None if key is None else key.team

    # -- keeping the copy fresh --------------------------------------------------------

    def load(self) -> None:
        """The first full read (blocking; at start, before the port opens): every key, and
        the tokens each has used, from one consistent read of the usage table."""
        started = time.time()
        self.team_weights = keystore.team_weights(self.db)
        self.prices = prices.price_list(self.db)
        self.remember(keystore.changed_since(self.db, 0.0))
        self._keys_seen_at = started
        after = self.db.now() - _LOOKBACK_S
        totals, recent = usage.totals_and_recent(self.db, after)
        self.used_tokens, self.used_here = totals, {}
        self._others_after = after
        self._others_seen = {row_id: recorded for row_id, ingress, recorded in recent
                             if ingress != self.ingress_id}

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await trio.sleep(self.refresh_interval)
            try:
                await self.db.in_thread(self.refresh)
            except Exception as exc:  # the database is away: keep serving from the copy
                self.refresh_failures += 1
                self.last_refresh_ok = False
                log.warning("ingress: could not refresh keys and usage (%s)", exc)

    def refresh(self) -> None:
        """What changed since the last refresh: keys, and the rows other ingress processes
        wrote (O(new rows), never a scan of the whole usage table)."""
        started = time.time()
        changed = keystore.changed_since(self.db, self._keys_seen_at - 1.0)
        weights = keystore.team_weights(self.db)
        self.prices = prices.price_list(self.db)  # a few rows: read whole, not diffed
        if weights != self.team_weights:  # every key of a team whose weight changed
            self.team_weights = weights
            changed = [*self.by_id.values(), *changed]
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
            if key.team:  # the team's weight, as the teams table says now
                key = replace(key, team_weight=self.team_weights.get(key.team, 1.0))
            old = self.by_id.get(key.id)
            if old is not None:
                self.by_hash.pop(old.secret_hash, None)
            self.by_id[key.id] = key
            if key.revoked_at is None:
                self.by_hash[key.secret_hash] = key
            limits = self.limits.get(key.id)
            if limits is not None:
                limits.reconfigure(key.rpm, key.tpm, key.max_concurrent)

    def _take_others(self, rows: list[tuple[str, str, int, int, float]],
                     db_now: float) -> None:
        """Others' rows count towards budgets (all) and this node's buckets (those that
        were admitted there), each once. The next scan starts ``_LOOKBACK_S`` before
        ``db_now`` (the database's clock when this scan began): whether or not anyone
        else writes, each scan reads only the last seconds' rows."""
        now = time.monotonic()
        for row_id, key_id, tokens, status, recorded in rows:
            if row_id in self._others_seen:
                continue
            self._others_seen[row_id] = recorded
            if tokens:
                self.used_tokens[key_id] = self.used_tokens.get(key_id, 0) + tokens
            limits = self.limits.get(key_id)
            if limits is not None and status not in _NOT_ADMITTED:
                limits.charge(1, tokens, now)
        self._others_after = max(self._others_after, db_now - _LOOKBACK_S)
        horizon = self._others_after
        self._others_seen = {k: t for k, t in self._others_seen.items() if t > horizon}

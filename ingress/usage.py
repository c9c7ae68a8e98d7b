"""Usage accounting: one row per request that reached the routing stage, written off the
request path and yet durable.

The request path only appends a tuple to a list (``finished``). ``run`` writes whatever has
gathered every ``flush_interval`` (25 ms by default) in one transaction. Rows carry an id
made here, never the client's request id, so a client cannot make two requests share a
row; each batch commits once, so nothing is counted twice. With SQLite in WAL mode a
commit survives a SIGKILL of the process, so every request whose response finished more
than one flush interval (plus the commit's own time) before a kill is in the database:
the durability promise is 100 ms, four intervals.

Queries for ``otela usage`` and the admin API are here too (``aggregate``, ``buckets``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from ingress.budgets import period_start
from ingress.database import Database, Row
from ingress.prices import PriceList
from otela.dataplane.exchange import Exchange

log = logging.getLogger("otela.ingress.usage")

_COLUMNS = ("id", "request_id", "key_id", "model", "route", "provider", "node_peer",
            "node_session", "prompt_tokens", "completion_tokens", "status", "error", "stream",
            "latency_ms", "ttft_ms", "started_at", "finished_at", "ingress", "spend", "team",
            "prompt", "user_id")
# recorded_at is the database's clock (``Database.now_sql``): the one clock every ingress
# node's refresh compares, so nodes' clock skew does not matter.
_MAX_TOKENS = 2**31 - 1  # what an engine may claim (a serving node could say anything)
_MAX_TEXT = 512
MAX_PROMPT = 64 * 1024  # characters of a prompt kept in the request log (opted in)


def _text(value: str) -> str:
    """Text as every database takes it: PostgreSQL refuses NUL characters."""
    if len(value) > _MAX_TEXT:
        value = value[:_MAX_TEXT]
    return value.replace("\x00", "\ufffd") if "\x00" in value else value


def _count(value: int) -> int:
    return value if 0 <= value <= _MAX_TOKENS else min(max(0, value), _MAX_TOKENS)


# What usage groups by: a column of the row (team and user: its key's then), or (owner)
# of the row's key as it is now.
GROUPS = {"key": "key_id", "team": "team", "user": "user_id", "model": "model",
          "provider": "provider", "node": "node_peer", "ingress": "ingress",
          "status": "status",
          "owner": "(SELECT owner FROM api_keys WHERE api_keys.id = usage.key_id)"}
# What usage filters on (``?key=...&model=...``, ``--key``, ``--model``): exact matches
# (``user``: a user's id; callers resolve an email first, ``keystore.user_id_of``).
FILTERS = {"key": "key_id", "team": "team", "user": "user_id", "model": "model",
           "provider": "provider", "node": "node_peer", "ingress": "ingress",
           "status": "status"}


class RowContext(Protocol):
    """What a usage row needs beyond its exchange (``ingress.access.Access``): the prices
    now, and a key's team and user now."""

    prices: PriceList

    def team_of(self, key_id: str | None) -> str | None: ...

    def user_of(self, key_id: str | None) -> str | None: ...


class _NoContext:
    prices = PriceList()

    def team_of(self, key_id: str | None) -> str | None:
        return None

    def user_of(self, key_id: str | None) -> str | None:
        return None


def tokens_of(exchange: Exchange) -> tuple[int, int]:
    """(prompt, completion) tokens the engine reported for ``exchange``."""
    tap = exchange.tap
    if tap is None:
        return 0, 0
    return tap.prompt_tokens or 0, tap.output_tokens


class UsageWriter:
    """An observer of the request path (``otela.api.observe``) that records usage rows."""

    def __init__(self, db: Database, ingress_id: str, flush_interval: float = 0.025,
                 context: RowContext | None = None, log_prompts: bool = False) -> None:
        self.db = db
        self.ingress_id = ingress_id
        self.log_prompts = log_prompts  # [ingress] log_prompts: the operator opted in
        self.context: RowContext = context or _NoContext()
        self.flush_interval = flush_interval
        self._finished: list[Exchange] = []  # not yet made rows
        self._rows: list[tuple[Any, ...]] = []  # rows to write (a failed batch's stay)
        self._prefix = os.urandom(8).hex()
        self._counter = 0
        self.written = 0
        self.failures = 0
        self.dropped = 0
        self.last_write_ok = True  # /v1/health's database_status

    def finished(self, exchange: Exchange) -> None:
        """On the request path: keep the exchange; its row is built at the next flush
        (one tight loop per batch costs the request path less than a row each time)."""
        if exchange.model:  # else refused before a model was named: not usage
            self._finished.append(exchange)

    def _row(self, exchange: Exchange) -> tuple[Any, ...]:
        prompt, completion = tokens_of(exchange)
        first = exchange.first_byte
        duration = exchange.duration
        self._counter += 1
        prompt, completion = _count(prompt), _count(completion)
        provider = _text(exchange.node_provider)
        # A request that used no tokens spent nothing, priced or not (a refusal, a
        # failure before the engine answered): not an 'unpriced' row either.
        spend = self.context.prices.spend(exchange.model, provider, prompt, completion) \
            if prompt or completion else 0.0
        return (f"{self._prefix}{self._counter:010x}", _text(exchange.request_id),
                exchange.api_key, _text(exchange.model), _text(exchange.route),
                provider, _text(exchange.node_peer),
                _text(exchange.node_session), prompt, completion,
                exchange.status, exchange.error, int(exchange.stream),
                round(duration * 1e3, 3), None if first is None else round(first * 1e3, 3),
                exchange.arrival, exchange.arrival + duration, self.ingress_id, spend,
                self.context.team_of(exchange.api_key), self._prompt(exchange),
                self.context.user_of(exchange.api_key))

    def _prompt(self, exchange: Exchange) -> str | None:
        prompt = exchange.prompt if self.log_prompts else None
        if prompt is None:
            return None
        prompt = prompt[:MAX_PROMPT]
        return prompt.replace("\x00", "\ufffd") if "\x00" in prompt else prompt

    def pending(self) -> int:
        return len(self._rows) + len(self._finished)

    async def run(self, *, task_status: Any = None) -> None:
        """Flush every ``flush_interval`` until cancelled; one last flush then. (trio is
        imported here, not by the module: the command line reads usage without it.)"""
        import trio

        if task_status is not None:
            task_status.started()
        try:
            while True:
                await trio.sleep(self.flush_interval)
                if self._rows or self._finished:
                    await self.flush()
        finally:
            with trio.CancelScope(shield=True):
                await self.flush()

    async def flush(self) -> None:
        if self._finished:
            finished, self._finished = self._finished, []
            for exchange in finished:
                try:
                    self._rows.append(self._row(exchange))
                except Exception:  # never seen; it must not stop the writer's task
                    self.dropped += 1
                    log.exception("usage: could not make a row of request %s",
                                  exchange.request_id[:100])
        if not self._rows:
            return
        rows, self._rows = self._rows, []
        try:
            await self.db.in_thread(self._write, rows)
            self.written += len(rows)
            self.last_write_ok = True
            return
        except Exception as exc:
            self.failures += 1
            self.last_write_ok = False
            log.warning("usage: could not write %d rows (%s)", len(rows), exc)
        # One row the database refuses must not hold the others back forever: write them
        # one by one; keep those that failed only if none went in (the database is away).
        kept = await self.db.in_thread(self._write_each, rows)
        self.written += len(rows) - len(kept)
        if len(kept) < len(rows):
            self.last_write_ok = True  # the database is there; it refused some rows
            self.dropped += len(kept)
            for row in kept:
                log.error("usage: the database refused row %s (request %s); dropped",
                          row[0], row[1])
        else:
            self._rows[:0] = rows
            import trio

            await trio.sleep(min(1.0, self.flush_interval * 2 ** min(self.failures, 6)))

    def _write(self, rows: list[tuple[Any, ...]]) -> None:
        self.db.insert_new("usage", _COLUMNS, rows, [("recorded_at", self.db.now_sql)])

    def _write_each(self, rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        failed = []
        for row in rows:
            try:
                self._write([row])
            except Exception:
                failed.append(row)
        return failed


# -- reading usage back ------------------------------------------------------------------

@dataclass(frozen=True)
class Totals:
    group: str | None
    requests: int
    prompt_tokens: int
    completion_tokens: int
    errors: int
    mean_latency_ms: float | None
    mean_ttft_ms: float | None
    spend: float = 0.0
    unpriced: int = 0  # requests that used tokens of a model without a price then
    label: str | None = None  # a user group's email (else name); None for other groups

    def to_dict(self) -> dict[str, Any]:
        return {"group": self.group, "label": self.label, "requests": self.requests,
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "errors": self.errors,
                "mean_latency_ms": self.mean_latency_ms, "mean_ttft_ms": self.mean_ttft_ms,
                "spend": self.spend, "unpriced_requests": self.unpriced}


# Mean latency and time to first token are over the requests that were served (or failed
# upstream): a request the ingress refused (401, 403, 429: key, model, budget, rate) took
# microseconds, and counting it made a throttled key's latency look better the more it was
# refused. Refusals still count as requests and errors.
_SERVED = "status NOT IN (401, 403, 429)"
# Each row's part of the sums below: the requests' own rows, and the days rolled up past
# the retention (``ingress.retention``; their time is their UTC day's start, their node
# and ingress are not kept). Reports and budgets read usage through this.
ROW_PARTS = (
    "1 AS requests, prompt_tokens, completion_tokens, "
    "CASE WHEN status >= 400 THEN 1 ELSE 0 END AS errors, "
    f"CASE WHEN {_SERVED} THEN latency_ms ELSE 0 END AS latency_sum, "
    f"CASE WHEN {_SERVED} THEN 1 ELSE 0 END AS latency_n, "
    f"CASE WHEN {_SERVED} AND ttft_ms IS NOT NULL THEN ttft_ms ELSE 0 END AS ttft_sum, "
    f"CASE WHEN {_SERVED} AND ttft_ms IS NOT NULL THEN 1 ELSE 0 END AS ttft_n, "
    "COALESCE(spend, 0) AS spend, "
    "CASE WHEN spend IS NULL AND prompt_tokens + completion_tokens > 0 THEN 1 ELSE 0 END "
    "AS unpriced")
_PART_NAMES = ("requests, prompt_tokens, completion_tokens, errors, latency_sum, latency_n, "
               "ttft_sum, ttft_n, spend, unpriced")
_SOURCE = (
    f"(SELECT key_id, team, user_id, model, provider, node_peer, ingress, status, "
    f"finished_at, {ROW_PARTS} FROM usage UNION ALL SELECT key_id, team, user_id, model, "
    f"provider, NULL, NULL, status, day, {_PART_NAMES} FROM usage_rollup) AS usage")
_SUMS = ("COALESCE(SUM(requests), 0), COALESCE(SUM(prompt_tokens), 0), "
         "COALESCE(SUM(completion_tokens), 0), COALESCE(SUM(errors), 0), "
         "SUM(latency_sum) / NULLIF(SUM(latency_n), 0), "
         "SUM(ttft_sum) / NULLIF(SUM(ttft_n), 0), COALESCE(SUM(spend), 0), "
         "COALESCE(SUM(unpriced), 0)")


def _window(since: float | None, until: float | None, key_id: str | None = None,
            filters: dict[str, Any] | None = None) -> tuple[str, list[Any]]:
    """The WHERE clause of a time window, a key and exact-match ``filters`` (``FILTERS``'
    names)."""
    clauses: list[str] = []
    params: list[Any] = []
    if since is not None:
        clauses.append("finished_at >= ?")
        params.append(since)
    if until is not None:
        clauses.append("finished_at < ?")
        params.append(until)
    if key_id is not None:
        clauses.append("key_id = ?")
        params.append(key_id)
    for name, value in (filters or {}).items():
        clauses.append(f"{FILTERS[name]} = ?")
        params.append(value)
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


def _totals(group: Any, row: Sequence[Any]) -> Totals:
    requests, prompt, completion, errors, latency, ttft, spend, unpriced = row
    return Totals(None if group is None else str(group), int(requests), int(prompt),
                  int(completion), int(errors),
                  None if latency is None else round(float(latency), 3),
                  None if ttft is None else round(float(ttft), 3),
                  round(float(spend), 6), int(unpriced))


def aggregate(db: Database, by: str, since: float | None = None,
              until: float | None = None, key_id: str | None = None,
              filters: dict[str, Any] | None = None) -> list[Totals]:
    """Usage per ``by`` group (``GROUPS``), largest first, between ``since`` and
    ``until`` (unix seconds, end exclusive), of the rows ``filters`` keep."""
    column = GROUPS[by]
    where, params = _window(since, until, key_id, filters)
    rows: list[Row] = db.query_sync(
        f"SELECT {column}, {_SUMS} FROM {_SOURCE}{where} GROUP BY 1 "
        "ORDER BY 2 DESC, 1", params)
    found = [_totals(row[0], row[1:]) for row in rows]
    return _labelled(db, found) if by == "user" else found


def _labelled(db: Database, totals: list[Totals]) -> list[Totals]:
    """User groups with their user's email (or name) beside the id: an id alone tells
    an operator nothing."""
    ids = sorted({t.group for t in totals if t.group is not None})
    if not ids:
        return totals
    rows = db.query_sync(f"SELECT id, COALESCE(email, name) FROM users WHERE id IN "
                         f"({', '.join('?' * len(ids))})", ids)
    labels = {str(user_id): label for user_id, label in rows}
    return [replace(t, label=labels.get(t.group or "")) for t in totals]


def buckets(db: Database, since: float, until: float, bucket_s: float,
            key_id: str | None = None, filters: dict[str, Any] | None = None
            ) -> list[dict[str, Any]]:
    """Usage over time: one entry per ``bucket_s`` from ``since`` (empty ones included)."""
    where, params = _window(since, until, key_id, filters)
    rows = db.query_sync(
        f"SELECT FLOOR((finished_at - ?) / ?), {_SUMS} FROM {_SOURCE}{where} GROUP BY 1",
        [since, bucket_s, *params])
    found = {int(row[0]): _totals(None, row[1:]) for row in rows}
    count = max(1, int((until - since) // bucket_s + (1 if (until - since) % bucket_s else 0)))
    out = []
    for index in range(min(count, 10_000)):
        totals = found.get(index)
        out.append({"start": since + index * bucket_s,
                    "requests": totals.requests if totals else 0,
                    "prompt_tokens": totals.prompt_tokens if totals else 0,
                    "completion_tokens": totals.completion_tokens if totals else 0,
                    "errors": totals.errors if totals else 0,
                    "spend": totals.spend if totals else 0.0})
    return out


# -- the request log ---------------------------------------------------------------------

# One entry per request, newest first: what was asked, of whom, how it went, what it
# cost. Never the answer; the prompt only where the operator opted in (else null).
LOG_COLUMNS = ("id", "request_id", "finished_at", "key_id", "team", "user_id", "model",
               "route", "provider", "node_peer", "ingress", "status", "error", "stream",
               "prompt_tokens", "completion_tokens", "latency_ms", "ttft_ms", "spend",
               "prompt")


def request_log(db: Database, since: float | None = None, until: float | None = None,
                key_id: str | None = None, filters: dict[str, Any] | None = None,
                limit: int = 100, after: str | None = None) -> tuple[list[dict[str, Any]],
                                                                     bool]:
    """A page of the request log, newest first: at most ``limit`` entries after the one
    whose id is ``after`` (a keyset on ``(finished_at, id)``: a page costs the same however
    deep, and rows written meanwhile neither shift nor repeat one), and whether more
    follow. An ``after`` that names no row in the window is a ``ValueError``."""
    where, params = _window(since, until, key_id, filters)
    if after is not None:
        anchor = db.query_sync("SELECT finished_at FROM usage WHERE id = ?", (after,))
        if not anchor:
            raise ValueError("'after' names no request in this log")
        at = anchor[0][0]
        where += (" AND " if where else " WHERE ") + \
            "(finished_at < ? OR (finished_at = ? AND id < ?))"
        params += [at, at, after]
    rows = db.query_sync(
        f"SELECT {', '.join(LOG_COLUMNS)} FROM usage{where} "
        "ORDER BY finished_at DESC, id DESC LIMIT ?", [*params, limit + 1])
    entries = [_entry(row) for row in rows[:limit]]
    return entries, len(rows) > limit


def _entry(row: Sequence[Any]) -> dict[str, Any]:
    entry = dict(zip(LOG_COLUMNS, row, strict=True))
    entry["object"] = "request"
    entry["stream"] = bool(entry["stream"])
    return entry


@dataclass(frozen=True)
class OtherRow:
    """A keyed row another ingress process wrote (``recent_by_others``)."""

    id: str
    key_id: str
    tokens: int
    status: int
    recorded_at: float
    spend: float
    team: str | None
    finished_at: float


def recent_by_others(db: Database, ingress_id: str, recorded_after: float) -> list[OtherRow]:
    """The keyed rows other ingress processes wrote after ``recorded_after`` (database
    clock): what ``ingress.access`` counts towards budgets and limits here. The
    ``(recorded_at, ingress)`` index keeps the scan to the recent rows, and this ingress's
    own among them cost an index entry each."""
    rows = db.query_sync(
        "SELECT id, key_id, prompt_tokens + completion_tokens, status, recorded_at, "
        "COALESCE(spend, 0), team, finished_at FROM usage "
        "WHERE recorded_at > ? AND ingress <> ? AND key_id IS NOT NULL",
        (recorded_after, ingress_id))
    return [OtherRow(str(r[0]), str(r[1]), int(r[2]), int(r[3]), float(r[4]), float(r[5]),
                     None if r[6] is None else str(r[6]), float(r[7])) for r in rows]


Windows = dict[str, tuple[int, float]]  # period -> (tokens, spend)
_TOKENS = "prompt_tokens + completion_tokens"
# Tokens and spend per (key, team) over all time, since the month's start and since the
# day's (``ingress.budgets.Ledger.from_totals``); parameters: month, month, day, day.
_WINDOW_SUMS = (
    f"SELECT 0, key_id, team, SUM({_TOKENS}), SUM(spend), "
    f"SUM(CASE WHEN finished_at >= ? THEN {_TOKENS} ELSE 0 END), "
    "SUM(CASE WHEN finished_at >= ? THEN spend ELSE 0 END), "
    f"SUM(CASE WHEN finished_at >= ? THEN {_TOKENS} ELSE 0 END), "
    "SUM(CASE WHEN finished_at >= ? THEN spend ELSE 0 END), NULL "
    f"FROM {_SOURCE} WHERE key_id IS NOT NULL GROUP BY key_id, team")


def _window_params(now: float) -> tuple[float, float, float, float]:
    month, day = period_start("month", now), period_start("day", now)
    return month, month, day, day


def _totals_of(rows: list[Row]) -> list[tuple[str, str | None, Windows]]:
    return [(str(r[1]), None if r[2] is None else str(r[2]),
             {"lifetime": (int(r[3] or 0), float(r[4] or 0)),
              "month": (int(r[5] or 0), float(r[6] or 0)),
              "day": (int(r[7] or 0), float(r[8] or 0))}) for r in rows if r[0] == 0]


def window_totals(db: Database, now: float, key_ids: Sequence[str] | None = None,
                  teams: Sequence[str] = ()) -> list[tuple[str, str | None, Windows]]:
    """Tokens and spend per (key, team) over all time, this month and today (UTC); with
    ``key_ids``, only the rows of those keys and of ``teams`` (one key's standing reads
    its key's and its team's rows, not the whole table)."""
    if key_ids is None:
        return _totals_of(db.query_sync(_WINDOW_SUMS, _window_params(now)))
    marks = ", ".join("?" * len(key_ids)) or "NULL"
    teamed = f" OR team IN ({', '.join('?' * len(teams))})" if teams else ""
    sql = _WINDOW_SUMS.replace(
        "WHERE key_id IS NOT NULL",
        f"WHERE key_id IS NOT NULL AND (key_id IN ({marks}){teamed})")
    return _totals_of(db.query_sync(sql, (*_window_params(now), *key_ids, *teams)))


def used_tokens(db: Database, key_ids: list[str] | None = None) -> dict[str, int]:
    """Tokens (prompt + completion) each key has used over its life (rows and roll-ups)."""
    used: dict[str, int] = {}
    for key_id, _team, windows in window_totals(db, time.time(), key_ids):
        used[key_id] = used.get(key_id, 0) + windows["lifetime"][0]
    return used if key_ids is None else {k: used.get(k, 0) for k in key_ids}


def totals_and_recent(db: Database, recorded_after: float, now: float
                      ) -> tuple[list[tuple[str, str | None, Windows]],
                                 list[tuple[str, str, float]]]:
    """``window_totals``, and (id, ingress, recorded_at) of the rows recorded after
    ``recorded_after``, in one statement: one snapshot, so a row is either in both or in
    neither (``Access.load`` then never counts one twice)."""
    rows = db.query_sync(
        f"{_WINDOW_SUMS} UNION ALL SELECT 1, id, ingress, 0, 0, 0, 0, 0, 0, recorded_at "
        "FROM usage WHERE recorded_at > ?", (*_window_params(now), recorded_after))
    recent = [(str(r[1]), str(r[2]), float(r[9])) for r in rows if r[0] == 1]
    return _totals_of(rows), recent

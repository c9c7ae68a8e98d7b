"""Shares of a budget handed out through the database, so that several ingress nodes on
one database cannot together spend more than the budget (``docs/ingress.md#budgets``).

Per account and period window, ``budget_windows`` holds what is **spoken for**: the
window's use before its first lease (read from the usage table once, when the row is
made), plus every share handed out since, less what was given back. ``budget_leases``
holds each ingress's share, cumulative over the window. A take (``take``) runs in one
transaction that locks the window's row (PostgreSQL: ``SELECT ... FOR UPDATE``; SQLite:
its single writer, ``BEGIN IMMEDIATE``), so no two takes see the same rest: each hands
out at most the rest, except the one that finds the rest smaller than its request's
need (``ingress.budgets.lease_grant``), after which nothing is left.

A share counts until its ingress gives back what it did not use (when idle, when its
window ends, when it stops: ``give_back``), or until it expires: an ingress renews its
shares at every refresh (``renew``); one that stopped renewing (killed) has its share
taken back by the next take after ``expires_at``, less what its usage rows show it used.
All blocking: callers on the event loop run these through ``Database.in_thread``.
"""

from __future__ import annotations

from ingress import usage
from ingress.budgets import Account, Budget, Spent, lease_grant
from ingress.database import Cursor, Database

# How long a share counts after its ingress last renewed it; the ingress itself stops
# admitting from it ``LEASE_MARGIN_S`` earlier (its clock and the database's may differ,
# and its renewal may be slow), so that a share is never used after it was taken back.
LEASE_TTL_S = 30.0
LEASE_MARGIN_S = 5.0

_WHERE = "kind = ? AND name = ? AND period = ? AND window_start = ?"


def window_base(db: Database, account: Account, period: str, now: float) -> Spent:
    """What ``account`` used in the ``period`` window holding ``now``, from the usage
    table (rows and roll-ups): what a window's row starts from."""
    kind, name = account
    if kind == "key":
        totals = usage.window_totals(db, now, [name])
    else:
        totals = usage.window_totals(db, now, [], teams=[name])
    base = Spent()
    for key_id, team, windows in totals:
        if (key_id if kind == "key" else team) == name:
            tokens, spend = windows[period]
            base.tokens += tokens
            base.spend += spend
    return base


def take(db: Database, ingress_id: str, account: Account, budget: Budget, window: float,
         need: Spent, now: float, ttl: float = LEASE_TTL_S) -> Spent | None:
    """Take a share of what is left of ``account``'s ``budget`` in the period window
    starting at ``window`` (``now``: this ingress's clock, for the window's first row):
    the share (added to this ingress's lease, renewed for ``ttl``), or None when nothing
    is left. Takes back, first, the shares of ingress nodes that stopped renewing theirs."""
    kind, name = account
    key = (kind, name, budget.period, window)
    if not db.query_sync(f"SELECT 1 FROM budget_windows WHERE {_WHERE}", key):
        base = window_base(db, account, budget.period, now)
        # Another ingress may make the row first: its base stands.
        db.run_sync("INSERT INTO budget_windows (kind, name, period, window_start, tokens, "
                    "spend) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (kind, name, period, "
                    "window_start) DO NOTHING", (*key, base.tokens, base.spend))
    lock = " FOR UPDATE" if db.dialect == "postgresql" else ""
    with db.transaction() as cursor:
        cursor.execute(f"SELECT tokens, spend FROM budget_windows WHERE {_WHERE}{lock}", key)
        rows = cursor.fetchall()
        if not rows:  # removed in between (nothing removes them today): try again later
            return None
        committed = Spent(int(rows[0][0]), float(rows[0][1]))
        _take_back_expired(cursor, db, account, key, ingress_id, committed)
        granted = lease_grant(budget, committed, need)
        if granted is None:
            return None
        cursor.execute(f"UPDATE budget_windows SET tokens = tokens + ?, spend = spend + ? "
                       f"WHERE {_WHERE}", (granted.tokens, granted.spend, *key))
        cursor.execute(
            "INSERT INTO budget_leases (kind, name, period, window_start, ingress, tokens, "
            f"spend, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, {db.now_sql} + ?) "
            "ON CONFLICT (kind, name, period, window_start, ingress) DO UPDATE SET "
            "tokens = budget_leases.tokens + excluded.tokens, "
            "spend = budget_leases.spend + excluded.spend, expires_at = excluded.expires_at",
            (*key, ingress_id, granted.tokens, granted.spend, ttl))
    return granted


def _take_back_expired(cursor: Cursor, db: Database, account: Account,
                       key: tuple[str, str, str, float], ingress_id: str,
                       committed: Spent) -> None:
    """Take back (within the caller's transaction, the window's row locked) the shares
    of the window that expired: granted less what the usage rows of their ingress show it
    used in the window (rows it wrote before its share was made count too: less comes
    back, never more). ``committed`` is lowered to match."""
    cursor.execute(f"DELETE FROM budget_leases WHERE {_WHERE} AND ingress <> ? AND "
                   f"expires_at < {db.now_sql} RETURNING ingress, tokens, spend",
                   (*key, ingress_id))
    expired = cursor.fetchall()
    column = "key_id" if account[0] == "key" else "team"
    back = Spent()
    for ingress, tokens, spend in expired:
        cursor.execute(
            "SELECT COALESCE(SUM(prompt_tokens + completion_tokens), 0), "
            f"COALESCE(SUM(spend), 0) FROM usage WHERE {column} = ? AND ingress = ? "
            "AND finished_at >= ?", (account[1], ingress, key[3]))
        used = cursor.fetchall()[0]
        back.tokens += max(0, int(tokens) - int(used[0]))
        back.spend += max(0.0, float(spend) - float(used[1]))
    if back.tokens or back.spend:
        cursor.execute(f"UPDATE budget_windows SET tokens = tokens - ?, spend = spend - ? "
                       f"WHERE {_WHERE}", (back.tokens, back.spend, *key))
        committed.tokens -= back.tokens
        committed.spend -= back.spend


def give_back(db: Database, ingress_id: str, account: Account, period: str,
              window: float, unused: Spent) -> None:
    """This ingress is done with its lease (idle, stranded, or stopping): ``unused`` of it
    (granted, neither used nor held by requests in flight) is free again; the rest stays
    spoken for (used, or to be, by this ingress's requests). The lease's row keeps that
    rest, not deleted: a take this ingress made meanwhile may have added to it (for the
    lease the ingress keeps next), and a row deleted here would lose it."""
    key = (account[0], account[1], period, window)
    lock = " FOR UPDATE" if db.dialect == "postgresql" else ""
    with db.transaction() as cursor:
        cursor.execute(f"SELECT tokens, spend FROM budget_windows WHERE {_WHERE}{lock}", key)
        if not cursor.fetchall():
            return
        cursor.execute(f"SELECT tokens, spend FROM budget_leases WHERE {_WHERE} AND "
                       "ingress = ?", (*key, ingress_id))
        rows = cursor.fetchall()
        if not rows:  # already taken back as expired: nothing of it counts any more
            return
        back = (max(0, min(unused.tokens, int(rows[0][0]))),
                max(0.0, min(unused.spend, float(rows[0][1]))))
        cursor.execute(f"UPDATE budget_leases SET tokens = tokens - ?, spend = spend - ? "
                       f"WHERE {_WHERE} AND ingress = ?", (*back, *key, ingress_id))
        cursor.execute(f"UPDATE budget_windows SET tokens = tokens - ?, spend = spend - ? "
                       f"WHERE {_WHERE}", (*back, *key))


def renew(db: Database, ingress_id: str, ttl: float = LEASE_TTL_S
          ) -> set[tuple[Account, str, float]]:
    """Renew this ingress's shares for ``ttl``; the (account, period, window) of those
    still there (one taken back while this ingress could not renew it is gone: it must
    not be used)."""
    rows = db.query_sync(f"UPDATE budget_leases SET expires_at = {db.now_sql} + ? "
                         "WHERE ingress = ? RETURNING kind, name, period, window_start",
                         (ttl, ingress_id))
    return {((str(kind), str(name)), str(period), float(start))
            for kind, name, period, start in rows}


def forget_ended(db: Database, month_start: float, day_start: float) -> None:
    """Remove the windows (and shares) of months before ``month_start`` and days before
    ``day_start``: nothing reads them once their period is over."""
    for table in ("budget_leases", "budget_windows"):
        db.run_sync(f"DELETE FROM {table} WHERE (period = 'month' AND window_start < ?) "
                    "OR (period = 'day' AND window_start < ?)", (month_start, day_start))

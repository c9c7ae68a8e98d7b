"""Usage past its retention ([ingress] usage_retention): its rows summed per UTC day, key,
team, user, model, provider and status into ``usage_rollup``, then deleted, in one
transaction.

The request log loses those requests one by one (that is the point: a year of requests is
hundreds of millions of rows), but nothing that counts them changes: budgets, ``otela
usage`` and the dashboard read usage through rows and roll-ups alike
(``ingress.usage``), with the roll-ups at their day's start and without their node and
ingress (grouped as none). Several ingress processes may run this at once: PostgreSQL's
advisory lock and SQLite's write lock make them take turns, and each deletes exactly the
rows it summed, so none is counted twice.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ingress.database import Database
from ingress.usage import ROW_PARTS

log = logging.getLogger("otela.ingress.retention")

DAY_S = 86400.0
CHECK_EVERY_S = 3600.0  # how often an ingress looks for rows past the retention
_LOCK_ID = 0x6F74656C62  # the advisory lock rolling up on PostgreSQL

_ROLL_UP = (
    "INSERT INTO usage_rollup (day, key_id, team, user_id, model, provider, status, "
    "requests, prompt_tokens, completion_tokens, errors, latency_sum, latency_n, ttft_sum, "
    "ttft_n, spend, unpriced) SELECT day, key_id, team, user_id, model, provider, status, "
    "SUM(requests), SUM(prompt_tokens), SUM(completion_tokens), SUM(errors), "
    "SUM(latency_sum), SUM(latency_n), SUM(ttft_sum), SUM(ttft_n), SUM(spend), "
    "SUM(unpriced) FROM ("
    f"SELECT FLOOR(finished_at / {DAY_S}) * {DAY_S} AS day, key_id, team, user_id, model, "
    f"provider, status, {ROW_PARTS} FROM usage WHERE finished_at < ?) AS old "
    "GROUP BY day, key_id, team, user_id, model, provider, status")


def roll_up(db: Database, before: float) -> int:
    """Sum the rows that finished before ``before`` into the roll-up and delete them;
    how many rows went."""
    with db.transaction() as cursor:
        if db.dialect == "postgresql":
            cursor.execute("SELECT pg_advisory_xact_lock(?)", (_LOCK_ID,))
        cursor.execute(_ROLL_UP, (before,))
        cursor.execute("DELETE FROM usage WHERE finished_at < ?", (before,))
        return int(cursor.rowcount)


async def keep(db: Database, retention_s: float, *, task_status: Any = None) -> None:
    """Roll up what passed ``retention_s`` now and every ``CHECK_EVERY_S`` (the service's
    task while a retention is set)."""
    import trio

    if task_status is not None:
        task_status.started()
    while True:
        try:
            gone = await db.in_thread(roll_up, db, time.time() - retention_s)
            if gone:
                log.info("usage: %d request rows past the retention summed by day", gone)
        except Exception as exc:  # the database is away: try again at the next check
            log.warning("usage: could not roll up rows past the retention (%s)", exc)
        await trio.sleep(CHECK_EVERY_S)

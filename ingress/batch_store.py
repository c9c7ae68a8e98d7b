"""Batches and their lines in the ingress database: what the Batch API reads and writes, and
what the batch runner records, each change in one transaction.

Durability is the point of this module. A line's result is written together with the
count it adds to (``record``), and only if the line had none (``outcome IS NULL``): a
result is never lost once counted, never counted twice, and two runners that both ran a
line (one whose lease lapsed while it was still running) record it once. A runner
restarted after a crash runs exactly the lines that have no result (``pending_lines``).

Runners take batches by lease (``claim``/``renew``): a batch is run by one ingress process
at a time (its ``runner`` column); a runner that stops renewing (killed, cut off) loses its
batches to any other after ``lease_s``, and finds its own again at once when it restarts
with the same id (a node's ingress id is its peer id, kept in its home).

Blocking calls (``Database.*_sync``); trio code runs them in a worker thread.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ingress import batches, files, paging
from ingress.batch_lines import ParsedLine, error_line
from ingress.batches import Batch
from ingress.database import Database, Row

_STAMP_COLUMNS = tuple(batches.STAMPS.values())
_COLUMNS = ("id, key_id, endpoint, input_file_id, completion_window, status, created_at, "
            "expires_at, metadata, errors, output_file_id, error_file_id, total, completed, "
            "failed, " + ", ".join(_STAMP_COLUMNS))
_ACTIVE = tuple(sorted(batches.ACTIVE))
_ACTIVE_IN = f"status IN ({', '.join('?' * len(_ACTIVE))})"


def _batch(row: Row) -> Batch:
    (ident, key_id, endpoint, input_file, window, status, created, expires, metadata, errors,
     output_file, error_file, total, completed, failed, *stamps) = row
    return Batch(id=str(ident), key_id=str(key_id), endpoint=str(endpoint),
                 input_file_id=str(input_file), completion_window=str(window),
                 status=str(status), created_at=float(created), expires_at=float(expires),
                 metadata=batches.loads(metadata), errors=batches.loads(errors),
                 output_file_id=output_file, error_file_id=error_file, total=int(total),
                 completed=int(completed), failed=int(failed),
                 stamps=dict(zip(_STAMP_COLUMNS, stamps, strict=True)))


def _locking(cursor: Any) -> str:
    """PostgreSQL: lock the row read until the commit (SQLite's BEGIN IMMEDIATE already
    holds the whole database)."""
    return "" if getattr(cursor, "dialect", "sqlite") == "sqlite" else " FOR UPDATE"


def _read(cursor: Any, batch_id: str) -> Batch | None:
    cursor.execute(f"SELECT {_COLUMNS} FROM batches WHERE id = ?{_locking(cursor)}",
                   (batch_id,))
    rows = cursor.fetchall()
    return _batch(rows[0]) if rows else None


def _set_status(cursor: Any, batch: Batch, status: str, now: float,
                extra: dict[str, Any] | None = None) -> None:
    """Move ``batch`` to ``status`` (``IllegalTransition`` if it may not go there),
    stamping the status's time and setting ``extra`` columns too."""
    batches.advance(batch.status, status)
    changes = {"status": status, batches.STAMPS[status]: now, **(extra or {})}
    cursor.execute(f"UPDATE batches SET {', '.join(f'{c} = ?' for c in changes)} "
                   "WHERE id = ?", (*changes.values(), batch.id))


# -- the API's side ----------------------------------------------------------------------

def create(db: Database, key_id: str, endpoint: str, input_file_id: str, window: str,
           metadata: dict[str, str] | None, now: float) -> Batch:
    batch = Batch(id=batches.new_batch_id(), key_id=key_id, endpoint=endpoint,
                  input_file_id=input_file_id, completion_window=window,
                  status=batches.VALIDATING, created_at=now,
                  expires_at=now + batches.COMPLETION_WINDOWS[window], metadata=metadata)
    db.run_sync("INSERT INTO batches (id, key_id, endpoint, input_file_id, "
                "completion_window, status, created_at, expires_at, metadata) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (batch.id, key_id, endpoint, input_file_id, window, batch.status, now,
                 batch.expires_at, batches.dumps(metadata)))
    return batch


def get(db: Database, key_id: str | None, batch_id: str) -> Batch | None:
    """A batch of ``key_id``'s (``None``: anyone's, for the runner)."""
    sql = f"SELECT {_COLUMNS} FROM batches WHERE id = ?"
    params: tuple[Any, ...] = (batch_id,)
    if key_id is not None:
        sql += " AND key_id = ?"
        params += (key_id,)
    rows = db.query_sync(sql, params)
    return _batch(rows[0]) if rows else None


def anchor(db: Database, key_id: str, batch_id: str) -> tuple[float, str] | None:
    """Where the ``after`` batch sits in the list (``None``: not one of this key's)."""
    rows = db.query_sync("SELECT created_at, id FROM batches WHERE id = ? AND key_id = ?",
                         (batch_id, key_id))
    return (float(rows[0][0]), str(rows[0][1])) if rows else None


def list_batches(db: Database, key_id: str, after: tuple[float, str] | None,
                 limit: int) -> tuple[list[Batch], bool]:
    """A page of this key's batches, newest first (``ingress.paging``)."""
    clause, params = paging.after_clause(after)
    rows = db.query_sync(f"SELECT {_COLUMNS} FROM batches WHERE key_id = ?{clause}"
                         f"{paging.ORDER}", (key_id, *params, limit + 1))
    found, more = paging.page(rows, limit)
    return [_batch(row) for row in found], more


def request_cancel(db: Database, key_id: str, batch_id: str, now: float) -> Batch | None:
    """Ask a batch of this key's to stop: ``cancelling`` if it was being validated or run
    (its runner then stops sending lines); else unchanged. ``None``: no such batch."""
    with db.transaction() as cursor:
        batch = _read(cursor, batch_id)
        if batch is None or batch.key_id != key_id:
            return None
        if batches.cancellable(batch.status):
            _set_status(cursor, batch, batches.CANCELLING, now)
    return get(db, key_id, batch_id)


# -- the runner's side ---------------------------------------------------------------------

def claim(db: Database, runner: str, now: float, lease_s: float) -> list[tuple[str, str]]:
    """Take the unfinished batches nobody holds (or whose holder's lease lapsed, or that
    this runner held before a restart) and renew this runner's lease on all it holds;
    (id, status) of the batches it now runs (a status ``cancelling`` may have been set
    through another ingress)."""
    db.run_sync(f"UPDATE batches SET runner = ?, lease_until = ? WHERE {_ACTIVE_IN} AND "
                "(runner IS NULL OR runner = ? OR lease_until IS NULL OR lease_until < ?)",
                (runner, now + lease_s, *_ACTIVE, runner, now))
    rows = db.query_sync(f"SELECT id, status FROM batches WHERE runner = ? AND {_ACTIVE_IN} "
                         "ORDER BY created_at, id", (runner, *_ACTIVE))
    return [(str(row[0]), str(row[1])) for row in rows]


def held(db: Database, runner: str, batch_id: str) -> Batch | None:
    """The batch if this runner still holds it (another may have taken it over)."""
    rows = db.query_sync(f"SELECT {_COLUMNS} FROM batches WHERE id = ? AND runner = ?",
                         (batch_id, runner))
    return _batch(rows[0]) if rows else None


def start(db: Database, batch_id: str, parsed: Sequence[ParsedLine], now: float) -> Batch:
    """A validated input file becomes the batch's lines, and the batch ``in_progress``
    (malformed lines recorded at once, in the error file). A batch cancelled while it was
    validated is ``cancelled`` instead, with no lines. One transaction: a crash leaves it
    validating, to be validated again."""
    with db.transaction() as cursor:
        batch = _read(cursor, batch_id)
        assert batch is not None
        if batch.status == batches.CANCELLING:
            _set_status(cursor, batch, batches.CANCELLED, now)
        elif batch.status == batches.VALIDATING:
            rows: list[tuple[Any, ...]] = []
            failed = 0
            for line in parsed:
                if line.error is not None:
                    result = error_line(batch_id, line.line, line.custom_id, line.error)
                    rows.append((batch_id, line.line, line.custom_id, None, files.ERROR,
                                 result, len(result)))
                    failed += 1
                else:
                    rows.append((batch_id, line.line, line.custom_id, line.request, None,
                                 None, None))
            cursor.executemany("INSERT INTO batch_lines (batch_id, line, custom_id, request, "
                               "outcome, result, result_bytes) VALUES (?, ?, ?, ?, ?, ?, ?)",
                               rows)
            _set_status(cursor, batch, batches.IN_PROGRESS, now,
                        {"total": len(parsed), "failed": failed})
    found = get(db, None, batch_id)
    assert found is not None
    return found


def fail(db: Database, batch_id: str, code: str, message: str, now: float) -> None:
    """The input file cannot be a batch (gone, empty, too long): ``failed``, with why
    (OpenAI's ``errors`` list). A batch cancelled meanwhile is ``cancelled``."""
    with db.transaction() as cursor:
        batch = _read(cursor, batch_id)
        if batch is None or batch.status in batches.TERMINAL:
            return
        if batch.status == batches.CANCELLING:
            _set_status(cursor, batch, batches.CANCELLED, now)
            return
        errors = [{"code": code, "message": message, "param": "input_file_id", "line": None}]
        _set_status(cursor, batch, batches.FAILED, now, {"errors": json.dumps(errors)})


def pending_lines(db: Database, batch_id: str, after_line: int, limit: int
                  ) -> list[tuple[int, str | None, str]]:
    """(line, custom_id, request body) of up to ``limit`` lines after ``after_line`` that
    have no result yet, in order."""
    rows = db.query_sync("SELECT line, custom_id, request FROM batch_lines WHERE batch_id = ? "
                         "AND line > ? AND outcome IS NULL ORDER BY line LIMIT ?",
                         (batch_id, after_line, limit))
    return [(int(line), custom_id, str(request)) for line, custom_id, request in rows]


def record(db: Database, batch_id: str, line: int, outcome: str, result: str) -> bool:
    """Record a line's result and count it, in one transaction; ``False`` if it already
    had one (recorded by another runner: not counted again)."""
    column = "completed" if outcome == files.OK else "failed"
    with db.transaction() as cursor:
        cursor.execute("UPDATE batch_lines SET outcome = ?, result = ?, result_bytes = ? "
                       "WHERE batch_id = ? AND line = ? AND outcome IS NULL",
                       (outcome, result, len(result.encode()), batch_id, line))
        if not cursor.rowcount:
            return False
        cursor.execute(f"UPDATE batches SET {column} = {column} + 1 WHERE id = ?",
                       (batch_id,))
    return True


def finish(db: Database, batch_id: str, now: float, expired: bool = False) -> Batch | None:
    """End a batch whose runner has stopped sending: ``completed`` (through
    ``finalizing``) when every line has a result, ``cancelled`` when it was cancelled,
    ``expired`` when ``expired`` (its unsent lines then go to the error file, failed).
    Makes the output and error files of what was recorded. ``None`` if none applies (a
    line still without a result, not cancelled, not expired: the runner goes on)."""
    with db.transaction() as cursor:
        batch = _read(cursor, batch_id)
        if batch is None or batch.status in batches.TERMINAL:
            return batch
        cursor.execute("SELECT COUNT(*) FROM batch_lines WHERE batch_id = ? AND "
                       "outcome IS NULL", (batch_id,))
        unfinished = int(cursor.fetchall()[0][0])
        if batch.status == batches.CANCELLING:
            final = batches.CANCELLED
        elif unfinished == 0 and batch.status == batches.IN_PROGRESS:
            _set_status(cursor, batch, batches.FINALIZING, now)
            batch = replace(batch, status=batches.FINALIZING)
            final = batches.COMPLETED
        elif expired:
            final = batches.EXPIRED
            if unfinished:
                _expire_unsent(cursor, batch_id)
        else:
            return None
        output = files.add_result_file(cursor, batch_id, batch.key_id, files.OK, now)
        errors = files.add_result_file(cursor, batch_id, batch.key_id, files.ERROR, now)
        _set_status(cursor, batch, final, now,
                    {"output_file_id": output, "error_file_id": errors, "runner": None,
                     "lease_until": None})
    return get(db, None, batch_id)


def _expire_unsent(cursor: Any, batch_id: str) -> None:
    """Every line without a result: an error line ``batch_expired``, counted as failed."""
    cursor.execute("SELECT line, custom_id FROM batch_lines WHERE batch_id = ? AND "
                   "outcome IS NULL", (batch_id,))
    rows = cursor.fetchall()
    error = {"code": "batch_expired",
             "message": "This request was not run before the batch's completion window "
                        "ended."}
    for line, custom_id in rows:
        result = error_line(batch_id, int(line), custom_id, error)
        cursor.execute("UPDATE batch_lines SET outcome = ?, result = ?, result_bytes = ? "
                       "WHERE batch_id = ? AND line = ?",
                       (files.ERROR, result, len(result), batch_id, line))
    cursor.execute("UPDATE batches SET failed = failed + ? WHERE id = ?", (len(rows), batch_id))


def expire_unvalidated(db: Database, batch_id: str, now: float) -> None:
    """A batch still validating when its window ended (it never had lines): ``expired``."""
    with db.transaction() as cursor:
        batch = _read(cursor, batch_id)
        if batch is not None and batch.status == batches.VALIDATING:
            _set_status(cursor, batch, batches.EXPIRED, now,
                        {"runner": None, "lease_until": None})

"""Files of the OpenAI Files API as the Batch API uses them: input files a key uploads
(purpose ``batch``), and each batch's output and error files (``batch_output``).

Everything is in the ingress database (``batch_files``): an uploaded file's content in its
row, so an ingress on PostgreSQL can run a batch whose file was uploaded through another
ingress, and a restarted one finds it where it left it (nothing on a node's disk to lose,
copy or clean up). An output or error file holds no content of its own: it is the results
its batch recorded (``batch_lines``), read in line order, so finishing a batch copies
nothing and a result is stored once.

Every call takes the caller's key id: a key sees only its own files; another key's file is
"not found", as one that does not exist.

Blocking calls (``Database.*_sync``); the API runs them in a worker thread.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any

from ingress import paging
from ingress.database import Database, Row

UPLOAD_PURPOSE = "batch"
OUTPUT_PURPOSE = "batch_output"
OK = "ok"  # batch_lines.outcome of a line in the output file
ERROR = "error"  # ... in the error file

_COLUMNS = "id, key_id, purpose, filename, bytes, created_at, batch_id, outcome"


def new_file_id() -> str:
    return "file-" + secrets.token_hex(12)


@dataclass(frozen=True)
class StoredFile:
    id: str
    key_id: str
    purpose: str
    filename: str
    bytes: int
    created_at: float
    batch_id: str | None = None  # output and error files: whose results
    outcome: str | None = None  # OK or ERROR: which results

    def to_dict(self) -> dict[str, Any]:
        """The file object as OpenAI shows it."""
        return {"id": self.id, "object": "file", "bytes": self.bytes,
                "created_at": int(self.created_at), "filename": self.filename,
                "purpose": self.purpose, "status": "processed", "status_details": None,
                "expires_at": None}


def _file(row: Row) -> StoredFile:
    ident, key_id, purpose, filename, size, created, batch_id, outcome = row
    return StoredFile(str(ident), str(key_id), str(purpose), str(filename), int(size),
                      float(created), batch_id, outcome)


def create(db: Database, key_id: str, filename: str, content: str,
           now: float | None = None) -> StoredFile:
    """Store an uploaded input file (its content already checked by the caller)."""
    made = StoredFile(new_file_id(), key_id, UPLOAD_PURPOSE, filename,
                      len(content.encode()), time.time() if now is None else now)
    db.run_sync("INSERT INTO batch_files (id, key_id, purpose, filename, bytes, created_at, "
                "content) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (made.id, key_id, made.purpose, filename, made.bytes, made.created_at,
                 content))
    return made


def get(db: Database, key_id: str, file_id: str) -> StoredFile | None:
    rows = db.query_sync(f"SELECT {_COLUMNS} FROM batch_files WHERE id = ? AND key_id = ?",
                         (file_id, key_id))
    return _file(rows[0]) if rows else None


def upload_content(db: Database, key_id: str, file_id: str) -> str | None:
    """An uploaded file's content (``None``: no such file of this key's, or not an
    upload)."""
    rows = db.query_sync("SELECT content FROM batch_files WHERE id = ? AND key_id = ? AND "
                         "content IS NOT NULL", (file_id, key_id))
    return str(rows[0][0]) if rows else None


def content(db: Database, key_id: str, file_id: str) -> bytes | None:
    """What ``GET /v1/files/{id}/content`` answers: an upload as it was sent, an output or
    error file as its batch's results, one JSON line each, in input order."""
    found = get(db, key_id, file_id)
    if found is None:
        return None
    if found.batch_id is None:
        text = upload_content(db, key_id, file_id)
        return None if text is None else text.encode()
    rows = db.query_sync("SELECT result FROM batch_lines WHERE batch_id = ? AND outcome = ? "
                         "ORDER BY line", (found.batch_id, found.outcome))
    return "".join(f"{row[0]}\n" for row in rows).encode()


def delete(db: Database, key_id: str, file_id: str) -> bool:
    """Delete a file of this key's (an output file's results stay with its batch, whose
    counts they are); whether there was one."""
    return db.run_sync("DELETE FROM batch_files WHERE id = ? AND key_id = ?",
                       (file_id, key_id)) > 0


def anchor(db: Database, key_id: str, file_id: str) -> tuple[float, str] | None:
    """Where the ``after`` file sits in the list (``None``: not one of this key's)."""
    rows = db.query_sync("SELECT created_at, id FROM batch_files WHERE id = ? AND key_id = ?",
                         (file_id, key_id))
    return (float(rows[0][0]), str(rows[0][1])) if rows else None


def list_files(db: Database, key_id: str, purpose: str | None,
               after: tuple[float, str] | None, limit: int) -> tuple[list[StoredFile], bool]:
    """A page of this key's files, newest first (``ingress.paging``)."""
    clause, params = paging.after_clause(after)
    if purpose is not None:
        clause += " AND purpose = ?"
        params.append(purpose)
    rows = db.query_sync(f"SELECT {_COLUMNS} FROM batch_files WHERE key_id = ?{clause}"
                         f"{paging.ORDER}", (key_id, *params, limit + 1))
    found, more = paging.page(rows, limit)
    return [_file(row) for row in found], more


def add_result_file(cursor: Any, batch_id: str, key_id: str, outcome: str,
                    now: float) -> str | None:
    """Inside the transaction that finishes a batch: its output (``OK``) or error
    (``ERROR``) file, made of the results recorded so far; ``None`` when there are none
    (OpenAI leaves that file id null)."""
    cursor.execute("SELECT COUNT(*), COALESCE(SUM(result_bytes + 1), 0) FROM batch_lines "
                   "WHERE batch_id = ? AND outcome = ?", (batch_id, outcome))
    count, size = cursor.fetchall()[0]
    if not count:
        return None
    file_id = new_file_id()
    name = f"{batch_id}_{'output' if outcome == OK else 'error'}.jsonl"
    cursor.execute("INSERT INTO batch_files (id, key_id, purpose, filename, bytes, "
                   "created_at, batch_id, outcome) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                   (file_id, key_id, OUTPUT_PURPOSE, name, int(size), now, batch_id,
                    outcome))
    return file_id

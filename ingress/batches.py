"""A batch of the OpenAI Batch API: what it is, the states it goes through, and how it is
shown. Pure: no I/O (``ingress.batch_store`` keeps batches in the database,
``ingress.batch_runner`` moves them along).

The lifecycle is OpenAI's::

    validating -> in_progress -> finalizing -> completed
         |             |
         |             +-> cancelling -> cancelled
         +-> failed    +-> expired
         +-> cancelling

``validating``: the input file is being read into lines (malformed ones go straight to the
error file); ``failed`` only when the file as a whole is unusable (gone, empty, too many
lines). ``in_progress``: lines are being sent. ``finalizing``: every line has a result and
the output and error files are being made. A cancel stops new lines; lines already sent
finish and are counted (``cancelling``), then ``cancelled`` with the partial files. Past its
completion window a batch is ``expired``: its unsent lines are reported in the error file.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

VALIDATING = "validating"
IN_PROGRESS = "in_progress"
FINALIZING = "finalizing"
COMPLETED = "completed"
FAILED = "failed"
CANCELLING = "cancelling"
CANCELLED = "cancelled"
EXPIRED = "expired"

STATUSES = (VALIDATING, IN_PROGRESS, FINALIZING, COMPLETED, FAILED, CANCELLING, CANCELLED,
            EXPIRED)
TERMINAL = frozenset({COMPLETED, FAILED, CANCELLED, EXPIRED})
# What a runner works on: everything that is not over yet.
ACTIVE = frozenset(STATUSES) - TERMINAL

# Which status may follow which (the runner and the API both go through ``advance``, so a
# batch never goes back, nor from one end to another).
TRANSITIONS: dict[str, frozenset[str]] = {
    VALIDATING: frozenset({IN_PROGRESS, FAILED, CANCELLING, EXPIRED}),
    IN_PROGRESS: frozenset({FINALIZING, CANCELLING, EXPIRED}),
    FINALIZING: frozenset({COMPLETED}),
    CANCELLING: frozenset({CANCELLED}),
    COMPLETED: frozenset(),
    FAILED: frozenset(),
    CANCELLED: frozenset(),
    EXPIRED: frozenset(),
}
# The column each status stamps when it is entered (OpenAI's ``<status>_at`` fields).
STAMPS = {IN_PROGRESS: "in_progress_at", FINALIZING: "finalizing_at",
          COMPLETED: "completed_at", FAILED: "failed_at", EXPIRED: "expired_at",
          CANCELLING: "cancelling_at", CANCELLED: "cancelled_at"}

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
# OpenAI accepts only "24h"; so does otela (the window is a promise it can keep: lines
# wait in the lowest priority class, behind everyone else, for at most this long).
COMPLETION_WINDOWS = {"24h": 24 * 3600.0}
MAX_METADATA_PAIRS = 16  # OpenAI's limits on ``metadata``
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512


class IllegalTransition(ValueError):
    """A status change the lifecycle does not allow (a bug, or a race another runner won)."""


def can_advance(old: str, new: str) -> bool:
    return new in TRANSITIONS.get(old, frozenset())


def advance(old: str, new: str) -> str:
    """``new`` if a batch in ``old`` may go there; ``IllegalTransition`` otherwise."""
    if not can_advance(old, new):
        raise IllegalTransition(f"a batch cannot go from {old} to {new}")
    return new


def cancellable(status: str) -> bool:
    """Whether a cancel changes anything: a batch still being validated or run (a batch
    already cancelling is answered as it is; one that is over cannot be cancelled)."""
    return status in (VALIDATING, IN_PROGRESS)


def new_batch_id() -> str:
    return "batch_" + secrets.token_hex(12)


def line_request_id(batch_id: str, line: int) -> str:
    """The id of a line's request (``batch_req_...``, as OpenAI names them), also sent as
    its ``x-otela-request-id``: the same for every attempt, so the usage rows show which
    line each request was."""
    return f"batch_req_{batch_id.removeprefix('batch_')}_{line:06d}"


@dataclass(frozen=True)
class Batch:
    id: str
    key_id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: str
    created_at: float
    expires_at: float
    metadata: dict[str, str] | None = None
    errors: list[dict[str, Any]] | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    total: int = 0
    completed: int = 0
    failed: int = 0
    stamps: dict[str, float | None] | None = None  # STAMPS' columns -> time

    def to_dict(self) -> dict[str, Any]:
        """The batch object as OpenAI shows it (times in whole unix seconds)."""
        stamps = self.stamps or {}
        out: dict[str, Any] = {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "errors": None if not self.errors else {"object": "list", "data": self.errors},
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": int(self.created_at),
            "expires_at": int(self.expires_at),
        }
        for column in STAMPS.values():
            value = stamps.get(column)
            out[column] = None if value is None else int(value)
        out["request_counts"] = {"total": self.total, "completed": self.completed,
                                 "failed": self.failed}
        out["metadata"] = self.metadata
        return out


def metadata_of(value: Any) -> dict[str, str] | None:
    """A batch's ``metadata`` as OpenAI allows it (up to 16 string pairs); ``ValueError``
    saying what is wrong."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError("'metadata' must be an object of string keys and values")
    if len(value) > MAX_METADATA_PAIRS:
        raise ValueError(f"'metadata' has at most {MAX_METADATA_PAIRS} pairs")
    for key, item in value.items():
        if not isinstance(item, str) or len(key) > MAX_METADATA_KEY or \
                len(item) > MAX_METADATA_VALUE:
            raise ValueError(f"'metadata' keys are strings of at most {MAX_METADATA_KEY} "
                             f"characters, values of at most {MAX_METADATA_VALUE}")
    return dict(value)


def dumps(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)

"""A batch's lines: reading an input file into requests (OpenAI's JSONL format), and the
lines of the output and error files. Pure: no I/O.

Each input line is ``{"custom_id": ..., "method": "POST", "url": <the batch's endpoint>,
"body": {...}}``. A line that is not that (not JSON, no ``custom_id``, a ``custom_id``
seen on an earlier line, another method or url, a body without a model, a streamed body)
is not fatal to the batch: it becomes a line of the error file, counted as failed, and
the other lines run. Blank lines are skipped; lines keep their number in the file (from
1), which the error messages quote.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ingress.batches import line_request_id

MAX_LINES = 50_000  # OpenAI's limit on requests per batch
MAX_CUSTOM_ID = 512


class InputUnusable(ValueError):
    """The file as a whole cannot be a batch (the batch fails; ``code`` says why)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class ParsedLine:
    """One line of an input file: a request to send (``request``: its body, JSON) or a
    malformed line (``error``: OpenAI's ``{"code", "message"}``)."""

    line: int
    custom_id: str | None
    request: str | None = None
    error: dict[str, str] | None = None


def _bad(line: int, custom_id: str | None, code: str, message: str) -> ParsedLine:
    return ParsedLine(line, custom_id, error={"code": code, "message": f"{message} (line "
                                              f"{line})"})


def parse_line(number: int, text: str, endpoint: str, seen: set[str]) -> ParsedLine:
    """Line ``number`` of an input file, checked against the batch's ``endpoint`` and the
    ``custom_id`` values ``seen`` on earlier lines (this one's is added when valid)."""
    try:
        item = json.loads(text)
    except ValueError:
        return _bad(number, None, "invalid_json", "This line is not valid JSON")
    if not isinstance(item, dict):
        return _bad(number, None, "invalid_json", "This line is not a JSON object")
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return _bad(number, None, "missing_custom_id",
                    "This line has no 'custom_id' (a non-empty string)")
    if len(custom_id) > MAX_CUSTOM_ID:
        return _bad(number, None, "invalid_custom_id",
                    f"This line's 'custom_id' is longer than {MAX_CUSTOM_ID} characters")
    if custom_id in seen:
        return _bad(number, custom_id, "duplicate_custom_id",
                    "This line's 'custom_id' is used by an earlier line")
    seen.add(custom_id)
    method = item.get("method")
    if method != "POST":
        return _bad(number, custom_id, "invalid_method",
                    "This line's 'method' must be \"POST\"")
    url = item.get("url")
    if url != endpoint:
        return _bad(number, custom_id, "invalid_url",
                    f"This line's 'url' must be the batch's endpoint {endpoint}")
    body = item.get("body")
    if not isinstance(body, dict):
        return _bad(number, custom_id, "invalid_body", "This line's 'body' must be an object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return _bad(number, custom_id, "invalid_body",
                    "This line's 'body' has no 'model' (a non-empty string)")
    if body.get("stream"):
        return _bad(number, custom_id, "invalid_body",
                    "Streaming is not supported in a batch ('stream' must be false)")
    return ParsedLine(number, custom_id, request=json.dumps(body, separators=(",", ":")))


def parse_input(text: str, endpoint: str) -> list[ParsedLine]:
    """Every non-blank line of an input file; ``InputUnusable`` for a file with no line or
    more than ``MAX_LINES``."""
    seen: set[str] = set()
    parsed: list[ParsedLine] = []
    for number, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue
        if len(parsed) >= MAX_LINES:
            raise InputUnusable("too_many_requests", f"The input file has more than "
                                f"{MAX_LINES} lines (the most a batch may have)")
        parsed.append(parse_line(number, raw, endpoint, seen))
    if not parsed:
        raise InputUnusable("empty_file", "The input file has no lines")
    return parsed


# -- the lines of the output and error files -----------------------------------------------

def _dump(value: dict[str, Any]) -> str:
    # ASCII only: a line's size in bytes is its length, in either database.
    return json.dumps(value, separators=(",", ":"))


def output_line(batch_id: str, line: int, custom_id: str | None, status: int,
                request_id: str, body: Any) -> str:
    """A line of the output file: the request's answer, as the engine gave it."""
    return _dump({"id": line_request_id(batch_id, line), "custom_id": custom_id,
                  "response": {"status_code": status, "request_id": request_id,
                               "body": body},
                  "error": None})


def error_line(batch_id: str, line: int, custom_id: str | None, error: dict[str, Any],
               status: int | None = None, request_id: str | None = None,
               body: Any = None) -> str:
    """A line of the error file: ``error`` (``{"code", "message"}``), and the HTTP answer
    when there was one (``status``, its ``request_id`` and ``body``)."""
    response = None if status is None else {"status_code": status, "request_id": request_id,
                                             "body": body}
    return _dump({"id": line_request_id(batch_id, line), "custom_id": custom_id,
                  "response": response, "error": error})


def error_of(status: int, body: Any) -> dict[str, Any]:
    """The ``{"code", "message"}`` of an HTTP error answer (OpenAI's error body when the
    answer is one, else the status)."""
    detail = body.get("error") if isinstance(body, dict) else None
    if isinstance(detail, dict):
        return {"code": detail.get("code") or detail.get("type") or f"http_{status}",
                "message": str(detail.get("message") or f"HTTP {status}")}
    return {"code": f"http_{status}", "message": f"The request failed with HTTP {status}"}


def decode_body(raw: bytes) -> Any:
    """An answer's body: its JSON, else its text (an engine may answer anything)."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")

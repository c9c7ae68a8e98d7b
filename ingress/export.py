"""The request log as files: CSV (a header, then one line per request) and JSON Lines.
Pure: entries in, text out; the caller streams it page by page."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from typing import Any

import orjson

from ingress.usage import LOG_COLUMNS

CONTENT_TYPES = {"csv": "text/csv; charset=utf-8", "jsonl": "application/x-ndjson"}
PAGE = 1000  # entries read per query while exporting


def render(entries: Sequence[dict[str, Any]], fmt: str, header: bool) -> bytes:
    """``entries`` in ``fmt`` (``csv`` or ``jsonl``); the CSV header first if ``header``."""
    if fmt == "jsonl":
        return b"".join(orjson.dumps(e) + b"\n" for e in entries)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    if header:
        writer.writerow(LOG_COLUMNS)
    for entry in entries:
        writer.writerow(["" if entry[c] is None else _cell(entry[c]) for c in LOG_COLUMNS])
    return out.getvalue().encode()


def _cell(value: Any) -> Any:
    """A spreadsheet opening the file must not run a cell as a formula: text that starts
    with one of its triggers gets a leading quote (model names and errors come from
    clients and engines)."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value

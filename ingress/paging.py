"""OpenAI's list paging (``?after=<id>&limit=N``, newest first) over a table of a key's
objects. Pure: builds the query's clause and the list object; the caller runs it.

Objects are ordered by ``(created_at, id)``, newest first: ``after`` names the last object
of the previous page, and the next page is what comes after it in that order (a keyset,
so a page costs the same however deep it is, and objects created meanwhile neither shift
nor repeat a page). One row more than asked is read to know whether there are more.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

DEFAULT_LIMIT = 20
MAX_LIMIT = 100


def limit_of(text: str | None, default: int = DEFAULT_LIMIT, most: int = MAX_LIMIT) -> int:
    """The ``limit`` parameter (1 to ``most``); ``ValueError`` saying what is wrong."""
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"'limit' must be an integer from 1 to {most}") from None
    if not 1 <= value <= most:
        raise ValueError(f"'limit' must be an integer from 1 to {most}")
    return value


def after_clause(anchor: tuple[float, str] | None) -> tuple[str, list[Any]]:
    """The ``AND ...`` that keeps objects after ``anchor`` (the ``after`` object's
    ``created_at`` and ``id``) in newest-first order; nothing without one."""
    if anchor is None:
        return "", []
    created, ident = anchor
    return " AND (created_at < ? OR (created_at = ? AND id < ?))", [created, created, ident]


ORDER = " ORDER BY created_at DESC, id DESC LIMIT ?"


def page(rows: Sequence[Any], limit: int) -> tuple[list[Any], bool]:
    """The page (at most ``limit`` rows of the ``limit + 1`` read) and whether more follow."""
    return list(rows[:limit]), len(rows) > limit


def list_object(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """OpenAI's list: ``data``, ``first_id``, ``last_id``, ``has_more``."""
    return {"object": "list", "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": has_more}

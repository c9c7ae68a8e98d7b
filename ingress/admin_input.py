"""Reading what an operator asks for (admin API bodies and queries, ``otela keys``
options) into checked values, with errors that name the bad field. Pure.

The same rules serve the admin API and the command line, so a key made either way obeys
the same limits: names and owners short and printable, limits positive, lists of model
and provider names without blanks.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from typing import Any

from ingress.keystore import KEY_FIELDS, TEAM_FIELDS, KeySpec
from ingress.prices import Price, checked
from ingress.usage import FILTERS, GROUPS
from otela.dataplane.errors import RequestError

MAX_TEXT = 200
MAX_NAMES = 1000
_KEY_ID = re.compile(r"^key_[0-9a-f]{12}$")
# The unix times of datetime's range (years 1 to 9999): query times outside it are refused.
EARLIEST = datetime(1, 1, 1, tzinfo=UTC).timestamp()
LATEST = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()
_FIELDS = {"owner", "name", "expires_in", "expires_at", "models", "providers", "rpm", "tpm",
           "max_concurrent", "budget_tokens", "team", "weight", "priority", "queue_wait",
           "budget_spend", "budget_period", "user"}
# Key fields that the API and the command line name otherwise: a key's ``user`` is given
# as a user's id or email, and kept as its id.
_GIVEN_AS = {"user_id": "user"}
MAX_WEIGHT = 1000.0
_CLASS = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")


def _bad(message: str, param: str) -> RequestError:
    return RequestError(400, message, code="invalid_request", param=param)


def _text(value: Any, param: str, required: bool = False) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_TEXT or \
            not value.isprintable():
        raise _bad(f"'{param}' must be a printable string of 1 to {MAX_TEXT} characters",
                   param)
    return value.strip()


def _positive(value: Any, param: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**62:
        raise _bad(f"'{param}' must be a positive integer", param)
    return value


def weight(value: Any, param: str = "weight") -> float | None:
    """A fair-share weight: a number above 0, at most ``MAX_WEIGHT``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or \
            not 0 < value <= MAX_WEIGHT:
        raise _bad(f"'{param}' must be a number above 0 and at most {MAX_WEIGHT:g}", param)
    return float(value)


def _seconds(value: Any, param: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or \
            not 0 <= value <= 86_400 * 365:
        raise _bad(f"'{param}' must be a number of seconds (0 to a year)", param)
    return float(value)


def _class(value: Any, param: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _CLASS.match(value.strip().lower()):
        raise _bad(f"'{param}' must be a priority class name (a short lowercase word, as "
                   "in the ingress's priority_classes)", param)
    return value.strip().lower()


def _names(value: Any, param: str) -> frozenset[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [part for part in re.split(r"[,\s]+", value) if part]
    if not isinstance(value, list) or not value or len(value) > MAX_NAMES:
        raise _bad(f"'{param}' must be a non-empty list of names (or omitted: any)", param)
    return frozenset(_text(item, param, required=True) for item in value)


def _known(body: dict[str, Any]) -> None:
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise _bad(f"unknown field '{unknown[0][:40]}' (expected: "
                   f"{', '.join(sorted(_FIELDS))})", unknown[0][:40])


def _expiry(body: dict[str, Any], now: float) -> float | None:
    """``expires_in`` (seconds from now) or ``expires_at`` (a unix time or an ISO 8601
    date/time, as everywhere the API takes a time), in the future and before year 10000."""
    if body.get("expires_in") is not None and body.get("expires_at") is not None:
        raise _bad("give 'expires_in' or 'expires_at', not both", "expires_in")
    expires_at = None
    if body.get("expires_in") is not None:
        expires_at = now + float(_positive(body["expires_in"], "expires_in") or 0)
    elif body.get("expires_at") is not None:
        value = body["expires_at"]
        future = _bad("'expires_at' must be a unix time or an ISO 8601 date/time in the "
                      "future", "expires_at")
        if isinstance(value, str):
            value = time_param(value, "expires_at")
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= now:
            raise future
        expires_at = float(value)
    if expires_at is not None and expires_at > LATEST:
        # 1e308 was taken, and every `otela keys list` then died formatting it
        # (OverflowError in time.gmtime): found by fuzzing the admin API.
        raise _bad("a key must expire before the year 10000",
                   "expires_in" if body.get("expires_in") is not None else "expires_at")
    return expires_at


def _value(field: str, body: dict[str, Any]) -> Any:
    """One key field read from ``body`` by the rule both creation and change apply."""
    value = body.get(_GIVEN_AS.get(field, field))
    if field == "user_id":  # an id or an email: the key store resolves it
        return _text(value, "user") or None
    if field == "owner":
        return _text(value, "owner", required=True)
    if field == "name":
        return _text(value, "name")
    if field in ("models", "providers"):
        return _names(value, field)
    if field == "team":
        return _text(value, "team") or None
    if field == "weight":
        return weight(value)
    if field == "priority":
        return _class(value, field)
    if field == "queue_wait":
        return _seconds(value, field)
    if field == "budget_spend":
        return money(value, field)
    if field == "budget_period":
        return period(value, field)
    return _positive(value, field)


def money(value: Any, param: str) -> float | None:
    """A budget in money: a number above 0 (in the currency of the prices)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or \
            not 0 < value <= 1e12:
        raise _bad(f"'{param}' must be an amount above 0 (in the currency of the prices)",
                   param)
    return float(value)


def period(value: Any, param: str) -> str | None:
    """A budget's period: ``day``, ``month`` or ``lifetime`` (None, the default)."""
    if value is None or value == "lifetime":
        return None
    if value not in ("day", "month"):
        raise _bad(f"'{param}' must be day, month or lifetime", param)
    return str(value)


def key_spec(body: dict[str, Any], now: float | None = None) -> KeySpec:
    """A new key's settings from an admin API body (or the CLI's options as a dict)."""
    _known(body)
    now = time.time() if now is None else now
    return KeySpec(expires_at=_expiry(body, now),
                   **{field: _value(field, body) for field in KEY_FIELDS
                      if field != "expires_at"})


def key_change(body: dict[str, Any], now: float | None = None) -> dict[str, Any]:
    """The fields of a key to change, from an admin API ``PATCH`` body (or the CLI's
    options): checked exactly as at creation. A field given as ``null`` goes back to its
    default (no limit, every model, the ingress's providers, no expiry, no name, no
    user); the owner cannot be removed. Raises 400 for an empty change."""
    _known(body)
    if not body:
        raise _bad(f"nothing to change: give one of {', '.join(sorted(_FIELDS))}", "body")
    now = time.time() if now is None else now
    change: dict[str, Any] = {}
    if "expires_in" in body or "expires_at" in body:
        change["expires_at"] = _expiry(body, now)
    for field in KEY_FIELDS:
        if _GIVEN_AS.get(field, field) in body and field != "expires_at":
            change[field] = _value(field, body)
    return change


def team_change(team: str, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A team's name and the settings to change (``PUT /v1/admin/teams/{team}``, ``otela
    keys team``): ``weight``, ``budget_tokens``, ``budget_spend``, ``budget_period``,
    ``models``, ``providers``, ``rpm``, ``tpm``, ``max_concurrent``, ``priority``, checked
    as for a key; null puts one back to its default."""
    fields = TEAM_FIELDS
    unknown = sorted(set(body) - set(fields))
    if unknown:
        raise _bad(f"unknown field '{unknown[0][:40]}' (expected: {', '.join(fields)})",
                   unknown[0][:40])
    if not body:
        raise _bad(f"nothing to change: give one of {', '.join(fields)}", "body")
    change: dict[str, Any] = {}
    for field in body:
        change[field] = weight(body[field]) if field == "weight" else _value(field, body)
    return _text(team, "team", required=True), change


def key_id(value: str) -> str:
    if not _KEY_ID.match(value):
        raise RequestError(404, "No such API key.", code="key_not_found", param="id")
    return value


def group_by(value: str | None) -> str:
    value = value or "key"
    if value not in GROUPS:
        raise _bad(f"'by' must be one of {', '.join(GROUPS)}", "by")
    return value


def time_param(value: str | None, param: str) -> float | None:
    """A unix time, or an ISO 8601 date/time (UTC unless it says otherwise), within the
    years 1 to 9999 either way. ``float()`` also reads ``nan``, ``inf`` and ``1e308``:
    ``?until=nan`` passed every comparison and made the bucket count ``int(nan)``, a 500
    (found by fuzzing), and ±1e308 overflowed the window to ``inf``."""
    if value is None or value == "":
        return None
    bad = _bad(f"'{param}' must be a unix time or an ISO 8601 date/time (years 1 to 9999)",
               param)
    try:
        number = float(value)
    except ValueError:
        number = None
    if number is not None:
        if not EARLIEST <= number <= LATEST:  # false for nan too
            raise bad
        return number
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise bad from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    try:
        stamp = moment.timestamp()
    except (OverflowError, ValueError):  # year 1 or 9999 pushed past the range by its zone
        raise bad from None
    if not EARLIEST <= stamp <= LATEST:
        raise bad
    return stamp


def bucket_seconds(value: str | None, since: float, until: float) -> float:
    """The chart's bucket: as asked, or a size that gives about 60 buckets."""
    if value is None or value == "":
        return max(60.0, (until - since) / 60)
    try:
        seconds = float(value)
    except ValueError:
        raise _bad("'bucket' must be a number of seconds", "bucket") from None
    # inf passed (0 buckets of infinite size) and made the first bucket start at nan,
    # which JSON cannot carry: a 500.
    if not 1 <= seconds <= LATEST - EARLIEST or (until - since) / seconds > 10_000:
        raise _bad("'bucket' must be at least 1 s and give at most 10,000 buckets", "bucket")
    return seconds


def usage_filters(query: Any) -> dict[str, Any]:
    """The exact-match filters of a usage or request-log query (``key``, ``team``,
    ``user``, ``model``, ``provider``, ``node``, ``ingress``, ``status``) from a query
    string's mapping; absent or empty ones are not filters (a ``user`` given by email is
    taken to its id by the caller, ``keystore.user_id_of``)."""
    filters: dict[str, Any] = {}
    for name in FILTERS:
        value = query.get(name)
        if value is None or value == "":
            continue
        if name == "status":
            if not (isinstance(value, str) and value.isdigit() and 100 <= int(value) <= 599):
                raise _bad("'status' must be an HTTP status from 100 to 599", "status")
            filters[name] = int(value)
        elif not isinstance(value, str) or len(value) > 512 or "\x00" in value:
            raise _bad(f"'{name}' must be at most 512 characters", name)
        else:
            filters[name] = value
    return filters


def window(since: str | None, until: str | None) -> tuple[float | None, float | None]:
    """A query's ``since`` and ``until`` (either may be absent), in order."""
    start = time_param(since, "since")
    end = time_param(until, "until")
    if start is not None and end is not None and start >= end:
        raise _bad("'since' must be before 'until'", "since")
    return start, end


EXPORT_FORMATS = ("json", "csv", "jsonl")


def export_format(value: str | None) -> str:
    value = value or "json"
    if value not in EXPORT_FORMATS:
        raise _bad(f"'format' must be one of {', '.join(EXPORT_FORMATS)}", "format")
    return value


def price(body: dict[str, Any]) -> Price:
    """A price from an admin API body: ``model``, ``provider`` (null or absent: every
    provider), ``input_per_mtok`` and ``output_per_mtok`` (per million tokens)."""
    unknown = set(body) - {"model", "provider", "input_per_mtok", "output_per_mtok"}
    if unknown:
        raise _bad(f"unknown field {sorted(unknown)[0]!r}", sorted(unknown)[0])
    try:
        return checked(body.get("model"), body.get("provider"), body.get("input_per_mtok"),
                       body.get("output_per_mtok"))
    except ValueError as exc:
        field = str(exc).split("'")[1] if "'" in str(exc) else "body"
        raise _bad(str(exc), field) from None

"""Setting values: parsing what people type (flags, environment, TOML) and printing it back.

Each parser takes a raw value (a string from a flag or the environment, or a TOML value)
and returns the typed value or raises ``ValueError`` with a short reason; the caller adds
which setting and which layer it came from. ``render_value`` prints a value the way the
config file spells it, ``describe`` the way ``--help`` shows a default. Pure.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from otela import names
from otela.durations import parse_duration


def split_addresses(values: list[str]) -> list[str]:
    """Flatten repeated flags and comma/space separated env values into one list."""
    out: list[str] = []
    for value in values:
        out.extend(part for part in value.replace(",", " ").split() if part)
    return out


def as_str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {type(value).__name__}")
    return value


def as_opt_str(value: Any) -> str | None:
    text = as_str(value)
    return text or None


def as_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("expected an integer, got a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise ValueError(f"expected an integer, got {value!r}")


def as_port(value: Any) -> int:
    port = as_int(value)
    if not 0 <= port < 65536:
        raise ValueError(f"port out of range: {port}")
    return port


def as_positive_int(value: Any) -> int:
    number = as_int(value)
    if number < 1:
        raise ValueError(f"must be at least 1, got {number}")
    return number


def as_float(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError("expected a number, got a boolean")
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            raise ValueError(f"expected a number, got {value!r}") from None
    else:
        raise ValueError(f"expected a number, got {type(value).__name__}")
    if number < 0:
        raise ValueError(f"must not be negative, got {number}")
    return number


def as_opt_int(value: Any) -> int | None:
    return None if value in ("", None) else as_positive_int(value)


def as_opt_float(value: Any) -> float | None:
    return None if value in ("", None) else as_float(value)


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def as_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError(f"expected true/false, got {value!r}")


def as_path(value: Any) -> Path:
    return Path(os.path.expanduser(as_str(value)))


def as_opt_path(value: Any) -> Path | None:
    text = as_str(value)
    return Path(os.path.expanduser(text)) if text else None


def as_addresses(value: Any) -> list[str]:
    if isinstance(value, str):
        return split_addresses([value])
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return split_addresses(value)
    raise ValueError("expected a list of multiaddrs")


def as_providers(value: Any) -> list[str]:
    """Provider ids, comma separated or repeated; checked as requests' lists are."""
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(v, str) for v in items):
        raise ValueError("expected provider ids")
    if not "".join(items).replace(",", "").strip():
        return []  # none named: any provider
    return sorted(names.parse_providers(",".join(items), "the list"))


def as_routes(value: Any) -> list[str]:
    """Inference routes, comma separated or repeated: canonical ``/v1/...`` paths."""
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(v, str) for v in items):
        raise ValueError("expected /v1/... paths")
    routes = sorted({r.strip() for item in items for r in item.split(",") if r.strip()})
    for route in routes:
        problem = names.route_problem(route)
        if problem is not None:
            raise ValueError(problem)
    return routes


def as_issuers(value: Any) -> list[str]:
    """Who may assign engines (``--accept-assignments``): peer ids, authority strings
    (``otela-authority:<key>``) or ``authority`` (the node's own ``--authority``); comma or
    space separated, or repeated. Names are checked here; the keys in them when the node
    loads its assignment policy."""
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(v, str) for v in items):
        raise ValueError("expected peer ids or authority strings")
    issuers = split_addresses(items)
    for issuer in issuers:
        problem = names.issuer_problem(issuer)
        if problem is not None:
            raise ValueError(f"--accept-assignments: {problem}")
    return issuers


def as_fraction(value: Any) -> float:
    number = as_float(value)
    if number > 1:
        raise ValueError(f"must be between 0 and 1, got {number}")
    return number


def as_balance(value: Any) -> float:
    """A load bound relative to the mean: above 1 (1 would leave no room to keep keys)."""
    number = as_float(value)
    if not number > 1 or number > 100:
        raise ValueError(f"must be above 1 (and at most 100), got {number}")
    return number


def as_policy(value: Any) -> str:
    """A routing policy's name: built in, or a plugin's (checked when the node starts,
    since plugins are looked up among installed packages)."""
    name = as_str(value).strip()
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
        raise ValueError(f"not a policy name: {name!r}")
    return name


def as_globs(value: Any) -> list[str]:
    """Shell-style globs (``Qwen/*``), comma separated or repeated."""
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(v, str) for v in items):
        raise ValueError("expected globs such as Qwen/*")
    globs = [g.strip() for item in items for g in item.split(",") if g.strip()]
    for glob in globs:
        if any(c.isspace() for c in glob) or len(glob) > 256:
            raise ValueError(f"not a model glob: {glob!r}")
    return globs


def as_class_names(value: Any) -> list[str]:
    """Priority class names, best first: distinct lowercase words, comma separated."""
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(v, str) for v in items):
        raise ValueError("expected class names such as interactive,default,batch")
    names_ = [n.strip().lower() for item in items for n in item.split(",") if n.strip()]
    if not names_:
        raise ValueError("at least one class is needed")
    for name in names_:
        if not re.fullmatch(r"[a-z][a-z0-9_-]{0,31}", name):
            raise ValueError(f"not a class name (a short lowercase word): {name!r}")
    if len(set(names_)) != len(names_):
        raise ValueError(f"class names repeat: {', '.join(names_)}")
    return names_


def as_class_name(value: Any) -> str:
    name = as_str(value).strip().lower()
    if not re.fullmatch(r"[a-z][a-z0-9_-]{0,31}", name):
        raise ValueError(f"not a class name (a short lowercase word): {name!r}")
    return name


def as_patterns(value: Any) -> list[str]:
    # From env or a flag a value is one regex (alternation with | covers several).
    patterns = [value] if isinstance(value, str) else value
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise ValueError("expected a list of regular expressions")
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"bad regular expression {pattern!r}: {exc}") from None
    return list(patterns)


_META_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")


def parse_model_meta(items: list[str]) -> dict[str, str]:
    """``["quantization=awq-4bit", ...]`` -> dict; rejects entries without ``=``."""
    meta: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not _META_KEY.match(key):
            raise ValueError(f"expected key=value with a simple key, got {item!r}")
        meta[key] = value.strip()
    return meta


def as_meta(value: Any) -> dict[str, str]:
    if isinstance(value, dict):
        return parse_model_meta([f"{k}={v}" for k, v in value.items()])
    if isinstance(value, str):
        return parse_model_meta([p for p in value.split(",") if p.strip()])
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return parse_model_meta(value)
    raise ValueError("expected key=value pairs")


def pairs(value: Any, form: str, last: bool = False) -> list[tuple[str, Any]]:
    """``key=value`` settings as (key, value) pairs: from a TOML table, a comma-separated
    string or a list of strings (``form`` names them in errors, e.g.
    ``endpoint=audience``); split at the first ``=``, or with ``last`` at the last one (a
    key that may hold one). Values are checked by the caller."""
    if isinstance(value, dict):
        return [(str(k), v) for k, v in value.items()]
    if isinstance(value, str):
        value = [part for part in value.split(",") if part.strip()]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"expected {form} pairs")
    found = []
    for item in value:
        key, sep, rest = item.rpartition("=") if last else item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"expected {form}, got {item!r}")
        found.append((key.strip(), rest))
    return found


def as_claim_map(value: Any) -> dict[str, str]:
    """Claim value -> name: a TOML table, or ``value=name`` pairs (comma separated or
    repeated). Split at the last ``=``, so a claim value may hold one (a group path or an
    LDAP DN with commas needs the TOML table)."""
    out: dict[str, str] = {}
    for claim, name in pairs(value, "claim-value=name", last=True):
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"the name for {claim!r} must be a non-empty string")
        out[claim] = name.strip()
    return out


def as_tokenizer_dirs(value: Any) -> dict[str, str]:
    """Model -> tokenizer directory: a TOML table, or ``MODEL=DIR`` pairs (comma separated
    or repeated). The node loads them as it starts (``otela.kvcache.tokenize``): a typo
    fails the start, not every request's cache lookup."""
    out: dict[str, str] = {}
    for model, directory in pairs(value, "model=directory"):
        if not isinstance(directory, str) or not directory.strip():
            raise ValueError(f"the tokenizer directory for {model!r} must be a path")
        out[model] = os.path.expanduser(directory.strip())
    return out


def as_kv_events(value: Any) -> str:
    """``auto``, ``off``, or a ZMQ endpoint (``tcp://HOST:PORT``, ``ipc://PATH``)."""
    text = as_str(value).strip()
    if text.lower() in ("auto", "off"):
        return text.lower()
    if not re.fullmatch(r"(tcp://[^\s]+:\d{1,5}|ipc://\S+)", text):
        raise ValueError(f"expected auto, off or a ZMQ endpoint such as "
                         f"tcp://127.0.0.1:5557, got {text!r}")
    return text


def as_words(value: Any) -> list[str]:
    """Words, space or comma separated, or a list (OAuth scopes, claim values)."""
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(v, str) for v in items):
        raise ValueError("expected a list of strings")
    return [w for item in items for w in item.replace(",", " ").split() if w]


_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2,
               "mib": 1024**2, "g": 1000**3, "gb": 1000**3, "gib": 1024**3}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def as_size(value: Any) -> int:
    """A byte count: an integer, or a number with a unit (``32MiB``, ``500kB``, ``1GB``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        number, unit = float(value), ""
    else:
        match = _SIZE.match(as_str(value))
        if match is None or match.group(2).lower() not in _SIZE_UNITS:
            raise ValueError(f"expected a size such as 32MiB or 1000000, got {value!r}")
        number, unit = float(match.group(1)), match.group(2).lower()
    size = int(number * _SIZE_UNITS[unit])
    if size < 1:
        raise ValueError(f"must be at least 1 byte, got {value!r}")
    return size


def as_workers(value: Any) -> int:
    """A number of processes: a positive integer, or ``auto`` (one per CPU core)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return len(os.sched_getaffinity(0)) or 1
    return as_positive_int(value)


def as_duration(value: Any) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return parse_duration(str(value))
    return parse_duration(as_str(value))


def as_duration_or_off(value: Any) -> float:
    """A duration, or ``0`` / ``off`` for none (the feature is off)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value == 0:
        return 0.0
    if isinstance(value, str) and value.strip().lower() in ("0", "0s", "off"):
        return 0.0
    return as_duration(value)


def as_opt_retention(value: Any) -> float | None:
    """A retention: a duration of at least a day (rows are summed by day), or nothing."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "off")):
        return None
    seconds = as_duration(value)
    if seconds < 86400:
        raise ValueError("a retention must be at least a day (1d): past it, usage is "
                         "kept as totals per day")
    return seconds


def as_log_level(value: Any) -> str:
    level = as_str(value).upper()
    if level not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
        raise ValueError(f"unknown log level {value!r}")
    return level


def format_duration(seconds: float) -> str:
    """``86400`` -> ``24h``, ``300`` -> ``5m``, ``1.5`` -> ``1.5s``: as a person types it."""
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def format_size(size: int) -> str:
    """``33554432`` -> ``32MiB``: the largest binary unit that divides it."""
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)


def render_value(value: Any) -> str:
    """A value as it would appear in TOML (for ``otela config show`` and ``otela init``)."""
    if value is None:
        return '""'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, Path):
        return _toml_string(str(value))
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_string(str(v)) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml_string(str(v))}" for k, v in value.items()) + "}"
    return _toml_string(str(value))


def _toml_string(text: str) -> str:
    # A TOML literal string needs no escaping unless it contains a single quote.
    if "'" not in text and "\n" not in text:
        return f"'{text}'"
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'

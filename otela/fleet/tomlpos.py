"""Where each key of a TOML document is written: the line a fleet file's error points to.

``tomllib`` gives values, not positions, and an error that says only "deployments[1].gpus"
leaves the operator counting tables. This scanner reads the text once, follows table
headers (``[a.b]``, ``[[a]]`` with their running index) and ``key = value`` lines (dotted
and quoted keys too), and records the line of every key path. It only has to be right on
documents ``tomllib`` already accepted, so it skips the inside of multi-line strings and
arrays rather than parsing them; keys inside inline tables resolve to the inline table's
own line. Pure.
"""

from __future__ import annotations

import re

Path = tuple[str | int, ...]

_BARE = re.compile(r"[A-Za-z0-9_-]+")


def _split_key(text: str) -> list[str] | None:
    """``a."b c".d`` -> ``["a", "b c", "d"]``; ``None`` if it is not a key."""
    parts: list[str] = []
    rest = text.strip()
    while rest:
        if rest[0] in "\"'":
            quote = rest[0]
            end = rest.find(quote, 1)
            if end < 0:
                return None
            parts.append(rest[1:end])
            rest = rest[end + 1:].lstrip()
        else:
            match = _BARE.match(rest)
            if not match:
                return None
            parts.append(match.group(0))
            rest = rest[match.end():].lstrip()
        if rest.startswith("."):
            rest = rest[1:].lstrip()
        elif rest:
            return None
    return parts or None


def _key_and_value(line: str) -> tuple[list[str], str] | None:
    """A ``key = value`` line's key parts and value text."""
    depth_quote: str | None = None
    for i, char in enumerate(line):
        if depth_quote:
            if char == depth_quote:
                depth_quote = None
        elif char in "\"'":
            depth_quote = char
        elif char == "=":
            key = _split_key(line[:i])
            return (key, line[i + 1:].strip()) if key else None
    return None


def _opens_multiline(value: str) -> str | None:
    """What closes the value if it continues on later lines: a triple quote or ``]``."""
    for triple in ('"""', "'''"):
        if value.startswith(triple) and value.count(triple) == 1:
            return triple
    if value.startswith("["):
        depth, quote = 0, None
        for char in value:
            if quote:
                if char == quote:
                    quote = None
            elif char in "\"'":
                quote = char
            elif char == "#":
                break
            elif char == "[":
                depth += 1
            elif char == "]":
                depth -= 1
        if depth > 0:
            return "]"
    return None


def key_lines(text: str) -> dict[Path, int]:
    """Every key path (table names, array-of-table indices, keys) -> its 1-based line."""
    lines: dict[Path, int] = {}
    counts: dict[Path, int] = {}
    table: Path = ()
    closing: str | None = None
    depth = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if closing is not None:  # inside a multi-line value
            if closing == "]":
                depth += line.count("[") - line.count("]")
                if depth <= 0:
                    closing = None
            elif closing in line:
                closing = None
            continue
        if not line or line.startswith("#"):
            continue
        if line.startswith("[["):
            parts = _split_key(line[2:line.find("]]")])
            if parts:
                base: Path = tuple(parts)
                index = counts.get(base, 0)
                counts[base] = index + 1
                table = (*base, index)
                lines.setdefault(base, number)
                lines[table] = number
            continue
        if line.startswith("["):
            parts = _split_key(line[1:line.find("]")])
            if parts:
                table = _resolve(tuple(parts), counts)
                lines[table] = number
            continue
        found = _key_and_value(line)
        if found is None:
            continue
        key, value = found
        lines[(*table, *key)] = number
        closing = _opens_multiline(value)
        if closing == "]":
            depth = value.count("[") - value.count("]")
    return lines


def _resolve(parts: Path, counts: dict[Path, int]) -> Path:
    """``[deployments.autoscale]`` after the second ``[[deployments]]`` is
    ``deployments.1.autoscale``: sub-tables belong to the latest array element."""
    out: list[str | int] = []
    for part in parts:
        out.append(part)
        index = counts.get(tuple(out))
        if index:
            out.append(index - 1)
    return tuple(out)


def line_of(lines: dict[Path, int], path: Path) -> int | None:
    """The line of ``path``, or of its nearest ancestor that has one."""
    for end in range(len(path), 0, -1):
        found = lines.get(path[:end])
        if found is not None:
            return found
    return None

"""A cache summary on the wire, inside a load report (``otela.load.reports``): a JSON
object whose fingerprint lists are base64 of packed big-endian 64-bit integers (8 bytes a
block before base64's third). ``{"e": epoch, "q": seq, "b": base (absent: the whole
set), "a": added, "r": removed, "z": block size, "h": hash algorithm}``."""

from __future__ import annotations

import base64
import struct
from typing import Any

from otela.kvcache.hashing import ALGORITHMS
from otela.kvcache.index import Summary

MAX_SUMMARY_BYTES = 96 * 1024  # 8,192 anchors whole, with room
MAX_BLOCK_SIZE = 1 << 16


def _pack(keys: tuple[int, ...]) -> str:
    return base64.b64encode(struct.pack(f">{len(keys)}Q", *keys)).decode()


def _unpack(text: object) -> tuple[int, ...]:
    if not isinstance(text, str):
        raise ValueError("a fingerprint list is a base64 string")
    data = base64.b64decode(text, validate=True)
    if len(data) % 8:
        raise ValueError("a fingerprint list is a whole number of 8-byte integers")
    return struct.unpack(f">{len(data) // 8}Q", data)


def to_wire(summary: Summary) -> dict[str, Any]:
    out: dict[str, Any] = {"e": summary.epoch, "q": summary.seq, "z": summary.block_size,
                           "h": summary.algorithm}
    if summary.base is not None:
        out["b"] = summary.base
    if summary.added:
        out["a"] = _pack(summary.added)
    if summary.removed:
        out["r"] = _pack(summary.removed)
    return out


def from_wire(fields: object) -> Summary:
    """A summary from its JSON object; ``ValueError`` for anything malformed."""
    if not isinstance(fields, dict):
        raise ValueError("a cache summary is an object")
    try:
        epoch, seq, size, algorithm = fields["e"], fields["q"], fields["z"], fields["h"]
    except KeyError as missing:
        raise ValueError(f"a cache summary needs {missing}") from None
    base = fields.get("b")
    for name, value in (("e", epoch), ("q", seq), ("z", size), ("b", base)):
        if value is None and name == "b":
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"a cache summary's {name!r} is a non-negative integer")
    if not 1 <= size <= MAX_BLOCK_SIZE or algorithm not in ALGORITHMS:
        raise ValueError("a cache summary's block size or hash algorithm is not usable")
    if base is not None and base > seq:
        raise ValueError("a cache summary's base is after its seq")
    added = _unpack(fields["a"]) if "a" in fields else ()
    removed = _unpack(fields["r"]) if "r" in fields else ()
    return Summary(epoch, seq, base, added, removed, size, algorithm)

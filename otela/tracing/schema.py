"""The otela trace schema (version 1): one request per record, no prompt text by default.

A trace file is JSON Lines: a header object first (`{"otela_trace": 1, ...}`), then one
object per request. This module is pure (no I/O): it defines the record, validates and
converts it, and hashes identifiers. `traces/io.py` reads and writes files;
`docs/traces.md` is the reference for every field.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any

SCHEMA_VERSION = 1
HEADER_KEY = "otela_trace"


class TraceError(ValueError):
    """A trace file or record that does not follow the schema (message says where/why)."""


@dataclass
class TraceRecord:
    """One request: when it arrived, what it asked for, and (if measured) how it went.

    Times are seconds; `arrival` counts from the trace's `start_time` (header). Latency
    fields are None when not measured (a generated trace) or not reached (a failed request).
    """

    arrival: float
    model: str
    input_tokens: int
    output_tokens: int
    request_id: str = ""
    ttft: float | None = None  # time to first token (streamed) or to the whole answer
    e2e: float | None = None  # arrival -> last byte of the response
    itl_mean: float | None = None  # inter-token latency summary over the streamed tokens
    itl_p50: float | None = None
    itl_p99: float | None = None
    itl_max: float | None = None
    status: int | None = None  # HTTP status; 0 = no HTTP answer (connect error, timeout)
    error: str | None = None  # error kind: http_503, connect, timeout, reset, stream, ...
    provider: str | None = None  # serving provider (hashed on request)
    node: str | None = None  # serving node (hashed on request)
    key: str | None = None  # API key, always hashed
    stream: bool | None = None
    max_tokens: int | None = None  # requested output budget (sampling parameter)
    prefix_hash: str | None = None  # shared-prefix identity (prefix caching), hashed
    prefix_len: int | None = None  # tokens covered by prefix_hash
    send_lag: float | None = None  # replay only: actual send time - scheduled arrival
    prompt: str | None = None  # only when the operator opts in (--record-prompts)
    extra: dict[str, Any] = field(default_factory=dict)  # unknown keys, kept verbatim

    @property
    def ok(self) -> bool:
        return self.error is None and (self.status is None or 200 <= self.status < 300)

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: (e2e - ttft) / (output - 1)."""
        if self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    def to_json(self) -> dict[str, Any]:
        """Compact JSON object: None fields and an empty `extra` are left out."""
        out = {k: v for k, v in asdict(self).items() if v is not None and k != "extra"}
        out.update(self.extra)
        return out


_FIELDS = {f.name: f for f in fields(TraceRecord)}
_REQUIRED = ("arrival", "model", "input_tokens", "output_tokens")
_INT = {"input_tokens", "output_tokens", "status", "max_tokens", "prefix_len"}
_FLOAT = {"arrival", "ttft", "e2e", "itl_mean", "itl_p50", "itl_p99", "itl_max", "send_lag"}
_STR = {"model", "request_id", "error", "provider", "node", "key", "prefix_hash", "prompt"}
COLUMNS = [f.name for f in fields(TraceRecord) if f.name != "extra"]


def record_from_json(obj: dict[str, Any], where: str = "") -> TraceRecord:
    """Validate and convert one JSON object; raise TraceError naming `where` on bad input."""
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: a record must be a JSON object")
    missing = [k for k in _REQUIRED if obj.get(k) is None or obj.get(k) == ""]
    if missing:
        raise TraceError(f"{where}: missing {', '.join(missing)}")
    kw: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for k, v in obj.items():
        if k not in _FIELDS or k == "extra":
            extra[k] = v
            continue
        if v is None or v == "":
            continue
        try:
            if k in _INT:
                kw[k] = int(float(v))
            elif k in _FLOAT:
                kw[k] = float(v)
                if not math.isfinite(kw[k]):
                    raise ValueError("not finite")
            elif k in _STR:
                kw[k] = str(v)
            elif k == "stream":
                kw[k] = v if isinstance(v, bool) else str(v).lower() in ("1", "true", "yes")
        except (TypeError, ValueError) as e:
            raise TraceError(f"{where}: field {k!r} has bad value {v!r}") from e
    if kw["input_tokens"] < 0 or kw["output_tokens"] < 0:
        raise TraceError(f"{where}: token counts must be >= 0")
    if kw["arrival"] < 0:
        raise TraceError(f"{where}: arrival must be >= 0 (seconds from the trace start)")
    return TraceRecord(**kw, extra=extra)


def make_header(source: str, start_time: float | None = None, **meta: Any) -> dict[str, Any]:
    """The first line of a trace file: schema version, wall-clock start, what produced it."""
    return {
        HEADER_KEY: SCHEMA_VERSION,
        "start_time": time.time() if start_time is None else start_time,
        "source": source,
        **meta,
    }


def check_header(obj: Any, where: str) -> dict[str, Any]:
    """Accept a version-1 header; anything else is a clear error."""
    if not isinstance(obj, dict) or HEADER_KEY not in obj:
        raise TraceError(f"{where}: not an otela trace (first line has no {HEADER_KEY!r} key)")
    version = obj[HEADER_KEY]
    if version != SCHEMA_VERSION:
        raise TraceError(
            f"{where}: trace schema version {version!r}; this otela reads {SCHEMA_VERSION}"
        )
    return dict(obj)


def hash_id(value: str, salt: str = "") -> str:
    """Irreversible short identifier (SHA-256, 16 hex digits) for keys, nodes, providers."""
    return hashlib.sha256((salt + "\x00" + value).encode()).hexdigest()[:16]

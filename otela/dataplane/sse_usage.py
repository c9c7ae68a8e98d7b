"""Asking a streaming engine for usage the client did not ask for, and hiding it again.

Usage accounting needs the tokens of every streamed answer, and OpenAI-compatible engines
report them only when asked (``stream_options.include_usage``): then the last event before
``[DONE]`` is a chunk with empty ``choices`` and a ``usage`` object. When the ingress adds
that request (``ask_for_usage``), the client did not ask for such a chunk, so
``UsageChunkFilter`` removes it from the stream before it is relayed. Events pass through
untouched otherwise; the filter holds back at most one incomplete event at a time.
"""

from __future__ import annotations

from typing import Any

import orjson


def ask_for_usage(body: dict[str, Any]) -> bool:
    """Set ``stream_options.include_usage`` in a streaming request ``body``; whether the
    client had not asked for it itself (so its usage chunk must be hidden)."""
    if body.get("stream") is not True:
        return False
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return False
    if options is not None and not isinstance(options, dict):
        return False  # malformed: leave it for the engine to refuse
    body["stream_options"] = {**(options or {}), "include_usage": True}
    return True


def _is_usage_only(event: bytes) -> bool:
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            payload = line[5:].strip()
            if b'"usage"' not in payload:
                return False
            try:
                data = orjson.loads(payload)
            except orjson.JSONDecodeError:
                return False
            return (isinstance(data, dict) and data.get("choices") == []
                    and isinstance(data.get("usage"), dict))
    return False


class UsageChunkFilter:
    """Feed the stream's chunks in order; relay what ``feed`` and ``end`` return."""

    def __init__(self) -> None:
        self._partial = b""
        self.removed = 0

    def feed(self, chunk: bytes) -> bytes:
        data = self._partial + chunk
        cut = max(data.rfind(b"\n\n"), data.rfind(b"\r\n\r\n"))
        if cut < 0:
            self._partial = data
            return b""
        end = cut + (4 if data.startswith(b"\r\n\r\n", cut) else 2)
        whole, self._partial = data[:end], data[end:]
        if b'"usage"' not in whole:
            return whole
        kept = []
        for event in _events(whole):
            if _is_usage_only(event):
                self.removed += 1
            else:
                kept.append(event)
        return b"".join(kept)

    def end(self) -> bytes:
        rest, self._partial = self._partial, b""
        return rest


def _events(data: bytes) -> list[bytes]:
    """``data`` (whole events) split into events, each with its blank-line terminator."""
    out, start = [], 0
    while start < len(data):
        lf, crlf = data.find(b"\n\n", start), data.find(b"\r\n\r\n", start)
        if lf < 0 and crlf < 0:
            out.append(data[start:])
            break
        end = crlf + 4 if crlf >= 0 and (lf < 0 or crlf <= lf) else lf + 2
        out.append(data[start:end])
        start = end
    return out

"""Asking a streaming engine for usage the client did not ask for, and hiding it again.

Usage accounting needs the tokens of every streamed answer, and OpenAI-compatible engines
report them only when asked (``stream_options.include_usage``): then the last event before
``[DONE]`` is a chunk with empty ``choices`` and a ``usage`` object. When the ingress adds
that request (``ask_for_usage``), the client did not ask for such a chunk, so
``UsageChunkFilter`` removes it from the stream before it is relayed. Events pass through
untouched otherwise.

Both hold back the incomplete event at the end of what arrived (``WholeEvents``) until
its end comes: then a stream the serving node breaks off can be ended with an error
event that parses, instead of after half an event. At most ``MAX_PARTIAL_BYTES`` are
held; a stream that has not ended an event by then is passed on as it comes.
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


MAX_PARTIAL_BYTES = 1024 * 1024


class WholeEvents:
    """Feed an event stream's chunks in order; relay what ``feed`` and ``end`` return:
    the same bytes, each event's released once it is complete."""

    def __init__(self) -> None:
        self._partial = b""
        self.at_boundary = True  # what was released so far ends between two events

    def feed(self, chunk: bytes) -> bytes:
        if not self._partial and (chunk.endswith(b"\n\n") or chunk.endswith(b"\r\n\r\n")):
            return self.released(chunk)  # whole events, as engines mostly write them
        data = self._partial + chunk
        cut = max(data.rfind(b"\n\n"), data.rfind(b"\r\n\r\n"))
        if cut < 0:
            if len(data) > MAX_PARTIAL_BYTES:  # not events as we know them: pass it on
                self._partial = b""
                self.at_boundary = False
                return data
            self._partial = data
            return b""
        end = cut + (4 if data.startswith(b"\r\n\r\n", cut) else 2)
        whole, self._partial = data[:end], data[end:]
        return self.released(whole)

    def released(self, whole: bytes) -> bytes:
        """Complete events on their way out (a subclass may change them)."""
        self.at_boundary = True
        return whole

    def end(self) -> bytes:
        """What is held when the stream ends properly (its last, unterminated event)."""
        rest, self._partial = self._partial, b""
        return rest


class UsageChunkFilter(WholeEvents):
    """``WholeEvents`` without the usage-only chunk the ingress asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.removed = 0

    def released(self, whole: bytes) -> bytes:
        self.at_boundary = True
        if b'"usage"' not in whole:
            return whole
        kept = []
        for event in _events(whole):
            if _is_usage_only(event):
                self.removed += 1
            else:
                kept.append(event)
        return b"".join(kept)


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

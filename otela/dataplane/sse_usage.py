"""Asking a streaming engine for usage the client did not ask for, and hiding it again.

Usage accounting needs the tokens of every streamed answer, and OpenAI-compatible engines
report them only when asked (``stream_options.include_usage``): then the last event before
``[DONE]`` is a chunk with empty ``choices`` and a ``usage`` object. When the ingress adds
that request (``ask_for_usage``), the client did not ask for such a chunk, so
``UsageChunkFilter`` removes it from the stream before it is relayed. Events pass through
untouched otherwise, whole events at a time (``sse_events.WholeEvents``).

Only chat and text completions need this. The other streamed shapes always say their usage:
the Responses API in its last event (``response.completed``, or ``response.incomplete`` /
``response.failed``), Anthropic's Messages API in ``message_start`` (input) and
``message_delta`` (output); their bodies go to the engine as the client sent them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from otela.dataplane.jsonfields import materialized
from otela.dataplane.sse import split_events
from otela.dataplane.sse_events import WholeEvents

# The routes whose streams report usage only when asked (``stream_options``).
ASKED_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions"})


def ask_for_usage(body: Mapping[str, Any], route: str) -> bool:
    """Set ``stream_options.include_usage`` in a streaming request ``body`` to ``route``
    (its path, without the query); whether the client had not asked for it itself (so its
    usage chunk must be hidden). Other routes' bodies are left alone (module docstring)."""
    if route not in ASKED_ROUTES or body.get("stream") is not True:
        return False
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return False
    if options is not None and not isinstance(options, dict):
        return False  # malformed: leave it for the engine to refuse
    materialized(body)["stream_options"] = {**(options or {}), "include_usage": True}
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
        for event in split_events(whole):
            if _is_usage_only(event):
                self.removed += 1
            else:
                kept.append(event)
        return b"".join(kept)

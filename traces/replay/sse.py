"""Incremental parsing of an OpenAI streaming response (server-sent events), pure.

Only what replay needs is extracted: when each token-bearing event arrived, the final
`usage` (exact token counts when the server sends it), and error events. Token events are
recognised without decoding their JSON (the hot path); usage and error events are decoded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from otela.dataplane.sse import EventSplitter


@dataclass
class StreamState:
    """What a response stream said so far."""

    token_times: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None
    done: bool = False
    _splitter: EventSplitter = field(default_factory=EventSplitter)

    def feed(self, data: bytes, now: float) -> None:
        """Consume body bytes received at `now`; events may span several calls (cut where
        every otela reader cuts them: ``otela.dataplane.sse``)."""
        for event in self._splitter.feed(data):
            self._event(event.rstrip(b"\r\n"), now)

    def _event(self, ev: bytes, now: float) -> None:
        if ev[:1] != b"d":
            ev = ev.lstrip(b"\r\n")
            if not ev.startswith(b"data:"):
                return  # comments (": ping"), event names, ids
        elif not ev.startswith(b"data:"):
            return
        if b'"choices"' in ev:
            if b'"choices":[]' in ev or b'"choices": []' in ev:
                self._usage(ev[5:])  # the usage-only chunk
                return
            if _has_content(ev):
                self.token_times.append(now)
            if b'"usage":{' in ev or b'"usage": {' in ev:  # usage on the last choice chunk
                self._usage(ev[5:])
            return
        payload = ev[5:].strip()
        if payload == b"[DONE]":
            self.done = True
        elif b'"error"' in payload:
            self.error = "stream"

    def _usage(self, payload: bytes) -> None:
        try:
            usage = json.loads(payload).get("usage") or {}
        except (ValueError, AttributeError):
            return
        if isinstance(usage.get("completion_tokens"), int):
            self.completion_tokens = usage["completion_tokens"]
        if isinstance(usage.get("prompt_tokens"), int):
            self.prompt_tokens = usage["prompt_tokens"]


def _has_content(payload: bytes) -> bool:
    """A chunk carries a token unless its text/content is empty or null (the role-only first
    chat chunk, the final finish_reason chunk)."""
    for key in (b'"text"', b'"content"', b'"reasoning_content"'):
        i = payload.find(key)
        while i >= 0:
            j = i + len(key)
            while j < len(payload) and payload[j] in b" :":
                j += 1
            if payload[j : j + 1] == b'"' and payload[j + 1 : j + 2] != b'"':
                return True
            i = payload.find(key, j)
    return False


def completion_tokens_of(body: bytes) -> tuple[int | None, int | None]:
    """(prompt, completion) tokens from a non-streamed JSON answer's `usage`."""
    try:
        usage = json.loads(body).get("usage") or {}
    except (ValueError, AttributeError):
        return None, None
    p, c = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return (p if isinstance(p, int) else None, c if isinstance(c, int) else None)

"""One request's story, for whoever watches the request path: what was asked, who served
it, how long each part took, and the tokens it used. Metrics, the access log, trace
recording (and later usage accounting) all read the same finished ``Exchange``.

``UsageTap`` watches a response on its way to the client without changing a byte: when the
first body bytes came, the gaps between streamed chunks, and the engine's own ``usage``
(``prompt_tokens``, ``completion_tokens``), from the JSON body or from the SSE event that
carries it. For a stream that reports no usage, the completion tokens are the number of
content events (one token each for vLLM and SGLang). It looks only at what it is given and
keeps at most ``MAX_BODY`` bytes of a non-streamed body.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson

MAX_BODY = 1024 * 1024  # a non-streamed answer larger than this is not searched for usage


@dataclass
class UsageTap:
    stream: bool
    started: float = field(default_factory=time.perf_counter)
    first_chunk: float | None = None
    last_chunk: float | None = None
    gaps: list[float] = field(default_factory=list)  # between streamed chunks, seconds
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    events: int = 0  # SSE data events with content
    _body: bytearray = field(default_factory=bytearray)
    _partial: bytes = b""
    _too_large: bool = False

    def chunk(self, data: bytes) -> None:
        now = time.perf_counter()
        if self.first_chunk is None:
            self.first_chunk = now
        elif self.stream and self.last_chunk is not None:
            self.gaps.append(now - self.last_chunk)
        self.last_chunk = now
        if self.stream:
            self._scan_events(data)
        elif not self._too_large:
            if len(self._body) + len(data) <= MAX_BODY:
                self._body += data
            else:
                self._body, self._too_large = bytearray(), True  # not worth parsing

    def _scan_events(self, data: bytes) -> None:
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                continue
            compact = payload.replace(b" ", b"")
            if (b'"content":"' in compact and b'"content":""' not in compact) or (
                    b'"text":"' in compact and b'"text":""' not in compact):
                self.events += 1
            if b'"usage"' in compact and b'"usage":null' not in compact:
                self._take_usage(payload)

    def finish(self) -> None:
        """The response is over: read usage from a whole JSON body."""
        if not self.stream and self._body:
            self._take_usage(bytes(self._body))
            self._body = bytearray()

    def _take_usage(self, payload: bytes) -> None:
        try:
            usage = orjson.loads(payload).get("usage")
        except (orjson.JSONDecodeError, AttributeError):
            return
        if isinstance(usage, dict):
            prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
            if isinstance(prompt, int):
                self.prompt_tokens = prompt
            if isinstance(completion, int):
                self.completion_tokens = completion

    @property
    def output_tokens(self) -> int:
        return self.completion_tokens if self.completion_tokens is not None else self.events


@dataclass
class Exchange:
    """One request through this node, filled in as it goes."""

    route: str  # the path asked for, e.g. /v1/chat/completions
    request_id: str
    arrival: float = field(default_factory=time.time)  # wall clock
    started: float = field(default_factory=time.perf_counter)
    model: str = ""
    stream: bool = False
    max_tokens: int | None = None
    status: int = 0
    error: str | None = None  # the error code, when otela answered with one
    node_peer: str = ""
    node_session: str = ""
    node_provider: str = ""
    path_kind: str = ""
    attempts: int = 0
    head_at: float | None = None  # the upstream's response head arrived (perf counter)
    finished_at: float | None = None
    bytes_out: int = 0
    api_key: str | None = None
    prompt: str | None = None  # kept only when the operator records prompts
    tap: UsageTap | None = None

    @property
    def duration(self) -> float:
        return (self.finished_at or time.perf_counter()) - self.started

    @property
    def first_byte(self) -> float | None:
        """Seconds to the first body byte (or to the head when there was no body)."""
        if self.tap is not None and self.tap.first_chunk is not None:
            return self.tap.first_chunk - self.started
        return None if self.head_at is None else self.head_at - self.started


def prompt_text(body: dict[str, Any]) -> str | None:
    """The prompt of an OpenAI request body, as text: a completion's ``prompt``, or the
    chat messages' text contents joined."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    parts = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(str(p.get("text")) for p in content
                         if isinstance(p, dict) and p.get("text"))
    return "\n".join(parts)

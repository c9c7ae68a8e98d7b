"""One request's story, for whoever watches the request path: what was asked, who served
it, how long each part took, and the tokens it used. Metrics, the access log, trace
recording and usage accounting all read the same finished ``Exchange``.

``UsageTap`` watches a response on its way to the client without changing a byte: when the
first body bytes came, the gaps between streamed chunks, and the engine's own usage, from
the JSON body or from the SSE event that carries it, in every shape engines answer in:

- chat and text completions, embeddings: ``usage.prompt_tokens`` / ``completion_tokens``
  (a stream's last chunk before ``[DONE]``);
- the Responses API: ``usage.input_tokens`` / ``output_tokens`` (cached input is part of
  ``input_tokens``); streamed, in the ``response`` of ``response.completed`` (or
  ``response.incomplete`` / ``response.failed``);
- Anthropic's Messages API: ``usage.input_tokens`` / ``output_tokens``, where input read
  from or written to the prompt cache is counted apart (``cache_read_input_tokens``,
  ``cache_creation_input_tokens``) and is added back: the prompt is all three; streamed,
  the input in ``message_start``'s message and the final counts in ``message_delta``.

For a stream that reports no usage (or breaks off before it does), the completion tokens
are the number of content events: chunks with text for chat and completions (one token
each for vLLM and SGLang), delta events for named-event streams. It looks only at what it
is given and keeps at most ``MAX_BODY`` bytes of a non-streamed body. On chat streams its
cost is what it was before the other shapes: lines without an ``event:`` field take the
same branch as ever.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from otela.dataplane.sse import EventSplitter

MAX_BODY = 1024 * 1024  # a non-streamed answer larger than this is not searched for usage
# Anthropic's usage counts cached input apart from ``input_tokens``.
_CACHE_READ, _CACHE_WRITE = "cache_read_input_tokens", "cache_creation_input_tokens"
_ANTHROPIC_CONTENT_EVENT = b"content_block_delta"


def _count(value: Any) -> int | None:
    """A token count as engines write it (an int, never a bool), else ``None``."""
    return value if type(value) is int else None


class _InputCounts:
    """Anthropic's input counts, kept apart: a later event may give only some of them."""

    __slots__ = ("cache_read", "cache_write", "input")

    def __init__(self) -> None:
        self.input: int | None = None
        self.cache_read = 0
        self.cache_write = 0


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
    _splitter: EventSplitter = field(default_factory=EventSplitter)
    _too_large: bool = False
    _inputs: _InputCounts | None = None  # made by the first input/output usage read

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

    def drop_partial(self) -> None:
        """Forget an unfinished event (its stream broke off; another continues it)."""
        self._splitter.partial = b""

    def _scan_events(self, data: bytes) -> None:
        for event in self._splitter.feed(data):
            self._read_event(event)

    def _read_event(self, event: bytes) -> None:
        name = None  # the Responses and Messages APIs name their events
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                if line.startswith(b"event:"):
                    name = line[6:].strip()
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                continue
            compact = payload.replace(b" ", b"")
            if name is None:  # chat and text completions' chunks
                if (b'"content":"' in compact and b'"content":""' not in compact) or (
                        b'"text":"' in compact and b'"text":""' not in compact):
                    self.events += 1
            elif name.endswith(b".delta") or name == _ANTHROPIC_CONTENT_EVENT:
                self.events += 1
            if b'"usage"' in compact and b'"usage":null' not in compact:
                self._take_usage(payload)

    def finish(self) -> None:
        """The response is over: read usage from a whole JSON body, or from a stream's
        last event if it was not terminated."""
        if self.stream:
            rest = self._splitter.rest()
            if rest:
                self._read_event(rest)
        elif self._body:
            self._take_usage(bytes(self._body))
            self._body = bytearray()

    def _take_usage(self, payload: bytes) -> None:
        try:
            data = orjson.loads(payload)
            usage = data.get("usage")
        except (orjson.JSONDecodeError, AttributeError):
            return
        final = True
        if not isinstance(usage, dict):
            # A whole response inside an event: the Responses API's last event (final
            # counts), Anthropic's ``message_start`` (its input; the output so far is not
            # what was generated, ``message_delta`` says that).
            inner = data.get("response")
            if not isinstance(inner, dict):
                inner, final = data.get("message"), False
            usage = inner.get("usage") if isinstance(inner, dict) else None
            if not isinstance(usage, dict):
                return
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if prompt is None and completion is None:
            self._take_input_output(usage, final)
            return
        if isinstance(prompt, int):
            self.prompt_tokens = prompt
        if isinstance(completion, int):
            self.completion_tokens = completion

    def _take_input_output(self, usage: dict[str, Any], final: bool) -> None:
        """The Responses and Messages APIs' ``input_tokens`` / ``output_tokens``. Counts
        a later event leaves out keep their earlier value (Anthropic's ``message_delta``
        may omit the input and cache counts that ``message_start`` gave)."""
        counts = self._inputs
        if counts is None:
            counts = self._inputs = _InputCounts()
        read, write = _count(usage.get(_CACHE_READ)), _count(usage.get(_CACHE_WRITE))
        if read is not None:
            counts.cache_read = read
        if write is not None:
            counts.cache_write = write
        given = _count(usage.get("input_tokens"))
        if given is not None:
            counts.input = given
        if counts.input is not None:
            self.prompt_tokens = counts.input + counts.cache_read + counts.cache_write
        output = _count(usage.get("output_tokens"))
        if final and output is not None:
            self.completion_tokens = output

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
    migrations: int = 0  # times its stream was continued on another node
    priority: str | None = None  # its class in the ingress queue, where it named one
    queued_s: float = 0.0  # time it waited in the ingress queue
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


def prompt_text(body: Mapping[str, Any]) -> str | None:
    """The prompt of a request body, as text (for prefix affinity and recorded traces): a
    completion's ``prompt``, the Responses API's ``instructions`` and ``input``, an
    embedding's ``input``, Anthropic's ``system``, and the messages' text contents, joined
    by newlines; ``None`` when the body has none of them."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    parts: list[str] = []
    for name in ("instructions", "system"):
        _texts(body.get(name), parts)
    found = bool(parts)
    for name in ("input", "messages"):
        items = body.get(name)
        if isinstance(items, str) and name == "input":
            parts.append(items)
            found = True
        elif isinstance(items, list):
            found = True
            for item in items:
                if isinstance(item, dict):
                    _texts(item.get("content"), parts)
                elif isinstance(item, str):
                    parts.append(item)
    return "\n".join(parts) if found else None


def _texts(content: Any, into: list[str]) -> None:
    """The text of a message's ``content``: a string, or a list of parts with ``text``
    (OpenAI's ``text``/``input_text`` parts, Anthropic's ``text`` blocks)."""
    if isinstance(content, str):
        into.append(content)
    elif isinstance(content, list):
        into.extend(str(p.get("text")) for p in content
                    if isinstance(p, dict) and p.get("text"))

"""Continuing a chat stream on another node when its node dies mid-answer. Pure.

The ingress has relayed part of an answer when the serving node breaks off (it died, or
its connection was cut). Instead of ending the client's stream with an error event, the
ingress asks another node to *continue* it: the same request, plus the text already sent
as a final, partial assistant message, with ``continue_final_message`` (vLLM's chat
extension: the model goes on from the last message instead of starting a new turn) and
``max_tokens`` reduced by what was already generated. The new node's events are then
spliced into the client's stream: the same ``id`` and ``created`` as before, its opening
role-only chunk dropped (the client has had one), its usage counted as the client sees it
(completion tokens: both nodes'; prompt tokens: the original prompt's).

What can be continued: a chat-completions stream with one choice, that has not finished
and carries no tool calls. Anything else ends with the error event as before. A content
chunk counts as one generated token (engines stream one token a chunk; a chunk of several
makes the reduced ``max_tokens`` a little generous).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from otela.dataplane.sse import EventSplitter, split_events

CHAT_ROUTE = "/v1/chat/completions"
DONE = b"data: [DONE]"


@dataclass
class Partial:
    """What the client has received of a chat stream."""

    id: str | None
    created: int | None
    text: str
    tokens: int  # content chunks


def partial_of(relayed: bytes) -> Partial | None:
    """The partial answer in ``relayed`` (whole events, as sent to the client); ``None``
    when it cannot be continued (finished, several choices, tool calls, not a chat
    stream)."""
    stream_id: str | None = None
    created: int | None = None
    parts: list[str] = []
    for event in split_events(relayed):
        data = _data(event)
        if data is None or data == b"[DONE]":
            continue
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(chunk, dict) or chunk.get("object") != "chat.completion.chunk":
            return None
        stream_id = chunk.get("id") if isinstance(chunk.get("id"), str) else stream_id
        created = chunk.get("created") if isinstance(chunk.get("created"), int) else created
        choices = chunk.get("choices") or []
        if len(choices) > 1 or any(c.get("index", 0) != 0 for c in choices
                                   if isinstance(c, dict)):
            return None
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("finish_reason"):
                return None  # finished: nothing to continue
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict) or delta.get("tool_calls") or \
                    delta.get("function_call"):
                return None
            content = delta.get("content")
            if isinstance(content, str) and content:
                parts.append(content)
    return Partial(stream_id, created, "".join(parts), len(parts))


def continuation_body(sent: bytes, partial: Partial) -> bytes | None:
    """The request that continues ``partial``: the body the failed node was sent
    (``sent``), with the partial answer as a final assistant message to continue;
    ``None`` when it cannot be made (not a chat body, several choices asked for, or no
    tokens left under its ``max_tokens``)."""
    try:
        body = orjson.loads(sent)
    except orjson.JSONDecodeError:
        return None
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list) or body.get("n", 1) not in (1, None):
        return None
    if partial.text:
        body["messages"] = [*messages, {"role": "assistant", "content": partial.text}]
        body["continue_final_message"] = True
        body["add_generation_prompt"] = False
    for name in ("max_tokens", "max_completion_tokens"):
        limit = body.get(name)
        if isinstance(limit, int) and not isinstance(limit, bool):
            left = limit - partial.tokens
            if left < 1:
                return None
            body[name] = left
    return orjson.dumps(body)


class Splice:
    """The continuation's events rewritten into the client's stream (module docstring).
    Feed its chunks in order; ``feed`` returns whole, rewritten events."""

    def __init__(self, partial: Partial) -> None:
        self.partial = partial
        self.events = EventSplitter()
        self.content_seen = False

    def feed(self, chunk: bytes) -> bytes:
        return b"".join(self._rewritten(event) for event in self.events.feed(chunk))

    def _rewritten(self, event: bytes) -> bytes:
        data = _data(event)
        if data is None or data == b"[DONE]":
            return event
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            return event
        if not isinstance(chunk, dict):
            return event
        if self.partial.id is not None:
            chunk["id"] = self.partial.id
        if self.partial.created is not None:
            chunk["created"] = self.partial.created
        choices = chunk.get("choices") or []
        if not self.content_seen and choices and all(_opening(c) for c in choices):
            return b""  # the client had its opening chunk from the first node
        if any(isinstance(c, dict) and isinstance(c.get("delta"), dict)
               and c["delta"].get("content") for c in choices):
            self.content_seen = True
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            chunk["usage"] = _as_seen(usage, self.partial.tokens)
        return b"data: " + orjson.dumps(chunk) + b"\n\n"


def _opening(choice: Any) -> bool:
    """A role-only first chunk (``{"role": "assistant", "content": ""}``)."""
    if not isinstance(choice, dict) or choice.get("finish_reason"):
        return False
    delta = choice.get("delta")
    return isinstance(delta, dict) and not delta.get("content") and \
        not delta.get("tool_calls")


def _as_seen(usage: dict[str, Any], partial_tokens: int) -> dict[str, Any]:
    """The continuation's usage as the client sees its one stream: the partial answer
    was prompt to the second node, completion to the client."""
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if isinstance(prompt, int) and isinstance(completion, int):
        moved = min(partial_tokens, prompt)
        usage = {**usage, "prompt_tokens": prompt - moved,
                 "completion_tokens": completion + moved}
    return usage


def _data(event: bytes) -> bytes | None:
    """The payload of an event's (single) ``data:`` line."""
    for line in event.splitlines():
        if line.startswith(b"data:"):
            return line[5:].strip()
    return None

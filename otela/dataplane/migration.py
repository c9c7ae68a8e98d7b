"""Continuing a stream on another node when its node dies mid-answer. Pure.

The ingress has relayed part of an answer when the serving node breaks off (it died, or
its connection was cut). Instead of ending the client's stream with an error event, the
ingress asks another node to *continue* it, with ``max_tokens`` reduced by what was
already generated:

- a chat-completions stream: the same request, plus the text already sent as a final,
  partial assistant message, with ``continue_final_message`` (vLLM's chat extension: the
  model goes on from the last message instead of starting a new turn);
- a (text) completions stream: the prompt followed by the text already sent, which a
  model simply goes on from.

The new node's events are then spliced into the client's stream: the same ``id`` and
``created`` as before, a chat stream's opening role-only chunk dropped (the client has had
one), its usage counted as the client sees it (completion tokens: both nodes'; prompt
tokens: the original prompt's, give or take a token where a completions prompt's end and
the partial text tokenize together).

What can be continued: a stream with one choice, that has not finished and carries no
tool calls; a completions request whose prompt is text (not token ids) and that does not
ask for its prompt echoed. Anything else ends with the error event as before. A content
chunk counts as one generated token (engines stream one token a chunk; a chunk of several
makes the reduced ``max_tokens`` a little generous).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from otela.dataplane.sse import EventSplitter, split_events

CHAT_ROUTE = "/v1/chat/completions"
COMPLETIONS_ROUTE = "/v1/completions"
CONTINUABLE_ROUTES = frozenset({CHAT_ROUTE, COMPLETIONS_ROUTE})
DONE = b"data: [DONE]"
_CHUNK_OBJECT = {True: "chat.completion.chunk", False: "text_completion"}  # by chat or not
# A completions request without ``max_tokens`` gets 16 (OpenAI's default and vLLM's): a
# continuation of one asks for what is left of those.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


@dataclass
class Partial:
    """What the client has received of a stream."""

    id: str | None
    created: int | None
    text: str
    tokens: int  # content chunks
    chat: bool = True  # a chat stream (else a text completions stream)


def partial_of(relayed: bytes, chat: bool = True) -> Partial | None:
    """The partial answer in ``relayed`` (whole events, as sent to the client) of a chat
    stream (``chat``) or a completions stream; ``None`` when it cannot be continued
    (finished, several choices, tool calls, not such a stream)."""
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
        if not isinstance(chunk, dict) or chunk.get("object") != _CHUNK_OBJECT[chat]:
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
            content = _piece(choice)
            if content:
                parts.append(content)
    return Partial(stream_id, created, "".join(parts), len(parts), chat)


def continuation_body(sent: bytes, partial: Partial) -> bytes | None:
    """The request that continues ``partial``: the body the failed node was sent
    (``sent``), with the partial answer as a final assistant message to continue (chat)
    or after the prompt (completions); ``None`` when it cannot be made (not such a body,
    several choices asked for, a prompt of token ids, its prompt echoed, or no tokens left
    under its ``max_tokens``)."""
    try:
        body = orjson.loads(sent)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(body, dict) or body.get("n", 1) not in (1, None):
        return None
    if partial.chat:
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        if partial.text:
            body["messages"] = [*messages, {"role": "assistant", "content": partial.text}]
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
    else:
        prompt = _text_prompt(body)
        if prompt is None or body.get("echo") or body.get("best_of", 1) not in (1, None):
            return None
        body["prompt"] = prompt + partial.text
        body.setdefault("max_tokens", COMPLETIONS_DEFAULT_MAX_TOKENS)
    for name in ("max_tokens", "max_completion_tokens"):
        limit = body.get(name)
        if isinstance(limit, int) and not isinstance(limit, bool):
            left = limit - partial.tokens
            if left < 1:
                return None
            body[name] = left
    return orjson.dumps(body)


def _text_prompt(body: dict[str, Any]) -> str | None:
    """A completions request's one prompt as text (a string, or a list of one string);
    ``None`` for token ids or several prompts."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else None


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
        if self.partial.chat and not self.content_seen and choices and \
                all(_opening(c) for c in choices):
            return b""  # the client had its opening chunk from the first node
        if any(_piece(c) for c in choices):
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


def _piece(choice: Any) -> str:
    """The text a streamed choice adds: a chat delta's content or a completion's text."""
    if not isinstance(choice, dict):
        return ""
    delta = choice.get("delta")
    piece = delta.get("content") if isinstance(delta, dict) else choice.get("text")
    return piece if isinstance(piece, str) else ""


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

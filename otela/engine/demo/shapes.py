"""The echo engine's other API shapes: embeddings, OpenAI's Responses API and Anthropic's
Messages API, as pure functions (checks, prompts, bodies, stream events); ``echo.py``
serves them.

Each shape is the one its official client parses, and that vLLM serves: what a client sends
through otela reaches a real engine in the same form, so the echo engine has to accept
and answer the same things to stand in for one. Deterministic: the answer is ``echo:`` and
the last user text, its tokens whitespace-delimited words (``echo.tokenize``), an
embedding a function of its text alone.

- ``/v1/embeddings``: ``input`` a string, strings, token ids or lists of token ids;
  ``encoding_format`` ``float`` or ``base64`` (little-endian float32, what the ``openai``
  client asks for by default); ``dimensions`` up to ``EMBEDDING_DIMENSIONS``.
- ``/v1/responses``: ``input`` a string or a list of input items, ``instructions``,
  ``max_output_tokens`` (a truncated answer is ``status: incomplete`` with
  ``incomplete_details.reason: max_output_tokens``, streamed as ``response.incomplete``,
  as OpenAI does); streamed as named events (``event: response.created`` ...) with
  ``sequence_number``, usage in the last one.
- ``/v1/messages`` (and ``/count_tokens``): Anthropic's required ``max_tokens`` and
  ``messages``, optional ``system``; streamed as ``message_start`` (input tokens),
  ``content_block_*``, ``message_delta`` (output tokens, stop reason), ``message_stop``.
  Errors in Anthropic's shape, ``{"type": "error", "error": {"type", "message"}}``, the
  message starting with the field it is about, since that is what its clients read.
"""

from __future__ import annotations

import base64
import hashlib
import math
import struct
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from otela.dataplane.errors import RequestError

EMBEDDING_DIMENSIONS = 64
Tokenize = Callable[[str], list[str]]


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _check_stream(body: dict[str, Any], anthropic: bool = False) -> None:
    if not isinstance(body.get("stream", False), bool | None):
        raise RequestError(400, "stream: must be a boolean" if anthropic
                           else "'stream' must be a boolean", param="stream")


def part_texts(content: Any) -> str:
    """The text of a message's content: a string, or the ``text`` of its parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return ""


# -- embeddings ----------------------------------------------------------------------------


def embedding_inputs(body: dict[str, Any]) -> list[str]:
    """The texts to embed (token ids become their decimal words); 400 naming the field."""
    given = body.get("input")
    if isinstance(given, str):
        items: list[Any] = [given]
    elif isinstance(given, list) and given:
        items = [given] if all(isinstance(i, int) and not isinstance(i, bool)
                               for i in given) else given
    else:
        raise RequestError(400, "'input' must be a string, a non-empty list of strings, or "
                           "token ids", param="input")
    texts = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            texts.append(item)
        elif isinstance(item, list) and item and all(
                isinstance(t, int) and not isinstance(t, bool) for t in item):
            texts.append(" ".join(str(t) for t in item))
        else:
            raise RequestError(400, f"input[{i}] must be a string or a list of token ids",
                               param=f"input[{i}]")
    encoding = body.get("encoding_format")
    if encoding not in (None, "float", "base64"):
        raise RequestError(400, "'encoding_format' must be 'float' or 'base64'",
                           param="encoding_format")
    dimensions = body.get("dimensions")
    if dimensions is not None and not (_positive_int(dimensions)
                                       and dimensions <= EMBEDDING_DIMENSIONS):
        raise RequestError(400, f"'dimensions' must be an integer from 1 to "
                           f"{EMBEDDING_DIMENSIONS}", param="dimensions")
    return texts


def embed(text: str, tokenize: Tokenize, dimensions: int = EMBEDDING_DIMENSIONS
          ) -> list[float]:
    """A unit vector that depends on the text's tokens alone (a bag of hashed words):
    equal texts embed equally, texts sharing words point alike."""
    vector = [0.0] * dimensions
    for token in tokenize(text):
        digest = hashlib.sha256(token.strip().encode()).digest()
        for i in range(dimensions):
            vector[i] += digest[i % len(digest)] / 127.5 - 1.0
    norm = math.sqrt(sum(v * v for v in vector))
    return [v / norm for v in vector] if norm else vector


def embeddings_body(body: dict[str, Any], model: str, texts: list[str],
                    tokenize: Tokenize) -> dict[str, Any]:
    dimensions = body.get("dimensions") or EMBEDDING_DIMENSIONS
    data = []
    for i, text in enumerate(texts):
        vector = embed(text, tokenize, dimensions)
        value: Any = vector
        if body.get("encoding_format") == "base64":
            value = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        data.append({"object": "embedding", "index": i, "embedding": value})
    tokens = sum(len(tokenize(t)) for t in texts)
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


# -- the Responses API ---------------------------------------------------------------------

_RESPONSE_ROLES = ("user", "assistant", "system", "developer")


def responses_prompt(body: dict[str, Any], tokenize: Tokenize) -> tuple[str, int]:
    """Check a Responses request (400 naming the field); the text to echo (the last user
    input) and the input's token count (instructions included)."""
    given = body.get("input")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise RequestError(400, "'instructions' must be a string", param="instructions")
    if isinstance(given, str):
        texts, users = [given], [given]
    elif isinstance(given, list) and given:
        texts, users = [], []
        for i, item in enumerate(given):
            if not isinstance(item, dict):
                raise RequestError(400, f"input[{i}] must be an object", param=f"input[{i}]")
            role, content = item.get("role"), item.get("content")
            if role is None:  # another kind of item (a tool call's output...): no text
                if not isinstance(item.get("type"), str):
                    raise RequestError(400, f"input[{i}] needs a 'role' or a 'type'",
                                       param=f"input[{i}]")
                continue
            if role not in _RESPONSE_ROLES:
                raise RequestError(400, f"input[{i}].role must be one of "
                                   f"{', '.join(_RESPONSE_ROLES)}", param=f"input[{i}].role")
            if not isinstance(content, str | list):
                raise RequestError(400, f"input[{i}].content must be a string or a list of "
                                   "parts", param=f"input[{i}].content")
            text = part_texts(content)
            texts.append(text)
            if role == "user":
                users.append(text)
    else:
        raise RequestError(400, "'input' must be a string or a non-empty list of items",
                           param="input")
    limit = body.get("max_output_tokens")
    if limit is not None and not _positive_int(limit):
        raise RequestError(400, "'max_output_tokens' must be a positive integer",
                           param="max_output_tokens")
    _check_stream(body)
    counted = [instructions or "", *texts]
    echoed = users[-1] if users else texts[-1] if texts else ""
    return echoed, sum(len(tokenize(t)) for t in counted)


class ResponsesAnswer:
    """One Responses API answer: the whole response object, and its stream of events."""

    def __init__(self, body: dict[str, Any], model: str, rid: str, created: int,
                 tokens: list[str], truncated: bool, prompt_tokens: int) -> None:
        self.body, self.model, self.rid, self.created = body, model, rid, created
        self.tokens, self.truncated, self.prompt_tokens = tokens, truncated, prompt_tokens
        self.item_id = "msg_" + rid.removeprefix("resp_")
        self.status = "incomplete" if truncated else "completed"

    def _part(self, text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def _item(self, done: bool) -> dict[str, Any]:
        return {"id": self.item_id, "type": "message", "role": "assistant",
                "status": self.status if done else "in_progress",
                "content": [self._part("".join(self.tokens))] if done else []}

    def response(self, done: bool = True) -> dict[str, Any]:
        """The response object (``done``: as it ends, with output and usage)."""
        output = len(self.tokens)
        return {
            "id": self.rid, "object": "response", "created_at": self.created,
            "status": self.status if done else "in_progress", "model": self.model,
            "output": [self._item(True)] if done else [],
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if done and self.truncated
            else None,
            "instructions": self.body.get("instructions"),
            "max_output_tokens": self.body.get("max_output_tokens"),
            "metadata": self.body.get("metadata") or {},
            "parallel_tool_calls": True, "previous_response_id": None,
            "temperature": self.body.get("temperature", 1.0),
            "top_p": self.body.get("top_p", 1.0), "tool_choice": "auto", "tools": [],
            "text": {"format": {"type": "text"}}, "truncation": "disabled",
            "usage": {"input_tokens": self.prompt_tokens,
                      "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens": output,
                      "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": self.prompt_tokens + output} if done else None,
        }

    def events(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """The stream as (event name, data) pairs, without ``sequence_number`` (see
        ``named_event``); one ``response.output_text.delta`` per token."""
        where = {"item_id": self.item_id, "output_index": 0, "content_index": 0}
        yield "response.created", {"response": self.response(done=False)}
        yield "response.in_progress", {"response": self.response(done=False)}
        yield "response.output_item.added", {"output_index": 0, "item": self._item(False)}
        yield "response.content_part.added", {**where, "part": self._part("")}
        for token in self.tokens:
            yield "response.output_text.delta", {**where, "delta": token, "logprobs": []}
        text = "".join(self.tokens)
        yield "response.output_text.done", {**where, "text": text, "logprobs": []}
        yield "response.content_part.done", {**where, "part": self._part(text)}
        yield "response.output_item.done", {"output_index": 0, "item": self._item(True)}
        yield f"response.{self.status}", {"response": self.response()}


def named_event(name: str, data: dict[str, Any], sequence: int | None = None) -> bytes:
    """One server-sent event with an ``event:`` name, as both APIs stream them; the data
    carries its ``type`` (and, for the Responses API, its ``sequence_number``)."""
    payload: dict[str, Any] = {"type": name, **data}
    if sequence is not None:
        payload["sequence_number"] = sequence
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


# -- Anthropic's Messages API --------------------------------------------------------------

_ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                          403: "permission_error", 404: "not_found_error",
                          413: "request_too_large", 429: "rate_limit_error",
                          529: "overloaded_error"}


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    """An error body as Anthropic's API (and vLLM's ``/v1/messages``) writes it."""
    kind = _ANTHROPIC_ERROR_TYPES.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def messages_prompt(body: dict[str, Any], tokenize: Tokenize, count_only: bool = False
                    ) -> tuple[str, int]:
    """Check a Messages request (400, the message naming the field first, as Anthropic's
    do); the text to echo (the last user message) and the input's token count (``system``
    included). ``count_only``: ``/v1/messages/count_tokens``, which takes no
    ``max_tokens``."""
    if not count_only:
        limit = body.get("max_tokens")
        if limit is None:
            raise RequestError(400, "max_tokens: Field required", param="max_tokens")
        if not _positive_int(limit):
            raise RequestError(400, "max_tokens: must be a positive integer",
                               param="max_tokens")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "messages: must be a non-empty list", param="messages")
    system = body.get("system")
    if system is not None and not isinstance(system, str | list):
        raise RequestError(400, "system: must be a string or a list of text blocks",
                           param="system")
    texts, users = [part_texts(system)], []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise RequestError(400, f"messages.{i}.role: must be 'user' or 'assistant'",
                               param=f"messages.{i}.role")
        content = message.get("content")
        if not isinstance(content, str | list) or (
                isinstance(content, list) and not all(
                    isinstance(b, dict) and isinstance(b.get("type"), str) for b in content)):
            raise RequestError(400, f"messages.{i}.content: must be a string or a list of "
                               "content blocks with a 'type'", param=f"messages.{i}.content")
        text = part_texts(content)
        texts.append(text)
        if message["role"] == "user":
            users.append(text)
    _check_stream(body, anthropic=True)
    echoed = users[-1] if users else texts[-1]
    return echoed, sum(len(tokenize(t)) for t in texts)


class MessagesAnswer:
    """One Messages API answer: the whole message, and its stream of events."""

    def __init__(self, model: str, mid: str, tokens: list[str], truncated: bool,
                 prompt_tokens: int) -> None:
        self.model, self.mid, self.tokens, self.prompt_tokens = model, mid, tokens, prompt_tokens
        self.stop_reason = "max_tokens" if truncated else "end_turn"

    def message(self, done: bool = True) -> dict[str, Any]:
        return {"id": self.mid, "type": "message", "role": "assistant", "model": self.model,
                "content": [{"type": "text", "text": "".join(self.tokens)}] if done else [],
                "stop_reason": self.stop_reason if done else None, "stop_sequence": None,
                "usage": {"input_tokens": self.prompt_tokens,
                          "output_tokens": len(self.tokens) if done else 0}}

    def events(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """The stream as (event name, data) pairs; one ``text_delta`` per token."""
        yield "message_start", {"message": self.message(done=False)}
        yield "content_block_start", {"index": 0, "content_block": {"type": "text",
                                                                     "text": ""}}
        yield "ping", {}
        for token in self.tokens:
            yield "content_block_delta", {"index": 0, "delta": {"type": "text_delta",
                                                                 "text": token}}
        yield "content_block_stop", {"index": 0}
        yield "message_delta", {"delta": {"stop_reason": self.stop_reason,
                                          "stop_sequence": None},
                                "usage": {"output_tokens": len(self.tokens)}}
        yield "message_stop", {}

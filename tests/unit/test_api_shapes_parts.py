"""The pure parts behind every API shape: the usage tap reads the Responses and Messages
APIs' usage (whole bodies and named-event streams, however a stream is cut into reads), a
key in ``x-api-key`` is the same key as in ``Authorization``, Anthropic's headers stay
behind, a broken named stream ends with a named error event, and prompts are found in
each shape's body."""

from __future__ import annotations

import json

import orjson
from hypothesis import given
from hypothesis import strategies as st

from otela.dataplane import headers as header_rules
from otela.dataplane.exchange import UsageTap, prompt_text
from otela.dataplane.sse_events import WholeEvents, error_event


def named(*events: tuple[str, dict]) -> bytes:
    return b"".join(b"event: " + name.encode() + b"\ndata: " + orjson.dumps({"type": name, **d})
                    + b"\n\n" for name, d in events)


def tap_of(data: bytes, stream: bool, cuts: list[int] | None = None) -> UsageTap:
    tap = UsageTap(stream=stream)
    at = 0
    for cut in cuts or []:
        tap.chunk(data[at:at + cut])
        at += cut
    tap.chunk(data[at:])
    tap.finish()
    return tap


RESPONSE_DONE = {"id": "resp_1", "object": "response", "status": "completed",
                 "output": [{"type": "message", "content": [
                     {"type": "output_text", "text": "a \"usage\": fake b"}]}],
                 "usage": {"input_tokens": 11, "input_tokens_details": {"cached_tokens": 4},
                           "output_tokens": 3, "total_tokens": 14}}
RESPONSES_STREAM = named(
    ("response.created", {"response": {**RESPONSE_DONE, "status": "in_progress",
                                       "output": [], "usage": None}}),
    ("response.output_item.added", {"output_index": 0, "item": {"type": "message"}}),
    ("response.content_part.added", {"part": {"type": "output_text", "text": ""}}),
    ("response.output_text.delta", {"delta": "a"}),
    ("response.output_text.delta", {"delta": " b"}),
    ("response.output_text.delta", {"delta": " c"}),
    ("response.output_text.done", {"text": "a b c"}),
    ("response.content_part.done", {"part": {"type": "output_text", "text": "a b c"}}),
    ("response.completed", {"response": RESPONSE_DONE}),
)
MESSAGES_STREAM = named(
    ("message_start", {"message": {"id": "msg_1", "type": "message", "content": [],
                                   "usage": {"input_tokens": 5,
                                             "cache_read_input_tokens": 20,
                                             "cache_creation_input_tokens": 2,
                                             "output_tokens": 1}}}),
    ("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
    ("ping", {}),
    ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "x"}}),
    ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": " y"}}),
    ("content_block_stop", {"index": 0}),
    # cumulative output; the input counts may be left out (they keep message_start's)
    ("message_delta", {"delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}}),
    ("message_stop", {}),
)


def test_whole_bodies_of_every_shape():
    responses = tap_of(orjson.dumps(RESPONSE_DONE), stream=False)
    assert (responses.prompt_tokens, responses.output_tokens) == (11, 3)  # cached: part of 11
    message = {"type": "message", "content": [{"type": "text", "text": "hi"}],
               "usage": {"input_tokens": 7, "cache_read_input_tokens": 30,
                         "cache_creation_input_tokens": 0, "output_tokens": 9}}
    anthropic = tap_of(orjson.dumps(message), stream=False)
    assert (anthropic.prompt_tokens, anthropic.output_tokens) == (37, 9)  # cache added back
    embeddings = tap_of(orjson.dumps({"object": "list", "data": [], "usage": {
        "prompt_tokens": 6, "total_tokens": 6}}), stream=False)
    assert (embeddings.prompt_tokens, embeddings.output_tokens) == (6, 0)


@given(st.lists(st.integers(1, 60), max_size=40))
def test_the_responses_stream_usage_comes_from_its_last_event_however_it_is_cut(cuts):
    tap = tap_of(RESPONSES_STREAM, stream=True, cuts=cuts)
    assert (tap.prompt_tokens, tap.output_tokens) == (11, 3)
    assert tap.events == 3  # the deltas, not the done events that repeat the text


@given(st.lists(st.integers(1, 60), max_size=40))
def test_the_messages_stream_usage_comes_from_start_and_delta_however_it_is_cut(cuts):
    tap = tap_of(MESSAGES_STREAM, stream=True, cuts=cuts)
    assert (tap.prompt_tokens, tap.output_tokens) == (5 + 20 + 2, 2)


def test_a_later_messages_usage_replaces_what_it_gives_and_keeps_the_rest():
    delta = named(("message_delta", {"delta": {}, "usage": {"input_tokens": 6,
                                                            "output_tokens": 4}}))
    tap = tap_of(MESSAGES_STREAM + delta, stream=True)
    assert (tap.prompt_tokens, tap.output_tokens) == (6 + 20 + 2, 4)


def test_broken_named_streams_count_what_was_relayed():
    """No final usage (the stream broke off): the input from ``message_start`` and one
    output token per delta event, never the provisional ``output_tokens`` of
    ``message_start``."""
    cut = MESSAGES_STREAM[:MESSAGES_STREAM.index(b"event: content_block_stop")]
    tap = tap_of(cut, stream=True)
    assert (tap.prompt_tokens, tap.output_tokens) == (27, 2)
    cut = RESPONSES_STREAM[:RESPONSES_STREAM.index(b"event: response.output_text.done")]
    tap = tap_of(cut, stream=True)
    assert (tap.prompt_tokens, tap.output_tokens) == (None, 3)


def test_chat_streams_are_read_as_before():
    chunk = {"choices": [{"delta": {"content": "x"}}], "usage": None}
    usage = {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}}
    stream = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in (chunk, chunk, usage))
    tap = tap_of(stream + b"data: [DONE]\n\n", stream=True, cuts=[3, 50])
    assert (tap.prompt_tokens, tap.output_tokens, tap.events) == (4, 2, 2)


def test_bools_and_strings_are_not_token_counts():
    body = orjson.dumps({"usage": {"input_tokens": True, "output_tokens": "9"}})
    tap = tap_of(body, stream=False)
    assert (tap.prompt_tokens, tap.completion_tokens) == (None, None)


def test_a_key_in_x_api_key_is_the_same_key_as_a_bearer_authorization():
    assert header_rules.credential([(b"x-api-key", b"otela-abc")]) == b"Bearer otela-abc"
    assert header_rules.credential([(b"x-api-key", b" otela-abc ")]) == b"Bearer otela-abc"
    # Authorization, when given, is the one read (whatever x-api-key says)
    both = [(b"x-api-key", b"otela-other"), (b"authorization", b"Bearer otela-abc")]
    assert header_rules.credential(both) == b"Bearer otela-abc"
    assert header_rules.credential([(b"content-type", b"application/json")]) is None


def test_credentials_and_anthropic_headers_are_never_forwarded():
    incoming = [(b"authorization", b"Bearer otela-abc"), (b"x-api-key", b"otela-abc"),
                (b"anthropic-version", b"2023-06-01"), (b"anthropic-beta", b"x"),
                (b"content-type", b"application/json"), (b"user-agent", b"Anthropic/Python")]
    sent = dict(header_rules.forwarded(incoming, b"rid"))
    assert not {b"authorization", b"x-api-key", b"anthropic-version", b"anthropic-beta"} & \
        set(sent)
    assert sent[b"user-agent"] == b"Anthropic/Python"


def _parse_sse(data: bytes) -> list[tuple[str | None, str]]:
    """(event name, data) of each event, as an SSE client reads them."""
    out = []
    for block in data.replace(b"\r\n", b"\n").split(b"\n\n"):
        name, lines = None, []
        for line in block.split(b"\n"):
            if line.startswith(b"event:"):
                name = line[6:].strip().decode()
            elif line.startswith(b"data:"):
                lines.append(line[5:].strip().decode())
        if lines:
            out.append((name, "\n".join(lines)))
    return out


def test_a_broken_named_stream_ends_with_a_named_error_event():
    error = b'{"error":{"message":"broke off","type":"upstream_error","param":null,' \
            b'"code":"upstream_failed"}}'
    for stream in (MESSAGES_STREAM, RESPONSES_STREAM):
        events = WholeEvents()
        relayed = events.feed(b": comment first\n\n") + events.feed(stream[:200])
        assert events.named is True
        end = error_event(error, events.at_boundary, events.named)
        (name, data), = _parse_sse(end)
        body = json.loads(data)
        # Anthropic's clients raise on ``event: error``; openai's on a data ``error``
        assert name == "error" and body["type"] == "error"
        assert body["error"]["code"] == "upstream_failed"
        assert _parse_sse(relayed + end)[-1] == (name, data)
    chat = WholeEvents()
    chat.feed(b'data: {"choices": []}\n\n')
    assert chat.named is False
    assert _parse_sse(error_event(error, True, chat.named)) == [(None, error.decode())]


def test_prompts_of_every_shape():
    assert prompt_text({"input": "tell me", "instructions": "be brief"}) == "be brief\ntell me"
    assert prompt_text({"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "a"}]}, {"type": "function_call_output"}]}) == "a"
    assert prompt_text({"input": ["one", "two"]}) == "one\ntwo"  # embeddings
    assert prompt_text({"system": [{"type": "text", "text": "sys"}], "messages": [
        {"role": "user", "content": "hi"}]}) == "sys\nhi"
    assert prompt_text({"model": "m"}) is None

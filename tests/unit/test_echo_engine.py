"""The echo engine's OpenAI API, exercised in-process (the integration tests run it for real)."""

import json

import httpx
import trio

from otela.engine.demo.echo import EchoSettings, create_app, tokenize


def call(settings, method, path, **kwargs):
    async def go():
        transport = httpx.ASGITransport(app=create_app(settings))
        async with httpx.AsyncClient(transport=transport, base_url="http://echo") as client:
            return await client.request(method, path, **kwargs)

    return trio.run(go)


SETTINGS = EchoSettings(models=("m",))
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello big world"}]}


def test_tokens_concatenate_back_to_the_text():
    assert "".join(tokenize("a  b c")) == "a b c"


def test_models_lists_served_ids_with_context_length():
    data = call(SETTINGS, "GET", "/v1/models").json()["data"]
    assert [(m["id"], m["max_model_len"]) for m in data] == [("m", 4096)]


def test_chat_echoes_the_last_user_message_with_usage():
    body = call(SETTINGS, "POST", "/v1/chat/completions", json=CHAT).json()
    assert body["choices"][0]["message"]["content"] == "echo: hello big world"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}


def test_max_tokens_truncates_with_finish_reason_length():
    body = call(SETTINGS, "POST", "/v1/completions",
                json={"model": "m", "prompt": "a b c d", "max_tokens": 2}).json()
    assert body["choices"][0]["text"] == "echo: a"
    assert body["choices"][0]["finish_reason"] == "length"


def test_stream_is_sse_chunks_ending_in_done():
    text = call(SETTINGS, "POST", "/v1/chat/completions",
                json={**CHAT, "stream": True, "stream_options": {"include_usage": True}}).text
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert content == "echo: hello big world"
    assert chunks[-1]["usage"]["completion_tokens"] == 4


def test_errors_are_openai_shaped():
    unknown = call(SETTINGS, "POST", "/v1/chat/completions", json={**CHAT, "model": "x"})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "model_not_found"
    bad = call(SETTINGS, "POST", "/v1/chat/completions", content=b"{nope")
    assert bad.status_code == 400
    assert bad.json()["error"]["type"] == "invalid_request_error"


def test_injected_failures_every_n_requests():
    settings = EchoSettings(models=("m",), fail_every=2, fail_status=503)

    async def go():
        transport = httpx.ASGITransport(app=create_app(settings))
        async with httpx.AsyncClient(transport=transport, base_url="http://echo") as client:
            return [(await client.post("/v1/chat/completions", json=CHAT)).status_code
                    for _ in range(4)]

    assert trio.run(go) == [200, 503, 200, 503]


def test_malformed_fields_are_400s_that_name_them_like_a_real_engine():
    cases = [
        ("/v1/chat/completions", {"model": "m", "messages": ["just a string"]}, "messages[0]"),
        ("/v1/chat/completions", {"model": "m", "messages": [{"content": "no role"}]},
         "messages[0]"),
        ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": 5}]},
         "messages[0].content"),
        ("/v1/chat/completions", {**CHAT, "stream": True, "stream_options": "yes"},
         "stream_options"),
        ("/v1/chat/completions", {**CHAT, "stream": "yes"}, "stream"),
        ("/v1/chat/completions", {**CHAT, "max_tokens": -3}, "max_tokens"),
        ("/v1/completions", {"model": "m", "prompt": {"a": 1}}, "prompt"),
        ("/v1/completions", {"model": "m"}, "prompt"),
    ]
    for path, body, param in cases:
        response = call(SETTINGS, "POST", path, json=body)
        assert response.status_code == 400, (path, body)
        assert response.json()["error"]["param"] == param


def test_multipart_content_with_odd_parts_is_still_answered():
    body = {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi"}, {"type": "image_url", "text": None}, "stray"]}]}
    response = call(SETTINGS, "POST", "/v1/chat/completions", json=body)
    assert response.status_code == 200


# -- the other shapes: embeddings, the Responses API, Anthropic's Messages API --------------


def _named_events(text):
    """(name, data) of a named-event stream."""
    out = []
    for block in text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "data" in lines:
            out.append((lines.get("event"), json.loads(lines["data"])))
    return out


def test_embeddings_are_deterministic_unit_vectors_in_both_encodings():
    import base64
    import math
    import struct

    body = {"model": "m", "input": ["big world", "hello big world", "big world"]}
    answer = call(SETTINGS, "POST", "/v1/embeddings", json=body).json()
    vectors = [d["embedding"] for d in answer["data"]]
    assert [d["index"] for d in answer["data"]] == [0, 1, 2]
    assert vectors[0] == vectors[2] != vectors[1]
    assert all(abs(math.sqrt(sum(v * v for v in vec)) - 1) < 1e-9 for vec in vectors)
    assert answer["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    packed = call(SETTINGS, "POST", "/v1/embeddings",
                  json={**body, "encoding_format": "base64", "dimensions": 8}).json()
    raw = base64.b64decode(packed["data"][0]["embedding"])
    assert len(struct.unpack("<8f", raw)) == 8
    tokens = call(SETTINGS, "POST", "/v1/embeddings", json={"model": "m", "input": [1, 2, 3]})
    assert tokens.json()["usage"]["prompt_tokens"] == 3


def test_responses_answer_whole_and_truncated():
    body = {"model": "m", "instructions": "be brief", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "hello big world"}]}]}
    answer = call(SETTINGS, "POST", "/v1/responses", json=body).json()
    assert answer["object"] == "response" and answer["status"] == "completed"
    (item,) = answer["output"]
    assert item["content"][0]["text"] == "echo: hello big world"
    assert answer["usage"]["input_tokens"] == 5 and answer["usage"]["output_tokens"] == 4
    assert answer["usage"]["total_tokens"] == 9
    short = call(SETTINGS, "POST", "/v1/responses",
                 json={**body, "max_output_tokens": 2}).json()
    assert short["status"] == "incomplete"
    assert short["incomplete_details"] == {"reason": "max_output_tokens"}
    assert short["output"][0]["content"][0]["text"] == "echo: hello"


def test_responses_stream_named_events_in_order_with_usage_last():
    text = call(SETTINGS, "POST", "/v1/responses",
                json={"model": "m", "input": "hi there", "stream": True}).text
    events = _named_events(text)
    assert all(name == data["type"] for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    names = [name for name, _ in events]
    assert names[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert names[-1] == "response.completed"
    deltas = [data["delta"] for name, data in events if name == "response.output_text.delta"]
    assert "".join(deltas) == "echo: hi there"
    assert events[0][1]["response"]["usage"] is None
    assert events[-1][1]["response"]["usage"]["output_tokens"] == len(deltas) == 3


def test_messages_answer_whole_and_streamed_like_anthropic():
    body = {"model": "m", "max_tokens": 100, "system": "be brief",
            "messages": [{"role": "user", "content": "hello big world"},
                         {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
                         {"role": "user", "content": [{"type": "text", "text": "again"}]}]}
    message = call(SETTINGS, "POST", "/v1/messages", json=body).json()
    assert message["type"] == "message" and message["role"] == "assistant"
    assert message["content"] == [{"type": "text", "text": "echo: again"}]
    assert message["stop_reason"] == "end_turn"
    assert message["usage"] == {"input_tokens": 7, "output_tokens": 2}
    events = _named_events(call(SETTINGS, "POST", "/v1/messages",
                                json={**body, "stream": True, "max_tokens": 1}).text)
    assert [n for n, _ in events] == ["message_start", "content_block_start", "ping",
                                      "content_block_delta", "content_block_stop",
                                      "message_delta", "message_stop"]
    assert events[0][1]["message"]["usage"]["input_tokens"] == 7
    assert events[5][1] == {"type": "message_delta", "usage": {"output_tokens": 1},
                            "delta": {"stop_reason": "max_tokens", "stop_sequence": None}}
    counted = call(SETTINGS, "POST", "/v1/messages/count_tokens",
                   json={k: v for k, v in body.items() if k != "max_tokens"}).json()
    assert counted == {"input_tokens": 7}


def test_new_shapes_refuse_bad_fields_with_400s_that_name_them():
    responses = [({"model": "m"}, "input"), ({"model": "m", "input": []}, "input"),
                 ({"model": "m", "input": [5]}, "input[0]"),
                 ({"model": "m", "input": [{"role": "robot", "content": "x"}]},
                  "input[0].role"),
                 ({"model": "m", "input": [{"role": "user", "content": 5}]},
                  "input[0].content"),
                 ({"model": "m", "input": "x", "max_output_tokens": 0}, "max_output_tokens"),
                 ({"model": "m", "input": "x", "instructions": 3}, "instructions"),
                 ({"model": "m", "input": "x", "stream": "yes"}, "stream")]
    for body, param in responses:
        answer = call(SETTINGS, "POST", "/v1/responses", json=body)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == param, body
    embeddings = [({"model": "m"}, "input"), ({"model": "m", "input": [{}]}, "input[0]"),
                  ({"model": "m", "input": "x", "encoding_format": "hex"}, "encoding_format"),
                  ({"model": "m", "input": "x", "dimensions": 4096}, "dimensions")]
    for body, param in embeddings:
        answer = call(SETTINGS, "POST", "/v1/embeddings", json=body)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == param, body
    ok = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    messages = [({k: v for k, v in ok.items() if k != "max_tokens"}, "max_tokens"),
                ({**ok, "max_tokens": -1}, "max_tokens"), ({**ok, "messages": []}, "messages"),
                ({**ok, "messages": [{"role": "system", "content": "x"}]}, "messages.0.role"),
                ({**ok, "messages": [{"role": "user", "content": [{"text": "no type"}]}]},
                 "messages.0.content"),
                ({**ok, "system": 7}, "system"), ({**ok, "stream": 1}, "stream")]
    for body, field in messages:
        answer = call(SETTINGS, "POST", "/v1/messages", json=body)
        assert answer.status_code == 400, body
        # Anthropic's shape: what its clients read
        assert answer.json()["type"] == "error", body
        assert answer.json()["error"]["type"] == "invalid_request_error"
        assert answer.json()["error"]["message"].startswith(field + ":"), body


def test_messages_errors_and_injected_failures_are_anthropic_shaped():
    unknown = call(SETTINGS, "POST", "/v1/messages", json={
        "model": "x", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["type"] == "not_found_error"
    assert call(SETTINGS, "POST", "/v1/messages", content=b"{nope").json()["type"] == "error"
    failing = EchoSettings(models=("m",), fail_every=1, fail_status=503)
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    failed = call(failing, "POST", "/v1/messages", json=body)
    assert failed.status_code == 503 and failed.json()["error"]["type"] == "api_error"
    failed = call(failing, "POST", "/v1/responses", json={"model": "m", "input": "x"})
    assert failed.status_code == 503 and "injected failure" in failed.json()["error"]["message"]


def test_the_route_is_not_chosen_by_a_query_parameter():
    answer = call(SETTINGS, "POST", "/v1/messages?kind=chat", json={
        "model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})
    assert answer.json()["type"] == "message"

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

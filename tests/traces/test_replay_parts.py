"""Replay's pure parts: exact payloads, SSE parsing, URL handling."""

import json

import pytest

from otela.tracing.schema import TraceRecord
from traces.replay.client import Endpoint
from traces.replay.payload import PayloadBuilder
from traces.replay.sse import StreamState


def _body(raw: bytes) -> dict:  # type: ignore[type-arg]
    return json.loads(raw.split(b"\r\n\r\n", 1)[1])


def test_completions_payload_has_exact_token_counts_and_headers() -> None:
    b = PayloadBuilder(host="h:1", api_key="sk-x", seed=1)
    raw = b.request(TraceRecord(0.0, "m", 1234, 56, "r9"))
    head, body = raw.split(b"\r\n\r\n", 1)
    assert b"POST /v1/completions HTTP/1.1" in head and b"Authorization: Bearer sk-x" in head
    assert f"Content-Length: {len(body)}".encode() in head
    d = json.loads(body)
    assert len(d["prompt"]) == 1234 and all(10 <= i < 500 for i in d["prompt"])
    assert d["max_tokens"] == d["min_tokens"] == 56 and d["ignore_eos"] and d["stream"]
    assert d["stream_options"] == {"include_usage": True}


def test_prompts_share_only_declared_prefixes() -> None:
    b = PayloadBuilder(host="h", seed=2)
    x = _body(b.request(TraceRecord(0, "m", 300, 5)))["prompt"]
    y = _body(b.request(TraceRecord(0, "m", 300, 5)))["prompt"]
    assert x[:16] != y[:16]  # unrelated requests: no accidental prefix-cache hits
    p = _body(b.request(TraceRecord(0, "m", 300, 5, prefix_hash="sys", prefix_len=128)))["prompt"]
    q = _body(b.request(TraceRecord(0, "m", 400, 5, prefix_hash="sys", prefix_len=128)))["prompt"]
    assert p[:128] == q[:128] and p[128:144] != q[128:144] and len(q) == 400


def test_chat_payload_words_and_no_exact_output() -> None:
    b = PayloadBuilder(host="h", api="chat", stream=False, exact_output=False)
    d = _body(b.request(TraceRecord(0, "m", 20000, 7)))
    assert len(d["messages"][0]["content"].split()) == 20000
    assert "min_tokens" not in d and "stream" not in d and d["max_tokens"] == 7


def test_sse_counts_tokens_usage_done_across_chunk_boundaries() -> None:
    events = [
        b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n',
        b'data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}\n\n',
        b'data: {"choices": [{"index": 0, "text": "lo"}]}\n\n',
        b": keep-alive comment\n\n",
        b'data: {"choices":[{"index":0,"text":"","finish_reason":"length"}]}\n\n',
        b'data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2}}\n\n',
        b"data: [DONE]\n\n",
    ]
    blob = b"".join(events)
    st = StreamState()
    for i in range(0, len(blob), 7):  # arbitrary split points
        st.feed(blob[i : i + 7], float(i))
    assert len(st.token_times) == 2 and st.done and st.error is None
    assert (st.prompt_tokens, st.completion_tokens) == (9, 2)
    bad = StreamState()
    bad.feed(b'data: {"error": {"message": "boom"}}\n\n', 0.0)
    assert bad.error == "stream"


@pytest.mark.parametrize(
    ("url", "host", "port", "prefix"),
    [
        ("http://127.0.0.1:8092", "127.0.0.1", 8092, ""),
        ("https://api.x.org/v1", "api.x.org", 443, ""),
        ("localhost:9/gw/v1/", "localhost", 9, "/gw"),
    ],
)
def test_endpoint_parsing(url: str, host: str, port: int, prefix: str) -> None:
    ep = Endpoint.parse(url)
    assert (ep.host, ep.port, ep.prefix) == (host, port, prefix)
    with pytest.raises(ValueError):
        Endpoint.parse("ftp://x")

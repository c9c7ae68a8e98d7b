"""Continuing a broken chat or completions stream on another node: what the client has
had is read back, the continuation asks for the rest, and its events splice into one
stream (pure parts of otela.dataplane.migration; the echo engine's continuation as the
second node)."""

from __future__ import annotations

import orjson

from otela.dataplane.migration import Partial, Splice, continuation_body, partial_of
from otela.engine.demo.echo import _answer, _continued, _split_continuation


def chunk(content: str | None = None, *, role: bool = False, finish: str | None = None,
          stream_id: str = "chatcmpl-first", created: int = 100) -> bytes:
    delta: dict[str, str] = {}
    if role:
        delta = {"role": "assistant", "content": ""}
    elif content is not None:
        delta = {"content": content}
    payload = {"id": stream_id, "object": "chat.completion.chunk", "created": created,
               "model": "m", "choices": [{"index": 0, "delta": delta,
                                          "finish_reason": finish}]}
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def stream(tokens: list[str], finish: str = "stop", **ids: object) -> list[bytes]:
    return [chunk(role=True, **ids), *(chunk(t, **ids) for t in tokens),  # type: ignore[arg-type]
            chunk(finish=finish, **ids), b"data: [DONE]\n\n"]  # type: ignore[arg-type]


def contents(events: bytes) -> str:
    text = []
    for line in events.split(b"\n"):
        if line.startswith(b"data: {"):
            for choice in orjson.loads(line[6:])["choices"]:
                text.append(choice.get("delta", {}).get("content") or "")
    return "".join(text)


def test_what_the_client_had_is_read_back() -> None:
    partial = partial_of(b"".join(stream(["echo:", " a", " b"])[:3]))
    assert partial == Partial("chatcmpl-first", 100, "echo: a", 2)
    assert partial_of(b"".join(stream(["echo:", " a"]))) is None  # finished: nothing to do
    two_choices = chunk("x").replace(b'"choices":[', b'"choices":[{"index":1},')
    assert partial_of(two_choices) is None
    tool = b'data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":' \
        b'{"tool_calls":[{"index":0}]},"finish_reason":null}]}\n\n'
    assert partial_of(tool) is None
    assert partial_of(b'data: {"object":"text_completion","choices":[]}\n\n') is None
    assert partial_of(chunk("x"), chat=False) is None  # a chat chunk in a completions stream


def test_the_continuation_asks_for_the_rest_within_the_limit() -> None:
    sent = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "a b"}],
                         "max_tokens": 5, "stream": True})
    body = orjson.loads(continuation_body(sent, Partial("id", 1, "echo: a", 2)) or b"{}")
    assert body["messages"][-1] == {"role": "assistant", "content": "echo: a"}
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert body["max_tokens"] == 3 and body["stream"] is True
    assert continuation_body(sent, Partial("id", 1, "x " * 5, 5)) is None  # none left
    assert continuation_body(b'{"model": "m", "prompt": "a"}', Partial("id", 1, "x", 1)) \
        is None


def test_a_stream_cut_anywhere_and_continued_is_the_uninterrupted_stream() -> None:
    prompt = "the quick brown fox jumps over the lazy dog"
    full, _ = _answer(prompt, None)
    whole = stream(full)
    uninterrupted = contents(b"".join(whole))
    for cut in range(1, len(whole) - 2):  # after the role chunk and 0..n-1 content chunks
        had = b"".join(whole[:cut])
        partial = partial_of(had)
        assert partial is not None
        sent = orjson.dumps({"model": "m", "stream": True,
                             "messages": [{"role": "user", "content": prompt}]})
        body = orjson.loads(continuation_body(sent, partial) or b"{}")
        rest, finish = _answer(prompt, None, _continued(body))
        second = stream(rest, finish, stream_id="chatcmpl-second", created=200)
        splice = Splice(partial)
        spliced = b"".join(splice.feed(event) for event in second)
        assert contents(had + spliced) == uninterrupted, cut
        ids = {orjson.loads(line[6:])["id"] for line in (had + spliced).split(b"\n")
               if line.startswith(b"data: {")}
        assert ids == {"chatcmpl-first"}
        assert spliced.endswith(b"data: [DONE]\n\n")
        assert spliced.count(b'"role"') == 0  # the client had its opening chunk


def test_usage_counts_what_the_client_received() -> None:
    splice = Splice(Partial("id", 1, "echo: a b", 3))
    usage = b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":12,' \
        b'"completion_tokens":4,"total_tokens":16}}\n\n'
    seen = orjson.loads(splice.feed(usage)[6:])["usage"]
    assert seen == {"prompt_tokens": 9, "completion_tokens": 7, "total_tokens": 16}


def text_chunk(text: str = "", finish: str | None = None, stream_id: str = "cmpl-first",
               created: int = 100) -> bytes:
    payload = {"id": stream_id, "object": "text_completion", "created": created,
               "model": "m", "choices": [{"index": 0, "text": text, "logprobs": None,
                                          "finish_reason": finish}]}
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def text_stream(tokens: list[str], finish: str = "stop", **ids: str) -> list[bytes]:
    return [*(text_chunk(t, **ids) for t in tokens), text_chunk(finish=finish, **ids),
            b"data: [DONE]\n\n"]


def texts(events: bytes) -> str:
    return "".join(choice["text"] for line in events.split(b"\n")
                   if line.startswith(b"data: {")
                   for choice in orjson.loads(line[6:])["choices"])


def test_a_completions_continuation_is_the_prompt_then_the_partial_text() -> None:
    sent = orjson.dumps({"model": "m", "prompt": "a b", "max_tokens": 5, "stream": True})
    partial = partial_of(b"".join(text_stream(["echo:", " a"])[:2]), chat=False)
    assert partial == Partial("cmpl-first", 100, "echo: a", 2, chat=False)
    body = orjson.loads(continuation_body(sent, partial) or b"{}")
    assert body["prompt"] == "a becho: a" and body["max_tokens"] == 3
    assert "messages" not in body and "continue_final_message" not in body
    one = orjson.loads(continuation_body(sent.replace(b'"a b"', b'["a b"]'), partial)
                       or b"{}")
    assert one["prompt"] == "a becho: a"  # a list of one prompt is one prompt
    unset = orjson.loads(continuation_body(b'{"prompt": "a b"}', partial) or b"{}")
    assert unset["max_tokens"] == 14  # what is left of the default 16
    for refused in (b'{"prompt": [1, 2, 3]}', b'{"prompt": ["a", "b"]}',
                    b'{"prompt": "a", "echo": true}', b'{"prompt": "a", "n": 2}',
                    b'{"prompt": "a", "best_of": 3}', b'{"messages": []}'):
        assert continuation_body(refused, partial) is None, refused


def test_a_completions_stream_cut_anywhere_and_continued_is_the_uninterrupted_stream() -> None:
    prompt = "the quick brown fox echo: jumps over the lazy dog"
    full, _ = _answer(prompt, None)
    whole = text_stream(full)
    uninterrupted = texts(b"".join(whole))
    assert _split_continuation(prompt) == (prompt, "")  # a plain prompt is answered whole
    for cut in range(0, len(whole) - 2):  # after 0..n-1 content chunks
        had = b"".join(whole[:cut])
        partial = partial_of(had, chat=False)
        assert partial is not None
        sent = orjson.dumps({"model": "m", "stream": True, "prompt": prompt,
                             "max_tokens": len(full)})
        body = orjson.loads(continuation_body(sent, partial) or b"{}")
        head, given = _split_continuation(body["prompt"])
        rest, finish = _answer(head, body["max_tokens"], given)
        assert finish == "stop"
        second = text_stream(rest, finish, stream_id="cmpl-second", created=200)
        spliced = b"".join(Splice(partial).feed(event) for event in second)
        assert texts(had + spliced) == uninterrupted, cut
        ids = {orjson.loads(line[6:])["id"] for line in (had + spliced).split(b"\n")
               if line.startswith(b"data: {")}
        assert ids == {"cmpl-first" if cut else "cmpl-second"}  # one id, the first seen

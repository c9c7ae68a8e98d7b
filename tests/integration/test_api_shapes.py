"""Every API shape through real otela processes, with the official clients: OpenAI's
Responses API (plain, streamed events, the stream helper) and embeddings with ``openai``,
Anthropic's Messages API (plain, streamed, token counting) with ``anthropic``; through one
hop and two, keyless and with the ingress service's keys, where every request's usage row
must hold the tokens its client was told, and limits apply to every shape.

Two nodes, each wrapping an echo engine (``otela/engine/demo/echo.py``):
``gate`` runs the ingress service on a real SQLite file and serves ``shape-a``; ``plain``
has no keys and serves ``shape-b``. A model's own node answers in one hop (client -> node
-> engine), the other node in two (client -> node -> the serving node's engine hop ->
engine)."""

from __future__ import annotations

import socket
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass

import anthropic
import httpx
import openai
import pytest

from otela.testing.localfed import (
    LocalFederation,
    LocalNode,
    echo_engine_command,
    free_port,
    wait_for,
)

from .helpers import CONVERGE_S

pytestmark = pytest.mark.slow

ADMIN = "admin-token-for-shape-tests-0123456789"
KEYED, KEYLESS = "shape-a", "shape-b"  # the models: served by gate (keys) and plain


@dataclass
class Fed:
    gate: LocalNode
    plain: LocalNode
    db: str

    def path(self, name: str) -> tuple[LocalNode, str, LocalNode]:
        """(entry node, model, serving node) of a path: keyed or keyless, one or two hops."""
        return {"keyed-one-hop": (self.gate, KEYED, self.gate),
                "keyed-two-hops": (self.gate, KEYLESS, self.plain),
                "keyless-one-hop": (self.plain, KEYLESS, self.plain),
                "keyless-two-hops": (self.plain, KEYED, self.gate)}[name]


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fed]:
    root = tmp_path_factory.mktemp("api-shapes")
    federation = LocalFederation(root)
    db = root / "ingress.db"
    try:
        gate = federation.start_node(
            "gate", ingress=True, provider_id="prov-gate",
            process=echo_engine_command(free_port(), [KEYED]),
            extra_args=["--ingress-db", str(db)], extra_env={"OTELA_ADMIN_TOKEN": ADMIN})
        plain = federation.start_node("plain", bootstrap=[gate], provider_id="prov-plain",
                                      process=echo_engine_command(free_port(), [KEYLESS]))
        for observer in (gate, plain):
            for target in (gate, plain):
                wait_for(lambda o=observer, t=target: o.states().get(t.session_id)
                         == "SERVING", CONVERGE_S, f"{observer.name} to see {target.name}")
        yield Fed(gate, plain, str(db))
    finally:
        federation.close()


def new_key(node: LocalNode, **spec: object) -> dict:
    created = httpx.post(f"{node.http_url}/v1/admin/keys", json={"owner": "shapes", **spec},
                         headers={"authorization": f"Bearer {ADMIN}"}, trust_env=False,
                         timeout=10)
    assert created.status_code == 200, created.text
    return created.json()


def openai_client(node: LocalNode, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{node.http_url}/v1", api_key=key, max_retries=0,
                         timeout=20, http_client=httpx.Client(trust_env=False))


def anthropic_client(node: LocalNode, key: str, header: str) -> anthropic.Anthropic:
    """The official client sending ``key`` as its ``api_key`` (this version sends that as
    ``Authorization: Bearer``) or as ``x-api-key``, as Anthropic's API documents it."""
    if header == "x-api-key":
        return anthropic.Anthropic(base_url=node.http_url, api_key=None, max_retries=0,
                                   timeout=20, default_headers={"x-api-key": key})
    return anthropic.Anthropic(base_url=node.http_url, api_key=key, max_retries=0, timeout=20)


def usage_rows(db: str, key_id: str) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT route, stream, prompt_tokens, completion_tokens, status, "
                            "node_session FROM usage WHERE key_id = ? ORDER BY finished_at",
                            (key_id,)).fetchall()


def every_shape(node: LocalNode, model: str, key: str) -> list[tuple[str, int, int, int]]:
    """One request of each shape with the official clients, checking each answer; what
    each client was told: (route, streamed, input tokens, output tokens)."""
    seen = []
    api = openai_client(node, key)

    answer = api.responses.create(model=model, instructions="be brief",
                                  input="hello big world")
    assert answer.output_text == "echo: hello big world" and answer.status == "completed"
    assert answer.usage is not None and answer.usage.input_tokens == 5
    seen.append(("/v1/responses", 0, answer.usage.input_tokens, answer.usage.output_tokens))

    events = list(api.responses.create(model=model, stream=True, max_output_tokens=3, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "one two three four"}]}]))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == "echo: one two" and events[-1].type == "response.incomplete"
    usage = events[-1].response.usage
    assert usage is not None and usage.output_tokens == 3
    seen.append(("/v1/responses", 1, usage.input_tokens, usage.output_tokens))

    with api.responses.stream(model=model, input="streamed helper") as stream:
        final = stream.get_final_response()
    assert final.output_text == "echo: streamed helper" and final.usage is not None
    seen.append(("/v1/responses", 1, final.usage.input_tokens, final.usage.output_tokens))

    vectors = api.embeddings.create(model=model, input=["big world", "hello", "big world"])
    assert [len(d.embedding) for d in vectors.data] == [64, 64, 64]  # base64, decoded
    assert vectors.data[0].embedding == vectors.data[2].embedding != vectors.data[1].embedding
    floats = api.embeddings.create(model=model, input="hello", encoding_format="float")
    assert floats.data[0].embedding == pytest.approx(vectors.data[1].embedding, abs=1e-6)
    for reply in (vectors, floats):
        seen.append(("/v1/embeddings", 0, reply.usage.prompt_tokens, 0))

    for header in ("authorization", "x-api-key"):
        claude = anthropic_client(node, key, header)
        message = claude.messages.create(model=model, max_tokens=50, system="be brief",
                                         messages=[{"role": "user", "content": "hi there"}])
        assert message.content[0].type == "text"
        assert message.content[0].text == "echo: hi there"
        assert message.stop_reason == "end_turn"
        seen.append(("/v1/messages", 0, message.usage.input_tokens,
                     message.usage.output_tokens))
        with claude.messages.stream(model=model, max_tokens=2, messages=[
                {"role": "user", "content": [{"type": "text", "text": "a b c"}]}]) as stream:
            text = "".join(stream.text_stream)
            streamed = stream.get_final_message()
        assert text == "echo: a" and streamed.stop_reason == "max_tokens"
        seen.append(("/v1/messages", 1, streamed.usage.input_tokens,
                     streamed.usage.output_tokens))
    counted = claude.messages.count_tokens(model=model, messages=[
        {"role": "user", "content": "four words right here"}])
    assert counted.input_tokens == 4
    seen.append(("/v1/messages/count_tokens", 0, 0, 0))
    return seen


@pytest.mark.parametrize("path", ["keyed-one-hop", "keyed-two-hops"])
def test_every_shape_keyed_each_request_counted_with_the_tokens_its_client_was_told(fed, path):
    node, model, server = fed.path(path)
    key = new_key(node)
    seen = every_shape(node, model, key["key"])
    wait_for(lambda: len(usage_rows(fed.db, key["id"])) == len(seen), 5,
             f"{len(seen)} usage rows")
    rows = usage_rows(fed.db, key["id"])
    assert {row[4] for row in rows} == {200}
    assert {row[5] for row in rows} == {server.session_id}  # one hop or two, as meant
    # count_tokens generates nothing and reports no usage: a row with no tokens
    assert [row[:4] for row in rows] == seen
    # the key's tokens (budgets) are what the rows say
    shown = httpx.get(f"{node.http_url}/v1/admin/keys/{key['id']}", trust_env=False,
                      headers={"authorization": f"Bearer {ADMIN}"}, timeout=10).json()
    assert shown["used_tokens"] == sum(row[2] + row[3] for row in rows) > 0


@pytest.mark.parametrize("path", ["keyless-one-hop", "keyless-two-hops"])
def test_every_shape_keyless(fed, path):
    node, model, server = fed.path(path)
    every_shape(node, model, "any-key-is-ignored-here")
    answer = httpx.post(f"{node.http_url}/v1/messages", trust_env=False, timeout=10, json={
        "model": model, "max_tokens": 3, "messages": [{"role": "user", "content": "x"}]})
    assert answer.headers["x-otela-session-id"] == server.session_id


def test_a_key_in_x_api_key_is_refused_like_a_bearer_one(fed):
    node = fed.gate
    for client in (anthropic_client(node, "otela-wrong", "x-api-key"),
                   anthropic_client(node, "otela-wrong", "authorization")):
        with pytest.raises(anthropic.AuthenticationError):
            client.messages.create(model=KEYED, max_tokens=5,
                                   messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.AuthenticationError):
        openai_client(node, "otela-wrong").responses.create(model=KEYED, input="x")
    revoked = new_key(node)
    assert httpx.post(f"{node.http_url}/v1/admin/keys/{revoked['id']}/revoke",
                      headers={"authorization": f"Bearer {ADMIN}"}, trust_env=False,
                      timeout=10).status_code == 200
    with pytest.raises(anthropic.AuthenticationError):
        anthropic_client(node, revoked["key"], "x-api-key").messages.create(
            model=KEYED, max_tokens=5, messages=[{"role": "user", "content": "x"}])


def _headers_only(node: LocalNode, path: str, headers: dict[str, str], length: int
                  ) -> tuple[bytes, float]:
    """A POST's headers announcing ``length`` body bytes, and no body: the answer, and how
    long it took (a refusal must come without waiting for the body)."""
    host, port = node.http_url.removeprefix("http://").split(":")
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    head = (f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{extra}"
            f"content-length: {length}\r\n\r\n").encode()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        started = time.monotonic()
        sock.sendall(head)
        answer = b""
        while chunk := sock.recv(65536):  # the server closes after refusing
            answer += chunk
        return answer, time.monotonic() - started


def test_an_x_api_key_is_checked_before_the_body_is_read(fed):
    node = fed.gate
    for headers in ({"x-api-key": "otela-wrong", "anthropic-version": "2023-06-01"},
                    {"x-api-key": ""}, {}):
        answer, took = _headers_only(node, "/v1/messages", headers, 30 * 1024 * 1024)
        assert answer.startswith(b"HTTP/1.1 401 ") and b"invalid_api_key" in answer, answer
        assert b"connection: close" in answer and took < 5
    key = new_key(node, rpm=6)  # holds 10 s of it: one request
    ok = anthropic_client(node, key["key"], "x-api-key").messages.create(
        model=KEYED, max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert ok.content
    answer, _ = _headers_only(node, "/v1/responses", {"x-api-key": key["key"]}, 1024 * 1024)
    assert answer.startswith(b"HTTP/1.1 429 ") and b"retry-after: " in answer.lower()


def test_budgets_and_token_rates_count_every_shape(fed):
    """The tokens of a Responses stream (read from its last event) and of a Messages answer
    are charged to the key: its budget and its tokens per minute refuse what follows."""
    node = fed.gate
    budget = new_key(node, budget_tokens=12)
    api = openai_client(node, budget["key"])
    for _ in api.responses.create(model=KEYED, input="one two three four five", stream=True):
        pass  # 5 in, 6 out: 11 of 12
    claude = anthropic_client(node, budget["key"], "x-api-key")
    claude.messages.create(model=KEYED, max_tokens=1, messages=[
        {"role": "user", "content": "x"}])  # 1 in, 1 out: 13
    with pytest.raises(anthropic.PermissionDeniedError) as refused:
        claude.messages.create(model=KEYED, max_tokens=1,
                               messages=[{"role": "user", "content": "x"}])
    assert refused.value.body["error"]["code"] == "budget_exceeded"
    with pytest.raises(openai.PermissionDeniedError):
        api.embeddings.create(model=KEYED, input="x")

    rate = new_key(node, tpm=60)  # its bucket holds 10 s of it: 10 tokens
    claude = anthropic_client(node, rate["key"], "authorization")
    with claude.messages.stream(model=KEYED, max_tokens=100, messages=[
            {"role": "user", "content": " ".join(["word"] * 20)}]) as stream:
        stream.until_done()  # 20 in, 21 out: the bucket is far below zero
    with pytest.raises(anthropic.RateLimitError) as limited:
        claude.messages.create(model=KEYED, max_tokens=1,
                               messages=[{"role": "user", "content": "x"}])
    assert limited.value.body["error"]["code"] == "token_rate_limit_exceeded"
    assert int(limited.value.response.headers["retry-after"]) >= 1

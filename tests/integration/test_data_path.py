"""The request path between real processes: bytes pass through unchanged both ways, every
OpenAI route reaches the engine, metrics count what happened, slow clients do not hurt
others. Two paths: one hop (the serving node answers directly) and the federation's two
(ingress -> serving node's engine hop -> engine). The engine is ``raw_engine.py``, which
answers with exact bytes."""

from __future__ import annotations

import json
import shlex
import socket
import sys
import time
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from otela.testing.localfed import LocalFederation, LocalNode, free_port, wait_for

from .helpers import wait_state
from .raw_engine import NAMED_CUT, SSE, SSE_CUT_AFTER, SSE_PARTS, big_body

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, LocalNode]]:
    federation = LocalFederation(tmp_path_factory.mktemp("datapath"))
    try:
        ingress = federation.start_node("ingress", ingress=True)
        engine = shlex.join([sys.executable, "-m", "tests.integration.raw_engine",
                             "--port", str(free_port())])
        server = federation.start_node("server", bootstrap=[ingress], process=engine)
        wait_state(ingress, server, "SERVING")
        yield {"two-hop": ingress, "one-hop": server}
    finally:
        federation.close()


PATHS = ["one-hop", "two-hop"]


def post(node: LocalNode, path: str, body: bytes, **headers: str) -> httpx.Response:
    return httpx.post(f"{node.http_url}{path}", content=body, timeout=30, trust_env=False,
                      headers={"content-type": "application/json", **headers})


@pytest.mark.parametrize("via", PATHS)
def test_request_bodies_reach_the_engine_as_the_bytes_sent(fed, via):
    body = ('{ "model":"raw" ,"case":"echo",\n  "messages": [{"role":"user","content":'
            '"caf\\u00e9 \u65e5\u672c"}], "z": 1.50, "a": [ ] }').encode()
    response = post(fed[via], "/v1/chat/completions", body, **{
        "x-request-id": "trace-me-1", "authorization": "Bearer sk-1", "x-api-key": "sk-2",
        "anthropic-version": "2023-06-01"})
    assert response.status_code == 200
    assert response.content == body
    assert response.headers["x-seen-request-id"] == "trace-me-1"  # the engine logs it
    assert response.headers["x-otela-request-id"] == "trace-me-1"
    # credentials stay behind, in either header; so does Anthropic's version (no engine
    # reads it: otela/dataplane/headers.py)
    assert response.headers["x-seen-authorization"] == "-"
    assert response.headers["x-seen-api-key"] == "-"
    assert response.headers["x-seen-anthropic"] == "-"


@pytest.mark.parametrize("via", PATHS)
def test_a_stream_arrives_byte_for_byte_comments_usage_and_done_included(fed, via):
    body = json.dumps({"model": "raw", "case": "sse", "stream": True}).encode()
    with httpx.stream("POST", f"{fed[via].http_url}/v1/chat/completions", content=body,
                      timeout=30, trust_env=False) as response:
        assert response.headers["content-type"] == "text/event-stream"
        received = b"".join(response.iter_raw())
    assert received == SSE


@pytest.mark.parametrize("case", ["sse-cut", "sse-cut-mid"])
@pytest.mark.parametrize("via", PATHS)
def test_a_stream_the_engine_breaks_off_ends_with_an_error_event(fed, via, case):
    body = json.dumps({"model": "raw", "case": case, "stream": True}).encode()
    with httpx.stream("POST", f"{fed[via].http_url}/v1/chat/completions", content=body,
                      timeout=30, trust_env=False) as response:
        assert response.status_code == 200
        received = b"".join(response.iter_raw())  # ends properly: no protocol error
    sent = b"".join(SSE_PARTS[:SSE_CUT_AFTER])
    assert received.startswith(sent)
    # Whole events only: half an event the engine left behind is never relayed.
    events = [e for e in received[len(sent):].split(b"\n\n") if e.strip()]
    assert len(events) == 1 and events[0].startswith(b"data: "), received
    error = json.loads(events[0][len(b"data: "):])["error"]
    assert error["code"] == "upstream_failed" and error["type"] == "upstream_error"
    assert "broke off" in error["message"]
    assert b"[DONE]" not in received  # never a complete-looking stream

    # The official client raises at once instead of reading a stream that just stopped.
    client = openai.OpenAI(base_url=f"{fed[via].http_url}/v1", api_key="-", max_retries=0)
    with pytest.raises(openai.APIError, match="broke off"):
        for _ in client.chat.completions.create(
                model="raw", messages=[{"role": "user", "content": "x"}], stream=True,
                extra_body={"case": case}):
            pass


@pytest.mark.parametrize("via", PATHS)
def test_a_broken_named_stream_ends_with_a_named_error_event_both_clients_raise_on(fed, via):
    """The Responses and Messages APIs name their events, and Anthropic's client skips
    unnamed ones: a broken stream of theirs ends with ``event: error``."""
    for path, case in (("/v1/messages", "messages-cut"), ("/v1/responses", "responses-cut")):
        body = json.dumps({"model": "raw", "case": case, "stream": True}).encode()
        with httpx.stream("POST", f"{fed[via].http_url}{path}", content=body, timeout=30,
                          trust_env=False) as response:
            assert response.status_code == 200
            received = b"".join(response.iter_raw())
        sent = b"".join(NAMED_CUT[case])
        assert received.startswith(sent)
        name, _, data = received[len(sent):].strip().partition(b"\n")
        assert name == b"event: error", received
        error = json.loads(data.removeprefix(b"data: "))
        assert error["type"] == "error" and error["error"]["code"] == "upstream_failed"

    url = fed[via].http_url
    client = anthropic.Anthropic(base_url=url, api_key="-", max_retries=0)
    with pytest.raises(anthropic.APIStatusError, match="broke off"), client.messages.stream(
            model="raw", max_tokens=5, extra_body={"case": "messages-cut"},
            messages=[{"role": "user", "content": "x"}]) as stream:
        for _ in stream:
            pass
    responses = openai.OpenAI(base_url=f"{url}/v1", api_key="-", max_retries=0)
    with pytest.raises(openai.APIError, match="broke off"):
        for _ in responses.responses.create(model="raw", input="x", stream=True,
                                            extra_body={"case": "responses-cut"}):
            pass


@pytest.mark.parametrize("via", PATHS)
def test_large_bodies_both_ways(fed, via):
    big = big_body()
    response = post(fed[via], "/v1/chat/completions",
                    json.dumps({"model": "raw", "case": "big"}).encode())
    assert response.status_code == 200 and response.content == big
    upload = json.dumps({"model": "raw", "case": "echo", "pad": "y" * 8_000_000}).encode()
    response = post(fed[via], "/v1/completions", upload)
    assert response.status_code == 200 and response.content == upload


@pytest.mark.parametrize("route", ["/v1/embeddings", "/v1/responses", "/v1/rerank",
                                   "/v1/score", "/v1/tokenize", "/v1/messages"])
def test_every_inference_route_goes_to_a_node_serving_its_model(fed, route):
    body = json.dumps({"model": "raw", "case": "echo", "input": "x"}).encode()
    response = post(fed["two-hop"], route, body)
    assert response.status_code == 200
    assert response.headers["x-seen-path"] == route
    assert response.content == body


def test_engine_administration_is_not_a_route(fed):
    body = json.dumps({"model": "raw", "lora_name": "x", "lora_path": "/x"}).encode()
    for path in ("/v1/load_lora_adapter", "/v1/audio/anything", "/v1/load_lora_adapter/"):
        response = post(fed["two-hop"], path, body)
        assert response.status_code == 404  # not a route: never sent anywhere
        assert "x-seen-path" not in response.headers


def test_the_canonical_path_is_what_is_checked_and_what_the_engine_gets(fed):
    body = json.dumps({"model": "raw", "case": "echo"}).encode()
    response = post(fed["two-hop"], "/v1//chat/%63ompletions/", body)
    assert response.status_code == 200 and response.headers["x-seen-path"] == \
        "/v1/chat/completions"
    for path, status in (("/v1/load%5Flora%5Fadapter", 404), ("/v1/%6Coad_lora_adapter", 404),
                         ("/v1/chat/%2e%2e/load_lora_adapter", 400), ("/v1/x%255F", 400)):
        response = post(fed["two-hop"], path, body)
        assert response.status_code == status, path
        assert "x-seen-path" not in response.headers


def test_models_are_listed_and_looked_up(fed):
    ingress = fed["two-hop"]
    listed = httpx.get(f"{ingress.http_url}/v1/models", trust_env=False).json()
    assert [m["id"] for m in listed["data"]] == ["raw"]
    one = httpx.get(f"{ingress.http_url}/v1/models/raw", trust_env=False)
    assert one.status_code == 200 and one.json()["id"] == "raw"
    missing = httpx.get(f"{ingress.http_url}/v1/models/nope", trust_env=False)
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"


def scrape(node: LocalNode) -> dict[tuple[str, tuple], float]:
    text = httpx.get(f"{node.http_url}/metrics", trust_env=False).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_parse_and_move_as_requests_are_made(fed):
    ingress, server = fed["two-hop"], fed["one-hop"]
    route = (("model", "raw"), ("node", server.status["peer_id"]),
             ("route", "/v1/chat/completions"), ("status", "200"))
    before = scrape(ingress)
    for _ in range(3):
        post(ingress, "/v1/chat/completions", json.dumps({"model": "raw", "case": "sse",
                                                          "stream": True}).encode())
    assert post(ingress, "/v1/chat/completions", b'{"model": "nope"}').status_code == 404
    after = scrape(ingress)
    assert after[("otela_requests_total", route)] - before.get(
        ("otela_requests_total", route), 0) == 3
    not_found = (("model", "nope"), ("node", ""), ("route", "/v1/chat/completions"),
                 ("status", "404"))
    assert after[("otela_requests_total", not_found)] >= 1
    duration = ("otela_request_duration_seconds_count", (("route", "/v1/chat/completions"),))
    assert after[duration] - before.get(duration, 0) == 4
    assert after[("otela_output_tokens_total", (("model", "raw"),))] >= 6  # engine's usage
    assert after[("otela_requests_in_flight", ())] == 0
    assert after[("otela_registry_sessions", (("state", "SERVING"),))] == 1
    assert ("otela_event_loop_lag_seconds_count", (("process", "node"),)) in after
    server_side = scrape(server)
    assert server_side[("otela_upstream_connections_opened_total", ())] >= 1


def test_a_client_that_does_not_read_holds_only_its_own_request(fed):
    ingress = fed["two-hop"]
    host, port = ingress.http_url.removeprefix("http://").rsplit(":", 1)
    rss = _rss(ingress)
    body = json.dumps({"model": "raw", "case": "big"}).encode()
    stalled = []
    for _ in range(4):  # four clients ask for 5 MB each and never read it
        sock = socket.create_connection((host, int(port)))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
                     b"application/json\r\ncontent-length: %d\r\n\r\n%b" % (len(body), body))
        stalled.append(sock)
    time.sleep(1.0)
    for _ in range(5):  # everyone else is served meanwhile
        response = post(ingress, "/v1/chat/completions",
                        json.dumps({"model": "raw", "case": "echo"}).encode())
        assert response.status_code == 200
    assert _rss(ingress) - rss < 100 * 1024 * 1024
    for sock in stalled:
        sock.close()
    wait_for(lambda: ingress.get("/v1/health")["in_flight"] == 0, 15,
             "the stalled requests to be released")


def _rss(node: LocalNode) -> int:
    with open(f"/proc/{node.process.pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def test_the_openai_client_works_through_both_paths(fed):
    from openai import OpenAI

    for via in PATHS:
        client = OpenAI(base_url=f"{fed[via].http_url}/v1", api_key="unused")
        models = client.models.list()
        assert [m.id for m in models.data] == ["raw"]
        stream = client.chat.completions.create(
            model="raw", messages=[{"role": "user", "content": "hi"}], stream=True,
            extra_body={"case": "sse"})
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text == "café 日本"


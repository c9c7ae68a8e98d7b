"""A serving node killed mid-stream: the client's chat or completions stream goes on from
another node, as one uninterrupted stream (request migration, issue 36). Real processes:
an ingress, echo engines behind their nodes, SIGKILL to the node and engine serving the
stream."""

from __future__ import annotations

import signal

import httpx
import orjson
import pytest

from otela.engine.demo.echo import _answer
from otela.testing.steady_load import is_stopped, machine_pids, signal_machine

from .helpers import serving_node, wait_state

pytestmark = pytest.mark.slow

MODEL = "migrating-model"
PROMPT = " ".join(f"word{i}" for i in range(40))  # a 41-token answer, 50 ms a token


def events_of(lines: list[str]) -> list[dict]:
    return [orjson.loads(line[6:]) for line in lines
            if line.startswith("data: {")]


def ingress_and_nodes(federation, names=("a", "b")):
    """An ingress and echo nodes serving MODEL at 50 ms a token, by peer id."""
    ingress = federation.start_node("ingress", ingress=True)
    nodes = {}
    for name in names:
        node = serving_node(federation, name, ingress, MODEL, "--token-delay", "0.05")
        nodes[node.status["peer_id"]] = node
    for node in nodes.values():
        wait_state(ingress, node, "SERVING")
    return ingress, nodes


def stream_killed_mid_answer(ingress, nodes, route: str, body: dict) -> list[str]:
    """Stream ``body`` to ``route``; SIGKILL the serving node (and its engine) after six
    content chunks; the lines the client read."""
    lines: list[str] = []
    with httpx.Client(timeout=60, trust_env=False) as client, client.stream(
            "POST", f"{ingress.http_url}{route}", json=body) as answer:
        assert answer.status_code == 200
        first = nodes.pop(answer.headers["x-otela-peer-id"])
        killed = False
        for line in answer.iter_lines():
            lines.append(line)
            if not killed and sum(_has_content(seen) for seen in lines) >= 6:
                signal_machine(machine_pids(first), signal.SIGKILL)  # mid-answer
                killed = True
    assert killed
    return lines


def _has_content(line: str) -> bool:
    if not line.startswith("data: {"):
        return False
    choices = orjson.loads(line[6:]).get("choices") or [{}]
    return bool(choices[0].get("text") or (choices[0].get("delta") or {}).get("content"))


def test_a_stream_whose_node_is_killed_goes_on_from_another_node(federation):
    """A chat stream, then a completions stream: each node killed mid-answer, each stream
    whole, as if uninterrupted."""
    ingress, nodes = ingress_and_nodes(federation, ("a", "b", "c"))
    answer = _answer(PROMPT, None)[0]
    expected = "".join(answer)
    body = {"model": MODEL, "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": PROMPT}]}
    lines = stream_killed_mid_answer(ingress, nodes, "/v1/chat/completions", body)
    chunks = events_of(lines)
    assert not [c for c in chunks if "error" in c], lines  # no error event
    assert lines[-1] == "data: [DONE]" or lines[-2:] == ["data: [DONE]", ""]
    content = "".join((c["choices"][0]["delta"].get("content") or "")
                      for c in chunks if c.get("choices"))
    assert content == expected  # the same text, nothing duplicated or missing
    assert len({c["id"] for c in chunks}) == 1  # one stream, one id
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")]
    assert finishes[-1] == "stop" and finishes.count("stop") == 1
    roles = [c for c in chunks if c.get("choices") and "role" in c["choices"][0]["delta"]]
    assert len(roles) == 1  # the second node's opening chunk was dropped
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] == len(answer)

    # completions: the continuation is the prompt followed by the partial text
    body = {"model": MODEL, "stream": True, "prompt": PROMPT, "max_tokens": len(answer) + 5,
            "stream_options": {"include_usage": True}}
    lines = stream_killed_mid_answer(ingress, nodes, "/v1/completions", body)
    chunks = events_of(lines)
    assert not [c for c in chunks if "error" in c], lines
    assert "data: [DONE]" in lines
    assert "".join(c["choices"][0]["text"] for c in chunks if c.get("choices")) == expected
    assert len({c["id"] for c in chunks}) == 1
    assert {c["object"] for c in chunks} == {"text_completion"}
    assert chunks[-1]["usage"]["completion_tokens"] == len(answer)
    # the original prompt's, but for its last word and the partial text's first, which
    # run together in the continuation's prompt ("word39echo:") and count as one token
    assert chunks[-1]["usage"]["prompt_tokens"] == len(PROMPT.split()) - 1
    metrics = httpx.get(f"{ingress.http_url}/metrics", trust_env=False).text
    assert "otela_stream_migrations_total 2" in metrics


def test_with_migrations_off_a_broken_stream_still_ends_with_an_error_event(federation):
    ingress, nodes = ingress_and_nodes(federation)
    body = {"model": MODEL, "stream": True,
            "messages": [{"role": "user", "content": PROMPT}]}
    lines: list[str] = []
    with httpx.Client(timeout=60, trust_env=False) as client, client.stream(
            "POST", f"{ingress.http_url}/v1/chat/completions", json=body,
            headers={"x-otela-migrations": "0"}) as answer:
        first = nodes[answer.headers["x-otela-peer-id"]]
        for line in answer.iter_lines():
            lines.append(line)
            if len(lines) == 8:
                signal_machine(machine_pids(first), signal.SIGKILL)
    errors = [c for c in events_of(lines) if "error" in c]
    assert errors and errors[0]["error"]["code"] == "upstream_failed", lines


def test_a_stream_whose_node_freezes_goes_on_once_the_node_is_suspected(federation):
    ingress, nodes = ingress_and_nodes(federation)
    expected = "".join(_answer(PROMPT, None)[0])
    body = {"model": MODEL, "stream": True,
            "messages": [{"role": "user", "content": PROMPT}]}
    lines: list[str] = []
    frozen: list[int] = []
    try:
        with httpx.Client(timeout=90, trust_env=False) as client, client.stream(
                "POST", f"{ingress.http_url}/v1/chat/completions", json=body) as answer:
            first = nodes[answer.headers["x-otela-peer-id"]]
            for line in answer.iter_lines():
                lines.append(line)
                if not frozen and len(lines) >= 12:
                    frozen = machine_pids(first)
                    signal_machine(frozen, signal.SIGSTOP)  # mid-answer: silent, not gone
        # the stream ended while the node was still frozen: it was not waited for
        assert all(is_stopped(pid) for pid in frozen)
    finally:
        signal_machine(frozen, signal.SIGCONT)
    chunks = events_of(lines)
    assert not [c for c in chunks if "error" in c], lines
    content = "".join((c["choices"][0]["delta"].get("content") or "")
                      for c in chunks if c.get("choices"))
    assert content == expected
    assert len({c["id"] for c in chunks}) == 1

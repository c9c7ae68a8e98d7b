"""Cache-aware routing over two real vLLM CPU engines with prefix caching and KV events.

Engine A runs under ``otela start --process`` (its events' endpoint read from the command's
``--kv-events-config``); engine B runs on its own and its node attaches to it
(``--engine-url``, ``--kv-events``), so that node can be restarted while the engine keeps
its cache. Both engines have a small cache (24 blocks of 32 tokens) so that it can be
filled. The ingress routes with ``cache_aware`` and the tiny model's tokenizer.

What is checked, in order: the ingress's token ids are the engine's own; a prefix that an
engine cached (sent to it directly, so only its KV events can tell) draws every request
that shares it, whoever sends it; once the engine evicts it, it no longer does; a node
restart leaves the new session with an empty summary, and the stopped session is never
routed to again although its summary said it held the prefix.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from typing import Any

import httpx
import pytest

from otela.kvcache.tokenize import ModelTokenizer
from otela.testing.localfed import (
    VLLM_ENV,
    LocalNode,
    free_port,
    http_client,
    vllm_engine_command,
    wait_for,
)

from .helpers import wait_state

# The suite's 300 s timeout is shorter than an engine's own readiness deadline
# (VLLM_READY_S, 400 s): a first vLLM start on a cold machine (its compile caches empty)
# was killed before the test's wait could say which engine was not ready. The waits bound
# the test instead.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("engines-and-slurm"),
              pytest.mark.timeout(700)]

MODEL = "tiny-llama"
VLLM_READY_S = 400.0
SUMMARY_S = 30.0  # a report interval is 1.5 s here; anything slower is a bug


def engine_args(events_port: int) -> list[str]:
    config = {"enable_kv_cache_events": True, "publisher": "zmq",
              "endpoint": f"tcp://*:{events_port}", "topic": "kv"}
    return ["--block-size", "32", "--num-gpu-blocks-override", "24",
            "--kv-events-config", json.dumps(config)]


def system_prompt(topic: str) -> str:
    """~240 tokens (7 full blocks) of a system prompt about ``topic``."""
    return f"You are an expert on {topic}. Answer briefly. " * 9


def chat_body(system: str, question: str, user: str) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 3, "user": user,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": question}]}


def cache_view(ingress: LocalNode) -> dict[str, Any]:
    return ingress.get("/v1/network", timeout=10)["routing"]["cache"]  # type: ignore[no-any-return]


def anchors_at(ingress: LocalNode, node: LocalNode) -> int:
    return int(cache_view(ingress)["nodes"].get(node.session_id, {}).get("anchors", 0))


def own_cache(node: LocalNode) -> dict[str, Any]:
    return node.get("/v1/network", timeout=10)["routing"]["cache"]["own"]  # type: ignore[no-any-return]


def caught_up(ingress: LocalNode, node: LocalNode) -> bool:
    """The ingress holds the node's latest summary (epoch and seq)."""
    own = own_cache(node)
    held = cache_view(ingress)["nodes"].get(node.session_id)
    return own is not None and held is not None and \
        (held["epoch"], held["seq"]) == (own["epoch"], own["seq"])


def wait_heard(ingress: LocalNode, node: LocalNode, stored_before: int, what: str) -> None:
    """Until the node's index took the engine's events for a request just answered (its
    blocks stored) and the ingress holds the summary that includes them."""
    wait_for(lambda: own_cache(node)["stored"] > stored_before and caught_up(ingress, node),
             SUMMARY_S, f"the ingress to hear {what}")


def decisions(ingress: LocalNode) -> dict[str, int]:
    return dict(cache_view(ingress)["decisions"])


def via_ingress(ingress: LocalNode, body: dict[str, Any]) -> str:
    """The session that answered ``body`` sent through the ingress."""
    answer = http_client().post(f"{ingress.http_url}/v1/chat/completions", json=body,
                                timeout=120)
    assert answer.status_code == 200, answer.text
    return answer.headers["x-otela-session-id"]


def straight_to(engine_url: str, body: dict[str, Any], route: str = "/v1/chat/completions"
                ) -> None:
    answer = http_client().post(f"{engine_url}{route}", json=body, timeout=120)
    assert answer.status_code == 200, answer.text


def test_requests_follow_what_the_engines_report_cached(federation, vllm_python,
                                                       tiny_model) -> None:
    port_a, port_b, events_a, events_b = (free_port() for _ in range(4))
    url_a, url_b = f"http://127.0.0.1:{port_a}", f"http://127.0.0.1:{port_b}"
    command_b = vllm_engine_command(vllm_python, tiny_model, MODEL, port_b,
                                    *engine_args(events_b))
    engine_b = subprocess.Popen(shlex.split(command_b), env={**os.environ, **VLLM_ENV},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        fast = ["--load-interval", "1s"]
        ingress = federation.start_node("ingress", ingress=True, extra_args=[
            *fast, "--routing-policy", "cache_aware", "--tokenizer", f"{MODEL}={tiny_model}"])
        node_a = federation.start_node(
            "a", bootstrap=[ingress], extra_env=VLLM_ENV, extra_args=fast,
            process=vllm_engine_command(vllm_python, tiny_model, MODEL, port_a,
                                        *engine_args(events_a)))
        wait_for(lambda: httpx.get(f"{url_b}/health", timeout=5).status_code == 200,
                 VLLM_READY_S, "engine B to be ready", interval=1.0)
        attach_b = [*fast, "--engine-url", url_b, "--kv-events", f"tcp://127.0.0.1:{events_b}"]
        node_b = federation.start_node("b", bootstrap=[ingress], extra_args=attach_b)
        wait_for(lambda: ingress.states().get(node_a.session_id) == "SERVING", VLLM_READY_S,
                 "engine A to be ready under otela", interval=1.0)
        wait_state(ingress, node_b, "SERVING")

        check_the_ingress_tokenizes_as_the_engine(tiny_model, url_a)
        check_cached_prefixes_draw_their_requests(ingress, [(node_a, url_a), (node_b, url_b)])
        check_an_evicted_prefix_no_longer_does(ingress, node_b, url_b)
        check_a_restarted_node_starts_empty(federation, ingress, node_a, node_b, url_b,
                                            attach_b)
    finally:
        engine_b.terminate()
        try:
            engine_b.wait(30)
        except subprocess.TimeoutExpired:
            engine_b.kill()


def check_the_ingress_tokenizes_as_the_engine(tiny_model, engine_url: str) -> None:
    """The ids the ingress hashes are the ones vLLM computes (its /tokenize), for a chat
    (rendered with the model's chat template) and a plain prompt."""
    tokenizer = ModelTokenizer(tiny_model)
    body = chat_body(system_prompt("tea"), "Which tea is best?", "u")
    for asked in ({"messages": body["messages"]}, {"prompt": system_prompt("rivers")}):
        theirs = httpx.post(f"{engine_url}/tokenize", json={"model": MODEL, **asked},
                            timeout=30).json()["tokens"]
        assert tokenizer.prompt_ids(asked) == theirs, asked


def check_cached_prefixes_draw_their_requests(ingress: LocalNode,
                                              engines: list[tuple[LocalNode, str]]) -> None:
    """A prefix sent straight to one engine (the ingress saw nothing of it: only that
    engine's KV events can tell) draws every request that shares it, from six users whom
    prefix affinity alone would spread over both nodes."""
    for node, url in engines:
        system = system_prompt(f"the node called {node.name}")
        stored = own_cache(node)["stored"]
        straight_to(url, chat_body(system, "Warm up.", "warm"))
        wait_heard(ingress, node, stored, f"{node.name}'s engine cached the prefix")
        routed_before = decisions(ingress).get("cache_hit_routed", 0)
        served = {via_ingress(ingress, chat_body(system, f"Question {i}?", f"user-{i}"))
                  for i in range(6)}
        assert served == {node.session_id}, (node.name, served)
        assert decisions(ingress).get("cache_hit_routed", 0) - routed_before == 6


def check_an_evicted_prefix_no_longer_does(ingress: LocalNode, node: LocalNode,
                                           engine_url: str) -> None:
    """Fill the engine's cache with other prompts: once its summary says so, requests with
    the prefix are placed without it (prefix affinity), and the next one follows the
    first to wherever it went."""
    system = system_prompt(f"the node called {node.name}")
    for i in range(4):  # 4 x 14 blocks through a cache of 24
        straight_to(engine_url, {"model": MODEL, "max_tokens": 1,
                                 "prompt": f"Filler number {i} about other things. " * 20},
                    "/v1/completions")
    wait_for(lambda: caught_up(ingress, node), SUMMARY_S,
             "the ingress to hold the summary after the eviction")
    assert own_cache(node)["removed"] > 0
    before = decisions(ingress)
    first = via_ingress(ingress, chat_body(system, "After the eviction?", "evicted-1"))
    after = decisions(ingress)
    assert after.get("fallback", 0) == before.get("fallback", 0) + 1, (before, after)
    assert after.get("cache_hit_routed", 0) == before.get("cache_hit_routed", 0)
    again = via_ingress(ingress, chat_body(system, "And again?", "evicted-2"))
    assert again == first
    assert decisions(ingress).get("cache_hit_routed", 0) == \
        after.get("cache_hit_routed", 0) + 1


def check_a_restarted_node_starts_empty(federation, ingress: LocalNode, node_a: LocalNode,
                                        node_b: LocalNode, url_b: str,
                                        attach_b: list[str]) -> None:
    """B's engine caches a new prefix and the ingress hears it; B's node restarts (its
    engine keeps running): the stopped session is never routed to, though its summary
    held the prefix, and the new one advertises nothing it has not seen itself."""
    system = system_prompt("restarts")
    stored = own_cache(node_b)["stored"]
    straight_to(url_b, chat_body(system, "Warm up.", "warm"))
    wait_heard(ingress, node_b, stored, "B's engine cached the restart prefix")
    federation.stop_node(node_b)
    restarted = federation.start_node("b-again", bootstrap=[ingress], extra_args=attach_b)
    wait_state(ingress, restarted, "SERVING")
    wait_for(lambda: ingress.states().get(node_b.session_id) in ("LEFT", None), SUMMARY_S,
             "the ingress to see B's old session leave")
    assert anchors_at(ingress, restarted) == 0
    before_decisions = decisions(ingress)
    served = via_ingress(ingress, chat_body(system, "Who answers?", "after-restart"))
    assert served in (node_a.session_id, restarted.session_id)
    after = decisions(ingress)
    assert after.get("fallback", 0) == before_decisions.get("fallback", 0) + 1

"""A real vLLM (CPU build) wrapped in ``otela start --process``, reached through an ingress.

One vLLM start (~50-60 s, ~3 GB) serves every assertion: registry on every node, chat and
text completions (plain and streaming) relayed from vLLM, then a SIGTERM drain.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from otela.localfed import VLLM_ENV, free_port, vllm_engine_command, wait_for

from .helpers import CONVERGE_S, wait_state

# The Slurm tests' worker also runs this one, so two real vLLM starts (~3 GB, both cores
# for ~45 s) never overlap when the suite runs on several workers (scripts/test).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("engines-and-slurm")]

MODEL = "tiny-llama"
VLLM_READY_S = 400.0


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "State:\tZ" not in f.read()
    except FileNotFoundError:
        return False


def test_real_vllm_behind_otela(federation, vllm_python, tiny_model):
    ingress = federation.start_node("ingress", ingress=True)
    other = federation.start_node("other", bootstrap=[ingress])
    command = vllm_engine_command(vllm_python, tiny_model, MODEL, free_port())
    started = time.monotonic()
    server = federation.start_node("vllm", bootstrap=[ingress], process=command,
                                   extra_env=VLLM_ENV,
                                   extra_args=["--model-meta", "family=llama"])
    wait_for(lambda: ingress.states().get(server.session_id) == "SERVING", VLLM_READY_S,
             "vLLM to become ready", interval=0.5)
    print(f"vLLM under otela SERVING after {time.monotonic() - started:.1f}s")
    engine_pids = server.engine_pids()
    assert engine_pids

    for observer in (ingress, other, server):
        wait_for(lambda o=observer: o.states().get(server.session_id) == "SERVING", CONVERGE_S,
                 f"{observer.name} to see vLLM serving")
        (entry,) = observer.get("/v1/registry/models")["models"]
        assert entry["id"] == MODEL
        (session,) = entry["sessions"]
        assert session["engine"] == "vllm"
        assert session["model"] == {"id": MODEL, "max_context": 512, "dtype": "bfloat16",
                                    "quantization": None, "tensor_parallel": None,
                                    "meta": {"family": "llama"}}
    listed = ingress.get("/v1/models")["data"]
    assert [(m["id"], m["max_model_len"]) for m in listed] == [(MODEL, 512)]

    url = ingress.http_url
    chat = httpx.post(f"{url}/v1/chat/completions", trust_env=False, timeout=60, json={
        "model": MODEL, "max_tokens": 12, "messages": [{"role": "user", "content": "hello"}]})
    assert chat.status_code == 200, chat.text
    body = chat.json()
    assert body["object"] == "chat.completion" and body["model"] == MODEL
    assert body["system_fingerprint"].startswith("vllm-")  # vLLM's own answer, relayed
    assert body["usage"]["completion_tokens"] == 12
    assert chat.headers["x-otela-session-id"] == server.session_id

    text = httpx.post(f"{url}/v1/completions", trust_env=False, timeout=60, json={
        "model": MODEL, "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0})
    assert text.status_code == 200, text.text
    assert text.json()["object"] == "text_completion"
    assert text.json()["usage"]["completion_tokens"] == 8

    events: list[str] = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", trust_env=False, timeout=60, json={
        "model": MODEL, "max_tokens": 10, "stream": True,
        "messages": [{"role": "user", "content": "stream"}]}) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        events = [line[6:] for line in stream.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")) >= 2

    assert federation.stop_node(server, timeout=60) == 0
    wait_state(ingress, server, "LEFT")
    wait_for(lambda: not any(_alive(p) for p in engine_pids), 30, "vLLM processes to exit")
    log = server.log_tail(40)
    assert log.index("announced DOWN") < log.index("announced LEFT")

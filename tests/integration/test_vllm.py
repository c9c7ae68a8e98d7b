"""A real vLLM (CPU build) wrapped in ``otela start --process``, reached through an ingress.

One vLLM start (~50-60 s, ~3 GB) serves every assertion: registry on every node, chat and
text completions (plain and streaming) relayed from vLLM, its LoRA administration out of
reach through the ingress and the engine hop however the path is written, then a SIGTERM
drain. vLLM runs with runtime LoRA updating on, so the administration is really there.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time

import httpx
import pytest

from otela.dataplane.hop_auth import HOP_HEADER, HopSigner
from otela.identity import load_or_create
from otela.testing.localfed import VLLM_ENV, LocalNode, free_port, vllm_engine_command, wait_for

from .helpers import CONVERGE_S, wait_state
from .stalling_relay import StallingRelay

# The Slurm tests' worker also runs this one, so two real vLLM starts (~3 GB, both cores
# for ~45 s) never overlap when the suite runs on several workers (scripts/test).
# The suite's 300 s timeout is shorter than an engine's own readiness deadline
# (VLLM_READY_S, 400 s): a first vLLM start on a cold machine (its compile caches empty)
# was killed before the test's wait could say which engine was not ready. The waits bound
# the test instead.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("engines-and-slurm"),
              pytest.mark.timeout(700)]

MODEL = "tiny-llama"
VLLM_READY_S = 400.0


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "State:\tZ" not in f.read()
    except FileNotFoundError:
        return False


# Every way of writing vLLM's adapter administration that vLLM itself decodes (checked at
# the end: straight to the engine, the encoded path loads an adapter).
ADMIN_PATHS = [
    "/v1/load_lora_adapter", "/v1/load%5Flora%5Fadapter", "/v1/%6Coad_lora_adapter",
    "/v1/%6coad%5flora%5fadapter", "/v1/load_lora_adapter/", "/v1//load_lora_adapter",
    "/v1/load_lora_adapter#frag", "/v1/chat/%2e%2e/load_lora_adapter",
    "/v1/load_lora_adapter?x=1", "/v1/unload_lora_adapter", "/v1/unload%5Flora%5Fadapter",
]


def raw_post(url: str, target: str, body: bytes, headers: dict[str, str] | None = None
             ) -> tuple[int, bytes]:
    """POST ``target`` exactly as written (HTTP clients normalise paths and drop
    fragments): the status and the body."""
    host, port = url.removeprefix("http://").split(":")
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    head = (f"POST {target} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"{extra}content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode()
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(head + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


def check_admin_is_out_of_reach(ingress: LocalNode, member: LocalNode, server: LocalNode,
                                engine_url: str, adapter: str) -> None:
    """Through the ingress, and through the serving node's engine hop with a member's valid
    token, no encoding of the administration reaches vLLM; straight to vLLM, it does."""
    signer = HopSigner(load_or_create(member.home).key_pair.private_key.to_bytes(),
                       member.status["peer_id"])
    body = json.dumps({"model": MODEL, "lora_name": "evil", "lora_path": adapter}).encode()
    # otela's refusals (vLLM's own errors are typed NotFoundError, BadRequestError...)
    ours = {"not_found_error", "invalid_request_error"}
    for path in ADMIN_PATHS:
        status, answer = raw_post(ingress.http_url, path, body)
        assert status in (400, 404) and json.loads(answer)["error"]["type"] in ours, \
            (path, status, answer)
        hop = "/v1/engine" + path
        token = signer.token(server.status["peer_id"], "POST", hop, body)
        status, answer = raw_post(server.http_url, hop, body, {HOP_HEADER: token})
        assert status in (400, 404) and json.loads(answer)["error"]["type"] in ours, \
            (path, status, answer)
    # The token works: the same member's chat request through the hop is answered by vLLM.
    chat = json.dumps({"model": MODEL, "max_tokens": 2,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    hop = "/v1/engine/v1/chat/completions"
    status, answer = raw_post(server.http_url, hop, chat,
                              {HOP_HEADER: signer.token(server.status["peer_id"], "POST",
                                                        hop, chat)})
    assert status == 200 and b"chat.completion" in answer, answer
    listed = httpx.get(f"{engine_url}/v1/models", trust_env=False, timeout=30).json()
    assert [m["id"] for m in listed["data"]] == [MODEL]  # nothing was loaded
    # Straight to the engine, the encoded path is vLLM's adapter loading: what otela keeps
    # out of reach is really there.
    status, answer = raw_post(engine_url, "/v1/load%5Flora%5Fadapter", body)
    assert status == 200 and b"added successfully" in answer, answer


def _piece(line: str) -> str:
    """The text an event line adds: a chat delta's content or a completion's text."""
    if not line.startswith("data: {"):
        return ""
    choice = (json.loads(line[6:])["choices"] or [{}])[0]
    return (choice.get("delta") or {}).get("content") or choice.get("text") or ""


def _content(lines: list[str]) -> str:
    return "".join(_piece(line) for line in lines)


def check_a_stream_continues_on_another_node(federation, ingress: LocalNode,
                                             port: int) -> None:
    """Request migration: a second node fronts the same vLLM (``--engine-url``); a stream
    that lands on it is cut by SIGKILLing that node, and the client's stream goes on from
    the first node's engine, as one stream. A chat stream (vLLM's continue_final_message),
    then a completions stream (the prompt followed by the partial text), each on a node of
    its own."""
    chat = {"messages": [{"role": "user", "content": "Tell me a story about a ship."}]}
    text = {"prompt": "Once upon a time, a ship"}
    for count, (route, body) in enumerate((("/v1/chat/completions", chat),
                                           ("/v1/completions", text)), start=1):
        with StallingRelay(port, hold_after=8) as relay:
            attached = federation.start_node(
                f"attached-{count}", bootstrap=[ingress],
                extra_args=["--engine-url", f"http://127.0.0.1:{relay.port}"])
            wait_state(ingress, attached, "SERVING")
            _cut_a_stream_on(ingress, attached, relay, route, body)
        metrics = httpx.get(f"{ingress.http_url}/metrics", trust_env=False).text
        counted = [ln for ln in metrics.splitlines()
                   if ln.startswith("otela_stream_migrations_total")]
        assert counted == [f"otela_stream_migrations_total {count}"], counted


def _cut_a_stream_on(ingress: LocalNode, attached: LocalNode, relay: StallingRelay,
                     route: str, asked: dict) -> None:
    """Stream until one lands on ``attached`` (its engine answers through ``relay``, which
    stalls the answer after a few chunks, so the cut is always mid-answer), kill the node
    there, and check the client's stream went on elsewhere as one stream."""
    body = {"model": MODEL, "max_tokens": 200, "ignore_eos": True, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}, **asked}
    for _ in range(20):  # until the routing policy picks the attached node
        lines: list[str] = []
        before: str | None = None
        with httpx.stream("POST", f"{ingress.http_url}{route}", json=body,
                          trust_env=False, timeout=120) as stream:
            assert stream.status_code == 200
            ours = stream.headers["x-otela-session-id"] == attached.session_id
            for line in stream.iter_lines():
                lines.append(line)
                if ours and before is None and sum(map(bool, map(_piece, lines))) >= 4:
                    assert relay.stalled.wait(30)  # the rest of the answer is held
                    attached.process.send_signal(signal.SIGKILL)  # mid-answer
                    before = _content(lines)
        if ours:
            break
    else:
        pytest.fail(f"no {route} stream was routed to the attached node")
    chunks = [json.loads(ln[6:]) for ln in lines if ln.startswith("data: {")]
    assert not [c for c in chunks if "error" in c], lines
    assert "data: [DONE]" in lines
    assert len({c["id"] for c in chunks}) == 1
    with_choices = [c for c in chunks if c["choices"]]
    if "messages" in asked:  # one opening chunk: the continuation's was dropped
        assert sum("role" in c["choices"][0]["delta"] for c in with_choices) == 1
    assert before is not None
    after = _content(lines)[len(before):]
    print(f"migrated {route} stream: {before!r} | {after!r}")
    assert before and after  # the second node went on from the partial answer
    assert with_choices[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert chunks[-1]["usage"]["completion_tokens"] <= 200 + 4  # the limit held (chunks)


def test_real_vllm_behind_otela(federation, vllm_python, tiny_model, tmp_path):
    ingress = federation.start_node("ingress", ingress=True)
    other = federation.start_node("other", bootstrap=[ingress])
    adapter = tmp_path / "adapter"
    subprocess.run([str(vllm_python), "-m", "otela.engine.demo.tiny_model", str(tiny_model),
                    "--lora", str(adapter)], check=True, capture_output=True, timeout=300)
    port = free_port()
    command = vllm_engine_command(vllm_python, tiny_model, MODEL, port, "--enable-lora",
                                  "--max-lora-rank", "8")
    started = time.monotonic()
    server = federation.start_node("vllm", bootstrap=[ingress], process=command,
                                   extra_env={**VLLM_ENV,
                                              "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"},
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

    wait_for(lambda: other.session_id in server.states(), CONVERGE_S,
             "the serving node to know the other member")
    check_admin_is_out_of_reach(ingress, other, server, f"http://127.0.0.1:{port}",
                                str(adapter))

    check_a_stream_continues_on_another_node(federation, ingress, port)

    assert federation.stop_node(server, timeout=60) == 0
    wait_state(ingress, server, "LEFT")
    wait_for(lambda: not any(_alive(p) for p in engine_pids), 30, "vLLM processes to exit")
    log = server.log_tail(40)
    assert log.index("announced DOWN") < log.index("announced LEFT")


def test_the_readme_vllm_demo_serves_every_shape_through_the_ingress():
    """``otela demo --engine vllm`` as the README gives it: vLLM serves behind an ingress,
    answers chat, completions and a stream, and the Responses and Anthropic Messages
    shapes with their official clients, then every node exits 0."""
    import os
    import re
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "otela", "demo", "--engine", "vllm", "--requests", "1"],
        capture_output=True, text=True, timeout=VLLM_READY_S + 120,
        env={**os.environ, "COLUMNS": "100"})
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert re.search(r"registry: tiny-llama -> provider-\w+ \(SERVING\)", out), out
    for shape in ("chat #0", "completion", "stream", "responses", "messages"):
        assert f"  {shape}: " in out, out
    assert re.search(r"responses: .* \(\d+ tokens in\)", out), out
    assert re.search(r"messages: .* \(\d+ tokens in\)", out), out
    assert "exit codes {'ingress': 0, 'vllm': 0}" in out

"""``otela demo --engine vllm``: a real vLLM engine wrapped by otela, behind an ingress.

Builds the tiny random-weight Llama locally (no downloads), starts an ingress node and a
serving node whose engine is vLLM's OpenAI server (CPU build), then sends chat requests, a
text completion and a streamed chat through the ingress with the openai client, and the
same prompt in the two other shapes agents speak: OpenAI's Responses API (openai client)
and Anthropic's Messages API (anthropic client), both relayed to vLLM's own routes. The
model's answers are gibberish (random weights); everything else is the real engine.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from anthropic import Anthropic
from openai import OpenAI
from rich.console import Console

from otela.console import make_console
from otela.testing.localfed import (
    VLLM_ENV,
    FederationError,
    LocalFederation,
    build_tiny_model,
    free_port,
    vllm_engine_command,
    vllm_python,
    wait_for,
)

MODEL_NAME = "tiny-llama"
VLLM_START_TIMEOUT_S = 300.0


def other_shapes(console: Console, url: str) -> None:
    """The Responses and Anthropic Messages shapes through the ingress, with their
    official clients (what agent tools send), each printing the usage vLLM reported."""
    client = OpenAI(base_url=f"{url}/v1", api_key="demo", max_retries=0)
    response = client.responses.create(model=MODEL_NAME, input="hello", max_output_tokens=16)
    console.print(f"  responses: {response.output_text!r} "
                  f"({response.usage.input_tokens if response.usage else '?'} tokens in)")
    anthropic = Anthropic(base_url=url, api_key="demo", max_retries=0)
    message = anthropic.messages.create(
        model=MODEL_NAME, max_tokens=16, messages=[{"role": "user", "content": "hello"}])
    text = "".join(getattr(block, "text", "") for block in message.content)
    console.print(f"  messages: {text!r} ({message.usage.input_tokens} tokens in)")


def run_vllm_demo(python: Path | None, requests: int = 3) -> int:
    console = make_console()
    with tempfile.TemporaryDirectory(prefix="otela-vllm-demo-") as tmp:
        root = Path(tmp)
        federation = LocalFederation(root / "fed")
        try:
            interpreter = vllm_python(python)
            with console.status("building the tiny random-weight model"):
                model_dir = build_tiny_model(interpreter, root / "tiny-llama")
            ingress = federation.start_node("ingress", ingress=True, provider_id="demo-ingress")
            console.print(f"ingress  [bold]{ingress.http_url}[/]")
            command = vllm_engine_command(interpreter, model_dir, MODEL_NAME, free_port())
            started = time.monotonic()
            node = federation.start_node(
                "vllm", bootstrap=[ingress], process=command, extra_env=VLLM_ENV
            )
            with console.status("vLLM is loading (about a minute on a CPU)"):
                wait_for(
                    lambda: ingress.states().get(node.session_id) == "SERVING",
                    VLLM_START_TIMEOUT_S,
                    "vLLM to serve",
                    interval=0.5,
                )
            console.print(f"vLLM serving after {time.monotonic() - started:.0f}s")
            for entry in ingress.get("/v1/registry/models")["models"]:
                where = ", ".join(f"{s['provider_id']} ({s['display_state']})"
                                  for s in entry["sessions"])
                console.print(f"registry: {entry['id']} -> {where}")
            client = OpenAI(base_url=f"{ingress.http_url}/v1", api_key="demo", max_retries=0)
            for i in range(requests):
                reply = client.chat.completions.create(
                    model=MODEL_NAME,
                    max_tokens=16,
                    messages=[{"role": "user", "content": f"hello #{i}"}],
                )
                console.print(f"  chat #{i}: {reply.choices[0].message.content!r}")
            text = client.completions.create(model=MODEL_NAME, prompt="Once upon", max_tokens=8)
            console.print(f"  completion: {text.choices[0].text!r}")
            console.print("  stream: ", end="")
            for chunk in client.chat.completions.create(
                model=MODEL_NAME,
                max_tokens=16,
                stream=True,
                messages=[{"role": "user", "content": "stream please"}],
            ):
                if chunk.choices and chunk.choices[0].delta.content:
                    console.print(repr(chunk.choices[0].delta.content), end=" ")
            console.print()
            other_shapes(console, ingress.http_url)
            return 0
        except FederationError as exc:
            console.print(f"[red]demo failed:[/] {exc}")
            for node in federation.nodes:
                console.print(f"[dim]--- {node.name} log ---\n{node.log_tail(15)}[/]")
            return 1
        except KeyboardInterrupt:
            return 130
        finally:
            with console.status("stopping (the vLLM node drains, then announces LEFT)"):
                codes = {n.name: federation.stop_node(n, timeout=60) for n in federation.nodes}
            console.print(f"exit codes {codes}")

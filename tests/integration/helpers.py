"""Small helpers for tests that drive real otela processes over HTTP."""

from __future__ import annotations

from typing import Any

import httpx

from otela.testing.localfed import (
    LocalFederation,
    LocalNode,
    echo_engine_command,
    free_port,
    http_client,
    wait_for,
)

CONVERGE_S = 20.0


def chat(node: LocalNode, model: str, content: str = "hello", **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": content}], **extra}
    return http_client().post(f"{node.http_url}/v1/chat/completions", json=body, timeout=30)


def serving_node(
    fed: LocalFederation, name: str, bootstrap: LocalNode, model: str, *engine_args: str,
    provider: str | None = None,
) -> LocalNode:
    command = echo_engine_command(free_port(), [model], *engine_args)
    return fed.start_node(name, bootstrap=[bootstrap], process=command,
                          provider_id=provider or f"prov-{name}")


def wait_state(observer: LocalNode, target: LocalNode, state: str) -> None:
    wait_for(lambda: observer.states().get(target.session_id) == state, CONVERGE_S,
             f"{observer.name} to see {target.name} {state}")


def wait_known(observer: LocalNode, *targets: LocalNode) -> None:
    """Until ``observer``'s registry lists every target (in any state): a node started
    beside an ingress may hear of it a moment after the ingress hears of the node."""
    wait_for(lambda: {t.session_id for t in targets} <= set(observer.states()), CONVERGE_S,
             f"{observer.name} to know {', '.join(t.name for t in targets)}")

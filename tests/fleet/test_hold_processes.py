"""Scale to zero at a real ingress, with and without data-path workers: a request for a
held model waits until a node serving it joins, then is answered by it (the timeout's
503 is in test_hold.py)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from otela.testing.localfed import echo_engine_command, free_port

pytestmark = [pytest.mark.slow]


def chat(url: str, model: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "are you there"}]}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60, trust_env=False)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_held_request_is_answered_by_the_first_node_that_serves(federation, workers):
    ingress = federation.start_node("ingress", ingress=True, extra_args=[
        "--hold-models", "cold-*", "--hold-timeout", "60", "--workers", workers])
    from otela.testing.localfed import wait_for
    wait_for(lambda: (ingress.get("/v1/health")["workers"] or {"count": 1})["count"]
             == int(workers), 30, "the data-path workers to listen")
    answers: list[httpx.Response] = []
    waiter = threading.Thread(target=lambda: answers.append(chat(ingress.http_url, "cold-m")))
    started = time.monotonic()
    waiter.start()

    def held() -> bool:
        text = httpx.get(f"{ingress.http_url}/metrics", trust_env=False).text
        return 'otela_held_requests{model="cold-m"} 1' in text

    wait_for(held, 20, "the request to be held")
    node = federation.start_node("node", bootstrap=[ingress],
                                 process=echo_engine_command(free_port(), ["cold-m"]))
    waiter.join(60)
    (answer,) = answers
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-otela-session-id"] == node.session_id
    print(f"held for {time.monotonic() - started:.1f}s")
    assert chat(ingress.http_url, "warm-unknown").status_code == 404  # not held

"""``--workers N``: several processes serve one node's port; the node still drains, stops
cleanly, and reports every worker's requests as its own."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from otela.testing.localfed import wait_for

from .helpers import chat, serving_node, wait_state

pytestmark = pytest.mark.slow


def worker_pids(node) -> list[int]:
    children = Path(f"/proc/{node.process.pid}/task/{node.process.pid}/children")
    pids = [int(p) for p in children.read_text().split()]
    return [p for p in pids
            if b"otela.workers.worker" in Path(f"/proc/{p}/cmdline").read_bytes()]


def gone(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    return not status.exists() or "zombie" in status.read_text()


def requests_total(node) -> float:
    text = httpx.get(f"{node.http_url}/metrics", trust_env=False).text
    return sum(s.value for f in text_string_to_metric_families(text)
               for s in f.samples if s.name == "otela_requests_total")


def test_workers_share_the_port_report_as_one_node_and_drain_on_sigterm(federation):
    ingress = federation.start_node("ingress", ingress=True, extra_args=["--workers", "2"])
    server = serving_node(federation, "server", ingress, "echo-w", "--token-delay", "0.2")
    wait_state(ingress, server, "SERVING")
    assert len(worker_pids(ingress)) == 2
    health = ingress.get("/v1/health")
    assert health["workers"] == {"count": 2, "restarts": 0}
    # The registry above is the control process's; each worker routes with a snapshot it
    # is pushed within ~50 ms of a change, and until then may not know the model (404).
    wait_for(lambda: all(chat(ingress, "echo-w", "ready?", max_tokens=1).status_code == 200
                         for _ in range(6)), 10, "every worker to know the model")

    for i in range(12):  # new connections each: the kernel spreads them over the workers
        response = chat(ingress, "echo-w", f"hello {i}", max_tokens=2)
        assert response.status_code == 200
        assert response.headers["x-otela-session-id"] == server.session_id
    wait_for(lambda: requests_total(ingress) >= 12, 5, "the workers' counts to arrive")
    assert ingress.get("/v1/models")["data"][0]["id"] == "echo-w"  # the API, via a worker
    # a POST for the API too: this node takes no assignments, and says so (not a 400)
    refused = httpx.post(f"{ingress.http_url}/v1/assignments", json={"envelope": "AA=="},
                         timeout=10, trust_env=False)
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["code"] == "not_opted_in"

    # A slow stream is in flight when SIGTERM arrives: it finishes, then the node leaves.
    events: list[str] = []
    answered = threading.Event()

    def stream() -> None:
        body = {"model": "echo-w", "stream": True,
                "messages": [{"role": "user", "content": "one two three four five six"}]}
        with httpx.stream("POST", f"{ingress.http_url}/v1/chat/completions", json=body,
                          timeout=30, trust_env=False) as response:
            answered.set()  # a worker holds it now
            events.extend(line for line in response.iter_lines() if line.startswith("data:"))

    reader = threading.Thread(target=stream)
    reader.start()
    # The client's side first: the node's in_flight adds up the workers' reports, and a
    # report from the requests above can still count one a moment after they finished.
    assert answered.wait(10), "the stream was not answered"
    wait_for(lambda: ingress.get("/v1/health")["in_flight"] >= 1, 10,
             "the stream to be in flight")
    workers = worker_pids(ingress)
    ingress.process.send_signal(signal.SIGTERM)
    reader.join(30)
    assert events and events[-1] == "data: [DONE]"  # drained, not cut
    assert federation.stop_node(ingress, signal_it=False) == 0
    assert all(gone(pid) for pid in workers)
    assert json.loads(events[0][6:])["object"] == "chat.completion.chunk"


def test_a_worker_that_dies_is_replaced(federation):
    node = federation.start_node("solo", ingress=True, extra_args=["--workers", "2"])
    victim = worker_pids(node)[0]
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: node.get("/v1/health")["workers"]["restarts"] == 1, 15,
             "the worker to be restarted")
    wait_for(lambda: len(worker_pids(node)) == 2, 15, "two workers again")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # every connection is served, whichever worker
        assert httpx.get(f"{node.http_url}/v1/health", trust_env=False).status_code == 200
        time.sleep(0.05)

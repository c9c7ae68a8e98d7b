"""Requests never outlive their client, and a hung engine costs a 504, not ten minutes.

A client that gives up (closes its connection) cancels the request on every hop: the
ingress's and the serving node's in-flight counts and open descriptors return to where
they were. An engine that takes a request and never answers is cut off after the
first-byte timeout.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
import trio

from otela.testing.localfed import (
    LocalFederation,
    LocalNode,
    echo_engine_command,
    free_port,
    wait_for,
)

from .helpers import chat, wait_known, wait_state

pytestmark = pytest.mark.slow

SLOW = "echo-slow"  # 3 s per token: a request runs ~30 s unless its client's leaving stops it
HUNG = "echo-hung"  # 1000 s per token: takes the request, never answers
FIRST_BYTE_TIMEOUT = 2.0  # streams; non-streamed answers: + 0.1 s per requested token...
RESPONSE_TIMEOUT = 4.0  # ...at most this, and this when no max_tokens is given


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, LocalNode]]:
    """An ingress in front of a slow engine (default timeouts) and, with a short first-byte
    timeout, an ingress in front of a hung one."""
    federation = LocalFederation(tmp_path_factory.mktemp("lifetime"))
    timeouts = ["--first-byte-timeout", f"{FIRST_BYTE_TIMEOUT}s",
                "--response-timeout", f"{RESPONSE_TIMEOUT}s"]
    try:
        ingress = federation.start_node("ingress", ingress=True)
        with federation.together():
            impatient = federation.start_node(
                "impatient", ingress=True, bootstrap=[ingress],
                extra_args=[*timeouts, "--eject-after", "1"])
            slow = federation.start_node(
                "slow", bootstrap=[ingress],
                process=echo_engine_command(free_port(), [SLOW], "--token-delay", "3"))
            hung = federation.start_node(
                "hung", bootstrap=[ingress], extra_args=timeouts,
                process=echo_engine_command(free_port(), [HUNG], "--token-delay", "1000"))
        wait_state(ingress, slow, "SERVING")
        wait_state(impatient, hung, "SERVING")
        # Started beside it, the hung node may hear of the impatient ingress a moment
        # later, and its engine hop serves members only.
        wait_known(hung, impatient)
        yield {"ingress": ingress, "impatient": impatient, "slow": slow, "hung": hung}
    finally:
        federation.close()


def open_fds(node: LocalNode) -> int:
    return len(os.listdir(f"/proc/{node.process.pid}/fd"))


def in_flight(node: LocalNode) -> int:
    return int(node.get("/v1/health")["in_flight"])


def request_bytes(model: str, stream: bool) -> bytes:
    body = json.dumps({"model": model, "stream": stream, "messages": [
        {"role": "user", "content": "one two three four five six seven eight"}]}).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
            b"\r\ncontent-length: %d\r\n\r\n%b" % (len(body), body))


async def abandon(node: LocalNode, data: bytes, after: float, read_first: bool) -> None:
    host, port = node.http_url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    await stream.send_all(data)
    if read_first:  # a streaming client that read the first event, then left
        with trio.move_on_after(5):
            await stream.receive_some(65536)
    await trio.sleep(after)
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00"
                             b"\x00")  # a reset, like a client process that was killed
    await stream.aclose()


def abandon_many(node: LocalNode, count: int, stream: bool) -> None:
    async def run() -> None:
        async with trio.open_nursery() as nursery:
            for i in range(count):
                nursery.start_soon(abandon, node, request_bytes(SLOW, stream), 0.2 + i % 5 * 0.1,
                                   stream)
                await trio.sleep(0.01)

    trio.run(run)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streaming"])
def test_abandoned_requests_free_every_counter_and_descriptor(fed, stream):
    ingress, slow = fed["ingress"], fed["slow"]
    assert chat(ingress, SLOW, "warm up", max_tokens=1).status_code == 200  # 3 s
    baseline = {n.name: open_fds(n) for n in (ingress, slow)}
    abandon_many(ingress, 60, stream)
    # Well before the abandoned requests could have finished on their own (~30 s each).
    for node in (ingress, slow):
        wait_for(lambda node=node: in_flight(node) == 0, 8, f"{node.name} in-flight back to 0")
        wait_for(lambda node=node: open_fds(node) <= baseline[node.name] + 4, 8,
                 f"{node.name} descriptors back to baseline ({baseline[node.name]})")
    assert chat(ingress, SLOW, "still serving", max_tokens=1).status_code == 200


def test_a_hung_engine_gives_a_504_after_the_first_byte_timeout(fed):
    """A non-streamed answer waits --first-byte-timeout plus 0.1 s per requested token, at
    most --response-timeout (and that when no max_tokens is given). (The echo engine starts
    a stream at once, so a stream's first byte does come.)"""
    ingress, hung = fed["impatient"], fed["hung"]
    for extra, timeout in (({"max_tokens": 10}, FIRST_BYTE_TIMEOUT + 1.0),
                           ({}, RESPONSE_TIMEOUT)):
        started = time.monotonic()
        response = chat(ingress, HUNG, "are you there", **extra)
        elapsed = time.monotonic() - started
        assert response.status_code == 504, extra
        assert response.json()["error"]["code"] == "upstream_timeout"
        assert timeout <= elapsed < timeout + 1.5, (extra, elapsed)
    for node in (ingress, hung):
        wait_for(lambda node=node: in_flight(node) == 0, 15, f"{node.name} in-flight back to 0")
    health = httpx.get(f"{hung.http_url}/v1/health", trust_env=False).json()
    assert health["state"] == "SERVING"  # the engine is slow, not dead: no fail-stop
    # ...but the silence counts against the node at the ingress (ejected after one here).
    metrics = httpx.get(f"{ingress.http_url}/metrics", trust_env=False).text
    assert re.search(r"^otela_routing_ejections_total [1-9]", metrics, re.M)

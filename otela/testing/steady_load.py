"""A steady open-loop load of chat requests, and machine-level faults, for a local federation.

Used by the chaos benchmark (``benchmarks/chaos.py``) and the chaos test tier
(``tests/integration/test_chaos.py``): both start the same federation (a bootstrap node, an
ingress, serving nodes with echo engines), send requests at a fixed mean rate whatever
happens to the nodes (open loop: a slow answer does not slow the sender, as with real
users), keep every outcome, and fail machines by signalling a node's daemon and engine
together.

Outcomes, per request: ``ok``; ``http <status>``; for streams, ``error event`` when the
stream ended with an OpenAI-style error event, ``cut`` when it ended without ``[DONE]``
or an error event; ``hang`` when nothing ended it within the client's timeout.
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import trio

from otela.testing.localfed import (
    LocalFederation,
    LocalNode,
    echo_engine_command,
    free_port,
    wait_for,
)

REQUEST_TIMEOUT_S = 60.0
QUIET = ["--log-level", "WARNING"]


def start_behind_ingress(
    fed: LocalFederation, model: str, serving: int, boot_port: int, *,
    engine_args: Sequence[str] = (), ingress_args: Sequence[str] = (),
    place: Callable[[int], dict[str, Any]] = lambda host: {}, settle_s: float = 120.0,
) -> tuple[LocalNode, LocalNode, list[LocalNode]]:
    """The bootstrap node (on ``boot_port``: a bootstrap node keeps its well-known address
    when restarted), an ingress, and ``serving`` nodes with echo engines for ``model``;
    returns once the ingress sees every serving node SERVING. ``place(host)`` gives
    ``start_node`` placement arguments (host 0 the bootstrap node, 1 the ingress, then the
    serving nodes), e.g. a network namespace each."""
    boot = fed.start_node("boot", extra_args=QUIET, p2p_port=boot_port, **place(0))
    with fed.together():
        ingress = fed.start_node("ingress", ingress=True, bootstrap=[boot], extra_args=[
            *QUIET, "--max-connections-per-client", "100000", *ingress_args], **place(1))
        nodes = [fed.start_node(f"n{i}", bootstrap=[boot], extra_args=QUIET, timeout=60,
                                process=echo_engine_command(free_port(), [model],
                                                            *engine_args), **place(2 + i))
                 for i in range(serving)]
    sessions = {n.session_id for n in nodes}
    wait_for(lambda: sum(ingress.states().get(s) == "SERVING" for s in sessions)
             == len(sessions), settle_s, "every serving node to be SERVING at the ingress",
             interval=0.25)
    # Started beside the ingress, a node may hear of it a moment later, and a node's engine
    # hop serves members only.
    wait_for(lambda: all(ingress.session_id in n.states() for n in nodes), settle_s,
             "every serving node to know the ingress", interval=0.25)
    return boot, ingress, nodes


@dataclass
class Outcome:
    sent_at: float  # time.monotonic()
    stream: bool
    result: str
    latency: float


@dataclass
class SteadyLoad:
    """Open-loop chat requests for ``model`` through ``url`` until stopped."""

    url: str
    model: str
    rate: float
    stream_share: float
    seed: int = 7
    timeout: float = REQUEST_TIMEOUT_S
    outcomes: list[Outcome] = field(default_factory=list)
    # Error bodies and stream error events, for a report of what went wrong.
    messages: collections.Counter[str] = field(default_factory=collections.Counter)

    async def run(self, stop: trio.Event) -> None:
        """Send until ``stop`` is set, then wait for every request sent to end."""
        limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
        async with httpx.AsyncClient(timeout=self.timeout, limits=limits,
                                     trust_env=False) as client, \
                trio.open_nursery() as nursery:
            rng = random.Random(self.seed)
            next_at = trio.current_time()
            while not stop.is_set():
                next_at += rng.expovariate(self.rate)
                with trio.move_on_at(next_at):
                    await stop.wait()
                if stop.is_set():
                    break
                stream = rng.random() < self.stream_share
                nursery.start_soon(self._one, client, stream, time.monotonic())

    def errors(self, since: float = 0.0, until: float = float("inf")) -> list[Outcome]:
        """The requests sent in [since, until) that did not end ``ok``."""
        return [o for o in self.outcomes
                if since <= o.sent_at < until and o.result != "ok"]

    def sent(self, since: float = 0.0, until: float = float("inf")) -> list[Outcome]:
        return [o for o in self.outcomes if since <= o.sent_at < until]

    async def _one(self, client: httpx.AsyncClient, stream: bool, sent_at: float) -> None:
        body = {"model": self.model, "stream": stream, "max_tokens": 8,
                "messages": [{"role": "user", "content": "one two three four five six"}]}
        try:
            if stream:
                result = await self._streamed(client, body)
            else:
                answer = await client.post(f"{self.url}/v1/chat/completions", json=body)
                result = "ok" if answer.status_code == 200 else f"http {answer.status_code}"
                if answer.status_code != 200:
                    self.messages[f"{result}: {answer.text[:300]}"] += 1
        except httpx.TimeoutException:
            result = "hang"
        except httpx.HTTPError as exc:
            result = f"cut ({type(exc).__name__})"
        self.outcomes.append(Outcome(sent_at, stream, result, time.monotonic() - sent_at))

    async def _streamed(self, client: httpx.AsyncClient, body: dict[str, object]) -> str:
        async with client.stream("POST", f"{self.url}/v1/chat/completions",
                                 json=body) as answer:
            if answer.status_code != 200:
                self.messages[f"http {answer.status_code}: "
                              f"{(await answer.aread())[:300].decode(errors='replace')}"] += 1
                return f"http {answer.status_code}"
            data = b""
            async for chunk in answer.aiter_raw():
                data += chunk
        if b"data: [DONE]" in data:
            return "ok"
        if b'data: {"error"' in data:
            self.messages[data[data.index(b'data: {"error"'):][:300].decode()] += 1
            return "error event"
        return "cut"


def machine_pids(node: LocalNode) -> list[int]:
    """The node's daemon and its engine: what a machine failure takes down."""
    return [node.process.pid, *node.engine_pids()]


def is_stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP: state ``T`` in /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"


def signal_machine(pids: list[int], sig: int) -> None:
    """Send ``sig`` to each process still there."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)

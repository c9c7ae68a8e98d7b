"""Chaos benchmark: what clients see while serving nodes die, freeze or lose their peer.

Real processes on 127.0.0.1: a bootstrap node, an ingress (bootstrapped from it) and
``--nodes`` serving nodes wrapping the echo engine (``--request-delay``: each request takes
that long before its first token; streams send a token every ``--token-delay``). A steady
open-loop load of ``--rate`` requests a second goes through the ingress the whole time,
``--stream-share`` of them streaming. Each scenario gets a fresh federation:

- ``kill``: SIGKILL half the serving nodes at once (daemon and engine: a machine gone);
- ``stop``: SIGSTOP a third of them (daemon and engine) for ``--stop-seconds``, then
  SIGCONT (a machine that froze: swap storm, a paused VM);
- ``boot``: restart the bootstrap node (SIGTERM, then start it again on its home).

For each: every request sent from the event on for ``--observe`` seconds, by outcome
(``ok``; ``http <status>``; for streams, ``error event`` when the stream ended with an
OpenAI-style error event, ``cut`` when it ended without ``[DONE]`` or an error event,
``hang`` when nothing ended it within ``REQUEST_TIMEOUT_S``), the latency p50/p99 of the
non-streaming ones that succeeded, and for ``kill`` the seconds until the ingress no longer
lists the killed sessions as SERVING. Figures are documented in docs/failure-detection.md.

Run: ``.venv/bin/python benchmarks/chaos.py [--scenarios kill,stop,boot]`` (~4 minutes).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import trio

from otela.localfed import LocalFederation, LocalNode, echo_engine_command, free_port, wait_for

MODEL = "echo-chaos"
QUIET = ["--log-level", "WARNING"]
REQUEST_TIMEOUT_S = 60.0


@dataclass
class Outcome:
    sent_at: float
    stream: bool
    result: str
    latency: float


@dataclass
class Load:
    """Open-loop requests through ``url`` until stopped; every outcome kept."""

    url: str
    rate: float
    stream_share: float
    outcomes: list[Outcome] = field(default_factory=list)
    messages: collections.Counter[str] = field(default_factory=collections.Counter)

    async def run(self, stop: trio.Event) -> None:
        limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
        async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits,
                                     trust_env=False) as client, \
                trio.open_nursery() as nursery:
            rng = random.Random(7)
            next_at = trio.current_time()
            while not stop.is_set():
                next_at += rng.expovariate(self.rate)
                await trio.sleep_until(next_at)
                stream = rng.random() < self.stream_share
                nursery.start_soon(self.one, client, stream, time.monotonic())

    async def one(self, client: httpx.AsyncClient, stream: bool, sent_at: float) -> None:
        body = {"model": MODEL, "stream": stream, "max_tokens": 8,
                "messages": [{"role": "user", "content": "one two three four five six"}]}
        try:
            if stream:
                result = await self.streamed(client, body)
            else:
                answer = await client.post(f"{self.url}/v1/chat/completions", json=body)
                result = "ok" if answer.status_code == 200 else f"http {answer.status_code}"
                if answer.status_code != 200:
                    self.messages[result] += 1
                    self.messages[answer.text[:300]] += 1
        except httpx.TimeoutException:
            result = "hang"
        except httpx.HTTPError as exc:
            result = f"cut ({type(exc).__name__})"
        self.outcomes.append(Outcome(sent_at, stream, result, time.monotonic() - sent_at))

    async def streamed(self, client: httpx.AsyncClient, body: dict[str, object]) -> str:
        async with client.stream("POST", f"{self.url}/v1/chat/completions",
                                 json=body) as answer:
            if answer.status_code != 200:
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


def signal_machine(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def start(fed: LocalFederation, args: argparse.Namespace
          ) -> tuple[LocalNode, LocalNode, list[LocalNode]]:
    # A bootstrap node has a well-known address: the same port after a restart.
    boot = fed.start_node("boot", extra_args=QUIET, p2p_port=args.boot_port)
    ingress = fed.start_node("ingress", ingress=True, bootstrap=[boot], extra_args=[
        *QUIET, "--max-connections-per-client", "100000",
        *(["--retry-broken"] if args.retry_broken else [])])
    serving = []
    for i in range(args.nodes):
        engine = echo_engine_command(free_port(), [MODEL], "--request-delay",
                                     str(args.request_delay), "--token-delay",
                                     str(args.token_delay))
        serving.append(fed.start_node(f"n{i}", bootstrap=[boot], process=engine,
                                      extra_args=QUIET, timeout=60))
    sessions = {n.session_id for n in serving}
    wait_for(lambda: sum(s == "SERVING" for k, s in ingress.states().items()
                         if k in sessions) == len(sessions), 120,
             "every serving node to be SERVING at the ingress", interval=0.5)
    return boot, ingress, serving


def run_scenario(name: str, args: argparse.Namespace, root: Path) -> dict[str, object]:
    with LocalFederation(root / name) as fed:
        boot, ingress, serving = start(fed, args)
        load = Load(ingress.http_url, args.rate, args.stream_share)
        extra: dict[str, object] = {}

        async def main() -> float:
            stop = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(load.run, stop)
                await trio.sleep(args.warm)
                event_at = time.monotonic()
                await trio.to_thread.run_sync(event(name, fed, boot, ingress, serving, args,
                                                    extra))
                await trio.sleep(max(0.0, args.observe - (time.monotonic() - event_at)))
                stop.set()
                await trio.sleep(2.0)  # let the last requests finish or time out
                nursery.cancel_scope.deadline = trio.current_time() + REQUEST_TIMEOUT_S
            return event_at

        event_at = trio.run(main)
        after = [o for o in load.outcomes if o.sent_at >= event_at]
        before = [o for o in load.outcomes if o.sent_at < event_at]
        for message, count in load.messages.most_common(8):
            print(f"  {count} x {message}", file=sys.stderr)
        return summarize(name, before, after, extra)


def event(name: str, fed: LocalFederation, boot: LocalNode, ingress: LocalNode,
          serving: list[LocalNode], args: argparse.Namespace, extra: dict[str, object]
          ) -> Callable[[], None]:
    def kill() -> None:
        victims = serving[: len(serving) // 2]
        started = time.monotonic()
        for node in victims:
            signal_machine(machine_pids(node), signal.SIGKILL)
        gone = {n.session_id for n in victims}
        wait_for(lambda: not any(ingress.states().get(s) == "SERVING" for s in gone), 120,
                 "the ingress to stop listing the killed nodes", interval=0.25)
        extra["not_serving_after_s"] = round(time.monotonic() - started, 1)
        wait_for(lambda: all(ingress.states().get(s) in (None, "LEFT") for s in gone), 120,
                 "the killed nodes to be LEFT", interval=0.25)
        extra["left_after_s"] = round(time.monotonic() - started, 1)

    def stop() -> None:
        frozen = serving[: max(1, len(serving) // 3)]
        pids = [pid for node in frozen for pid in machine_pids(node)]
        signal_machine(pids, signal.SIGSTOP)
        time.sleep(args.stop_seconds)
        signal_machine(pids, signal.SIGCONT)
        resumed = time.monotonic()
        # Back in rotation: each frozen machine serves again (under a new session if it
        # was evicted meanwhile).
        names = {n.status["peer_id"] for n in frozen}

        def serving_again() -> bool:
            nodes = ingress.get("/v1/registry/nodes")["nodes"]
            back = {n["peer_id"] for n in nodes if n["state"] == "SERVING"}
            return names <= back

        wait_for(serving_again, 120, "the frozen nodes to serve again", interval=0.25)
        extra["serving_again_after_s"] = round(time.monotonic() - resumed, 1)
        states = ingress.states()
        extra["evicted_while_frozen"] = sum(
            states.get(n.session_id) != "SERVING" for n in frozen)

    def restart_boot() -> None:
        started = time.monotonic()
        fed.stop_node(boot)
        restarted = fed.start_node("boot", extra_args=QUIET, timeout=60,
                                   p2p_port=args.boot_port)
        peers = {n.status["peer_id"] for n in [ingress, *serving]}
        wait_for(lambda: peers <= {n["peer_id"] for n in
                                   restarted.get("/v1/registry/nodes")["nodes"]
                                   if n["state"] != "LEFT"}, 120,
                 "the restarted bootstrap node to list everyone again", interval=0.25)
        extra["boot_converged_s"] = round(time.monotonic() - started, 1)

    return {"kill": kill, "stop": stop, "boot": restart_boot}[name]


def summarize(name: str, before: list[Outcome], after: list[Outcome],
              extra: dict[str, object]) -> dict[str, object]:
    def counts(outcomes: list[Outcome], stream: bool) -> dict[str, int]:
        return dict(collections.Counter(o.result for o in outcomes if o.stream == stream))

    latencies = sorted(o.latency for o in after if not o.stream and o.result == "ok")

    def pct(q: float) -> float | None:
        if not latencies:
            return None
        return round(1000 * latencies[min(len(latencies) - 1, int(q * len(latencies)))], 1)

    return {"scenario": name, "requests": len(after),
            "plain": counts(after, False), "streams": counts(after, True),
            "before_errors": dict(collections.Counter(o.result for o in before
                                                      if o.result != "ok")),
            "p50_ms": pct(0.5), "p99_ms": pct(0.99),
            "median_before_ms": round(1000 * statistics.median(
                [o.latency for o in before if not o.stream and o.result == "ok"] or [0]), 1),
            **extra}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenarios", default="kill,stop,boot")
    parser.add_argument("--nodes", type=int, default=6)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--stream-share", type=float, default=0.2)
    parser.add_argument("--request-delay", type=float, default=0.05)
    parser.add_argument("--token-delay", type=float, default=0.05)
    parser.add_argument("--warm", type=float, default=5.0)
    parser.add_argument("--observe", type=float, default=45.0)
    parser.add_argument("--stop-seconds", type=float, default=30.0)
    parser.add_argument("--retry-broken", action="store_true",
                        help="run the ingress with --retry-broken")
    parser.add_argument("--json", action="store_true", help="one JSON object per scenario")
    parser.add_argument("--keep", metavar="DIR", help="keep the nodes' homes and logs here")
    args = parser.parse_args()
    args.boot_port = free_port()
    with tempfile.TemporaryDirectory(prefix="otela-chaos-") as tmp:
        root = Path(args.keep) if args.keep else Path(tmp)
        for name in args.scenarios.split(","):
            result = run_scenario(name, args, root)
            if args.json:
                print(json.dumps(result), flush=True)
            else:
                print(f"{name}: " + ", ".join(f"{k} {v}" for k, v in result.items()
                                                if k != "scenario"), flush=True)


if __name__ == "__main__":
    sys.exit(main())

"""Routing benchmark: what the choice of node does to latency, through real processes.

Two federations on 127.0.0.1, each one ingress and four serving nodes wrapping the echo
engine with a fixed service time and a concurrency limit (``--request-delay``,
``--max-concurrency``: a node serves at most N requests at once, the rest queue in the
engine, as a real engine's batch does):

1. **Load** — three fast nodes and one 4x slower (capacity 3 x 80 + 20 = 260 req/s with
   the defaults). For each policy (chosen per request with ``X-Otela-Policy``), an
   open-loop Poisson load near capacity for ``--seconds``; throughput, p50/p99 latency
   (from each request's scheduled send time, so a stalled system cannot hide its queue)
   and each node's share of the requests. Goal: ``power_of_two`` or ``least_in_flight``
   cut p99 by >= 2x against ``random``.
2. **Affinity** — four equal nodes, requests whose prompts start with one of
   ``--prefixes`` long shared prefixes (system prompts, conversations); for
   ``prefix_affinity`` (and ``power_of_two`` for contrast): the share of requests that
   went to their prefix's most used node, and the busiest node's requests over the mean.
   Goal: >= 90 % on the prefix's node, no node above 1.5x the mean.

3. **Cache** (``--phases cache``, not run by default: it needs scripts/setup-vllm, ~10 GB
   and ~10 minutes) — three real vLLM CPU nodes with prefix caching and KV events, a
   multi-turn chat trace routed by ``power_of_two``, ``prefix_affinity`` and
   ``cache_aware``: the engines' own prefix-cache hit rate, TTFT and the busiest node
   (``benchmarks/cache_routing.py``; ``benchmarks/cache_scale.py`` has the summaries'
   bytes at 50 nodes and the decision time at 1,000).

Run: ``python benchmarks/routing.py [--seconds 20] [--rate 200]``; figures go in
docs/routing.md.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import random
import resource
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cache_routing  # the cache phase (benchmarks/ is on the path when run as a script)
import httptools
import trio

from otela.testing.localfed import (
    LocalFederation,
    LocalNode,
    echo_engine_command,
    free_port,
    wait_for,
)

MODEL = "echo-bench"
LOAD_POLICIES = ("random", "round_robin", "weighted", "least_in_flight", "power_of_two",
                 "prefix_affinity")
REQUEST_TIMEOUT_S = 60.0
QUIET = ["--log-level", "WARNING"]


# -- a small HTTP/1.1 client: open loop, per-request headers, the serving node's id back --


class _Reply:
    """httptools callbacks for one response."""

    def __init__(self) -> None:
        self.done = False
        self.session = ""
        self._name = b""

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"x-otela-session-id":
            self.session = value.decode()

    def on_message_complete(self) -> None:
        self.done = True


class Client:
    """Keep-alive connections to one server, opened as the open loop needs them."""

    def __init__(self, url: str) -> None:
        self.host, port = url.removeprefix("http://").rsplit(":", 1)
        self.port = int(port)
        self.idle: list[trio.SocketStream] = []

    async def post(self, path: str, body: bytes, headers: dict[str, str]
                   ) -> tuple[int, str]:
        """(status, serving session id); a connection the server closed is reopened."""
        stream = self.idle.pop() if self.idle else await trio.open_tcp_stream(
            self.host, self.port)
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        head = (f"POST {path} HTTP/1.1\r\nhost: {self.host}\r\ncontent-type: "
                f"application/json\r\ncontent-length: {len(body)}\r\n{extra}\r\n").encode()
        reply = _Reply()
        parser = httptools.HttpResponseParser(reply)
        try:
            await stream.send_all(head + body)
            while not reply.done:
                data = await stream.receive_some(65536)
                if not data:
                    raise ConnectionError("closed")
                parser.feed_data(data)
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        if parser.should_keep_alive():
            self.idle.append(stream)
        else:
            await stream.aclose()
        return parser.get_status_code(), reply.session


@dataclass
class Outcome:
    latencies: list[float] = field(default_factory=list)  # of answered requests, seconds
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    by_node: collections.Counter[str] = field(default_factory=collections.Counter)
    by_key_node: dict[int, collections.Counter[str]] = field(
        default_factory=lambda: collections.defaultdict(collections.Counter))
    wall_s: float = 0.0


def chat(content: str) -> bytes:
    return json.dumps({"model": MODEL, "max_tokens": 16,
                       "messages": [{"role": "user", "content": content}]}).encode()


async def open_loop(url: str, rate: float, seconds: float, policy: str, rng: random.Random,
                    prompts: Sequence[str] | None = None) -> Outcome:
    """Poisson arrivals at ``rate`` for ``seconds``, each request sent whatever the
    earlier ones are doing; latency counts from the scheduled send time."""
    client = Client(url)
    outcome = Outcome()
    headers = {"X-Otela-Policy": policy}

    async def one(scheduled: float, key: int | None, body: bytes) -> None:
        with trio.move_on_after(REQUEST_TIMEOUT_S):
            try:
                status, node = await client.post("/v1/chat/completions", body, headers)
            except (OSError, ConnectionError, trio.BrokenResourceError,
                    httptools.HttpParserError) as exc:
                outcome.errors[type(exc).__name__] += 1
                return
            if status != 200:
                outcome.errors[str(status)] += 1
                return
            outcome.latencies.append(trio.current_time() - scheduled)
            outcome.by_node[node] += 1
            if key is not None:
                outcome.by_key_node[key][node] += 1
            return
        outcome.errors["timeout"] += 1

    started = trio.current_time()
    async with trio.open_nursery() as nursery:
        at = started
        while at < started + seconds:
            await trio.sleep_until(at)
            key = None
            if prompts:
                key = rng.randrange(len(prompts))
                body = chat(prompts[key] + f" turn {rng.randrange(10**9)}")
            else:
                body = chat(f"hello {rng.randrange(10**9)}")
            nursery.start_soon(one, at, key, body)
            at += rng.expovariate(rate)
    outcome.wall_s = trio.current_time() - started
    return outcome


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- federations ----------------------------------------------------------------------------


def start_federation(fed: LocalFederation, delays: Sequence[float], concurrency: int
                     ) -> tuple[LocalNode, dict[str, str]]:
    """An ingress and one serving node per delay; their session ids -> labels."""
    # One load generator stands in for many clients: lift the per-client connection cap
    # (429 beyond it), so that a blind policy's queue shows as latency, not as refusals.
    ingress = fed.start_node("ingress", ingress=True, extra_args=[
        *QUIET, "--max-connections-per-client", "100000"])
    labels: dict[str, str] = {}
    nodes = []
    for i, delay in enumerate(delays):
        engine = echo_engine_command(free_port(), [MODEL], "--request-delay", str(delay),
                                     "--max-concurrency", str(concurrency))
        node = fed.start_node(f"n{i}", bootstrap=[ingress], process=engine, extra_args=QUIET)
        nodes.append(node)
        labels[node.session_id] = f"n{i} ({delay * 1000:.0f} ms)"
    wanted = set(labels)

    def all_serving() -> bool:
        states = ingress.states()
        return all(states.get(session) == "SERVING" for session in wanted)

    wait_for(all_serving, 90, "every serving node to be SERVING at the ingress")
    return ingress, labels


def load_phase(args: argparse.Namespace, root: Path) -> list[dict[str, object]]:
    delays = [args.delay] * 3 + [args.delay * 4]
    rows: list[dict[str, object]] = []
    with LocalFederation(root / "load") as fed:
        ingress, labels = start_federation(fed, delays, args.concurrency)
        capacity = sum(args.concurrency / d for d in delays)
        print(f"load phase: capacity {capacity:.0f} req/s, offered {args.rate:.0f} req/s "
              f"({args.rate / capacity:.0%}), {args.seconds:.0f} s per policy")
        for policy in args.policies:
            outcome = trio.run(open_loop, ingress.http_url, args.rate, args.seconds, policy,
                               random.Random(args.seed))
            rows.append(summarise(policy, outcome, labels))
            print_row(rows[-1])
    return rows


def affinity_phase(args: argparse.Namespace, root: Path) -> list[dict[str, object]]:
    rng = random.Random(args.seed)
    prompts = [f"System prompt {i}: " + " ".join(
        rng.choice(("plan", "solve", "reason", "answer", "check", "write"))
        for _ in range(120)) for i in range(args.prefixes)]
    rows: list[dict[str, object]] = []
    with LocalFederation(root / "affinity") as fed:
        ingress, labels = start_federation(fed, [args.delay] * 4, args.concurrency)
        print(f"affinity phase: {args.prefixes} prefixes, {args.affinity_rate:.0f} req/s")
        for policy in ("prefix_affinity", "power_of_two"):
            outcome = trio.run(open_loop, ingress.http_url, args.affinity_rate, args.seconds,
                               policy, random.Random(args.seed), prompts)
            row = summarise(policy, outcome, labels)
            modal = sum(max(c.values()) for c in outcome.by_key_node.values())
            row["on_prefix_node"] = modal / max(1, sum(outcome.by_node.values()))
            counts = [outcome.by_node.get(s, 0) for s in labels]
            row["max_over_mean"] = max(counts) / max(1e-9, statistics.mean(counts))
            rows.append(row)
            print_row(row)
            print(f"    on the prefix's node {row['on_prefix_node']:.1%}, busiest node "
                  f"{row['max_over_mean']:.2f}x the mean")
    return rows


def summarise(policy: str, outcome: Outcome, labels: dict[str, str]) -> dict[str, object]:
    answered = len(outcome.latencies)
    return {
        "policy": policy, "answered": answered, "errors": dict(outcome.errors),
        "throughput": answered / outcome.wall_s if outcome.wall_s else 0.0,
        "p50_ms": percentile(outcome.latencies, 0.50) * 1000,
        "p99_ms": percentile(outcome.latencies, 0.99) * 1000,
        "share": {labels.get(s, s or "?"): n / max(1, answered)
                  for s, n in sorted(outcome.by_node.items(), key=lambda kv: labels.get(
                      kv[0], kv[0]))},
    }


def print_row(row: dict[str, object]) -> None:
    share = row["share"]
    assert isinstance(share, dict)
    shares = "  ".join(f"{label} {value:.0%}" for label, value in share.items())
    errors = f"  errors {row['errors']}" if row["errors"] else ""
    print(f"  {row['policy']:<16} {row['throughput']:7.1f} req/s  p50 {row['p50_ms']:8.1f} ms"
          f"  p99 {row['p99_ms']:8.1f} ms  | {shares}{errors}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="load per policy")
    parser.add_argument("--rate", type=float, default=200.0, help="load phase, req/s")
    parser.add_argument("--affinity-rate", type=float, default=200.0)
    parser.add_argument("--delay", type=float, default=0.05,
                        help="fast nodes' service time, s (the slow node's is 4x)")
    parser.add_argument("--concurrency", type=int, default=4,
                        help="requests an engine serves at once")
    parser.add_argument("--prefixes", type=int, default=64)
    parser.add_argument("--policies", type=lambda s: s.split(","), default=list(LOAD_POLICIES))
    parser.add_argument("--phases", type=lambda s: s.split(","), default=["load", "affinity"])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    cache_routing.add_arguments(parser)
    args = parser.parse_args()
    # Thousands of requests may queue behind a slow node under a blind policy.
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))
    root = Path(tempfile.mkdtemp(prefix="otela-routing-bench-"))
    started = time.time()
    results: dict[str, Any] = {}
    try:
        if "load" in args.phases:
            results["load"] = load_phase(args, root)
        if "affinity" in args.phases:
            results["affinity"] = affinity_phase(args, root)
        if "cache" in args.phases:
            results["cache"] = cache_routing.cache_phase(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if "load" in results:
        p99 = {str(r["policy"]): float(str(r["p99_ms"])) for r in results["load"]}
        if "random" in p99:
            for policy in ("least_in_flight", "power_of_two"):
                if policy in p99:
                    print(f"{policy}: p99 {p99['random'] / p99[policy]:.1f}x better than "
                          "random")
    print(f"({time.time() - started:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

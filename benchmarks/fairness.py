"""Fairness benchmark: the ingress queue's priority classes, token shares and Batch API.

Real processes on 127.0.0.1: an ingress with the ingress service (API keys on SQLite) and
one serving node whose echo engine takes ``--slots`` requests at once (its
``--max-concurrency``, which otela reads) and generates a token every ``--token-delay``,
so the model has a fixed, finite capacity. Scenarios (``--scenarios``):

- ``shares``: two teams flood the model (closed loop, ``2 x slots`` clients each) for
  ``--duration`` seconds, first with equal weights, then 3:1. Prints each team's tokens
  and the ratio (goals: equal within 5 %, 3:1 within 10 %).
- ``interactive``: an interactive key sends streaming requests at ``--rate`` per second;
  its time to first token (TTFT) is measured (1) with the model otherwise idle, (2) beside
  a ``--batch-lines`` batch (the Batch API), and (3) beside the batch and a key flooding
  the model in the default class. Prints TTFT p50/p99 per phase (goal: p99 within 1.25x
  of idle) with where the time went (the ingress's Server-Timing, the event-loop lag of
  the ingress and of the serving node, the engine's own queue), and in phase 2 the
  batch's share of the capacity the interactive key left (goal: at least 90 %; the
  capacity is measured first, flooding alone).

Run: ``.venv/bin/python benchmarks/fairness.py [--scenarios shares,interactive]
[--duration 120]`` (~8 minutes with the defaults). Figures: docs/scheduling.md.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path
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

MODEL = "echo-fair"
ADMIN = "fairness-bench-admin-token-0123456789"
PROMPT = " ".join(f"w{i}" for i in range(10))  # 12 output tokens ("echo: w0 ... w9")


def admin(node: LocalNode, method: str, path: str, body: Any = None) -> Any:
    answer = httpx.request(method, f"{node.http_url}/v1/admin{path}", trust_env=False,
                           timeout=30, headers={"authorization": f"Bearer {ADMIN}"},
                           json=body)
    answer.raise_for_status()
    return answer.json()


def new_key(node: LocalNode, owner: str, **fields: Any) -> str:
    return str(admin(node, "POST", "/keys", {"owner": owner, **fields})["key"])


def body(stream: bool = False) -> dict[str, Any]:
    return {"model": MODEL, "stream": stream,
            "messages": [{"role": "user", "content": PROMPT}]}


async def flood(client: httpx.AsyncClient, url: str, secret: str, until: float,
                tokens: Counter[str], name: str, headers: dict[str, str] | None = None
                ) -> None:
    """One closed-loop client: a request as soon as the last is answered."""
    while trio.current_time() < until:
        answer = await client.post(f"{url}/v1/chat/completions", json=body(), timeout=300,
                                   headers={"authorization": f"Bearer {secret}",
                                            "x-otela-queue-timeout": "600",
                                            **(headers or {})})
        if answer.status_code == 200 and trio.current_time() < until:
            tokens[name] += answer.json()["usage"]["completion_tokens"]


def server_timing(header: str) -> dict[str, float]:
    """``Server-Timing: route;dur=0.1, upstream;dur=2.3, ...`` as seconds by name."""
    timings = {}
    for part in header.split(","):
        name, _, dur = part.strip().partition(";dur=")
        if dur:
            timings[name] = float(dur) / 1e3
    return timings


async def interactive(client: httpx.AsyncClient, url: str, secret: str, rate: float,
                      until: float, ttfts: list[float],
                      timings: list[dict[str, float]] | None = None) -> None:
    """Streaming requests at ``rate`` per second (open loop); the TTFT of each, and the
    ingress's own account of it (its Server-Timing: queue, route, upstream head)."""
    async def one() -> None:
        started = time.perf_counter()
        async with client.stream(
                "POST", f"{url}/v1/chat/completions", json=body(stream=True), timeout=120,
                headers={"authorization": f"Bearer {secret}",
                         "x-otela-priority": "interactive"}) as answer:
            first = None
            async for line in answer.aiter_lines():
                if first is None and line.startswith("data:") and '"content"' in line:
                    first = time.perf_counter() - started
            if first is not None:
                ttfts.append(first)
                if timings is not None:
                    timings.append(server_timing(answer.headers.get("server-timing", "")))

    async with trio.open_nursery() as nursery:
        while trio.current_time() < until:
            nursery.start_soon(one)
            await trio.sleep(1 / rate)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def shares(ingress: LocalNode, args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for weights in ((1, 1), (3, 1)):
        label = f"{weights[0]}:{weights[1]}"
        teams = {}
        for team, weight in zip(("a", "b"), weights, strict=True):
            name = f"team-{team}-{label}"
            teams[name] = new_key(ingress, name, team=name)
            admin(ingress, "PUT", f"/teams/{name}", {"weight": weight})
        time.sleep(1.5)  # every ingress's key cache has the weights
        tokens: Counter[str] = Counter()

        async def run() -> None:
            until = trio.current_time() + args.duration
            async with httpx.AsyncClient(trust_env=False, limits=httpx.Limits(
                    max_connections=1000)) as client, trio.open_nursery() as nursery:
                for name, secret in teams.items():  # noqa: B023
                    for _ in range(2 * args.slots):
                        nursery.start_soon(flood, client, ingress.http_url, secret, until,
                                           tokens, name)  # noqa: B023

        trio.run(run)
        a, b = (tokens[name] for name in teams)
        ratio = a / b if b else float("inf")
        results[label] = {"tokens": dict(tokens), "ratio": round(ratio, 3),
                          "error_pct": round(100 * (ratio / (weights[0] / weights[1]) - 1), 1)}
        print(f"shares {label}: {dict(tokens)} ratio {ratio:.3f} "
              f"({results[label]['error_pct']:+.1f} % off {weights[0] / weights[1]:g})",
              flush=True)
    return results


async def sample_waiting(client: httpx.AsyncClient, engine_port: int, until: float,
                         samples: list[float]) -> None:
    """The engine's ``vllm:num_requests_waiting`` every 50 ms until ``until``."""
    while trio.current_time() < until:
        text = (await client.get(f"http://127.0.0.1:{engine_port}/metrics")).text
        samples += [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                    if line.startswith("vllm:num_requests_waiting")]
        await trio.sleep(0.05)


def histogram_totals(url: str, name: str, label: str = "") -> tuple[float, float]:
    """The ingress's histogram ``name`` so far (its series with ``label`` in them): its
    count and sum."""
    text = httpx.get(f"{url}/metrics", trust_env=False, timeout=30).text
    count = total = 0.0
    for line in text.splitlines():
        if label not in line:
            continue
        if line.startswith(f"{name}_count"):
            count += float(line.rsplit(" ", 1)[1])
        elif line.startswith(f"{name}_sum"):
            total += float(line.rsplit(" ", 1)[1])
    return count, total


def queue_waits(url: str, priority: str) -> tuple[float, float]:
    """How many requests of ``priority`` waited in the ingress queue so far, and how long
    in all (its ``otela_queue_wait_seconds`` count and sum)."""
    return histogram_totals(url, "otela_queue_wait_seconds", f'priority="{priority}"')


def flood_process(url: str, secret: str, connections: int, seconds: float
                  ) -> subprocess.Popen[str]:
    """wrk keeping ``connections`` requests of ``secret`` in flight for ``seconds``."""
    script = Path(tempfile.mkdtemp()) / "flood.lua"
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {secret}",
               "X-Otela-Queue-Timeout": "600"}
    script.write_text('wrk.method = "POST"\n' + f"wrk.body = {json.dumps(json.dumps(body()))}\n"
                      + "".join(f'wrk.headers["{k}"] = "{v}"\n' for k, v in headers.items()))
    return subprocess.Popen(["wrk", "-t1", f"-c{connections}", f"-d{round(seconds)}s",
                             "--timeout", "600s", "-s", str(script),
                             f"{url}/v1/chat/completions"], stdout=subprocess.PIPE, text=True)


def wrk_requests(output: str) -> int:
    match = re.search(r"(\d+) requests in", output)
    return int(match.group(1)) if match else 0


def upload_batch(url: str, secret: str, lines: int) -> str:
    text = "".join(json.dumps({"custom_id": f"line-{i}", "method": "POST",
                               "url": "/v1/chat/completions", "body": body()}) + "\n"
                   for i in range(lines))
    headers = {"authorization": f"Bearer {secret}"}
    upload = httpx.post(f"{url}/v1/files", headers=headers, trust_env=False, timeout=60,
                        data={"purpose": "batch"},
                        files={"file": ("batch.jsonl", text.encode(), "application/jsonl")})
    upload.raise_for_status()
    batch = httpx.post(f"{url}/v1/batches", headers=headers, trust_env=False, timeout=60,
                       json={"input_file_id": upload.json()["id"], "completion_window": "24h",
                             "endpoint": "/v1/chat/completions"})
    batch.raise_for_status()
    return str(batch.json()["id"])


def batch_done(url: str, secret: str, batch_id: str) -> int:
    answer = httpx.get(f"{url}/v1/batches/{batch_id}", trust_env=False, timeout=30,
                       headers={"authorization": f"Bearer {secret}"})
    counts = answer.json()["request_counts"]
    return int(counts["completed"]) + int(counts["failed"])


def interactive_scenario(ingress: LocalNode, args: argparse.Namespace, server: LocalNode,
                         engine_port: int) -> dict[str, Any]:
    url = ingress.http_url
    chatter = new_key(ingress, "interactive", priority="interactive")
    bulk = new_key(ingress, "bulk")
    flooder = new_key(ingress, "flooder")
    results: dict[str, Any] = {}

    # capacity: requests per second with every slot busy
    tokens: Counter[str] = Counter()

    async def capacity() -> None:
        until = trio.current_time() + 20
        async with httpx.AsyncClient(trust_env=False) as client, trio.open_nursery() as n:
            for _ in range(2 * args.slots):
                n.start_soon(flood, client, url, flooder, until, tokens, "capacity")

    trio.run(capacity)
    per_request = 12
    full = tokens["capacity"] / per_request / 20
    print(f"capacity: {full:.1f} requests/s", flush=True)

    def phase(name: str, batch: str | None, flooding: bool) -> None:
        ttfts: list[float] = []
        timings: list[dict[str, float]] = []
        flooded: Counter[str] = Counter()
        before = batch_done(url, bulk, batch) if batch else 0
        waited_before = queue_waits(url, "interactive")
        lag_before = histogram_totals(url, "otela_event_loop_lag_seconds")
        node_lag_before = histogram_totals(server.http_url, "otela_event_loop_lag_seconds")
        engine_waiting: list[float] = []  # the engine's own queue, sampled
        started = time.monotonic()
        # The flooding key runs in wrk (another process, in C): clients in this process
        # would share the event loop that times the interactive requests' first tokens.
        wrk = flood_process(url, flooder, 2 * args.slots, args.phase) if flooding else None

        async def run() -> None:
            until = trio.current_time() + args.phase
            async with httpx.AsyncClient(trust_env=False) as client, \
                    trio.open_nursery() as nursery:
                nursery.start_soon(sample_waiting, client, engine_port, until, engine_waiting)
                await interactive(client, url, chatter, args.rate, until, ttfts, timings)

        trio.run(run)
        if wrk is not None:
            output = wrk.communicate(timeout=args.phase + 120)[0]
            flooded["default"] = per_request * wrk_requests(output)
        elapsed = time.monotonic() - started
        waited = [a - b for a, b in zip(queue_waits(url, "interactive"), waited_before,
                                        strict=True)]
        lagged = [a - b for a, b in zip(histogram_totals(url, "otela_event_loop_lag_seconds"),
                                        lag_before, strict=True)]
        node_lagged = [a - b for a, b in zip(histogram_totals(
            server.http_url, "otela_event_loop_lag_seconds"), node_lag_before, strict=True)]
        entry: dict[str, Any] = {"ttft_p50_ms": round(1e3 * pct(ttfts, 0.5), 1),
                                 "ttft_p99_ms": round(1e3 * pct(ttfts, 0.99), 1),
                                 "requests": len(ttfts),
                                 # where the time went, by the ingress's Server-Timing:
                                 # p50/p99 of its queue, of the engine's answer head (via
                                 # the serving node), and of its whole time to that head
                                 **{f"{name}_p{q}_ms": round(1e3 * pct(
                                     [t.get(name, 0.0) for t in timings], q / 100), 1)
                                    for name in ("queue", "upstream", "total")
                                    for q in (50, 99)},
                                 # interactive requests that had to wait in the queue, and
                                 # their mean wait there
                                 "queued": int(waited[0]),
                                 "queued_mean_ms": round(1e3 * waited[1] / waited[0], 1)
                                 if waited[0] else 0.0,
                                 # the ingress's event loop: how late it woke, on average
                                 "loop_lag_mean_ms": round(1e3 * lagged[1] / lagged[0], 2)
                                 if lagged[0] else 0.0,
                                 "node_loop_lag_mean_ms": round(
                                     1e3 * node_lagged[1] / node_lagged[0], 2)
                                 if node_lagged[0] else 0.0,
                                 # requests waiting inside the engine (for its slots)
                                 "engine_waiting_mean": round(
                                     sum(engine_waiting) / max(1, len(engine_waiting)), 2),
                                 "engine_waiting_max": max(engine_waiting, default=0)}
        if batch:
            done = batch_done(url, bulk, batch) - before
            entry["batch_lines_per_s"] = round(done / elapsed, 2)
            leftover = full - args.rate - flooded["default"] / per_request / elapsed
            entry["batch_share_of_leftover"] = round(done / elapsed / leftover, 3) \
                if leftover > 0 else None
        results[name] = entry
        print(f"{name}: {entry}", flush=True)

    phase("idle", None, False)
    batch = upload_batch(url, bulk, args.batch_lines)
    wait_for(lambda: batch_done(url, bulk, batch) > 0, 60, "the batch to start")
    phase("with_batch", batch, False)
    phase("with_batch_and_flood", batch, True)
    idle_p99 = results["idle"]["ttft_p99_ms"]
    for name in ("with_batch", "with_batch_and_flood"):
        results[name]["p99_vs_idle"] = round(results[name]["ttft_p99_ms"] / idle_p99, 2)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", default="shares,interactive")
    parser.add_argument("--slots", type=int, default=10, help="engine requests at once")
    parser.add_argument("--token-delay", type=float, default=0.02)
    parser.add_argument("--duration", type=float, default=120.0, help="per share run (s)")
    parser.add_argument("--phase", type=float, default=40.0, help="per TTFT phase (s)")
    parser.add_argument("--rate", type=float, default=4.0, help="interactive requests/s")
    parser.add_argument("--batch-lines", type=int, default=5000)
    parser.add_argument("--reserve", type=float, default=0.1,
                        help="the ingress's --priority-reserve (slots kept for interactive)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    out: dict[str, Any] = {"settings": {k: v for k, v in vars(args).items() if k != "json"}}
    with tempfile.TemporaryDirectory() as tmp, LocalFederation(Path(tmp)) as fed:
        ingress = fed.start_node("ingress", ingress=True, provider_id="bench", extra_args=[
            "--log-level", "WARNING", "--ingress-db", str(Path(tmp) / "keys.db"),
            "--max-connections-per-client", "100000", "--priority-reserve",
            str(args.reserve)],
            extra_env={"OTELA_ADMIN_TOKEN": ADMIN,  # a batch can keep every slot busy
                       "OTELA_BATCH_CONCURRENCY": str(2 * args.slots),
                       "OTELA_BATCH_IN_FLIGHT": str(2 * args.slots)})
        engine_port = free_port()
        engine = echo_engine_command(engine_port, [MODEL], "--token-delay",
                                     str(args.token_delay), "--max-concurrency",
                                     str(args.slots))
        node = fed.start_node("server", bootstrap=[ingress], process=engine,
                              provider_id="bench", extra_args=["--log-level", "WARNING"])
        wait_for(lambda: ingress.states().get(node.session_id) == "SERVING", 60, "serving")
        probe = new_key(ingress, "probe")
        wait_for(lambda: httpx.post(f"{ingress.http_url}/v1/chat/completions", json=body(),
                                    headers={"authorization": f"Bearer {probe}"},
                                    trust_env=False, timeout=30).status_code == 200, 60,
                 "the model served through the ingress")
        if "shares" in args.scenarios:
            out["shares"] = shares(ingress, args)
        if "interactive" in args.scenarios:
            out["interactive"] = interactive_scenario(ingress, args, node, engine_port)
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

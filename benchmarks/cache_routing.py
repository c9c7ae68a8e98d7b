"""Cache-aware routing on real engines: a multi-turn chat trace over three real vLLM CPU
nodes, routed by ``power_of_two``, ``prefix_affinity`` and ``cache_aware`` in turn.

One federation: an ingress (with the tiny model's tokenizer) and three nodes, each
``otela start --process`` wrapping vLLM (CPU build, the tiny random Llama, prefix caching
on, KV events on, ``--cache-blocks`` blocks of 32 tokens: a cache smaller than the trace's
working set, as in production; the model built for 2,048 positions, served with
1,024). Each run is ``--conversations`` chats of ``--turns`` turns that all open with one
system prompt (new for every run, so no run inherits another's cache), ``--chats-at-once``
chats at once, each turn streamed; the clients send no ``user`` field (many do not). The
policy is chosen per request (``X-Otela-Policy``); runs are interleaved over ``--rounds``
rounds so that a drift of the machine hits each policy alike.

Per policy: the engines' own prefix-cache hit rate (``vllm:prefix_cache_hits_total`` over
``..._queries_total``, tokens, summed over the three engines), mean and p90 time to first
token at the client, and the busiest node's requests over the mean. Goals (issue 40):
hit rate >= 1.5x power_of_two's and >= prefix_affinity's, mean TTFT lower than both,
busiest node <= 1.5x the mean.

Run: ``python benchmarks/routing.py --phases cache`` (or this file), ~10 minutes, ~10 GB
of memory; needs scripts/setup-vllm.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import trio

from otela.kvcache.hashing import BlockHasher
from otela.kvcache.tokenize import ModelTokenizer
from otela.testing.localfed import (
    VLLM_ENV,
    LocalFederation,
    LocalNode,
    build_tiny_model,
    free_port,
    vllm_engine_command,
    vllm_python,
    wait_for,
)

MODEL = "tiny-llama"
POLICIES = ("power_of_two", "prefix_affinity", "cache_aware")
MAX_CONTEXT = 1024  # a chat of six turns fits: the tiny model is built for 2,048
WORDS = ["river", "mountain", "cloud", "engine", "garden", "copper", "violet", "harbor",
         "lantern", "meadow", "signal", "orchard", "canyon", "marble", "falcon", "ember",
         "thistle", "quartz", "willow", "beacon"]


def engine_args(events_port: int, cache_blocks: int) -> list[str]:
    config = {"enable_kv_cache_events": True, "publisher": "zmq",
              "endpoint": f"tcp://*:{events_port}", "topic": "kv"}
    return ["--max-model-len", str(MAX_CONTEXT), "--block-size", "32",
            "--num-gpu-blocks-override", str(cache_blocks),
            "--kv-events-config", json.dumps(config)]


def sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def prefix_counters(engine_url: str) -> tuple[float, float]:
    """(hits, queries) in tokens, from the engine's own metrics."""
    hits = queries = 0.0
    for line in httpx.get(f"{engine_url}/metrics", timeout=30).text.splitlines():
        if line.startswith("vllm:prefix_cache_hits_total"):
            hits += float(line.rsplit(" ", 1)[1])
        elif line.startswith("vllm:prefix_cache_queries_total"):
            queries += float(line.rsplit(" ", 1)[1])
    return hits, queries


async def one_turn(client: httpx.AsyncClient, url: str, policy: str,
                   messages: list[dict[str, str]], max_tokens: int
                   ) -> tuple[float, str, str]:
    """(time to first token, serving session, the reply's text) of one streamed turn."""
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens,
            "ignore_eos": True, "temperature": 0, "stream": True}
    started = time.perf_counter()
    first: float | None = None
    text: list[str] = []
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body,
                             headers={"x-otela-policy": policy}) as reply:
        if reply.status_code != 200:
            raise RuntimeError(f"{reply.status_code}: {(await reply.aread())[:300]!r}")
        session = reply.headers["x-otela-session-id"]
        async for line in reply.aiter_lines():
            if not line.startswith("data: {"):
                continue
            delta = json.loads(line[6:])["choices"][0].get("delta", {}).get("content")
            if delta:
                if first is None:
                    first = time.perf_counter() - started
                text.append(delta)
    return (first if first is not None else time.perf_counter() - started), session, \
        "".join(text)


class Reuse:
    """The trace's own ceiling: the prompt tokens, in full blocks, that an earlier request
    of the run already had as a prefix (what an unbounded cache that every request could
    reach would hit; vLLM recomputes a prompt's last token, as counted here)."""

    def __init__(self, model: Path) -> None:
        self.tokenizer = ModelTokenizer(model)
        self.hasher = BlockHasher("sha256", 32)
        self.seen: set[int] = set()
        self.reusable = self.prompt = 0

    def add(self, messages: list[dict[str, str]]) -> None:
        ids = self.tokenizer.prompt_ids({"messages": messages}) or []
        chain = self.hasher.chain(ids[:-1])
        shared = 0
        for key in chain:
            if key not in self.seen:
                break
            shared += 1
        self.seen.update(chain)
        self.reusable += shared * 32
        self.prompt += len(ids)


async def run_trace(url: str, policy: str, args: argparse.Namespace, seed: int,
                    reuse: Reuse) -> tuple[list[float], Counter[str]]:
    rng = random.Random(seed)
    shared = f"Session {seed}. " + " ".join(sentence(rng, 8) for _ in range(3))
    ttfts: list[float] = []
    served: Counter[str] = Counter()
    conversations = list(range(args.conversations))

    async def chat(client: httpx.AsyncClient, number: int) -> None:
        local = random.Random(seed * 1000 + number)
        system = shared if not args.own_system_prompts else \
            f"Chat {seed}-{number}. " + " ".join(sentence(local, 8) for _ in range(3))
        messages = [{"role": "system", "content": system}]
        for _turn in range(args.turns):
            messages.append({"role": "user", "content": sentence(local, 8)})
            reuse.add(messages)
            ttft, session, text = await one_turn(client, url, policy, messages,
                                                 args.reply_tokens)
            ttfts.append(ttft)
            served[session] += 1
            messages.append({"role": "assistant", "content": text})
            await trio.sleep(local.uniform(0.1, args.think_s))

    async def worker(client: httpx.AsyncClient) -> None:
        while conversations:
            await chat(client, conversations.pop())

    async with httpx.AsyncClient(timeout=300, trust_env=False) as client, \
            trio.open_nursery() as nursery:
        for _ in range(args.chats_at_once):
            nursery.start_soon(worker, client)
    return ttfts, served


def cache_phase(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Per policy: hit rate, its ceiling, TTFT, balance (``policies``); and the measured
    staleness of the summaries (``staleness_s``)."""
    python = vllm_python()
    model = build_tiny_model(python, root / "tiny-llama", "--max-positions", "2048")
    with LocalFederation(root / "fed") as fed:
        ingress = fed.start_node("ingress", ingress=True, extra_args=[
            "--tokenizer", f"{MODEL}={model}", "--log-level", "WARNING"])
        engines: dict[str, str] = {}
        nodes: list[LocalNode] = []
        for i in range(3):
            port = free_port()
            node = fed.start_node(f"vllm-{i}", bootstrap=[ingress], extra_env=VLLM_ENV,
                                  extra_args=["--log-level", "WARNING"],
                                  process=vllm_engine_command(
                                      python, model, MODEL, port,
                                      *engine_args(free_port(), args.cache_blocks)))
            engines[node.session_id] = f"http://127.0.0.1:{port}"
            nodes.append(node)
        for node in nodes:
            wait_for(lambda n=node: ingress.states().get(n.session_id) == "SERVING", 600,
                     f"{node.name} to serve", interval=1.0)
        opening = "a system prompt per chat" if args.own_system_prompts else \
            "one shared system prompt"
        print(f"cache phase ({opening}): "
              f"3 vLLM CPU nodes ({args.cache_blocks} blocks of 32 tokens "
              f"each), {args.conversations} chats x {args.turns} turns per run, "
              f"{args.chats_at_once} at once, {args.rounds} round(s)")
        totals: dict[str, dict[str, Any]] = {
            p: {"ttft": [], "served": Counter(), "hits": 0.0, "queries": 0.0}
            for p in args.cache_policies}
        seed = args.seed
        for round_number in range(args.rounds):
            order = args.cache_policies[round_number % len(args.cache_policies):] + \
                args.cache_policies[:round_number % len(args.cache_policies)]
            for policy in order:
                seed += 1
                before = {s: prefix_counters(u) for s, u in engines.items()}
                reuse = Reuse(model)
                ttfts, served = trio.run(run_trace, ingress.http_url, policy, args, seed,
                                         reuse)
                totals[policy]["reusable"] = totals[policy].get("reusable", 0) + \
                    reuse.reusable
                totals[policy]["prompt"] = totals[policy].get("prompt", 0) + reuse.prompt
                after = {s: prefix_counters(u) for s, u in engines.items()}
                total = totals[policy]
                total["ttft"] += ttfts
                total["served"] += served
                for session in engines:
                    total["hits"] += after[session][0] - before[session][0]
                    total["queries"] += after[session][1] - before[session][1]
                print(f"  round {round_number + 1} {policy}: {len(ttfts)} turns, "
                      f"mean TTFT {statistics.mean(ttfts) * 1000:.0f} ms")
        rows = []
        for policy, total in totals.items():
            counts = [total["served"].get(s, 0) for s in engines]
            ttft = sorted(total["ttft"])
            rows.append({
                "policy": policy,
                "hit_rate": total["hits"] / max(1.0, total["queries"]),
                "ceiling": total["reusable"] / max(1, total["prompt"]),
                "mean_ttft_ms": statistics.mean(ttft) * 1000,
                "p90_ttft_ms": ttft[int(len(ttft) * 0.9)] * 1000,
                "busiest_over_mean": max(counts) / statistics.mean(counts),
                "requests": counts})
        decisions = ingress.get("/v1/network")["routing"]["cache"]["decisions"]
        staleness = measure_staleness(ingress, nodes, engines, args.staleness_samples)
        print(f"{'policy':<16} {'hit rate':>9} {'of ceiling':>11} {'TTFT mean':>10} "
              f"{'TTFT p90':>9} {'busiest/mean':>13}  requests per node")
        for row in rows:
            print(f"{row['policy']:<16} {row['hit_rate']:>9.1%} "
                  f"{row['hit_rate'] / max(1e-9, row['ceiling']):>11.0%} "
                  f"{row['mean_ttft_ms']:>8.0f}ms {row['p90_ttft_ms']:>7.0f}ms "
                  f"{row['busiest_over_mean']:>13.2f}  {row['requests']}")
        by_policy = {r["policy"]: r for r in rows}
        if {"cache_aware", "power_of_two"} <= set(by_policy):
            ratio = by_policy["cache_aware"]["hit_rate"] / \
                max(1e-9, by_policy["power_of_two"]["hit_rate"])
            print(f"cache_aware's hit rate: {ratio:.2f}x power_of_two's")
        print(f"cache_aware decisions at the ingress: {decisions}")
        if staleness:
            ordered = sorted(staleness)
            print(f"staleness (a request answered straight by an engine -> the ingress "
                  f"holds the summary with its blocks), {len(ordered)} samples: "
                  f"p50 {ordered[len(ordered) // 2]:.2f} s, max {ordered[-1]:.2f} s")
        return {"policies": rows, "staleness_s": staleness}


def measure_staleness(ingress: LocalNode, nodes: list[LocalNode], engines: dict[str, str],
                      samples: int) -> list[float]:
    """Seconds from an answer straight from an engine (its blocks stored, their events
    published) until the ingress holds that node's summary including them."""
    rng = random.Random(1)
    out: list[float] = []
    for i in range(samples):
        node = nodes[i % len(nodes)]
        own_before = node.get("/v1/network")["routing"]["cache"]["own"]
        body = {"model": MODEL, "max_tokens": 1, "prompt": sentence(rng, 60)}
        httpx.post(f"{engines[node.session_id]}/v1/completions", json=body, timeout=60)
        answered = time.monotonic()

        def caught_up(n: LocalNode = node, before: dict[str, Any] = own_before) -> bool:
            own = n.get("/v1/network")["routing"]["cache"]["own"]
            held = ingress.get("/v1/network")["routing"]["cache"]["nodes"].get(
                n.session_id)
            return own["stored"] > before["stored"] and held is not None and \
                (held["epoch"], held["seq"]) == (own["epoch"], own["seq"])

        wait_for(caught_up, 60, "the ingress to hold the new summary", interval=0.05)
        out.append(time.monotonic() - answered)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--conversations", type=int, default=24)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--chats-at-once", dest="chats_at_once", type=int, default=6)
    parser.add_argument("--reply-tokens", type=int, default=24)
    parser.add_argument("--think-s", type=float, default=1.0)
    parser.add_argument("--cache-blocks", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--staleness-samples", type=int, default=9)
    parser.add_argument("--own-system-prompts", action="store_true",
                        help="every chat opens with a system prompt of its own (agents, "
                        "per-user memory) instead of one shared by all")
    parser.add_argument("--cache-policies", type=lambda s: s.split(","),
                        default=list(POLICIES))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="otela-cache-bench-") as root:
        figures = cache_phase(args, Path(root))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()

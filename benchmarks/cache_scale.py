"""Cache-aware routing at scale, without engines: what the cache summaries cost on the wire
at 50 serving nodes, how stale an ingress's view is, and how long the routing decision
takes at 1,000 nodes. ``benchmarks/routing.py --cache`` measures the same policy on real
vLLM engines; docs/performance.md has the figures.

**Bytes and staleness.** ``--nodes`` serving nodes, each an engine with a prefix cache of
``--cache-blocks`` blocks of ``--block-size`` tokens, modelled as vLLM's block pool is
(a request's full blocks stored, hits reused, freed tail first into an LRU queue, the
least recently freed evicted); its events go through otela's real ``CacheIndex``, and on
the real report schedule (``ReportSchedule``: at most once per ``max(2 s, 0.5 s x
members)``) each node sends its ingress(es) the real encoded report
(``otela.load.reports.encode``), applied by the real ``CacheBoard``. The workload is a
multi-turn chat trace (Poisson arrivals, ``--rate`` requests a second per node, a shared
system prompt, conversations of ``--turns`` turns), routed by ``cache_aware`` itself.
Printed: report bytes a second per serving node (and per ingress), and for every advertised
block the delay from the engine's event to the ingress's board.

**Decision time.** A board holding ``--decision-nodes`` nodes' summaries
(``--anchors-per-node`` each), and the policy's ``pick`` over that many candidates given
as a list, for a request whose blocks were hashed already, and separately the hashing of a
``--prompt-tokens`` prompt (per request, whatever the federation's size). The router's
whole decision (filters, the lazy candidate view, the pick) is
``benchmarks/routing_decision.py``'s.

Run: ``python benchmarks/cache_scale.py`` (about a minute).
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

from otela.kvcache.anchors import anchor_depths
from otela.kvcache.board import CacheBoard
from otela.kvcache.events import Batch, Removed, Stored
from otela.kvcache.hashing import BlockHasher
from otela.kvcache.index import CacheIndex
from otela.kvcache.tokenize import Tokenizers
from otela.load.reports import TTL_INTERVALS, ReportSchedule, decode, encode
from otela.registry.records import Lifecycle, NodeRecord
from otela.routing.cache_aware import CacheAware, CacheContext
from otela.routing.load import NodeLoad
from otela.routing.policies import Candidate, Pick, Policy, PowerOfTwo, load_policy


class BlockPool:
    """A vLLM-like prefix cache: full blocks by hash, free ones in an LRU queue."""

    def __init__(self, capacity: int, hasher: BlockHasher) -> None:
        self.capacity = capacity
        self.hasher = hasher
        self.held: set[int] = set()
        self.free: OrderedDict[int, None] = OrderedDict()  # evicted from the front
        self.seq = 0

    def serve(self, tokens: list[int]) -> Batch:
        size = self.hasher.block_size
        chain = self.hasher.chain(tokens)
        events: list[Stored | Removed] = []
        new_start = None
        for i, key in enumerate(chain):
            if key in self.held:
                self.free.pop(key, None)  # in use again
                continue
            while len(self.held) >= self.capacity and self.free:
                victim, _ = self.free.popitem(last=False)
                self.held.discard(victim)
                events.append(Removed((victim,)))
            self.held.add(key)
            if new_start is None:
                new_start = i
        if new_start is not None:
            parent = chain[new_start - 1] if new_start else None
            events.append(Stored(tuple(chain[new_start:]), parent,
                                 tuple(tokens[new_start * size:len(chain) * size]), size,
                                 True))
        for key in reversed(chain):  # freed tail first: the tail is evicted first
            self.free[key] = None
        self.seq += 1
        return Batch(self.seq - 1, tuple(events))


def record(session: str) -> NodeRecord:
    return NodeRecord(session, "peer-" + session, "provider", Lifecycle.SERVING, 1,
                      "http://127.0.0.1:1")


class TokenTokenizers(Tokenizers):
    """Requests carry their token ids already (``prompt`` as a list)."""

    def __init__(self) -> None:
        super().__init__({})

    def for_model(self, model: str) -> object:  # type: ignore[override]
        return _Ids()


class _Ids:
    def prompt_ids(self, body: dict[str, object]) -> list[int] | None:
        prompt = body.get("prompt")
        return prompt if isinstance(prompt, list) else None


@dataclass
class Conversation:
    history: list[int]
    turns_left: int
    user: str = ""


@dataclass
class Node:
    session: str
    pool: BlockPool
    index: CacheIndex = field(default_factory=CacheIndex)
    schedule: ReportSchedule = field(default_factory=ReportSchedule)
    held: dict[str, tuple[int, int] | None] = field(default_factory=dict)
    stored_at: dict[int, float] = field(default_factory=dict)  # anchor -> event time
    bytes_sent: int = 0


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1, 50_000) for _ in range(n)]


def simulate(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    hasher = BlockHasher("sha256", args.block_size)
    nodes = [Node(f"n{i:03d}", BlockPool(args.cache_blocks, hasher))
             for i in range(args.nodes)]
    ingresses = [f"ingress-{i}" for i in range(args.ingresses)]
    boards = {name: CacheBoard() for name in ingresses}
    clock = [0.0]
    context = CacheContext(boards[ingresses[0]], TokenTokenizers(), lambda: clock[0])
    policy: Policy = CacheAware(context) if args.policy == "cache_aware" else \
        load_policy(args.policy)
    records = [record(n.session) for n in nodes]
    in_flight = {n.session: 0 for n in nodes}
    by_session = {n.session: n for n in nodes}
    system = tokens(rng, args.system_tokens)
    staleness: list[float] = []
    members = args.nodes + args.ingresses
    ttl = TTL_INTERVALS * max(2.0, 0.5 * members)
    # events: (time, kind, payload); arrivals of new conversations and next turns, and
    # each node's report ticks every 2 s (the schedule decides whether one is due)
    queue: list[tuple[float, int, str, object]] = []
    order = iter(range(10**9))
    rate = args.rate * args.nodes
    t = 0.0
    while t < args.duration:
        t += rng.expovariate(rate / args.turns)  # conversations start at rate / turns
        heapq.heappush(queue, (t, next(order), "turn", Conversation(
            system + tokens(rng, args.turn_tokens), args.turns)))
    for node in nodes:
        heapq.heappush(queue, (rng.uniform(0, 2.0), next(order), "tick", node))
    requests = cached_tokens = prompt_tokens = 0
    while queue:
        now, _, kind, item = heapq.heappop(queue)
        if now > args.duration:
            break
        clock[0] = now
        if kind == "done":
            assert isinstance(item, str)
            in_flight[item] -= 1
            continue
        if kind == "tick":
            assert isinstance(item, Node)
            node = item
            pending = any(node.held.get(i) != (node.index.epoch, node.index.seq)
                          for i in ingresses) and node.index.ready
            due = node.schedule.due(now, members, True, lambda: NodeLoad(in_flight=1),
                                    pending, bool(node.index.anchors))
            if due is not None:
                for name in ingresses:
                    summary = node.index.summary_for(node.held.get(name))
                    cache = summary or (node.index.epoch, node.index.seq)
                    data = encode(node.session, due[0], due[1], cache)
                    node.bytes_sent += len(data)
                    report = decode(data)
                    assert report is not None and report[3] is not None
                    board = boards[name]
                    taken = board.take(node.session, report[3], now, ttl) if not \
                        isinstance(report[3], tuple) else \
                        board.touch(node.session, *report[3], now, ttl)
                    node.held[name] = (node.index.epoch, node.index.seq) if taken else None
                    if taken and name == ingresses[0]:
                        for key in board.nodes[node.session].anchors:
                            at = node.stored_at.pop(key, None)
                            if at is not None:
                                staleness.append(now - at)
            heapq.heappush(queue, (now + 2.0, next(order), "tick", node))
            continue
        assert isinstance(item, Conversation)
        conversation = item
        body = {"prompt": conversation.history}
        # prefix_affinity's key: the prompt's start (512 characters: ~128 tokens)
        pick = Pick("m", " ".join(map(str, conversation.history[:128])), body=body)
        candidates = [Candidate(r, float(in_flight[r.session_id]), 1.0) for r in records]
        chosen = policy.pick(candidates, pick, rng)
        policy.on_start(chosen, pick)
        node = by_session[chosen.session]
        held_before = set(node.pool.held)
        reply = tokens(rng, args.reply_tokens)
        batch = node.pool.serve(conversation.history + reply)
        chain = hasher.chain(conversation.history)
        hit = 0
        for key in chain:
            if key not in held_before:
                break
            hit += 1
        cached_tokens += hit * args.block_size
        # busy for its prefill (what was not cached) and its decode
        service = (len(conversation.history) - hit * args.block_size) / args.prefill_rate \
            + args.reply_tokens * args.decode_s
        in_flight[node.session] += 1
        heapq.heappush(queue, (now + service, next(order), "done", node.session))
        prompt_tokens += len(conversation.history)
        requests += 1
        anchors_before = set(node.index.anchors)
        node.index.apply(batch)
        for key in node.index.anchors:
            if key not in anchors_before:
                node.stored_at[key] = now
        policy.on_end(chosen, pick, "ok")
        conversation.turns_left -= 1
        if conversation.turns_left > 0:
            conversation.history = conversation.history + reply + tokens(rng, args.turn_tokens)
            think = rng.expovariate(1 / args.think_s)
            heapq.heappush(queue, (now + think, next(order), "turn", conversation))
    sent = [n.bytes_sent / args.duration for n in nodes]
    print(f"{args.nodes} serving nodes, {args.ingresses} ingress(es), {args.duration:.0f} s "
          f"simulated, {requests} requests ({requests / args.duration:.1f}/s), block size "
          f"{args.block_size}, cache {args.cache_blocks} blocks a node")
    print(f"  policy {args.policy}: prefix-cache hit rate (tokens) "
          f"{cached_tokens / max(1, prompt_tokens):.1%}")
    print(f"  report interval: {max(2.0, 0.5 * members):.1f} s")
    print(f"  bytes/s per serving node, all reports to {args.ingresses} ingress(es): "
          f"mean {statistics.mean(sent):.0f}, max {max(sent):.0f} "
          f"({statistics.mean(sent) / args.ingresses:.0f} per ingress)")
    anchors = [len(n.index.anchors) for n in nodes]
    print(f"  anchors advertised per node at the end: mean {statistics.mean(anchors):.0f}, "
          f"max {max(anchors)} (blocks held: mean "
          f"{statistics.mean(len(n.pool.held) for n in nodes):.0f})")
    if staleness:
        ordered = sorted(staleness)
        print(f"  staleness (engine event -> ingress board), {len(ordered)} blocks: "
              f"p50 {ordered[len(ordered) // 2]:.1f} s, "
              f"p99 {ordered[int(len(ordered) * 0.99)]:.1f} s, max {ordered[-1]:.1f} s")


def decision(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    hasher = BlockHasher("sha256", args.block_size)
    board = CacheBoard()
    n = args.decision_nodes
    prompt = tokens(rng, args.prompt_tokens)
    chain = hasher.chain(prompt)
    holders = set(rng.sample(range(n), 3))
    for i in range(n):
        keys = [rng.getrandbits(64) for _ in range(args.anchors_per_node)]
        if i in holders:  # three nodes hold this prompt's first half
            half = len(chain) // 2
            keys += [chain[d - 1] for d in anchor_depths(half)]
        from otela.kvcache.index import Summary
        board.take(f"n{i:04d}", Summary(1, 1, None, tuple(keys), (), args.block_size,
                                        "sha256"), 0.0, 1e9)
    context = CacheContext(board, TokenTokenizers(), lambda: 1.0)
    policy = CacheAware(context)
    candidates = [Candidate(record(f"n{i:04d}"), float(rng.randrange(4)), 1.0)
                  for i in range(n)]
    body = {"prompt": prompt}

    def timed(fn: object, loops: int) -> float:
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(loops):
                fn()  # type: ignore[operator]
            best = min(best, (time.perf_counter() - start) / loops)
        return best * 1e6

    warm = Pick("m", None, body=body)
    policy.pick(candidates, warm, rng)  # hashes once: the memo holds the anchors
    decide = timed(lambda: policy.pick(candidates, warm, rng), 200)
    assert int(policy.pick(candidates, warm, rng).session[1:]) in holders
    full = timed(lambda: policy.pick(candidates, Pick("m", None, body=body), rng), 100)
    hashing = timed(lambda: hasher.chain(prompt), 100)  # its blocks remembered
    cold = timed(lambda: BlockHasher("sha256", args.block_size).chain(prompt), 20)
    p2c = PowerOfTwo()
    two = timed(lambda: p2c.pick(candidates, warm, rng), 2000)
    print(f"decision at {n} nodes, {args.anchors_per_node} anchors each "
          f"({len(board._holders)} fingerprints indexed):")
    print(f"  cache_aware pick, request already hashed: {decide:.1f} us "
          f"(power_of_two: {two:.1f} us)")
    print(f"  hashing a {args.prompt_tokens}-token prompt ({len(chain)} blocks): "
          f"{cold:.1f} us new, {hashing:.1f} us seen before; hashing (seen) + pick: "
          f"{full:.1f} us")


def main(argv: Iterator[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--ingresses", type=int, default=1)
    parser.add_argument("--duration", type=float, default=600.0, help="simulated seconds")
    parser.add_argument("--rate", type=float, default=2.0, help="requests/s per node")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--cache-blocks", type=int, default=20_000)
    parser.add_argument("--system-tokens", type=int, default=400)
    parser.add_argument("--turn-tokens", type=int, default=150)
    parser.add_argument("--reply-tokens", type=int, default=200)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--think-s", type=float, default=30.0)
    parser.add_argument("--prefill-rate", type=float, default=5000.0, help="tokens/s")
    parser.add_argument("--decode-s", type=float, default=0.02, help="s per output token")
    parser.add_argument("--decision-nodes", type=int, default=1000)
    parser.add_argument("--anchors-per-node", type=int, default=2000)
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--policy", default="cache_aware",
                        help="the simulation's routing: cache_aware, power_of_two, ...")
    parser.add_argument("--skip-simulation", action="store_true")
    parser.add_argument("--skip-decision", action="store_true")
    args = parser.parse_args(list(argv) if argv is not None else None)
    if not args.skip_simulation:
        simulate(args)
    if not args.skip_decision:
        decision(args)


if __name__ == "__main__":
    main()

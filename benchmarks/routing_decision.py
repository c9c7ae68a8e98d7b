"""The ingress's routing decision at federation sizes this machine cannot run as processes:
how long ``Router`` takes to turn a request into a node, before anything is sent.

What is timed is what every request pays between its headers being read and its
connection being opened: ``Router.nodes_for`` (the registry's SERVING candidates for the
model, then trust, suspicion, requirements and ejections) and ``Router.choose`` (each
candidate as the policy sees it, then the policy's pick). The router is otela's own,
with a registry of ``--nodes`` SERVING records (four providers), a load report from every
node, and for ``cache_aware`` a board holding every node's cache summary
(``--anchors-per-node`` fingerprints each; three nodes hold half the request's prompt).
The request's blocks are hashed once beforehand (hashing and tokenizing cost per request
whatever the federation's size: ``benchmarks/cache_scale.py`` measures them).

Cases: ``open`` (no trust set, nothing suspected), ``trusted`` (the caller trusts two of
the four providers), ``suspect`` (the failure detector suspects one node), and for
``cache_aware`` a request no node has cached (``miss``: its fallback decides).

Run: ``python benchmarks/routing_decision.py [--nodes 10 100 1000]`` (under a minute).
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable, Iterator

from otela.kvcache.anchors import anchor_depths
from otela.kvcache.hashing import BlockHasher
from otela.kvcache.index import Summary
from otela.registry.crdt import Entry, tiebreak_of
from otela.registry.records import Lifecycle, ModelInfo, NodeRecord
from otela.registry.session import session_id_for
from otela.registry.store import Registry
from otela.routing.ask import Ask
from otela.routing.cache_aware import CacheAware
from otela.routing.load import NodeLoad
from otela.routing.policies import Pick, Policy
from otela.routing.router import Router, routing_settings
from otela.routing.trust import ANY

PROVIDERS = ("a", "b", "c", "d")
POLICIES = ("random", "power_of_two", "least_in_flight", "prefix_affinity", "cache_aware")
BLOCK = 16


def session(i: int) -> str:
    """Node ``i``'s session id (owned by its peer, as every session id must be)."""
    return session_id_for(f"peer-{i:06d}", f"000000{i:010x}")


def _entry(i: int) -> Entry:
    record = NodeRecord(
        session_id=session(i), peer_id=f"peer-{i:06d}", provider_id=PROVIDERS[i % 4],
        state=Lifecycle.SERVING, version=1, http_url=f"http://10.0.{i // 250}.{i % 250}:8000",
        models=(ModelInfo("m"),), updated_at=1000.0)
    entry = Entry(key=record.session_id, state=record.state, version=1, updated_at=1000.0,
                  tiebreak=tiebreak_of(record.session_id.encode()), record=record)
    object.__setattr__(entry, "proof", entry)  # unsigned: a pure registry, as in unit tests
    return entry


class _NoUpstreams:
    """Nothing is sent: only the decision is timed."""

    def self_session(self) -> None:
        return None


def build(nodes: int, anchors_per_node: int, rng: random.Random
          ) -> tuple[Router, list[int], set[str], list[str]]:
    """A router over ``nodes`` SERVING nodes with load reports and cache summaries; the
    request's prompt; the sessions holding half of it; the suspected peers (one)."""
    registry = Registry()
    for i in range(nodes):
        registry.apply(_entry(i), 1000.0)
    suspected = [f"peer-{rng.randrange(nodes):06d}"]
    now = 1000.0
    router = Router(registry, _NoUpstreams(), routing_settings(),  # type: ignore[arg-type]
                    rng=random.Random(rng.random()), clock=lambda: now,
                    suspected=lambda: frozenset(suspected))
    for i in range(nodes):
        router.loads.report(session(i), NodeLoad(in_flight=rng.randrange(4), running=None,
                                                   waiting=None, kv_usage=None,
                                                   capacity=1.0), now, ttl=1e9)
    prompt = [rng.randrange(1, 50_000) for _ in range(2000)]
    chain = BlockHasher("sha256", BLOCK).chain(prompt)
    holders = {session(i) for i in rng.sample(range(nodes), min(3, nodes))}
    for i in range(nodes):
        node = session(i)
        keys = [rng.getrandbits(64) for _ in range(anchors_per_node)]
        if node in holders:
            keys += [chain[d - 1] for d in anchor_depths(len(chain) // 2)]
        router.take_cache(node, Summary(1, 1, None, tuple(keys), (), BLOCK, "sha256"),
                          1e9)
    return router, prompt, holders, suspected


def per_decision(router: Router, policy: Policy, ask: Ask, pick: Pick, loops: int
                 ) -> float:
    """Microseconds of this thread's CPU per decision (the machine may be shared): the
    best of five runs' means."""
    now = router.clock()

    def decide() -> None:
        router.choose(router.nodes_for("m", ask, now), policy, pick, now)

    best = float("inf")
    for _ in range(5):
        start = time.thread_time()
        for _ in range(loops):
            decide()
        best = min(best, (time.thread_time() - start) / loops)
    return best * 1e6


def measure(nodes: int, anchors_per_node: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    router, prompt, holders, _ = build(nodes, anchors_per_node, rng)
    loops = max(20, 20_000 // nodes)
    open_ask = Ask(ANY, body=b"{}")
    trusted = Ask(ANY.narrowed(frozenset(PROVIDERS[:2]), "X-Otela-Providers"), body=b"{}")
    results: dict[str, float] = {}
    suspect: Callable[[], frozenset[str]] = router.suspected
    for name in POLICIES:
        policy = router.policy_for(name)
        body = {"prompt": prompt}
        pick = Pick("m", "user-17", body=body if name == "cache_aware" else None)
        if name == "cache_aware":
            assert isinstance(policy, CacheAware) and policy.context is not None
            policy.context.tokenizers = _PromptIds()  # type: ignore[assignment]
            chosen = router.choose(router.nodes_for("m", open_ask, 1000.0), policy, pick,
                                   1000.0)
            assert chosen.session in holders, "the benchmark's holders must win"
            other = Pick("m", "user-17", body={"prompt": [7] * 2000})
            results[f"{name} miss"] = per_decision(router, policy, open_ask, other, loops)
        router.suspected = frozenset
        results[f"{name} open"] = per_decision(router, policy, open_ask, pick, loops)
        results[f"{name} trusted"] = per_decision(router, policy, trusted, pick, loops)
        router.suspected = suspect
        results[f"{name} suspect"] = per_decision(router, policy, open_ask, pick, loops)
    return results


class _PromptIds:
    """Requests carry their token ids (``prompt`` as a list): no tokenizer needed."""

    def for_model(self, model: str) -> _PromptIds:
        return self

    def prompt_ids(self, body: dict[str, object]) -> list[int] | None:
        prompt = body.get("prompt")
        return prompt if isinstance(prompt, list) else None


def main(argv: Iterator[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--anchors-per-node", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(list(argv) if argv is not None else None)
    table = {n: measure(n, args.anchors_per_node, args.seed) for n in args.nodes}
    cases = list(next(iter(table.values())))
    print("routing decision, us (nodes_for + choose; best of 5 means)")
    print(f"{'case':28}" + "".join(f"{n:>10,}" for n in args.nodes))
    for case in cases:
        print(f"{case:28}" + "".join(f"{table[n][case]:10.1f}" for n in args.nodes))


if __name__ == "__main__":
    main()

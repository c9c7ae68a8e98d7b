"""The scale scenarios of issue 38, each a function of a seeded ``World`` returning figures.

Every scenario starts from a converged federation (``World.seed_state``), lets it settle,
then measures: idle bytes, a registry change's convergence, churn, a crash's time to LEFT
everywhere, a partitioned region's heal, a joiner's time and bytes to a full replica,
load reports at an ingress, and false suspicions/evictions under loss and pauses.
``benchmarks/mesh_scale.py`` runs them and prints the tables of docs/scale.md.
"""

from __future__ import annotations

import statistics
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from otela.registry.records import Lifecycle, ModelInfo
from otela.registry.store import Registry
from otela.routing.load import NodeLoad
from simulator.mesh.world import Watched, World

SETTLE_S = 20.0
ENGINE_S = 3.0  # a joiner's engine loading before it announces SERVING
THIN = {"memory", "thin_joiner", "thin_change"}  # scenarios that need only World.seed_thin


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else 0.0


def _bytes(world: World, window: float, nodes: list[int] | None = None) -> dict[str, float]:
    stats = world.net.stats
    chosen = nodes if nodes is not None else world.alive_nodes()
    rates = [stats.moved(i) / window for i in chosen]
    return {"median_Bps": statistics.median(rates) if rates else 0.0,
            "max_Bps": max(rates, default=0.0)}


def breakdown(world: World, window: float) -> dict[str, Any]:
    """Where the bytes went: per kind of message, bytes moved (sent plus received) per
    node per second, averaged over the live nodes; and per message gossiped on the
    registry topic, how many copies a node received (the first and the duplicates)."""
    alive = max(1, len(world.alive_nodes()))
    gossip = world.gossip
    kinds = {kind: round(2 * wire / alive / window, 1)
             for kind, wire in sorted(world.net.stats.by_kind.items())}
    copies = gossip.firsts + gossip.duplicates
    sent = gossip.payload_bytes + gossip.envelope_bytes
    return {"Bps_per_node_by_kind": kinds,
            "gossip_copies_per_first": round(copies / max(1, gossip.firsts), 2),
            "gossip_payload_share": round(gossip.payload_bytes / max(1, sent), 3),
            **({"tree_prunes": gossip.prunes, "tree_grafts": gossip.grafts}
               if gossip.tree else {})}


def _convergence(watched: Watched, alive: list[int]) -> dict[str, float]:
    delays = [watched.applied[i] - watched.at for i in alive if i in watched.applied]
    return {"reached": len(delays) / max(1, len(alive)), "p50_s": percentile(delays, 0.5),
            "p99_s": percentile(delays, 0.99), "max_s": max(delays, default=float("inf"))}


def idle(world: World, window: float = 60.0) -> dict[str, Any]:
    world.loop.run_until(world.loop.now + SETTLE_S)
    world.net.stats.reset()
    cpu = time.process_time()
    world.loop.run_until(world.loop.now + window)
    cpu = time.process_time() - cpu
    out = _bytes(world, window)
    # the simulator's own speed once the federation is built and settled (issue 38's goal:
    # 10,000 nodes x 600 s in 600 s of CPU is 10,000 node-seconds per CPU second)
    out["window_cpu_s"] = round(cpu, 2)
    out["node_s_per_cpu_s"] = round(len(world.alive_nodes()) * window / max(cpu, 1e-9))
    ingresses = [n.index for n in world.nodes if n.ingress]
    if ingresses:
        out["ingress_Bps"] = _bytes(world, window, ingresses)["max_Bps"]
    relays = range(world.net.config.relays if any(world.net.nat) else 0)
    if relays:  # its own traffic plus what it carries for the nodes behind NAT
        stats = world.net.stats
        out["relay_Bps"] = max((stats.moved(r) + stats.relayed[r]) / window for r in relays)
    out["cpu_per_node_pct"] = 100 * statistics.median(
        world.net.stats.busy[i] for i in world.alive_nodes()) / window
    return out


def change(world: World, count: int = 3, gap: float = 10.0) -> dict[str, Any]:
    """A node changes its state and model list; every replica's arrival time (pooled
    over ``count`` changes, as ``benchmarks/convergence.py`` pools them)."""
    world.loop.run_until(world.loop.now + SETTLE_S)
    delays: list[float] = []
    reached = 1.0
    for k in range(count):
        node = world.nodes[world.rng.choice(world.alive_nodes())]
        node.announce(models=(ModelInfo(f"model-{k}"), ModelInfo("model-a")))
        watched = world.watch_change(node.index)
        world.loop.run_until(world.loop.now + gap)
        reached = min(reached, _arrivals(watched, world.alive_nodes(), delays))
    return _pooled(delays, reached)


def change_join(world: World, count: int = 3, engine_s: float = 3.0,
                gap: float = 20.0) -> dict[str, Any]:
    """``benchmarks/convergence.py``'s change: a new node joins through the bootstrap
    node (node 0) and announces SERVING once its engine loaded (``engine_s``); every
    other replica's arrival time of that version, pooled over ``count`` joiners."""
    world.loop.run_until(world.loop.now + SETTLE_S)
    delays: list[float] = []
    reached = 1.0
    for k in range(count):
        node = world.join(0, models=(f"model-{k}",), serve_after=engine_s)
        world.loop.run_until(world.loop.now + engine_s + 1e-6)
        watched = world.watch_change(node.index)
        world.loop.run_until(world.loop.now + gap)
        reached = min(reached, _arrivals(watched, world.alive_nodes(), delays))
    return _pooled(delays, reached)


def _arrivals(watched: Watched, alive: list[int], into: list[float]) -> float:
    """Add each other replica's delay to ``into``; the share of replicas reached."""
    others = [i for i in alive if i != watched_origin(watched)]
    got = [watched.applied[i] - watched.at for i in others if i in watched.applied]
    into.extend(got)
    return len(got) / max(1, len(others))


def watched_origin(watched: Watched) -> int:
    """The node whose change is watched: the one that applied it at the moment it was
    made."""
    return next((i for i, t in watched.applied.items() if t == watched.at), -1)


def _pooled(delays: list[float], reached: float) -> dict[str, Any]:
    return {"p50_s": percentile(delays, 0.5), "p95_s": percentile(delays, 0.95),
            "p99_s": percentile(delays, 0.99), "max_s": max(delays, default=float("inf")),
            "reached": reached}


def rechurn(world: World, churners: int = 10, every: float = 3.0,
            window: float = 15.0) -> dict[str, Any]:
    """``benchmarks/convergence.py``'s churn: ``churners`` nodes re-sign and gossip a new
    record version every ``every`` seconds. Also how long the versions made in the window
    took to reach every replica (pooled; those of its last ``every`` seconds excluded,
    still spreading when it ends)."""
    world.loop.run_until(world.loop.now + SETTLE_S)
    chosen = world.rng.sample(world.alive_nodes(), churners)
    changes: list[Watched] = []

    def tick() -> None:
        for index in chosen:
            node = world.nodes[index]
            if node.alive:
                node.announce()
                changes.append(world.watch_change(index))
        world.loop.after(every, tick)

    tick()
    world.loop.run_until(world.loop.now + every)
    world.net.stats.reset()
    world.gossip.reset_counts()
    start = world.loop.now
    world.loop.run_until(start + window)
    out = _bytes(world, window)
    out["false_evictions"] = world.false_evictions
    alive = world.alive_nodes()
    delays: list[float] = []
    timed = [c for c in changes if start <= c.at <= world.loop.now - every]
    reached = min((_arrivals(c, alive, delays) for c in timed), default=1.0)
    out.update({f"change_{k}": v for k, v in _pooled(delays, reached).items()})
    out.update(breakdown(world, window))
    return out


def churn(world: World, minutes: float = 3.0, rate: float = 0.01) -> dict[str, Any]:
    """``rate`` of the nodes leave and as many join per minute, spread evenly."""
    world.loop.run_until(world.loop.now + SETTLE_S)
    size = len(world.alive_nodes())
    per_minute = max(1, round(rate * size))
    gap = 60.0 / per_minute
    joins: list[Watched] = []

    def step() -> None:
        alive = world.alive_nodes()
        leaver = world.rng.choice([i for i in alive if not world.nodes[i].ingress])
        world.leave(leaver)
        joiner = world.join(world.rng.choice(alive), serve_after=ENGINE_S)
        joins.append(world.watch_change(joiner.index))
        world.loop.after(gap, step)

    world.net.stats.reset()
    world.gossip.reset_counts()
    start = world.loop.now
    world.loop.after(gap / 2, step)
    world.loop.run_until(start + 60.0 * minutes)
    window = world.loop.now - start
    out = _bytes(world, window)
    settled = [j for j in joins if world.loop.now - j.at > 10]
    alive = world.alive_nodes()
    conv = [_convergence(j, [i for i in alive if i < j.population]) for j in settled]
    out["join_p99_s"] = max((c["p99_s"] for c in conv), default=0.0)
    out["join_reached"] = min((c["reached"] for c in conv), default=1.0)
    out["false_evictions"] = world.false_evictions
    out["false_suspicions"] = world.false_suspicions
    out.update(breakdown(world, window))
    return out


def kill(world: World) -> dict[str, Any]:
    """SIGKILL one node: when every survivor holds its session LEFT."""
    world.loop.run_until(world.loop.now + SETTLE_S)
    victim = world.rng.choice([i for i in world.alive_nodes() if not world.nodes[i].ingress])
    left = world.watch_left(victim)
    world.kill(victim)
    world.loop.run_until(world.loop.now + 60.0)
    alive = world.alive_nodes()
    conv = _convergence(left, alive)
    # As benchmarks/failure_detection.py reads it: a survivor's first "suspected" or
    # "confirmed" event for the victim (its routing drops it then), or LEFT if earlier.
    name = world.nodes[victim].peer_id
    excluded = []
    for i in alive:
        times = [e["at"] for e in world.nodes[i].events.events if e["peer_id"] == name
                 and e["event"] in ("suspected", "confirmed") and e["at"] >= left.at]
        if i in left.applied:
            times.append(left.applied[i])
        if times:
            excluded.append(min(times) - left.at)
    return {"excluded_p50_s": percentile(excluded, 0.5),
            "excluded_max_s": max(excluded, default=float("inf")),
            "left_p50_s": conv["p50_s"], "left_p99_s": conv["p99_s"],
            "left_max_s": conv["max_s"], "reached": conv["reached"]}


def agreement(world: World) -> bool:
    roots = {world.nodes[i].registry.map.digest_root() for i in world.alive_nodes()}
    return len(roots) == 1


def live_suspicions(world: World) -> int:
    """(node, suspect) pairs where a live node holds a live member suspected or confirmed:
    each one an eviction that may still come."""
    alive = {world.nodes[i].peer_id for i in world.alive_nodes()}
    return sum(len(world.nodes[i].table.unhealthy & alive) for i in world.alive_nodes())


def partition(world: World, share: float = 0.1, cut_for: float = 60.0,
              limit: float = 120.0) -> dict[str, Any]:
    """A region (``share`` of the sites) is cut off, then healed: how long until every
    replica agrees again and no live node suspects another, and what the cut cost.

    The majority side evicting the cut nodes during the cut is the design; the figures
    that should be zero are ``majority_nodes_evicted`` (the cut-off minority evicting
    live members of the majority it cannot reach: each one a live node made LEFT on every
    replica at the heal) and ``evictions_after_heal`` (of anyone, once all can reach all).
    """
    world.loop.run_until(world.loop.now + SETTLE_S)
    sites = sorted(set(world.net.site))
    region = set(sites[: max(1, round(share * len(sites)))])
    cut = {i for i in world.alive_nodes() if world.net.site[i] in region}
    world.partition(cut)
    world.loop.run_until(world.loop.now + cut_for)
    during = list(world.evictions)
    cut_ids = {world.nodes[i].peer_id for i in cut}
    world.heal()
    healed = world.loop.now
    agreed: float | None = None
    while world.loop.now - healed < limit:
        world.loop.run_until(world.loop.now + 0.5)
        if agreed is None and agreement(world):
            agreed = world.loop.now - healed
        if agreed is not None and live_suspicions(world) == 0:
            break
    settled = agreed is not None and live_suspicions(world) == 0
    return {"cut": len(cut), "cut_for_s": cut_for, "evictions_signed": len(during),
            "cut_nodes_evicted": len({peer for _, _, peer in during if peer in cut_ids}),
            "majority_nodes_evicted": len({peer for _, _, peer in during
                                           if peer not in cut_ids}),
            "evictions_after_heal": len(world.evictions) - len(during),
            "agree_after_heal_s": agreed,
            "settled_after_heal_s": world.loop.now - healed if settled else None,
            "live_suspicions_left": live_suspicions(world)}


def joiner(world: World, bootstrap: int | None = None) -> dict[str, Any]:
    """A new node joins through one peer: time and bytes to a full replica."""
    world.loop.run_until(world.loop.now + SETTLE_S)
    chosen = world.rng.choice(world.alive_nodes()) if bootstrap is None else bootstrap
    target = len(world.nodes[chosen].registry.map)
    node = world.join(chosen)
    start = world.loop.now
    world.net.stats.reset()
    while len(node.registry.map) < target and world.loop.now - start < 60:
        world.loop.run_until(world.loop.now + 0.05)
    return {"full_replica_s": world.loop.now - start,
            "bytes": world.net.stats.moved(node.index), "entries": len(node.registry.map)}


def flaky(world: World, minutes: float = 5.0, pause_s: float = 0.2,
          pauses_per_node_min: float = 1.0) -> dict[str, Any]:
    """Idle under the network's loss with every node pausing ``pause_s`` about
    ``pauses_per_node_min`` times a minute: false suspicions and evictions per node-hour."""
    world.loop.run_until(world.loop.now + SETTLE_S)
    size = len(world.alive_nodes())
    gap = 60.0 / (pauses_per_node_min * size)

    def pause() -> None:
        world.pause(world.rng.choice(world.alive_nodes()), pause_s)
        world.loop.after(world.rng.expovariate(1 / gap), pause)

    suspicions, evictions = world.false_suspicions, world.false_evictions
    pause()
    world.loop.run_until(world.loop.now + 60.0 * minutes)
    node_hours = size * minutes / 60.0
    return {"false_suspicions_per_node_hour": (world.false_suspicions - suspicions) / node_hours,
            "false_evictions_per_node_hour": (world.false_evictions - evictions) / node_hours}


def load_reports(world: World, window: float = 60.0) -> dict[str, Any]:
    """Every node's load changes all the time and it reports to the ingress."""
    world.loop.run_until(world.loop.now + SETTLE_S)

    def load(index: int, now: float) -> NodeLoad:
        return NodeLoad(in_flight=int(now * 7 + index) % 5)

    world.report_loads(load)
    world.loop.run_until(world.loop.now + 10)
    world.report_bytes.clear()
    world.loop.run_until(world.loop.now + window)
    return {"ingress_report_Bps": max(world.report_bytes.values(), default=0) / window}


def thin_joiner(world: World) -> dict[str, Any]:
    """``joiner`` in a ``World.seed_thin`` federation: only its bootstrap peer (node 0)
    holds the full replica, so it runs at sizes whose full replicas do not fit."""
    return joiner(world, bootstrap=0)


def thin_change(world: World) -> dict[str, Any]:
    """``change`` in a ``World.seed_thin`` federation: a record change's spread through
    the GossipSub mesh, each replica holding little else (no probes running). Checked
    against ``change`` at 1,000 nodes (docs/scale.md)."""
    return change(world)


def replica_memory(world: World) -> dict[str, Any]:
    """Bytes a replica of this federation's registry holds (Python's own allocations)."""
    envelopes = [e.proof for e in world.nodes[0].registry.map]
    node = world.nodes[0]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    registry = Registry()
    for envelope in envelopes:
        entry = world.verify(envelope, node.replica.trust, world.wall())
        registry.apply(entry, world.wall())
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return {"entries": len(registry.map), "bytes_per_replica": used}


SCENARIOS: dict[str, Callable[..., dict[str, Any]]] = {
    "idle": idle, "change": change, "change_join": change_join, "rechurn": rechurn,
    "churn": churn, "kill": kill,
    "partition": partition, "joiner": joiner, "flaky": flaky, "load": load_reports,
    "memory": replica_memory, "thin_joiner": thin_joiner, "thin_change": thin_change,
}

__all__ = ["SCENARIOS", "Lifecycle"]

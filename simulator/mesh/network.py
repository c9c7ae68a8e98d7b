"""The simulated network and hosts: latency classes, TCP-style loss, bandwidth, partitions,
NAT through relays, pauses, and CPU.

Latency: every node sits at a site, every site on a continent; a link's base one-way
latency is drawn once per pair (lognormal around the class median: same site, same
continent, intercontinental) and each message adds a little jitter. Loss: messages travel
on TCP connections, so a lost segment is a retransmission, not a lost message: it arrives
a retransmission timeout late (200 ms + the round trip, doubling if lost again). A plain
TCP connect that loses its SYN waits 1 s. Bandwidth: each node's uplink serialises what it
sends. Partitions: a set of nodes cut off from the rest (nothing crosses, both ways).
NAT: a node behind NAT is reached through its relay (both legs' latency; the relay counts
the bytes). Pauses: a paused node handles nothing until it resumes (SIGSTOP, a GC pause);
its peers' TCP stacks still accept what they send. CPU: each host has cores; a node's
work (a message handled, a signature checked) queues for the earliest free core, so many
nodes on a 2-core host slow each other down as the real-process benchmarks do.
Bytes are counted per node, sent plus received, as the kernel's TCP payload counters
count them (``benchmarks/fedbench.py``).
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from simulator.mesh.loop import Loop

# Per-frame overhead on a libp2p connection: Noise (2-byte length + 16-byte tag) and a
# Yamux header (12 bytes).
FRAME_OVERHEAD = 30
HANDSHAKE_BYTES = 3_000  # a new connection: TCP, Noise XX, multistream, Yamux, identify, hellos


@dataclass
class NetConfig:
    """The network's shape and costs (defaults: one continent of sites)."""

    continents: int = 1
    sites_per_continent: int = 10
    same_site_s: float = 0.0005
    same_continent_s: float = 0.015
    intercontinental_s: float = 0.080
    spread: float = 0.35  # lognormal sigma of a pair's base latency around its class median
    jitter: float = 0.05  # per-message jitter, as a share of the base latency
    loss: float = 0.0
    rto_s: float = 0.2  # Linux's minimum retransmission timeout
    uplink_bytes_s: float = 125e6  # 1 Gbit/s
    nat_share: float = 0.0  # share of nodes behind NAT, reached through a relay
    relays: int = 0  # the first this many nodes are public relays
    cores_per_host: int = 1
    nodes_per_host: int = 1  # >1: several nodes share a host's cores (calibration)
    # CPU per unit of work, seconds (py-libp2p measured on this machine; docs/scale.md).
    cpu_frame_s: float = 0.0004  # a framed message on a standing stream, each side
    # A GossipSub message handled (decode, validate, forward): 3-10 ms measured per node
    # (shared/reference); 6 ms fits the 64-node real-process convergence (docs/scale.md).
    cpu_gossip_s: float = 0.006
    # An envelope ingested by anti-entropy: decode, Ed25519 verification (84 us alone),
    # merge and view (ReplicaCore.ingest, 238 us measured on this machine under load).
    cpu_verify_s: float = 200e-6
    cpu_connect_s: float = 0.02  # a new libp2p connection, each side
    cpu_wake_s: float = 0.0001  # a task's timer firing (trio's scheduler, a checkpoint)
    # The daemon's own idle work per second beyond the messages modelled (GossipSub's
    # heartbeat, timers, the loop-lag sampler): 0.6-0.9 % of a core per idle node in the
    # real-process benchmarks (docs/mesh.md), less the ~0.1 % the probes account for.
    cpu_background_s: float = 0.006


@dataclass
class Host:
    cores: list[float]  # when each core is free again


@dataclass
class NetStats:
    sent: Counter[int] = field(default_factory=Counter)
    received: Counter[int] = field(default_factory=Counter)
    by_kind: Counter[str] = field(default_factory=Counter)
    relayed: Counter[int] = field(default_factory=Counter)  # bytes a relay carried
    busy: defaultdict[int, float] = field(default_factory=lambda: defaultdict(float))  # CPU s

    def reset(self) -> None:
        for counter in (self.sent, self.received, self.by_kind, self.relayed, self.busy):
            counter.clear()

    def moved(self, node: int) -> int:
        return self.sent[node] + self.received[node]


class Network:
    def __init__(self, loop: Loop, config: NetConfig, size: int, rng: random.Random) -> None:
        self.loop = loop
        self.config = config
        self.rng = rng
        self.stats = NetStats()
        sites = config.continents * config.sites_per_continent
        self.site = [rng.randrange(sites) for _ in range(size)]
        self.nat = [False] * size
        self.relay_of = [-1] * size
        self.hosts: list[Host] = []
        self.host_of: list[int] = []
        self.paused_until = [0.0] * size
        self.cut: set[int] = set()  # one side of a partition
        self.partitioned = False
        self._base: dict[tuple[int, int], float] = {}
        self._uplink_free = [0.0] * size
        for node in range(size):
            self.add_node(node, initial=True)

    def add_node(self, node: int, initial: bool = False) -> None:
        """Place a node (a joiner gets the next index)."""
        config = self.config
        if not initial:
            self.site.append(self.rng.randrange(config.continents * config.sites_per_continent))
            self.nat.append(False)
            self.relay_of.append(-1)
            self.paused_until.append(0.0)
            self._uplink_free.append(0.0)
        if node >= config.relays and config.relays and self.rng.random() < config.nat_share:
            self.nat[node] = True
            self.relay_of[node] = self.rng.randrange(config.relays)
        if node % config.nodes_per_host == 0:
            self.hosts.append(Host([0.0] * config.cores_per_host))
        self.host_of.append(len(self.hosts) - 1)

    # -- latency -------------------------------------------------------------------------

    def base_latency(self, a: int, b: int) -> float:
        key = (a, b) if a < b else (b, a)
        cached = self._base.get(key)
        if cached is not None:
            return cached
        config = self.config
        sa, sb = self.site[a], self.site[b]
        if sa == sb:
            median = config.same_site_s
        elif sa // config.sites_per_continent == sb // config.sites_per_continent:
            median = config.same_continent_s
        else:
            median = config.intercontinental_s
        # Drawn from the pair's own hash: the same whichever order pairs are first used in.
        h = int.from_bytes(hashlib.blake2b(f"{key}".encode(), digest_size=8).digest(), "big")
        u = (h + 0.5) / 2**64
        z = math.sqrt(2) * _erfinv(2 * u - 1)
        value = median * math.exp(config.spread * z)
        self._base[key] = value
        return value

    def one_way(self, a: int, b: int) -> float:
        """A message's one-way delay from ``a`` to ``b`` now, through a relay if either
        end is behind NAT, with retransmissions for lost segments."""
        if self.nat[a] or self.nat[b]:
            relay = self.relay_of[b] if self.nat[b] else self.relay_of[a]
            delay = self.base_latency(a, relay) + self.base_latency(relay, b)
        else:
            delay = self.base_latency(a, b)
        delay *= 1 + self.config.jitter * self.rng.random()
        loss = self.config.loss
        if loss:
            rto = self.config.rto_s + 2 * delay
            while self.rng.random() < loss:
                delay += rto
                rto *= 2
        return delay

    def blocked(self, a: int, b: int) -> bool:
        if not self.partitioned:
            return False
        return (a in self.cut) != (b in self.cut)

    # -- sending and CPU -----------------------------------------------------------------

    def send(self, a: int, b: int, size: int, kind: str, deliver: Callable[..., Any],
             *args: Any) -> bool:
        """Send ``size`` payload bytes from ``a`` to ``b`` on an open connection; call
        ``deliver(*args)`` at ``b`` when it arrives and ``b`` has handled it. False if
        the network cut it (a partition)."""
        if self.blocked(a, b):
            return False
        wire = size + FRAME_OVERHEAD
        stats = self.stats
        stats.sent[a] += wire
        stats.received[b] += wire
        stats.by_kind[kind] += wire
        if self.nat[a] or self.nat[b]:
            stats.relayed[self.relay_of[b] if self.nat[b] else self.relay_of[a]] += 2 * wire
        now = self.loop.now
        start = max(now, self._uplink_free[a])
        self._uplink_free[a] = start + wire / self.config.uplink_bytes_s
        arrive = self._uplink_free[a] + self.one_way(a, b)
        self.loop.at(arrive, self.handle, b, self.config.cpu_frame_s, deliver, args)
        return True

    def handle(self, node: int, cost: float, callback: Callable[..., Any],
               args: tuple[Any, ...]) -> None:
        """Run ``callback`` at ``node`` once it is running and a core has done ``cost``."""
        now = self.loop.now
        resume = self.paused_until[node]
        if resume > now:
            self.loop.at(resume, self.handle, node, cost, callback, args)
            return
        if cost <= 0:
            callback(*args)
            return
        done = self.charge(node, cost)
        if done <= now:
            callback(*args)
        else:
            self.loop.at(done, callback, *args)

    def charge(self, node: int, cost: float) -> float:
        """Queue ``cost`` seconds of ``node``'s work on its host's cores; when it is done."""
        cores = self.hosts[self.host_of[node]].cores
        index = min(range(len(cores)), key=cores.__getitem__) if len(cores) > 1 else 0
        start = max(self.loop.now, cores[index])
        cores[index] = start + cost
        self.stats.busy[node] += cost
        return start + cost


def _erfinv(y: float) -> float:
    """Inverse error function (Giles' approximation, ample for drawing latencies)."""
    y = max(-0.999999, min(0.999999, y))
    w = -math.log((1.0 - y) * (1.0 + y))
    if w < 5.0:
        w -= 2.5
        p = 2.81022636e-08
        for c in (3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                  -0.00125372503, -0.00417768164, 0.246640727, 1.50140941):
            p = c + p * w
    else:
        w = math.sqrt(w) - 3.0
        p = -0.000200214257
        for c in (0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
                  -0.0076224613, 0.00943887047, 1.00167406, 2.83297682):
            p = c + p * w
    return p * y

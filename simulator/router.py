"""Routing policies that pick a replica for each arriving request."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from simulator.engine import Replica


class Router(Protocol):
    """Chooses the index of the replica that serves request `rid`."""

    def choose(self, replicas: list[Replica], rid: int) -> int: ...


class RoundRobin:
    def __init__(self) -> None:
        self.i = -1

    def choose(self, replicas: list[Replica], rid: int) -> int:
        self.i = (self.i + 1) % len(replicas)
        return self.i


class Random:
    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def choose(self, replicas: list[Replica], rid: int) -> int:
        return int(self.rng.integers(len(replicas)))


class LeastOutstanding:
    """Fewest queued + running requests (upstream OpenTela's shortest-queue)."""

    def choose(self, replicas: list[Replica], rid: int) -> int:
        return min(range(len(replicas)), key=lambda i: (replicas[i].outstanding, i))


class MostFreeKV:
    """Replica with the largest free KV-cache fraction; ties broken by queue length."""

    def choose(self, replicas: list[Replica], rid: int) -> int:
        return max(
            range(len(replicas)),
            key=lambda i: (replicas[i].kv_free_fraction - 0.01 * len(replicas[i].waiting), -i),
        )


ROUTERS = ("round_robin", "random", "least_outstanding", "most_free_kv")


def make_router(name: str, seed: int = 0) -> Router:
    """Router by name: one of `ROUTERS`."""
    key = name.lower().replace("-", "_")
    if key == "round_robin":
        return RoundRobin()
    if key == "random":
        return Random(seed)
    if key in ("least_outstanding", "shortest_queue"):
        return LeastOutstanding()
    if key in ("most_free_kv", "least_kv"):
        return MostFreeKV()
    raise ValueError(f"unknown router {name!r}; choose from {', '.join(ROUTERS)}")

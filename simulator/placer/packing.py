"""TP groups on hosts (C3: a tensor-parallel group never spans hosts). Pure.

`host_patterns` lists the maximal ways one host of G GPUs can be cut into groups of the
allowed TP degrees; the constraint model chooses how many hosts of each class use each
pattern, which is exact: any set of groups that fits on the hosts is covered by some choice
of patterns (a packing of one host is contained in a maximal pattern). `pack` is an
independent first-principles check (backtracking over hosts), used by the exhaustive
enumerator and the tests; `assign_groups` turns chosen patterns into concrete hosts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

K = TypeVar("K", bound=Hashable)


def host_patterns(gpus: int, degrees: Sequence[int],
                  one_group: bool = False) -> list[tuple[int, ...]]:
    """Maximal multisets of `degrees` (descending tuples) with sum <= `gpus`; with
    `one_group`, one group per host (each degree that fits, alone)."""
    ds = sorted({d for d in degrees if 1 <= d <= gpus}, reverse=True)
    if one_group:
        return [(d,) for d in ds]
    out: list[tuple[int, ...]] = []

    def rec(start: int, left: int, acc: list[int]) -> None:
        extended = False
        for i in range(start, len(ds)):
            if ds[i] <= left:
                extended = True
                acc.append(ds[i])
                rec(i, left - ds[i], acc)
                acc.pop()
        if not extended and acc and all(d > left for d in ds):
            out.append(tuple(acc))

    rec(0, gpus, [])
    return out


def pack(groups: Mapping[int, int], hosts: Sequence[int],
         one_group: Sequence[bool] = ()) -> list[list[int]] | None:
    """Place `groups` ({tp: count}) on hosts with the given GPU counts (hosts flagged in
    `one_group` take at most one group), or None if they do not fit; returns, per host, the
    TP degrees placed on it. Exhaustive (backtracking, largest groups first, identical free
    hosts tried once)."""
    single = list(one_group) + [False] * (len(hosts) - len(one_group))
    items = sorted((t for t, n in groups.items() for _ in range(n)), reverse=True)
    if sum(items) > sum(hosts):
        return None
    free = list(hosts)
    placed: list[list[int]] = [[] for _ in hosts]

    def rec(i: int) -> bool:
        if i == len(items):
            return True
        tried: set[tuple[int, bool]] = set()
        for h, cap in enumerate(free):
            if single[h] and placed[h]:
                continue
            if cap >= items[i] and (cap, single[h]) not in tried:
                tried.add((cap, single[h]))
                free[h] -= items[i]
                placed[h].append(items[i])
                if rec(i + 1):
                    return True
                free[h] += items[i]
                placed[h].pop()
        return False

    return placed if rec(0) else None


def assign_groups(
    pattern_use: Sequence[tuple[tuple[int, ...], int]],
    hosts: Sequence[str],
    demand: Mapping[K, tuple[int, int]],
) -> dict[K, list[str]]:
    """Concrete placement on one host class: `pattern_use` says how many hosts use each
    pattern, `demand` maps an owner (e.g. a service) to (tp, replicas). Returns, per owner,
    the host name of each replica. Raises ValueError if the patterns do not cover demand."""
    slots: dict[int, list[str]] = {}
    it = iter(hosts)
    for pattern, n in pattern_use:
        for _ in range(n):
            host = next(it)
            for tp, k in Counter(pattern).items():
                slots.setdefault(tp, []).extend([host] * k)
    out: dict[K, list[str]] = {}
    for owner, (tp, replicas) in demand.items():
        free = slots.get(tp, [])
        if len(free) < replicas:
            raise ValueError(f"patterns leave {len(free)} TP{tp} slots, {replicas} needed")
        out[owner], slots[tp] = free[:replicas], free[replicas:]
    return out

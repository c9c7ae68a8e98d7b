"""Rendezvous (highest random weight) hashing for ``prefix_affinity``: which node a key
prefers, consistently (a node joining or leaving moves only its share of keys). Pure.

Up to ``FLAT_MAX`` candidates every one is scored (exact, weighted by capacity:
Schindelhauer & Schomaker's ``-w / ln(u)``). Beyond, scoring all of them costs ~2 us a
node (a 1,000-node federation: ~4 ms a request), so the candidates are placed in a fixed
tree (``Tree``): each session's hash picks one of ``FANOUT`` branches per level, and a key
descends from the root choosing among the non-empty branches by rendezvous weighted by
how many nodes each holds, then ranks the nodes of the leaf it reaches by capacity. A key
scores ~``FANOUT`` branches per level and the few nodes of one leaf: under 1 % of the
nodes at 1,000. It stays consistent (a join or a leave changes the weights on one path
only, and moves keys to or from that path alone) and spreads keys in proportion to node
counts across leaves and to capacity within a leaf; where capacities differ a lot, the
bounded load of ``prefix_affinity`` evens out what the counts do not.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Sequence
from typing import Any

FLAT_MAX = 64  # up to this many candidates, every one is scored
FANOUT = 8  # branches per level of the tree
LEVELS = 4  # 4,096 leaves: a few nodes per leaf up to ~50,000 nodes

_SESSION_HASH: dict[str, int] = {}


def hash64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def session_hash(session: str) -> int:
    """A session's 64-bit hash, remembered (the hot path asks for it per request)."""
    salt = _SESSION_HASH.get(session)
    if salt is None:
        if len(_SESSION_HASH) > 65536:
            _SESSION_HASH.clear()
        salt = _SESSION_HASH[session] = hash64(session.encode())
    return salt


def score(key: int, salt: int, weight: float) -> float:
    """The rendezvous score of ``salt`` (a node, a branch) for ``key``: a node of twice
    the weight wins about twice the keys. (SplitMix64's finalizer, written out: this is
    the policy's innermost loop.)"""
    x = key ^ salt
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
    return -weight / math.log(((x ^ (x >> 31)) + 1) / (2**64 + 1))  # log of (0, 1)


# A branch: (its salt, how many candidates are under it, its child: branches or a leaf
# of candidate indexes).
Branch = tuple[int, int, "list[Branch] | list[int]"]


class Tree:
    """Candidates (by index) placed by their session's hash: ``LEVELS`` levels of
    ``FANOUT`` branches. Built once per candidate set (the router remembers it for the
    registry's tuple of a model's nodes)."""

    def __init__(self, sessions: Sequence[str]) -> None:
        nested: dict[int, Any] = {}
        for index, session in enumerate(sessions):
            h = session_hash(session)
            node = nested
            for _level in range(LEVELS - 1):
                node = node.setdefault(h % FANOUT, {})
                h //= FANOUT
            node.setdefault(h % FANOUT, []).append(index)
        self.root: list[Branch] = _branches(nested, ())

    def leaves(self, key: int) -> Iterator[list[int]]:
        """The leaves (lists of candidate indexes) in ``key``'s order of preference."""
        yield from _descend(self.root, key)


def _branches(nested: dict[int, Any], path: tuple[int, ...]) -> list[Branch]:
    out: list[Branch] = []
    for branch, child in sorted(nested.items()):
        here = (*path, branch)
        salt = hash64(repr(here).encode())  # its path: two levels' branch 3 differ
        if isinstance(child, list):
            out.append((salt, len(child), child))
        else:
            below = _branches(child, here)
            out.append((salt, sum(b[1] for b in below), below))
    return out


def _descend(branches: list[Branch], key: int) -> Iterator[list[int]]:
    ranked = branches if len(branches) == 1 else sorted(
        branches, key=lambda b: score(key, b[0], b[1]), reverse=True)
    for _salt, _count, child in ranked:
        if child and isinstance(child[0], tuple):
            yield from _descend(child, key)
        else:
            yield child  # type: ignore[misc]

"""Which blocks of a chain are advertised: the anchors.

A cached prefix is a chain of blocks, and an engine evicts a chain from its tail first
(vLLM frees a finished request's blocks last-to-first into an LRU queue), so holding the
block at depth d almost always means holding depths 1..d. An ingress therefore needs only
some depths to estimate how long a prefix a node holds: otela advertises the blocks at
depths 1, 2, 4, 8 and 16, and every 16th after that. A chain of 64 blocks (1,024 tokens at
vLLM's GPU block size) costs 7 fingerprints instead of 64; the estimate is exact up to 16
blocks and at most 15 blocks short beyond (docs/routing.md, "cache_aware")."""

from __future__ import annotations

STRIDE = 16


def is_anchor(depth: int) -> bool:
    """Whether the block at ``depth`` (1: a prompt's first block) is advertised."""
    return depth >= 1 and (depth % STRIDE == 0 or depth & (depth - 1) == 0)


def anchor_depths(blocks: int) -> list[int]:
    """The anchor depths of a chain of ``blocks`` blocks, deepest first."""
    return [d for d in range(blocks, 0, -1) if is_anchor(d)]

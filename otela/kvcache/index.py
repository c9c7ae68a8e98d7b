"""A serving node's index of the blocks its engine holds, built from the engine's KV
events, and the summaries of it that go to the ingresses. Pure: no I/O, no clock.

What is kept: every block the engine reported stored and has not removed, with its depth
in its chain and the fingerprint an ingress computes for it (``otela.kvcache.hashing``).
What is advertised: the anchors (``otela.kvcache.anchors``) among them, at most
``max_anchors`` (the oldest stop being advertised first). Every change to the advertised
set is numbered (``seq``) and logged, so an ingress that holds the set as of ``seq`` n is
sent only what changed since (a delta); an ingress that holds nothing, another epoch or
a number older than the log is sent the whole set. The epoch changes whenever the index
starts over: the engine cleared its cache or restarted, or events were lost (a gap in the
publisher's sequence numbers), so an ingress never mixes two engines' states.

The fingerprint: if the engine hashes with an algorithm otela reproduces (``sha256`` or
``sha256_cbor``, the default seed), its own hashes are the fingerprints; the first block
stored is checked against each (``calibrated``). Otherwise (xxhash, a private seed) the
node re-keys every block with ``sha256`` from the token ids in the events, so ingresses
compute the same thing either way.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from otela.kvcache.anchors import is_anchor
from otela.kvcache.events import Batch, Cleared, Removed, Stored
from otela.kvcache.hashing import ALGORITHMS, BlockHasher, Fingerprint, fingerprint

DEFAULT_MAX_ANCHORS = 8192
DEFAULT_LOG_LIMIT = 16384


@dataclass(frozen=True, slots=True)
class Summary:
    """What one ingress is sent: the whole advertised set (``base`` None) or the changes
    from ``base`` to ``seq``."""

    epoch: int
    seq: int
    base: int | None
    added: tuple[Fingerprint, ...]
    removed: tuple[Fingerprint, ...]
    block_size: int
    algorithm: str  # how the ingress must hash a request's blocks for this node


@dataclass(slots=True)
class _Block:
    depth: int | None  # None: its chain's start was never seen
    key: Fingerprint  # what ingresses compute for it
    digest: bytes | None  # our own sha256 digest, when re-keying (the next block's parent)


class CacheIndex:
    def __init__(self, max_anchors: int = DEFAULT_MAX_ANCHORS,
                 log_limit: int = DEFAULT_LOG_LIMIT, rng: random.Random | None = None
                 ) -> None:
        self.max_anchors = max_anchors
        self.log_limit = log_limit
        self._rng = rng or random.Random()
        self.block_size: int | None = None
        self.algorithm: str | None = None  # the engine's, once calibrated
        self.rekey: BlockHasher | None = None  # when the engine's cannot be reproduced
        self.blocks: dict[int, _Block] = {}  # by the engine's hash
        self.anchors: OrderedDict[Fingerprint, None] = OrderedDict()  # oldest first
        self.epoch = self._rng.getrandbits(31) + 1
        self.seq = 0
        self._log: list[tuple[int, Fingerprint, bool]] = []  # (seq, key, added)
        self._last_batch: int | None = None
        self.stats = {"batches": 0, "stored": 0, "removed": 0, "resets": 0, "gaps": 0,
                      "unplaced": 0, "not_advertised": 0}

    # -- events in ------------------------------------------------------------------

    def apply(self, batch: Batch) -> None:
        """One batch from the engine's publisher, in the order it was published."""
        if self._last_batch is not None and batch.seq != self._last_batch + 1:
            # Lost batches (or a restarted publisher counting from 0): what we hold may
            # be wrong either way, so start over; the engine's later events rebuild it.
            self.stats["gaps"] += 1
            self.reset()
        self._last_batch = batch.seq
        self.stats["batches"] += 1
        for event in batch.events:
            if isinstance(event, Stored):
                self._stored(event)
            elif isinstance(event, Removed):
                self._removed(event.hashes)
            elif isinstance(event, Cleared):
                self.reset()

    def reset(self) -> None:
        """Forget everything under a new epoch (the engine restarted or cleared its cache;
        the next summary to every ingress is a whole, empty, set)."""
        self.stats["resets"] += 1
        self.blocks.clear()
        self.anchors.clear()
        self._log.clear()
        self.epoch = self._rng.getrandbits(31) + 1
        self.seq = 0

    def engine_restarted(self) -> None:
        """The engine process was replaced: its publisher counts from 0 again."""
        self._last_batch = None
        self.reset()

    def _calibrate(self, event: Stored) -> None:
        self.block_size = event.block_size
        first = event.tokens[:event.block_size]
        for name in ALGORITHMS:
            try:
                if BlockHasher(name, event.block_size).chain(first) == [event.hashes[0]]:
                    self.algorithm = name
                    return
            except ImportError:  # cbor2 missing: that one cannot be it for us
                continue
        self.algorithm = "sha256"
        self.rekey = BlockHasher("sha256", event.block_size)

    def _stored(self, event: Stored) -> None:
        self.stats["stored"] += len(event.hashes)
        if not event.plain:
            return  # adapters, images, salts: an ingress cannot name these blocks
        if self.algorithm is None:
            if event.parent is not None:
                self.stats["unplaced"] += len(event.hashes)
                return
            self._calibrate(event)
        if event.block_size != self.block_size:
            return
        parent = None if event.parent is None else self.blocks.get(event.parent)
        depth = 0 if event.parent is None else (parent.depth if parent else None)
        digest = None if parent is None else parent.digest
        if event.parent is not None and parent is None:
            self.stats["unplaced"] += len(event.hashes)
        size = event.block_size
        for i, engine_hash in enumerate(event.hashes):
            depth = None if depth is None else depth + 1
            if self.rekey is not None:
                if depth is None:
                    return  # without the chain's start there is nothing to re-key from
                digest = self.rekey.block(digest, event.tokens[i * size:(i + 1) * size])
                key = fingerprint(digest)
            else:
                key = engine_hash
            if engine_hash in self.blocks:
                continue
            self.blocks[engine_hash] = _Block(depth, key, digest)
            if depth is not None and is_anchor(depth):
                self._advertise(key)

    def _removed(self, hashes: Iterable[int]) -> None:
        for engine_hash in hashes:
            block = self.blocks.pop(engine_hash, None)
            if block is None:
                continue
            self.stats["removed"] += 1
            if block.key in self.anchors:
                del self.anchors[block.key]
                self._change(block.key, False)

    def _advertise(self, key: Fingerprint) -> None:
        if key in self.anchors:
            return
        if len(self.anchors) >= self.max_anchors:
            oldest, _ = self.anchors.popitem(last=False)
            self.stats["not_advertised"] += 1
            self._change(oldest, False)
        self.anchors[key] = None
        self._change(key, True)

    def _change(self, key: Fingerprint, added: bool) -> None:
        self.seq += 1
        self._log.append((self.seq, key, added))
        if len(self._log) > 2 * self.log_limit:  # trimmed in chunks: appends stay O(1)
            del self._log[:len(self._log) - self.log_limit]

    def report(self) -> dict[str, object]:
        """What ``/v1/network`` shows of this node's index (``routing.cache.own``)."""
        return {"epoch": self.epoch, "seq": self.seq, "anchors": len(self.anchors),
                "blocks": len(self.blocks), "algorithm": self.algorithm,
                "block_size": self.block_size, **self.stats}

    # -- summaries out ----------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """Whether there is anything an ingress can use (the hashing is known)."""
        return self.algorithm is not None and self.block_size is not None

    def summary_for(self, held: tuple[int, int] | None) -> Summary | None:
        """What an ingress that holds ``held`` (epoch, seq) is sent; ``None`` when it is up
        to date (or nothing is known yet)."""
        if not self.ready:
            return None
        assert self.algorithm is not None and self.block_size is not None
        if held is not None and held[0] == self.epoch:
            base = held[1]
            if base == self.seq:
                return None
            first_logged = self._log[0][0] if self._log else self.seq + 1
            if base <= self.seq and base + 1 >= first_logged:
                added, removed = _net(self._log[base + 1 - first_logged:])
                return Summary(self.epoch, self.seq, base, added, removed,
                               self.block_size, self.algorithm)
        return Summary(self.epoch, self.seq, None, tuple(self.anchors), (),
                       self.block_size, self.algorithm)


def _net(log: list[tuple[int, Fingerprint, bool]]
         ) -> tuple[tuple[Fingerprint, ...], tuple[Fingerprint, ...]]:
    """The net changes in ``log``: a key's first and last change decide (added then
    removed, or the reverse, is no change)."""
    first: dict[Fingerprint, bool] = {}
    last: dict[Fingerprint, bool] = {}
    for _seq, key, added in log:
        first.setdefault(key, added)
        last[key] = added
    adds = tuple(k for k, a in last.items() if a and first[k])
    removes = tuple(k for k, a in last.items() if not a and not first[k])
    return adds, removes

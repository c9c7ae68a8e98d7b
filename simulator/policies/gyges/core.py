"""Gyges's decisions, free of simulation: when a request forces a TP merge, which GPUs merge,
where a request goes (Algorithm 1) and when a merged instance splits back (Algorithm 2).

Instances live on one host in aligned power-of-two blocks (a TP2 on GPUs 2-3, a TP4 on 4-7),
as TP groups do on an 8-GPU NVLink machine, so merging "the neighbours" of an instance to TP k
means taking the aligned block of k GPUs that contains it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

# Gyges Table 1 (Qwen2.5-32B on H20): the longest sequence each TP degree supports.
PAPER_MAX_SEQ: Mapping[int, int] = {1: 3_750, 2: 41_250, 4: 120_500}


class Slot(NamedTuple):
    """One instance as the scheduler sees it (a named tuple: the router builds one per
    instance on every arrival, and a frozen dataclass costs several times more to build)."""

    id: int
    first_gpu: int  # index of its first GPU on the host
    tp: int
    load: float  # remaining tokens of work (prefill + decode) queued or running on it
    long_requests: int  # requests on it that only a TP > 1 instance can hold
    max_seq: int

    @property
    def gpus(self) -> range:
        return range(self.first_gpu, self.first_gpu + self.tp)


def required_tp(length: int, max_seq: Mapping[int, int]) -> int | None:
    """Smallest TP degree whose instances hold a `length`-token sequence (None: none does)."""
    for tp in sorted(max_seq):
        if max_seq[tp] >= length:
            return tp
    return None


def needs_merge(length: int, slot: Slot, max_seq: Mapping[int, int]) -> int | None:
    """The merge trigger: the TP degree `slot` must grow to for this request, or None if it
    already holds it."""
    if length <= slot.max_seq:
        return None
    return required_tp(length, max_seq)


def block_of(gpu: int, tp: int) -> range:
    """The aligned block of `tp` GPUs containing `gpu`."""
    start = gpu - gpu % tp
    return range(start, start + tp)


def merge_members(slots: Sequence[Slot], gpu: int, tp: int) -> list[Slot] | None:
    """The instances that merge into a TP-`tp` instance on the block containing `gpu`; None when
    an instance already spans more than that block (nothing to merge into)."""
    block = block_of(gpu, tp)
    members = [s for s in slots if s.first_gpu in block]
    for s in members:
        if s.first_gpu + s.tp > block.stop:
            return None
    if any(s.first_gpu < block.start < s.first_gpu + s.tp for s in slots):
        return None
    if sum(s.tp for s in members) != tp:
        return None  # part of the block is not serving (should not happen on a full host)
    return members


def best_merge_block(
    slots: Sequence[Slot], tp: int, host_gpus: int
) -> tuple[int, list[Slot]] | None:
    """Gyges's scale-up choice: of the aligned TP-`tp` blocks that can merge, the one whose
    instances carry the least load and no long requests (fewest requests disturbed); returns
    (first GPU, members)."""
    best: tuple[tuple[int, float], int, list[Slot]] | None = None
    for start in range(0, host_gpus, tp):
        members = merge_members(slots, start, tp)
        if not members or (len(members) == 1 and members[0].tp == tp):
            continue
        key = (sum(m.long_requests for m in members), sum(m.load for m in members))
        if best is None or key < best[0]:
            best = (key, start, members)
    return None if best is None else (best[1], best[2])


@dataclass(frozen=True)
class Decision:
    """Where a request goes: an existing instance, or a merge of `merge` into TP `tp`."""

    target: int | None = None
    merge: tuple[int, ...] = ()
    tp: int = 1
    first_gpu: int = 0


def schedule_request(
    length: int, slots: Sequence[Slot], max_seq: Mapping[int, int], host_gpus: int
) -> Decision | None:
    """Gyges Algorithm 1. A long request (beyond TP1's limit) goes to the least-loaded existing
    instance that already holds it; only if there is none does a block scale up (the
    least-loaded block). A short request skips merged instances that have no long requests
    left (they are held back so they can scale down) unless nothing else exists, and takes the
    least-loaded of the rest. None: no instance can ever hold the request."""
    fitting = [s for s in slots if s.max_seq >= length]
    base = min(max_seq) if max_seq else 1
    short = length <= max_seq.get(base, 0)
    if short:
        reserved = {s.id for s in slots if s.tp > base and s.long_requests == 0}
        pool = [s for s in fitting if s.id not in reserved] or fitting
        if pool:
            return Decision(target=min(pool, key=lambda s: (s.load, s.id)).id)
    elif fitting:
        return Decision(target=min(fitting, key=lambda s: (s.load, s.id)).id)
    tp = required_tp(length, max_seq)
    if tp is None:
        return None
    choice = best_merge_block(slots, tp, host_gpus)
    if choice is None:
        return None
    start, members = choice
    return Decision(merge=tuple(m.id for m in members), tp=tp, first_gpu=start)


def baseline_request(
    length: int, slots: Sequence[Slot], chosen: Slot, max_seq: Mapping[int, int]
) -> Decision | None:
    """RR / least-load with transformation (the paper's baselines): the router picks `chosen`
    blind to TP; if it cannot hold the request, it merges with its neighbours."""
    tp = needs_merge(length, chosen, max_seq)
    if tp is None:
        return Decision(target=chosen.id)
    members = merge_members(slots, chosen.first_gpu, tp)
    if members is None:
        return None
    start = block_of(chosen.first_gpu, tp).start
    return Decision(merge=tuple(m.id for m in members), tp=tp, first_gpu=start)


def should_scale_down(slot: Slot, load_threshold: float, base_tp: int = 1) -> bool:
    """Gyges Algorithm 2: split a merged instance once it serves no long request and its load
    is below the threshold (the split is then attempted; it fails if the KV does not fit)."""
    return slot.tp > base_tp and slot.long_requests == 0 and slot.load < load_threshold

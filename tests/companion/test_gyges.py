"""Gyges's cores: the TP merge trigger, merge blocks, Algorithm 1's routing against the
RR/least-load baselines, and Algorithm 2's scale-down rule."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from simulator.models import get_model
from simulator.policies.cluster import Cluster, Pool, run_cluster
from simulator.policies.gyges.core import (
    PAPER_MAX_SEQ,
    Slot,
    baseline_request,
    best_merge_block,
    block_of,
    merge_members,
    needs_merge,
    required_tp,
    schedule_request,
    should_scale_down,
)
from simulator.policies.gyges.policy import GygesPolicy


def _host(tp4_first: int | None = None, load: float = 0.0, long4: int = 0) -> list[Slot]:
    """8 GPUs: a TP4 at `tp4_first` (if any) and TP1 instances elsewhere."""
    slots = []
    g = 0
    i = 0
    while g < 8:
        if tp4_first is not None and g == tp4_first:
            slots.append(Slot(i, g, 4, load, long4, PAPER_MAX_SEQ[4]))
            g += 4
        else:
            slots.append(Slot(i, g, 1, 100.0 * g, 0, PAPER_MAX_SEQ[1]))
            g += 1
        i += 1
    return slots


def test_merge_trigger_follows_the_paper_limits() -> None:
    assert required_tp(3_750, PAPER_MAX_SEQ) == 1
    assert required_tp(3_751, PAPER_MAX_SEQ) == 2
    assert required_tp(50_000, PAPER_MAX_SEQ) == 4
    assert required_tp(200_000, PAPER_MAX_SEQ) is None
    tp1 = Slot(0, 0, 1, 0.0, 0, PAPER_MAX_SEQ[1])
    assert needs_merge(1_024, tp1, PAPER_MAX_SEQ) is None
    assert needs_merge(51_024, tp1, PAPER_MAX_SEQ) == 4
    tp4 = Slot(1, 4, 4, 0.0, 0, PAPER_MAX_SEQ[4])
    assert needs_merge(51_024, tp4, PAPER_MAX_SEQ) is None


def test_merge_blocks_are_aligned() -> None:
    assert list(block_of(5, 4)) == [4, 5, 6, 7]
    assert list(block_of(5, 2)) == [4, 5]
    slots = _host()
    assert [s.id for s in merge_members(slots, 5, 4) or []] == [4, 5, 6, 7]
    with_tp4 = _host(tp4_first=4)
    assert merge_members(with_tp4, 5, 2) is None  # inside an existing TP4: nothing to merge


def test_long_request_goes_to_the_existing_tp4() -> None:
    slots = _host(tp4_first=4, load=1e6, long4=1)  # busy with a long request already
    d = schedule_request(51_000, slots, PAPER_MAX_SEQ, 8)
    assert d is not None and d.target == 4 and not d.merge
    # with no TP4 yet, the least-loaded aligned block merges (GPUs 0-3 carry least load)
    d = schedule_request(51_000, _host(), PAPER_MAX_SEQ, 8)
    assert d is not None and d.merge == (0, 1, 2, 3) and d.tp == 4 and d.first_gpu == 0
    assert best_merge_block(_host(), 4, 8) is not None


def test_short_requests_avoid_a_tp4_that_can_scale_down() -> None:
    slots = _host(tp4_first=0, load=0.0, long4=0)  # idle TP4: keep it free to split
    d = schedule_request(1_500, slots, PAPER_MAX_SEQ, 8)
    assert d is not None and d.target != 0
    busy = _host(tp4_first=0, load=0.0, long4=1)  # serving a long request: usable
    d = schedule_request(1_500, busy, PAPER_MAX_SEQ, 8)
    assert d is not None and d.target == 0


def test_baselines_merge_wherever_their_router_points() -> None:
    slots = _host(tp4_first=4, load=1e6, long4=1)
    chosen = slots[0]  # least loaded by tokens: a TP1
    d = baseline_request(51_000, slots, chosen, PAPER_MAX_SEQ)
    assert d is not None and d.merge == (0, 1, 2, 3)  # a second TP4: what Gyges avoids
    d = baseline_request(1_000, slots, chosen, PAPER_MAX_SEQ)
    assert d is not None and d.target == 0


def test_scale_down_rule() -> None:
    tp4 = Slot(0, 0, 4, 10.0, 0, PAPER_MAX_SEQ[4])
    assert should_scale_down(tp4, load_threshold=100.0)
    assert not should_scale_down(Slot(0, 0, 4, 10.0, 1, PAPER_MAX_SEQ[4]), 100.0)
    assert not should_scale_down(Slot(0, 0, 4, 500.0, 0, PAPER_MAX_SEQ[4]), 100.0)
    assert not should_scale_down(Slot(0, 0, 1, 0.0, 0, PAPER_MAX_SEQ[1]), 100.0)


class _FreshSlots(GygesPolicy):
    """Gyges whose every view of the hosts is also rebuilt from scratch and compared."""

    checks = 0

    def _slots(self, cluster: Cluster, hosts: Sequence[int]) -> dict[int, list[Slot]]:
        got = super()._slots(cluster, hosts)
        kept = self._slot_cache, self._fixed, self._is_long
        self._slot_cache, self._fixed, self._is_long = {}, {}, None
        for i in cluster.live:
            i.replica.tokens_memo = None
        fresh = super()._slots(cluster, hosts)
        self._slot_cache, self._fixed, self._is_long = kept
        assert got == fresh
        self.checks += 1
        return got


def test_kept_slots_equal_fresh_ones() -> None:
    """The policy keeps each instance's Slot while its replica is unchanged; through merges,
    splits and every arrival it equals reading every instance again."""
    from simulator.policies.gyges import scenario

    wl = scenario.workload(120.0, 6.0, seed=3, model="llama-3.1-8b")
    spec = dataclasses.replace(get_model("llama-3.1-8b"), max_context=131_072)
    for mode in ("gyges", "least_loaded"):
        pol = _FreshSlots("llama-3.1-8b", mode, PAPER_MAX_SEQ)
        run_cluster(wl, pol, Pool.uniform("h100-sxm", 8), models={"llama-3.1-8b": spec})
        assert pol.merges >= 1 and pol.splits >= 1
        assert pol.checks > 800

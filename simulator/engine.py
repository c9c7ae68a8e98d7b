"""Event-driven simulation of continuous-batching LLM replicas behind a router.

Each replica mimics a vLLM/SGLang scheduler at iteration granularity: a token budget per
step, decode-first continuous batching, optional chunked prefill, paged KV blocks admitted
FIFO (requests wait, never vanish, when memory is full), preempt-and-recompute of the
newest request when a running one needs a block that does not exist, and an optional
prefix cache keyed by trace prefix hashes.

Speed comes from "macro-steps": between two events (arrival, completion, block exhaustion)
a pure-decode batch repeats the same step with context growing by one token per sequence,
so its step times form an arithmetic series that is summed (and inverted) in closed form.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from simulator.memory import MemoryPlan
from simulator.roofline import StepCost
from simulator.router import Router, make_router
from simulator.workload import Workload

INF = float("inf")

# `a.sum()` / `a.min()` of a 1-D array without the Python-level wrappers of numpy's methods
# (the same reductions; they matter on the small arrays of every iteration)
_sum = np.add.reduce
_min = np.minimum.reduce

# Decode runs of at most this many requests are planned and committed with Python scalars
# instead of numpy arrays (the same integer and float arithmetic, element by element): most
# runs of many-model or lightly loaded replicas hold a handful of requests, where the fixed
# cost of each numpy call dominates.
SMALL_BATCH = 4

# request status codes
WAITING, RUNNING, DONE, REJECTED = 0, 1, 2, 3


@dataclass(frozen=True)
class EngineConfig:
    """Scheduler knobs of one replica (defaults follow vLLM V1)."""

    block_size: int = 16
    max_num_seqs: int = 256
    max_batched_tokens: int = 8192
    chunked_prefill: bool = True  # prefills ride with decodes in one token budget (vLLM V1)
    # With chunked_prefill: may a prompt be split across steps? False is TensorRT-LLM's default
    # (no chunked context): a prompt runs whole, with the decodes, in the first step whose
    # remaining budget holds it (FCFS), so two long prompts never share a step.
    chunk_prompts: bool = True
    prefix_caching: bool = False
    watermark: float = 0.01  # fraction of blocks kept free when admitting (vLLM V0 default)
    # SGLang-style conservative admission: reserve this fraction of every running and new
    # request's remaining output tokens before admitting (SGLang's init_new_token_ratio=0.7);
    # 0 = vLLM behaviour (reserve the prompt only, preempt when decode growth overflows).
    reserve_output_ratio: float = 0.0
    macro_steps: bool = True  # closed-form runs of identical decode steps (exact; for speed)


@dataclass
class RequestTable:
    """Per-request state and results as parallel arrays (index = request id)."""

    n: int
    arrival: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    prefix_hash: np.ndarray
    prefix_len: np.ndarray
    sent: np.ndarray = field(init=False)
    first_sched: np.ndarray = field(init=False)
    first_token: np.ndarray = field(init=False)
    finish: np.ndarray = field(init=False)
    replica: np.ndarray = field(init=False)
    preemptions: np.ndarray = field(init=False)
    cached_tokens: np.ndarray = field(init=False)
    status: np.ndarray = field(init=False)
    target: np.ndarray = field(init=False)
    computed: np.ndarray = field(init=False)
    generated: np.ndarray = field(init=False)
    kv_len: np.ndarray = field(init=False)
    blocks: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        n = self.n
        self.sent = self.arrival.astype(float).copy()
        self.max_itl = np.zeros(n)  # longest gap between two consecutive output tokens
        self.last_token = np.zeros(n)
        for name in ("first_sched", "first_token", "finish"):
            setattr(self, name, np.full(n, np.nan))
        for name in (
            "replica",
            "preemptions",
            "cached_tokens",
            "status",
            "computed",
            "generated",
            "kv_len",
            "blocks",
        ):
            setattr(self, name, np.zeros(n, np.int64))
        self.replica[:] = -1
        self.target = self.input_len.astype(np.int64).copy()

    @classmethod
    def from_workload(cls, w: Workload) -> RequestTable:
        return cls(len(w), w.arrival, w.input_len, w.output_len, w.prefix_hash, w.prefix_len)


@dataclass
class _Plan:
    """A run of identical decode iterations: step j (1-based) costs a0 + slope*(s0 + (j-1)*b)."""

    idx: np.ndarray
    # kv, held, left (and grow): numpy arrays, or Python lists of ints for a small batch
    # (`ids` is then idx as a list; see `SMALL_BATCH`)
    kv: Any
    held: Any
    left: Any  # output tokens each request has still to generate
    b: int
    k_cap: int
    a0: float
    s0: float
    slope: float
    start: float
    end: float
    # the blocks each request gains over the first `grow_k` iterations, when the planning
    # already computed them (a run committed whole reuses them)
    grow: Any = None
    grow_k: int = 0
    grow_total: int = 0  # sum(grow)
    left_min: int = 0  # min(left): a commit of fewer iterations finishes no request
    ids: list[int] | None = None

    def cum(self, k: int) -> float:
        """Duration of the first k iterations (closed form of the arithmetic series)."""
        return k * self.a0 + self.slope * (k * self.s0 + self.b * k * (k - 1) / 2)

    def steps_before(self, t: float) -> int:
        """Number of iterations that START before t (>= 1 when t > start)."""
        delta = t - self.start
        qa = self.slope * self.b / 2
        qb = self.a0 + self.slope * self.s0 - qa
        kt = (-qb + math.sqrt(qb * qb + 4 * qa * delta)) / (2 * qa) if qa > 0 else delta / qb
        k = max(1, min(self.k_cap, math.ceil(kt - 1e-9)))
        while k > 1 and self.cum(k - 1) >= delta:  # guard float error in the root
            k -= 1
        while k < self.k_cap and self.cum(k) < delta:
            k += 1
        return k


def _largest_fitting(k_max: int, fits: Callable[[int], bool], k_min: int = 0) -> int:
    """The largest k in [k_min, k_max] with ``fits(k)``, for ``fits`` true at ``k_min`` and
    monotone (true up to some k, false after): how many decode steps the free KV blocks
    allow, or how many cycles one line of a pipelined run keeps binding."""
    lo, hi = k_min, k_max
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _binding_line(
    lines: list[tuple[float, float]], s0: float, b: int, k_cap: int
) -> tuple[tuple[float, float], int] | None:
    """For a pipelined decode run (cycle j costs max over `lines` of a + slope*(s0+(j-1)b)):
    the line that binds at the first cycle and the number of cycles it keeps binding (at
    most `k_cap`), so that the run is one arithmetic series; None if under 2 cycles.

    A maximum of lines is convex in j, so the line binding at cycle 1 binds on an interval
    of cycles that starts there; past its end the next run picks the new line.
    """

    first = max(lines, key=lambda ln: (ln[0] + ln[1] * s0, ln[1]))  # cycle 1: ctx = s0
    a1, s1 = first

    def binds(j: int) -> bool:
        # `first` is at least every line at cycle j: a + slope * ctx, the context computed
        # once (called ~10 times a decode run, once per pipelined arrival)
        ctx = s0 + (j - 1) * b
        top = a1 + s1 * ctx
        return all(top >= a + slope * ctx for a, slope in lines)

    if binds(k_cap):
        return first, k_cap
    last = _largest_fitting(k_cap - 1, binds, k_min=1)  # the last cycle `first` binds
    return (first, last) if last >= 2 else None


class Replica:
    """One model replica (a TP x PP group of GPUs) with its own scheduler and KV pool."""

    def __init__(
        self, idx: int, cost: StepCost, plan: MemoryPlan, cfg: EngineConfig, req: RequestTable
    ):
        self.idx = idx
        self.cost = cost
        self.plan = plan
        self.cfg = cfg
        self.req = req
        self.bs = cfg.block_size
        # log2 of a power-of-two block size: integer division of arrays by a shift (several
        # times faster in numpy than a floor division, and the same for non-negative values)
        power_of_two = self.bs & (self.bs - 1) == 0
        self._bs_shift = self.bs.bit_length() - 1 if power_of_two else -1
        self.total_blocks = plan.kv_blocks
        self.free_blocks = plan.kv_blocks
        self.watermark_blocks = int(cfg.watermark * plan.kv_blocks)
        self.waiting: deque[int] = deque()
        self.running: list[int] = []
        self.prefix_cache: OrderedDict[int, list[int]] = OrderedDict()  # hash -> [blocks, refs]
        self.evictable = 0
        self.prefix_owner: dict[int, int] = {}  # request -> prefix hash it references
        self.clock = 0.0
        self.busy = 0.0
        self.steps = 0
        # (steps, ids): every running request is decoding, in running order, as of `steps`
        self._all_decoding: tuple[int, np.ndarray] | None = None
        self.timeline: list[tuple[float, int]] = []
        self.finished: list[int] = []
        # bumped by everything that can change the queues or their requests' progress
        # (`enqueue`, `step`, `_commit`; code that edits the queues directly bumps it too), so
        # that a figure derived from them can be reused while it stays the same
        self.changes = 0
        self.tokens_memo: tuple[int, int] | None = None  # (changes, pending tokens)
        self.window = cost.model.sliding_window
        self.pending: _Plan | None = None
        # pipeline stages: each iteration ("cycle") carries up to `pp` micro-batches, each
        # with its own token budget, priced by `StepCost.cycle_time`
        self.pp = cost.par.pp

    # ---- queries used by routers ------------------------------------------------------
    @property
    def outstanding(self) -> int:
        return len(self.waiting) + len(self.running)

    @property
    def kv_free_fraction(self) -> float:
        return (self.free_blocks + self.evictable) / max(1, self.total_blocks)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- block management ---------------------------------------------------------------
    def _blocks_for(self, tokens: np.ndarray, more: int = 0) -> np.ndarray:
        """Blocks that hold each of `tokens` + `more` (non-negative) tokens: ceil(. / bs),
        `more` folded into the rounding constant (one array operation fewer)."""
        if self._bs_shift >= 0:
            return (tokens + (more + self.bs - 1)) >> self._bs_shift
        return (tokens + (more + self.bs - 1)) // self.bs

    def _available(self) -> int:
        return self.free_blocks + self.evictable

    def _take(self, n: int) -> bool:
        """Allocate n blocks, evicting unreferenced cached prefixes (LRU) if needed."""
        if n <= 0:
            return True
        if n > self.free_blocks + self.evictable:
            return False
        while n > self.free_blocks:
            for h, (nb, refs) in self.prefix_cache.items():
                if refs == 0:
                    del self.prefix_cache[h]
                    self.evictable -= nb
                    self.free_blocks += nb
                    break
        self.free_blocks -= n
        return True

    def _release(self, r: int) -> None:
        req = self.req
        self.free_blocks += req.blocks.item(r)
        req.blocks[r] = 0
        h = self.prefix_owner.pop(r, None)
        if h is not None and h in self.prefix_cache:
            ent = self.prefix_cache[h]
            ent[1] -= 1
            if ent[1] == 0:
                self.evictable += ent[0]

    # ---- lifecycle ----------------------------------------------------------------------
    def enqueue(self, r: int, t: float) -> None:
        self.settle(t)
        self.changes += 1
        if not self.has_work:
            self.clock = max(self.clock, t)
        self.req.replica[r] = self.idx
        self.waiting.append(r)

    def _preempt(self, r: int) -> None:
        req = self.req
        self._release(r)
        self.running.remove(r)
        req.preemptions[r] += 1
        req.target[r] = req.input_len[r] + req.generated[r]
        req.computed[r] = 0
        req.kv_len[r] = 0
        req.status[r] = WAITING
        self.waiting.appendleft(r)

    def _try_admit(self, r: int) -> bool:
        """Reserve blocks for the whole prompt (minus a cached prefix) of waiting request r."""
        req = self.req
        target = req.target.item(r)  # Python ints: called once per admitted request
        cached_blocks = 0
        h = req.prefix_hash.item(r)
        if self.cfg.prefix_caching and h >= 0 and h in self.prefix_cache:
            nb = self.prefix_cache[h][0]
            cached_blocks = min(nb, (target - 1) // self.bs)
        need = math.ceil(target / self.bs) - cached_blocks
        if need + self._reserve(r) > self._available() - self.watermark_blocks and self.running:
            return False
        if cached_blocks:
            ent = self.prefix_cache[h]
            if ent[1] == 0:
                self.evictable -= ent[0]
            ent[1] += 1
            self.prefix_cache.move_to_end(h)
            self.prefix_owner[r] = h
        if not self._take(need):
            if cached_blocks:
                self._release_ref_only(r)
            return False
        req.blocks[r] = need
        req.computed[r] = cached_blocks * self.bs
        req.kv_len[r] = cached_blocks * self.bs
        if req.preemptions.item(r) == 0:
            req.cached_tokens[r] = cached_blocks * self.bs
        req.status[r] = RUNNING
        if math.isnan(req.first_sched.item(r)):
            req.first_sched[r] = self.clock
        self.running.append(r)
        return True

    def _reserve(self, r: int) -> int:
        """Blocks held back for future decode tokens (0 unless reserve_output_ratio > 0)."""
        ratio = self.cfg.reserve_output_ratio
        if ratio <= 0:
            return 0
        req = self.req
        idx = np.asarray([*self.running, r], dtype=np.int64)
        left = np.maximum(req.output_len[idx] - req.generated[idx], 0)
        return math.ceil(ratio * float(_sum(left)) / self.bs)

    def _release_ref_only(self, r: int) -> None:
        h = self.prefix_owner.pop(r, None)
        if h is not None:
            ent = self.prefix_cache[h]
            ent[1] -= 1
            if ent[1] == 0:
                self.evictable += ent[0]

    def _register_prefix(self, r: int) -> None:
        """After r's prefill, hand its prefix blocks to the cache so later requests hit."""
        req = self.req
        h = int(req.prefix_hash[r])
        if h < 0 or h in self.prefix_cache or r in self.prefix_owner:
            return
        nb = min(int(req.prefix_len[r]) // self.bs, int(req.blocks[r]))
        if nb <= 0:
            return
        req.blocks[r] -= nb
        self.prefix_cache[h] = [nb, 1]
        self.prefix_owner[r] = h

    def _finish(self, r: int) -> None:
        req = self.req
        req.finish[r] = self.clock
        req.status[r] = DONE
        self._release(r)
        self.finished.append(r)

    # ---- one scheduler iteration ------------------------------------------------------------
    def _grow_decodes(self, decoding: np.ndarray) -> np.ndarray:
        """Give each decoding request room for one more token; preempt newest on shortage.

        Usually the pool holds every new block: then one vectorised pass takes them all (a
        step of a thousand sequences needs a block for about one in `block_size`). Only a
        shortage, where who gets preempted depends on the order, goes one request at a time.
        """
        if len(decoding) == 0:
            return decoding
        req = self.req
        if len(decoding) <= SMALL_BATCH:  # the same, with Python ints
            ids = decoding.tolist()
            kv_len, blocks = req.kv_len, req.blocks
            up, bs = self.bs - 1, self.bs
            needs = [max((kv_len.item(r) + 1 + up) // bs - blocks.item(r), 0) for r in ids]
            n = sum(needs)
            if self._can_take_at_once(n):
                self._take(n)
                for r, x in zip(ids, needs, strict=True):
                    blocks[r] = blocks.item(r) + x
                return decoding
            return np.asarray(self._grow_one_by_one(ids), dtype=np.int64)
        held = req.blocks[decoding]
        need = np.maximum(self._blocks_for(req.kv_len[decoding], 1) - held, 0)
        total = int(_sum(need))
        if self._can_take_at_once(total):
            self._take(total)
            req.blocks[decoding] = held + need
            return decoding
        return np.asarray(self._grow_one_by_one(decoding.tolist()), dtype=np.int64)

    def _can_take_at_once(self, n: int) -> bool:
        """Can `n` blocks be taken in one `_take` with the same outcome as taking them request
        by request? Yes whenever the pool holds them all (evictions follow the same LRU order
        either way)."""
        return n <= self._available()

    def _grow_one_by_one(self, decoding: list[int]) -> list[int]:
        """`_grow_decodes` in request order, preempting the newest request on a shortage."""
        req = self.req
        out: list[int] = []
        for r in decoding:
            if req.status[r] != RUNNING:
                continue  # preempted as a victim earlier in this loop
            need = (int(req.kv_len[r]) + 1 + self.bs - 1) // self.bs - int(req.blocks[r])
            while need > 0 and not self._take(need):
                victim = self.running[-1]
                self._preempt(victim)
                if victim == r:
                    break
            if req.status[r] == RUNNING:
                if need > 0:
                    req.blocks[r] += need
                out.append(r)
        return out

    def _split_running(self) -> tuple[np.ndarray, list[int]]:
        """Running requests whose prompt is fully computed (decoding, as an array) and those
        still prefilling, both in running order (one numpy pass, not two Python loops).

        Usually the iteration or decode run just applied already knows the answer (every
        running request decoding, `_all_decoding`): converting a list of a thousand ids to
        an array costs more than the rest of the split, so that answer is reused while no
        iteration has run since and the batch has the same size.
        """
        known = self._all_decoding
        if known is not None and known[0] == self.steps and len(known[1]) == len(self.running):
            return known[1], []
        req = self.req
        if len(self.running) <= SMALL_BATCH:  # the same split with Python ints
            computed, target = req.computed, req.target
            dec: list[int] = []
            pre: list[int] = []
            for r in self.running:
                (dec if computed.item(r) >= target.item(r) else pre).append(r)
            return np.array(dec, dtype=np.int64), pre
        run = np.fromiter(self.running, dtype=np.int64, count=len(self.running))
        done = req.computed[run] >= req.target[run]
        return run[done], run[~done].tolist()

    def _note_all_decoding(self, ids: np.ndarray) -> None:
        """Record that `ids` are the running requests, all decoding, in running order."""
        self._all_decoding = (self.steps, ids)

    def step(self) -> None:
        """Run one iteration, or a closed-form run of identical decode iterations."""
        self.changes += 1
        req = self.req
        cfg = self.cfg
        decoding, prefilling = self._split_running()
        only_decodes = not prefilling  # then the running list is `decoding` + admissions
        budget = cfg.max_batched_tokens * self.pp  # one budget per micro-batch in flight
        per_chunk = cfg.max_batched_tokens  # a chunk rides in one micro-batch
        chunks: list[tuple[int, int, int]] = []  # (request, chunk, prior)
        # per-request reads go through `.item` (a Python int): a profiling step admits a
        # thousand prompts, and numpy scalars cost several times more per operation
        target, computed = req.target, req.computed
        if cfg.chunked_prefill:
            decoding = self._grow_decodes(decoding)
            budget -= len(decoding)
            status = req.status
            for r in prefilling:
                if budget <= 0:
                    break
                if status.item(r) != RUNNING:
                    continue
                prior = computed.item(r)
                c = min(target.item(r) - prior, budget, per_chunk)
                chunks.append((r, c, prior))
                budget -= c
            while self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
                r = self.waiting[0]
                if (
                    not cfg.chunk_prompts
                    and (chunks or len(decoding))
                    and target.item(r) - computed.item(r) > budget
                ):
                    break  # runs whole in a later step
                if not self._try_admit(r):
                    break
                self.waiting.popleft()
                prior = computed.item(r)
                whole = target.item(r) - prior  # after a prefix-cache hit
                c = whole if not cfg.chunk_prompts else min(whole, budget, per_chunk)
                chunks.append((r, c, prior))
                budget -= c
        else:
            # vLLM V0 without chunking: a prefill-only iteration whenever a prompt can start
            while self.waiting and len(self.running) < cfg.max_num_seqs:
                r = self.waiting[0]
                c = int(req.target[r])
                if chunks and c > budget:
                    break
                if not self._try_admit(r):
                    break
                self.waiting.popleft()
                c = int(req.target[r] - req.computed[r])
                chunks.append((r, c, int(req.computed[r])))
                budget -= c
            decoding = decoding[:0] if chunks else self._grow_decodes(decoding)
        if not chunks and not len(decoding):
            if self.waiting and not self.running:
                # head request can never fit: reject it rather than spin forever
                r = self.waiting.popleft()
                req.status[r] = REJECTED
            return
        small = len(decoding) <= SMALL_BATCH  # then Python ints, the same arithmetic
        if small:
            ids = decoding.tolist()
            kv_len = req.kv_len
            kvs = [kv_len.item(r) for r in ids]
            ctx_sum = float(sum(kvs)) + len(ids)
            w = self.window
            sw = float(sum(min(x + 1, w) for x in kvs)) if w else 0.0
        elif len(decoding):
            kv = req.kv_len[decoding]
            ctx_sum = float(_sum(kv)) + len(decoding)
            sw = float(_sum(np.minimum(kv + 1, self.window))) if self.window else 0.0
        else:
            ctx_sum = sw = 0.0
        dt = self.cost.cycle_time(
            len(decoding),
            ctx_sum,
            [(c, p) for _, c, p in chunks],
            sampled=len(decoding) + sum(1 for r, c, p in chunks if p + c >= target.item(r)),
            sliding_ctx_sum=sw,
        )
        self.clock += dt
        self.busy += dt
        self.steps += 1
        still = decoding  # decodes that keep running after this iteration
        if small:
            if ids:
                still = self._decoded_small(ids, kvs, decoding)
        elif len(decoding):
            di = decoding
            req.max_itl[di] = np.maximum(req.max_itl[di], self.clock - req.last_token[di])
            req.last_token[di] = self.clock
            req.kv_len[di] = kv + 1
            generated = req.generated[di] + 1
            req.generated[di] = generated
            finished = generated >= req.output_len[di]
            done = di[finished]
            if len(done):
                still = di[~finished]
                for r in done.tolist():
                    self.running.remove(r)
                    self._finish(r)
        joined: list[int] = []  # admitted prompts that finished prefilling and keep running
        if chunks:
            all_prefilled = self._prefilled(chunks, joined)
            only_decodes = only_decodes and all_prefilled
        if only_decodes and cfg.chunked_prefill:
            # the running list was `decoding`; admissions were appended in chunk order
            self._note_all_decoding(
                np.concatenate((still, np.asarray(joined, dtype=np.int64))) if joined else still
            )
        self.timeline.append((self.clock, self.total_blocks - self.free_blocks - self.evictable))

    def _prefilled(self, chunks: list[tuple[int, int, int]], joined: list[int]) -> bool:
        """`step`'s update of its prefill `chunks` (request, chunk, prior), with Python ints and
        floats (the same values as numpy scalars give): prompts that finish emit their first
        token, and those that keep running are appended to `joined`. False if a prompt is
        still prefilling after this step."""
        req, cfg, clock = self.req, self.cfg, self.clock
        computed, target, kv_len, generated = req.computed, req.target, req.kv_len, req.generated
        first_token, last_token, max_itl = req.first_token, req.last_token, req.max_itl
        output_len = req.output_len
        all_done = True
        for r, c, _ in chunks:
            now_computed = computed.item(r) + c
            computed[r] = now_computed
            kv_len[r] = kv_len.item(r) + c
            if now_computed < target.item(r):
                all_done = False  # a prompt still prefilling
                continue
            if cfg.prefix_caching:
                self._register_prefix(r)
            g = generated.item(r) + 1
            generated[r] = g
            if math.isnan(first_token.item(r)):
                first_token[r] = clock
            else:  # re-prefill after preemption: the user saw a stall
                max_itl[r] = max(max_itl.item(r), clock - last_token.item(r))
            last_token[r] = clock
            if g >= output_len.item(r):
                self.running.remove(r)
                self._finish(r)
            else:
                joined.append(r)
        return all_done

    def _decoded_small(self, ids: list[int], kvs: list[int], decoding: np.ndarray) -> np.ndarray:
        """`step`'s update of its decoding requests `ids` (KV lengths `kvs` before the step),
        element by element; returns those that keep running (`decoding` if all do)."""
        req = self.req
        clock = self.clock
        max_itl, last_token, kv_len = req.max_itl, req.last_token, req.kv_len
        generated, out = req.generated, req.output_len
        keep: list[int] = []
        done: list[int] = []
        for r, x in zip(ids, kvs, strict=True):
            gap = clock - last_token.item(r)
            m = max_itl.item(r)
            max_itl[r] = m if m >= gap else gap  # np.maximum(m, gap)
            last_token[r] = clock
            kv_len[r] = x + 1
            g = generated.item(r) + 1
            generated[r] = g
            (done if g >= out.item(r) else keep).append(r)
        if not done:
            return decoding
        for r in done:
            self.running.remove(r)
            self._finish(r)
        return np.array(keep, dtype=np.int64)

    def _waiting_blocked(self) -> bool:
        """True when no waiting request can start before something finishes."""
        if not self.waiting:
            return True
        if len(self.running) >= self.cfg.max_num_seqs:
            return True
        r = self.waiting[0]
        need = math.ceil(int(self.req.target[r]) / self.bs) + self._reserve(r)
        return need > self._available() - self.watermark_blocks

    def _plan_macro(self, decoding: np.ndarray) -> _Plan | None:
        """Plan the longest run of identical decode iterations (until the first completion or
        the KV pool runs out); None if it would be shorter than 2 iterations."""
        req = self.req
        idx = np.asarray(decoding, dtype=np.int64)
        if len(idx) <= SMALL_BATCH:
            return self._plan_macro_small(idx)
        kv = req.kv_len[idx]
        held = req.blocks[idx]
        b = len(idx)
        left = req.output_len[idx] - req.generated[idx]
        left_min = k_cap = int(_min(left))
        if k_cap < 2:
            return None
        avail = self._available()
        def extra_blocks(k: int) -> int:
            return int(_sum(np.maximum(self._blocks_for(kv, k) - held, 0)))

        grow_cap = np.maximum(self._blocks_for(kv, k_cap) - held, 0)
        grow: np.ndarray | None = grow_cap
        grow_k = k_cap
        grow_total = int(_sum(grow_cap))
        if grow_total > avail:
            grow = None
            k_cap = _largest_fitting(k_cap, lambda k: extra_blocks(k) <= avail)
        if k_cap < 2:
            return None
        cost = self.cost
        s0 = float(_sum(kv)) + b
        if self.pp == 1 and not cost.host_overlap:
            a0 = cost.decode_base(b)
            if self.window:
                a0 += cost.attn_slope_sliding * float(_sum(np.minimum(kv + 1, self.window)))
            slope = cost.attn_slope
        else:
            sw = float(_sum(np.minimum(kv + 1, self.window))) if self.window else 0.0
            line = _binding_line(cost.decode_cycle_lines(b, sw), s0, b, k_cap)
            if line is None:
                return None
            (a0, slope), k_cap = line
        plan = _Plan(idx, kv, held, left, b, k_cap, a0, s0, slope, self.clock, 0.0,
                     grow if grow_k == k_cap else None, grow_k, grow_total, left_min)
        plan.end = self.clock + plan.cum(k_cap)
        return plan

    def _plan_macro_small(self, idx: np.ndarray) -> _Plan | None:
        """`_plan_macro` for at most `SMALL_BATCH` requests, with Python ints (same result)."""
        req = self.req
        ids = idx.tolist()
        kv_len, blocks, out, gen = req.kv_len, req.blocks, req.output_len, req.generated
        kv = [kv_len.item(r) for r in ids]
        held = [blocks.item(r) for r in ids]
        left = [out.item(r) - gen.item(r) for r in ids]
        b = len(ids)
        left_min = k_cap = min(left)
        if k_cap < 2:
            return None
        avail = self._available()
        up = self.bs - 1
        bs = self.bs

        def grow_by(k: int) -> list[int]:
            return [max((x + k + up) // bs - h, 0) for x, h in zip(kv, held, strict=True)]

        grow_cap = grow_by(k_cap)
        grow: list[int] | None = grow_cap
        grow_k = k_cap
        grow_total = sum(grow_cap)
        if grow_total > avail:
            grow = None
            k_cap = _largest_fitting(k_cap, lambda k: sum(grow_by(k)) <= avail)
        if k_cap < 2:
            return None
        cost = self.cost
        s0 = float(sum(kv)) + b
        w = self.window
        if self.pp == 1 and not cost.host_overlap:
            a0 = cost.decode_base(b)
            if w:
                a0 += cost.attn_slope_sliding * float(sum(min(x + 1, w) for x in kv))
            slope = cost.attn_slope
        else:
            sw = float(sum(min(x + 1, w) for x in kv)) if w else 0.0
            line = _binding_line(cost.decode_cycle_lines(b, sw), s0, b, k_cap)
            if line is None:
                return None
            (a0, slope), k_cap = line
        plan = _Plan(idx, kv, held, left, b, k_cap, a0, s0, slope, self.clock, 0.0,
                     grow if grow_k == k_cap else None, grow_k, grow_total, left_min, ids)
        plan.end = self.clock + plan.cum(k_cap)
        return plan

    def _commit(self, p: _Plan, k: int) -> None:
        """Apply the first k iterations of plan p (1 <= k <= p.k_cap)."""
        self.changes += 1
        if p.ids is not None:
            self._commit_small(p, k, p.ids)
            return
        req, idx = self.req, p.idx
        dt = p.cum(k)
        first_gap = p.start + p.a0 + p.slope * p.s0 - req.last_token[idx]
        last_gap = p.a0 + p.slope * (p.s0 + (k - 1) * p.b)
        req.max_itl[idx] = np.maximum(req.max_itl[idx], np.maximum(first_gap, last_gap))
        req.last_token[idx] = p.start + dt
        new_kv = p.kv + k
        if k == p.grow_k and p.grow is not None:
            grow = p.grow
            self._take(p.grow_total)
        else:
            grow = np.maximum(self._blocks_for(new_kv) - p.held, 0)
            self._take(int(_sum(grow)))
        req.blocks[idx] = p.held + grow
        req.kv_len[idx] = new_kv
        req.generated[idx] += k
        self.clock = p.start + dt
        self.busy += dt
        self.steps += k
        if k < p.left_min:  # no request finishes
            self._note_all_decoding(idx)  # the plan held every running request
        else:
            finished = p.left <= k
            for r in idx[finished].tolist():
                self.running.remove(r)
                self._finish(r)
            self._note_all_decoding(idx[~finished])
        self.timeline.append((self.clock, self.total_blocks - self.free_blocks - self.evictable))

    def _commit_small(self, p: _Plan, k: int, ids: list[int]) -> None:
        """`_commit` of a plan made by `_plan_macro_small`, element by element: the same
        float operations in the same order as the numpy expressions, on the same values."""
        req = self.req
        dt = p.cum(k)
        gap0 = p.start + p.a0 + p.slope * p.s0
        last_gap = p.a0 + p.slope * (p.s0 + (k - 1) * p.b)
        t_end = p.start + dt
        max_itl, last_token = req.max_itl, req.last_token
        for r in ids:
            gap = gap0 - last_token.item(r)
            if not gap >= last_gap:  # np.maximum(gap, last_gap)
                gap = last_gap
            m = max_itl.item(r)
            max_itl[r] = m if m >= gap else gap
            last_token[r] = t_end
        if k == p.grow_k and p.grow is not None:
            grow = p.grow
            self._take(p.grow_total)
        else:
            up, bs = self.bs - 1, self.bs
            grow = [max((x + k + up) // bs - h, 0) for x, h in zip(p.kv, p.held, strict=True)]
            self._take(sum(grow))
        blocks, kv_len, generated = req.blocks, req.kv_len, req.generated
        for r, x, h, g in zip(ids, p.kv, p.held, grow, strict=True):
            blocks[r] = h + g
            kv_len[r] = x + k
            generated[r] = generated.item(r) + k
        self.clock = p.start + dt
        self.busy += dt
        self.steps += k
        if k < p.left_min:  # no request finishes
            self._note_all_decoding(p.idx)  # the plan held every running request
        else:
            keep = []
            for r, left in zip(ids, p.left, strict=True):
                if left <= k:
                    self.running.remove(r)
                    self._finish(r)
                else:
                    keep.append(r)
            self._note_all_decoding(np.array(keep, dtype=np.int64))
        self.timeline.append((self.clock, self.total_blocks - self.free_blocks - self.evictable))

    def _macro_ready(self) -> np.ndarray | None:
        """Decoding requests if the next iterations are pure, repeatable decode steps."""
        if not self.cfg.macro_steps or not self.running:
            return None
        if not self._waiting_blocked():
            return None
        decoding, prefilling = self._split_running()
        return None if prefilling else decoding

    def settle(self, t: float) -> None:
        """Commit the part of a pending decode run that starts before t (before routing a
        request here, so it joins at the next iteration boundary after t)."""
        p = self.pending
        if p is None:
            return
        self.pending = None
        if t >= p.end:
            self._commit(p, p.k_cap)
        elif t > p.start:
            self._commit(p, p.steps_before(t))

    def advance(self, t_until: float) -> None:
        """Run iterations that start before `t_until` (a step in flight may end after it).

        A pure-decode run that would cross `t_until` is planned but left pending: other
        replicas' arrivals do not change it, so it is only cut if a request is routed here.
        """
        while self.has_work and self.clock < t_until:
            if self.pending is None:
                decoding = self._macro_ready()
                plan = self._plan_macro(decoding) if decoding is not None else None
                if plan is None:
                    self.step()
                    continue
                self.pending = plan
            p = self.pending
            if p.end <= t_until:
                self.pending = None
                self._commit(p, p.k_cap)
                continue
            return

    def advance_to_completion(self) -> None:
        """Run until at least one request finishes (closed-loop clients)."""
        n = len(self.finished)
        while self.has_work and len(self.finished) == n:
            self._advance_one()

    def _advance_one(self) -> None:
        if self.pending is not None:
            self.settle(INF)
            return
        decoding = self._macro_ready()
        plan = self._plan_macro(decoding) if decoding is not None else None
        if plan is None:
            self.step()
        else:
            self._commit(plan, plan.k_cap)


@dataclass
class SimOutput:
    """Raw simulation results handed to `report.summarize`."""

    req: RequestTable
    replicas: list[Replica]
    makespan: float


def _collect_finished(
    reps: list[Replica], req: RequestTable, seen: list[int], free_slots: list[float]
) -> None:
    """Push the finish times of requests completed since the last call onto the slot heap
    (`seen[i]`: how many of replica i's completions were collected already)."""
    for i, x in enumerate(reps):
        for r in x.finished[seen[i] :]:
            heapq.heappush(free_slots, float(req.finish[r]))
        seen[i] = len(x.finished)


def simulate(
    workload: Workload,
    cost: StepCost,
    plan: MemoryPlan,
    cfg: EngineConfig | None = None,
    replicas: int = 1,
    router: str | Router = "least_outstanding",
    max_concurrency: int | None = None,
    seed: int = 0,
) -> SimOutput:
    """Serve `workload` on `replicas` identical replicas behind `router`.

    `max_concurrency` turns the client closed-loop (like `vllm bench serve
    --max-concurrency`): a request is sent at max(its arrival, the moment an in-flight slot
    frees); latencies count from the send time.
    """
    cfg = cfg or EngineConfig()
    if not plan.fits:
        raise ValueError(f"configuration does not fit: {plan.reason}")
    req = RequestTable.from_workload(workload)
    reps = [Replica(i, cost, plan, cfg, req) for i in range(replicas)]
    route = make_router(router, seed) if isinstance(router, str) else router
    too_long = (req.input_len + req.output_len) > plan.max_context
    req.status[too_long] = REJECTED
    # closed loop: the times at which client slots free up (a request takes the earliest);
    # every slot is free at the start, and a completion frees its slot at its finish time
    free_slots: list[float] = [0.0] * (max_concurrency or 0)
    seen = [0] * len(reps)
    t_client = 0.0  # a closed-loop client sends in order: never before the previous send
    for r in range(req.n):
        if too_long[r]:
            continue
        t = float(req.arrival[r])
        if max_concurrency is not None:
            t = max(t, t_client)
            while not free_slots:
                busy = [x for x in reps if x.has_work]
                if not busy:
                    free_slots.append(t)  # nothing in flight can free a slot: never stall
                    break
                for x in busy:  # the replica that finishes something first frees a slot
                    x.advance_to_completion()
                _collect_finished(reps, req, seen, free_slots)
            t = max(t, heapq.heappop(free_slots))
            req.sent[r] = t
            t_client = t
        # the engine sees the request after the frontend has parsed and tokenized it
        t_engine = t + cost.request_overhead
        for x in reps:
            x.advance(t_engine)
        if max_concurrency is not None:
            _collect_finished(reps, req, seen, free_slots)
        target = reps[route.choose(reps, r)]
        target.enqueue(r, t_engine)
    for x in reps:
        x.advance(INF)
        while x.waiting:  # anything left can never be admitted on an empty replica
            x.step()
    makespan = max([x.clock for x in reps] + [float(req.sent.max()) if req.n else 0.0])
    return SimOutput(req=req, replicas=reps, makespan=makespan)

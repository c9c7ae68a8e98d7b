"""Event-loop hygiene: how late the node's trio loop runs, and which task steps made it so.

Everything on a node shares one event loop, so any step that holds it (a signature check,
a burst of gossip, a garbage collection, a synchronous file write) delays every request
waiting behind it. Two instruments, cheap enough to stay on:

- ``LagSampler``: a task that asks to sleep ``interval`` and records how late it woke
  (the ``otela_event_loop_lag_seconds`` histogram);
- ``SlowSteps``: a trio ``Instrument`` timing every task step, keeping the slowest steps
  (task name, duration) above ``threshold``; ``/v1/health``'s ``event_loop`` shows them,
  so a stall can be traced to what caused it.
"""

from __future__ import annotations

import gc
import heapq
import time
from collections import Counter, deque
from typing import Any

import trio

from otela.metrics import Histogram


class LagSampler:
    """Samples once a second. Every wake-up of an otherwise idle node costs CPU (the loop
    turn, the timer, the hypervisor's share): sampling every 50 ms took an idle node from
    1.25 % to 1.95 % of a core (benchmarks/convergence.py), every 250 ms it added ~0.13 %,
    a tenth of an idle node's CPU once anti-entropy stopped running on a timer. Stalls are
    still counted in proportion to how often they happen (a 20 ms stall is hit 2 % of the
    time), and ``SlowSteps`` below names every step over 5 ms whatever the sampling."""

    def __init__(self, lag: Histogram, label: str = "node", interval: float = 1.0) -> None:
        self.interval = interval
        self.lag = lag
        self.label = label  # the ``process`` label: "node", "control", "worker-N"
        self.worst = 0.0

    async def run(self) -> None:
        while True:
            before = trio.current_time()
            await trio.sleep(self.interval)
            late = trio.current_time() - before - self.interval
            self.lag.observe(max(0.0, late), self.label)
            self.worst = max(self.worst, late)


def freeze_startup_objects() -> None:
    """Move everything allocated while starting (libp2p, imports, the registry) out of the
    garbage collector's reach: a full collection walked all of it, holding the event loop
    for 80-100 ms (every request waiting behind it). Later garbage is still collected."""
    gc.collect()
    gc.freeze()


class SlowSteps(trio.abc.Instrument):
    """Times task steps; keeps the ``keep`` slowest above ``threshold`` seconds."""

    def __init__(self, threshold: float = 0.005, keep: int = 20) -> None:
        self.threshold = threshold
        self.keep = keep
        self.slowest: list[tuple[float, str, float]] = []  # (duration, task, wall time)
        # The latest slow steps, whatever their length: what held the loop in a given
        # window (the slowest of all time may be from a start-up long ago).
        self.recent: deque[tuple[float, str, float]] = deque(maxlen=keep)
        self.by_task: Counter[str] = Counter()  # slow steps per task name
        self._started: float = 0.0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._started = time.perf_counter()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        took = time.perf_counter() - self._started
        if took < self.threshold:
            return
        name = task.name.rsplit(".", 1)[-1]
        self.by_task[name] += 1
        item = (took, name, time.time())
        self.recent.append(item)
        if len(self.slowest) < self.keep:
            heapq.heappush(self.slowest, item)
        elif took > self.slowest[0][0]:
            heapq.heapreplace(self.slowest, item)

    def report(self) -> dict[str, Any]:
        return {
            "slow_steps": [{"task": name, "ms": round(took * 1e3, 2), "at": at}
                           for took, name, at in sorted(self.slowest, reverse=True)],
            "recent_slow_steps": [{"task": name, "ms": round(took * 1e3, 2), "at": at}
                                  for took, name, at in self.recent],
            "slow_steps_by_task": dict(self.by_task.most_common(10)),
        }

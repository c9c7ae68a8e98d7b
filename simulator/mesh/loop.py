"""The discrete-event clock: callbacks at simulated times, in time then insertion order."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any


class Loop:
    """A heap of (time, sequence, callback, args); ``run_until`` advances ``now``."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = 0
        self.handled = 0

    def at(self, when: float, callback: Callable[..., Any], *args: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (max(when, self.now), self._seq, callback, args))

    def after(self, delay: float, callback: Callable[..., Any], *args: Any) -> None:
        self.at(self.now + delay, callback, *args)

    def run_until(self, end: float) -> None:
        heap = self._heap
        pop = heapq.heappop
        while heap and heap[0][0] <= end:
            when, _, callback, args = pop(heap)
            self.now = when
            callback(*args)
            self.handled += 1
        self.now = max(self.now, end)

    def pending(self) -> int:
        return len(self._heap)

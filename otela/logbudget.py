"""A budget for log lines that anyone can cause.

``POST /v1/assignments`` is open to every client (a node that did not opt in answers 403)
and each refusal was logged as a warning: 5,000 fuzzed requests wrote 5,000 lines, so an
anonymous client could fill a node's disk or drown the lines that matter. A token bucket
lets a burst through, then about one line per ``window / burst`` seconds, and the next line
logged says how many were skipped. Counters (e.g. ``Acceptor.refused``) still see every
event. Pure: the caller passes the clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class LogBudget:
    """At most ``burst`` lines at once, refilled at ``burst`` per ``window`` seconds."""

    def __init__(self, burst: int = 20, window: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.burst = burst
        self.rate = burst / window
        self.clock = clock
        self._tokens = float(burst)
        self._at = clock()
        self.skipped = 0  # lines not logged since the last one that was

    def take(self) -> int | None:
        """``None``: do not log this one. Otherwise log it, with this many skipped before
        it (0 usually)."""
        now = self.clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1:
            self.skipped += 1
            return None
        self._tokens -= 1
        skipped, self.skipped = self.skipped, 0
        return skipped

"""Local health (Lifeguard's "local health multiplier"): how much to distrust our own view.

A node starved of CPU or network makes *other* nodes look dead. So each node scores its
own health: being told it is suspected, its event loop waking up late, and probe rounds in
which not even the indirect helpers answered all raise the score (helpers' "could not
reach it either" nacks clear us: then the target is down, not our network); successful
probes lower it. Probe timeouts, the recent-contact window, the probe period and the
suspicion timeout are multiplied by ``1 + score`` (at most ``1 + maximum``), so an
overloaded node waits longer before accusing anyone, instead of setting off a cascade of
false evictions.

Beyond that, a node whose event loop woke up late within the stale window accuses nobody
at all (``lagging``): its failed probes say more about itself than about its peers, and
the refutation that would clear a suspect may sit unread in its socket buffers. (It does
not catch a machine where every loop is on time but every peer answers late; adaptive
probe timeouts, ``rtt.py``, are for that.) Pure: callers pass times in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class LocalHealth:
    maximum: int  # the score's ceiling
    stale_window: float  # how long a late wake-up keeps us from accusing anyone
    probe_interval: float  # waking up later than half of it counts as late
    on_change: Callable[[int], None] = field(default=lambda multiplier: None)
    score: int = 0  # 0 = healthy
    late_at: float | None = None  # when our event loop last woke up late

    @property
    def multiplier(self) -> int:
        return 1 + self.score

    def worse(self) -> None:
        self._set(self.score + 1)

    def better(self) -> None:
        self._set(self.score - 1)

    def _set(self, score: int) -> None:
        self.score = max(0, min(self.maximum, score))
        self.on_change(self.multiplier)

    def slept(self, asked: float, took: float, now: float) -> None:
        """We asked to sleep ``asked`` seconds and woke up after ``took``: more than half a
        probe period late means our own event loop is the slow one."""
        if took - asked > self.probe_interval / 2:
            self.late_at = now
            self.worse()

    def lagging(self, now: float) -> bool:
        """Whether our event loop woke late within the last stale window (see above)."""
        return self.late_at is not None and now - self.late_at < self.stale_window

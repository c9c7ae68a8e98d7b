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
probe timeouts, ``rtt.py``, are for that.)

That machine is the one a saturated host makes: every process's probes and acks queue for
a core, loops still wake on time, and every peer looks slow at once. The kernel sees it
(``otela.hostload``: the share of the last 10 s in which a runnable task waited for a
core), so host CPU pressure above ``SATURATED_PRESSURE`` puts a floor under the score,
rising to the maximum at 100 %: the node probes less often (less of the load that
saturated the host) and waits longer before accusing or confirming anyone; the floor goes
as the pressure falls. On its own hardware a node rarely sees this; on a host shared by
many nodes (128 daemons on 2 cores) it is what set off cascades of false evictions.
Pure: callers pass times and pressure in.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

# Host CPU pressure (percent) from which the host counts as saturated. Measured on a 2-core
# VM: the test suite's federations (2 workers) run at 32 % median, 70 % p90, 86 % max;
# 64 nodes under churn at 55-99 %; 100-128 nodes cascading at 99-100 %.
SATURATED_PRESSURE = 80.0


def pressure_floor(pressure: float | None, maximum: int) -> int:
    """The least score a host at ``pressure`` percent CPU pressure allows: 0 up to
    ``SATURATED_PRESSURE``, then rising linearly to ``maximum`` at 100 %."""
    if pressure is None or pressure <= SATURATED_PRESSURE:
        return 0
    share = (min(pressure, 100.0) - SATURATED_PRESSURE) / (100.0 - SATURATED_PRESSURE)
    return min(maximum, math.ceil(maximum * share))


@dataclass
class LocalHealth:
    maximum: int  # the score's ceiling
    stale_window: float  # how long a late wake-up keeps us from accusing anyone
    probe_interval: float  # waking up later than half of it counts as late
    on_change: Callable[[int], None] = field(default=lambda multiplier: None)
    score: int = 0  # 0 = healthy
    late_at: float | None = None  # when our event loop last woke up late
    host_floor: int = 0  # the least score our host's CPU pressure allows now

    @property
    def multiplier(self) -> int:
        return 1 + max(self.score, self.host_floor)

    def observe_host(self, pressure: float | None) -> None:
        """Our host's CPU pressure now, in percent (None where the kernel does not say)."""
        floor = pressure_floor(pressure, self.maximum)
        if floor != self.host_floor:
            self.host_floor = floor
            self.on_change(self.multiplier)

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

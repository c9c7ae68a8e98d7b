"""What happened to whom and when: the failure detector's event log.

Operators ask "why did my node stop getting traffic?" (``/v1/network``, ``otela doctor``)
and the SIGKILL benchmark reads detection times from here, so times are wall-clock.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Collection
from typing import Any

EVENT_HISTORY = 200  # events kept, newest last


class EventLog:
    def __init__(self, clock: Callable[[], float] = time.time,
                 history: int = EVENT_HISTORY) -> None:
        self.clock = clock
        self.events: deque[dict[str, Any]] = deque(maxlen=history)
        self._suspected_since: dict[str, float] = {}

    def record(self, peer_id: str, event: str, detail: str) -> None:
        at = self.clock()
        if event == "suspected":
            self._suspected_since.setdefault(peer_id, at)
        elif event == "refuted":
            self._suspected_since.pop(peer_id, None)
        self.events.append({"at": at, "peer_id": peer_id, "event": event, "detail": detail})

    def suspected_since(self, peer_id: str) -> float | None:
        return self._suspected_since.get(peer_id)

    def forget(self, peer_id: str) -> None:
        """Forget the suspicion time of a peer no longer a member."""
        self._suspected_since.pop(peer_id, None)

    def keep_only(self, members: Collection[str]) -> None:
        """Forget suspicion times of peers that are no longer members."""
        self._suspected_since = {p: t for p, t in self._suspected_since.items()
                                 if p in members}

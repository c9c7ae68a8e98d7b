"""Count the requests a node is relaying, so a graceful stop can wait for them to finish.

A draining node first announces DOWN (no new requests come), then waits until this
count reaches zero or the grace period ends, and only then stops its engine. A request
counts from the moment it is accepted until its response is fully sent (the last chunk
of a stream included) or its client goes away; ``track`` ties the count to that span, so
no path (an exception, a cancellation, a client hanging up) can leave it raised.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import trio


class Inflight:
    def __init__(self) -> None:
        self.count = 0
        self._idle = trio.Event()
        self._idle.set()

    @contextmanager
    def track(self) -> Iterator[None]:
        """Count one request for the duration of the ``with`` block."""
        self.count += 1
        if self._idle.is_set():
            self._idle = trio.Event()
        try:
            yield
        finally:
            self.count -= 1
            if self.count <= 0:
                self.count = 0
                self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until nothing is in flight; ``False`` if ``timeout`` ran out first. Idle
        now is True even with no time left (a drain whose grace its workers used up)."""
        if self._idle.is_set():
            return True
        with trio.move_on_after(timeout):
            await self._idle.wait()
            return True
        return False

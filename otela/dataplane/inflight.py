"""Count the requests a node is relaying, so a graceful stop can wait for them to finish.

A draining node first announces DOWN (no new requests come), then waits until this
count reaches zero or the grace period ends, and only then stops its engine. Streaming
responses count until their last chunk is relayed.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator

import trio
from fastapi.responses import Response, StreamingResponse


class Inflight:
    def __init__(self) -> None:
        self.count = 0
        self._idle = trio.Event()
        self._idle.set()

    def begin(self) -> None:
        self.count += 1
        if self._idle.is_set():
            self._idle = trio.Event()

    def end(self) -> None:
        self.count -= 1
        if self.count <= 0:
            self.count = 0
            self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until nothing is in flight; ``False`` if ``timeout`` ran out first."""
        with trio.move_on_after(timeout):
            await self._idle.wait()
            return True
        return False

    def hold_until_sent(self, response: Response) -> Response:
        """End this request's count once ``response`` is fully sent (call after ``begin``)."""
        if isinstance(response, StreamingResponse):
            response.body_iterator = self._release_after(response.body_iterator)
        else:
            self.end()
        return response

    async def _release_after(
        self, chunks: AsyncIterable[str | bytes | memoryview]
    ) -> AsyncIterator[bytes]:
        try:
            async for chunk in chunks:
                yield chunk.encode() if isinstance(chunk, str) else bytes(chunk)
        finally:
            self.end()

"""Probe channels: a stream slow to open is opened once, not once per timed-out probe."""

from __future__ import annotations

from typing import Any

import msgpack
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from otela.liveness.channels import Channels


class SilentStream:
    """Accepts frames and never answers (a peer too busy to reply in time)."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    async def write(self, data: bytes) -> None:
        self.written.append(data)

    async def read(self, n: int = -1) -> bytes:
        await trio.sleep_forever()
        return b""

    async def reset(self) -> None:
        pass


class SlowHost:
    """Negotiating a stream takes ``delay`` seconds, longer than a probe's timeout."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.opened: list[SilentStream] = []
        self.attempts = 0

    async def new_stream(self, peer: ID, protocols: list[TProtocol]) -> Any:
        self.attempts += 1
        await trio.sleep(self.delay)
        stream = SilentStream()
        self.opened.append(stream)
        return stream


def test_a_slow_stream_is_opened_once_and_then_carries_the_probes() -> None:
    peer = ID.from_pubkey(create_new_key_pair().public_key).to_base58()
    host = SlowHost(delay=0.5)
    channels = Channels(host, TProtocol("/test/1"), msgpack.packb,
                        lambda sender, data: msgpack.unpackb(data))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(channels.run)
            for _ in range(4):  # each probe gives up after 0.2 s, the opening goes on
                assert await channels.request(peer, {"k": "ping"}, 0.2) is None
            assert await channels.request(peer, {"k": "ping"}, 0.2) is None
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert host.attempts == 1
    assert len(host.opened) == 1 and len(host.opened[0].written) >= 1
    assert channels.stats["streams_opened"] == 1

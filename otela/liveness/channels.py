"""Request/reply over one long-lived libp2p stream per peer, for the failure detector.

A new stream per probe costs ~4 ms of CPU on each side in py-libp2p (multistream-select
negotiation alone ~1.8 ms, plus Yamux stream set-up) and two extra round trips, which
under CPU starvation (many daemons on few cores) is what made probes time out. Here each
node keeps one outbound stream per peer it probes; every frame is a msgpack map with a
request id ``i`` that the reply echoes, so replies may come back in any order and a late
reply to a request that already timed out is simply dropped. A broken stream is
forgotten and reopened on the next request.

The serving side answers each request on the stream it came in on; requests that take
time (asking a third peer) run concurrently, so one slow target never delays the acks
of others.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from otela.mesh.framing import read_frame, write_frame

log = logging.getLogger("otela.liveness")

MAX_MESSAGE_BYTES = 64 * 1024
# Requests one inbound stream may have in flight: an honest prober has a handful (a ping
# and a few indirect probes); a misbehaving peer writing thousands of ``req`` frames would
# otherwise start a task (and a probe of a third peer) for each. Beyond it, requests are
# dropped unanswered, as a lost packet would be.
MAX_IN_FLIGHT_PER_STREAM = 64

Pack = Callable[[str, dict[str, Any]], bytes]  # (the peer it goes to, the message)
Unpack = Callable[[str, bytes], dict[str, Any]]
Answer = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any] | None]]


class _Channel:
    def __init__(self, peer: str, stream: Any) -> None:
        self.peer = peer
        self.stream = stream
        self.write_lock = trio.Lock()
        self.waiting: dict[int, trio.MemorySendChannel[dict[str, Any]]] = {}
        self.broken = False


class Channels:
    """Outbound request channels (one stream per peer) and the inbound server."""

    def __init__(self, host: Any, protocol: TProtocol, pack: Pack, unpack: Unpack) -> None:
        self.host = host
        self.protocol = protocol
        self.pack = pack  # adds piggybacked news to every frame we send
        self.unpack = unpack  # applies the news in every frame we receive
        self._channels: dict[str, _Channel] = {}
        self._opening: dict[str, trio.Lock] = {}
        self._ids = itertools.count(1)
        self._nursery: trio.Nursery | None = None
        self.stats = {"streams_opened": 0, "streams_broken": 0, "requests_dropped": 0}

    async def run(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Own the reader tasks of outbound channels; runs until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    # -- client side ---------------------------------------------------------------------

    async def request(self, peer: str, message: dict[str, Any], timeout: float
                      ) -> dict[str, Any] | None:
        """Send ``message`` to ``peer`` and wait for its reply; None on timeout or error."""
        request_id = next(self._ids)
        send, receive = trio.open_memory_channel[dict[str, Any]](1)
        channel: _Channel | None = None
        with trio.move_on_after(timeout):
            try:
                channel = await self._channel(peer)
                channel.waiting[request_id] = send
                async with channel.write_lock:
                    await write_frame(channel.stream, self.pack(peer, {**message, "i": request_id}))
                return await receive.receive()
            except (trio.EndOfChannel, trio.BrokenResourceError):
                return None  # the stream broke while we waited
            except Exception as exc:  # unreachable peers fail in many transport-specific ways
                log.debug("swim %s to %s failed: %s", message.get("k"), peer, exc)
                if channel is not None:
                    await self._break(channel)
                return None
            finally:
                if channel is not None:
                    channel.waiting.pop(request_id, None)
        return None

    async def _channel(self, peer: str) -> _Channel:
        channel = self._channels.get(peer)
        if channel is not None and not channel.broken:
            return channel
        lock = self._opening.setdefault(peer, trio.Lock())
        async with lock:  # concurrent requests to one peer open one stream
            channel = self._channels.get(peer)
            if channel is not None and not channel.broken:
                return channel
            stream = await self.host.new_stream(ID.from_base58(peer), [self.protocol])
            channel = _Channel(peer, stream)
            self._channels[peer] = channel
            self.stats["streams_opened"] += 1
            assert self._nursery is not None, "run() first"
            self._nursery.start_soon(self._read_replies, channel)
            return channel

    async def _read_replies(self, channel: _Channel) -> None:
        try:
            while True:
                reply = self.unpack(channel.peer,
                                    await read_frame(channel.stream, MAX_MESSAGE_BYTES))
                request_id = reply.get("i")
                waiter = channel.waiting.pop(request_id, None) if isinstance(
                    request_id, int) else None
                if waiter is not None:
                    waiter.send_nowait(reply)
        except Exception as exc:  # closed connection, reset stream, garbage from the peer
            log.debug("swim channel to %s closed: %s", channel.peer, exc)
        finally:
            await self._break(channel)

    async def _break(self, channel: _Channel) -> None:
        if channel.broken:
            return
        channel.broken = True
        self.stats["streams_broken"] += 1
        if self._channels.get(channel.peer) is channel:
            del self._channels[channel.peer]
        for waiter in channel.waiting.values():
            waiter.close()  # wakes the requester with EndOfChannel
        channel.waiting.clear()
        try:
            await channel.stream.reset()
        except Exception:
            log.debug("resetting swim stream to %s failed", channel.peer, exc_info=True)

    def forget(self, peer: str) -> None:
        """Drop the channel to ``peer`` (its reader ends when the connection closes)."""
        channel = self._channels.pop(peer, None)
        if channel is not None:
            channel.broken = True

    # -- server side ---------------------------------------------------------------------

    async def serve(self, stream: Any, admitted: Callable[[ID], bool], answer: Answer) -> None:
        """Answer every request arriving on ``stream`` until it closes."""
        peer_id = stream.muxed_conn.peer_id
        peer = peer_id.to_base58()
        write_lock = trio.Lock()
        in_flight = 0

        async def reply(message: dict[str, Any]) -> None:
            nonlocal in_flight
            try:
                response = await answer(peer, message)
                if response is not None:
                    async with write_lock:
                        await write_frame(stream,
                                          self.pack(peer, {**response, "i": message.get("i")}))
            finally:
                in_flight -= 1

        try:
            async with trio.open_nursery() as nursery:
                while True:
                    data = await read_frame(stream, MAX_MESSAGE_BYTES)
                    if not admitted(peer_id):
                        return
                    message = self.unpack(peer, data)
                    if in_flight >= MAX_IN_FLIGHT_PER_STREAM:
                        self.stats["requests_dropped"] += 1
                        continue
                    in_flight += 1
                    nursery.start_soon(reply, message)
        except Exception as exc:  # a misbehaving peer must never take the handler down
            log.debug("swim stream from %s ended: %s", peer, exc)
        finally:
            try:
                await stream.reset()
            except Exception:
                log.debug("closing swim stream from %s failed", peer, exc_info=True)

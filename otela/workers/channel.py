"""Messages between a node's control process and its data-path workers: length-prefixed
msgpack maps over a Unix socket pair (inherited by the worker at spawn), written and read
with the request path's non-blocking socket helpers."""

from __future__ import annotations

import socket
import struct
from typing import Any

import msgpack
import trio

from otela.dataplane import sockio

_HEADER = struct.Struct(">I")
MAX_MESSAGE = 64 * 1024 * 1024  # a registry snapshot of a very large federation fits


class ChannelClosed(Exception):
    """The other process is gone (or sent garbage)."""


class Channel:
    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock
        self._buffer = bytearray()
        # Several tasks send (the state pusher, an admin call telling workers to refresh
        # their keys): a message is written whole before the next one starts.
        self._sending = trio.Lock()

    async def send(self, message: dict[str, Any]) -> None:
        data = msgpack.packb(message, use_bin_type=True)
        async with self._sending:
            try:
                await sockio.send_all(self.sock, _HEADER.pack(len(data)) + data)
            except sockio.Closed as exc:
                raise ChannelClosed(str(exc)) from None

    async def receive(self) -> dict[str, Any]:
        while True:
            if len(self._buffer) >= _HEADER.size:
                (length,) = _HEADER.unpack_from(self._buffer)
                if length > MAX_MESSAGE:
                    raise ChannelClosed(f"message of {length} bytes")
                if len(self._buffer) >= _HEADER.size + length:
                    data = bytes(self._buffer[_HEADER.size:_HEADER.size + length])
                    del self._buffer[:_HEADER.size + length]
                    try:
                        message = msgpack.unpackb(data, raw=False, strict_map_key=False)
                    except Exception as exc:
                        raise ChannelClosed(f"undecodable message: {exc}") from None
                    if not isinstance(message, dict):
                        raise ChannelClosed("not a message")
                    return message
            try:
                chunk = await sockio.recv(self.sock)
            except sockio.Closed as exc:
                raise ChannelClosed(str(exc)) from None
            if not chunk:
                raise ChannelClosed("the other process closed the channel")
            self._buffer += chunk

    def close(self) -> None:
        sockio.close(self.sock)

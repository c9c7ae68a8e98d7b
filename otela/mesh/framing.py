"""Length-prefixed frames over libp2p streams, with a hard size limit.

A frame is a 4-byte big-endian length followed by that many bytes. A peer announcing a
frame over the limit is cut off before we read its body.
"""

from __future__ import annotations

import struct
from typing import Any

MAX_FRAME_BYTES = 8 * 1024 * 1024
_HEADER = struct.Struct(">I")


class FrameError(IOError):
    """The peer sent an oversized frame or closed mid-frame."""


async def read_exactly(stream: Any, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = await stream.read(n - len(buf))
        if not chunk:
            raise FrameError(f"stream closed after {len(buf)} of {n} bytes")
        buf.extend(chunk)
    return bytes(buf)


async def read_frame(stream: Any, limit: int = MAX_FRAME_BYTES) -> bytes:
    (length,) = _HEADER.unpack(await read_exactly(stream, _HEADER.size))
    if length > limit:
        raise FrameError(f"frame of {length} bytes exceeds limit {limit}")
    return await read_exactly(stream, length)


async def write_frame(stream: Any, payload: bytes) -> None:
    if len(payload) > MAX_FRAME_BYTES:
        raise FrameError(f"frame of {len(payload)} bytes exceeds limit {MAX_FRAME_BYTES}")
    await stream.write(_HEADER.pack(len(payload)) + payload)

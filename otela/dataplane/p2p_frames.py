"""Frames of the ``/otela/http/2`` protocol: many HTTP exchanges on one long-lived stream.

A new libp2p stream per request costs ~4 ms direct and 7-10 ms through a relay (each
multistream-select round trip crosses the Python relay), so requests share streams and are
told apart by a request id. A frame is a 9-byte header ``>IBI`` (request id, kind, payload
length) and the payload.

Client to server: ``REQUEST`` (msgpack ``{"path", "headers", "body"}``), ``CANCEL``.
Server to client: ``HEAD`` (msgpack ``{"status", "headers"}``), ``DATA`` (raw body bytes,
possibly many), ``END``, or ``ERROR`` (msgpack ``{"message", "not_delivered"}``) instead of
HEAD/DATA/END. ``not_delivered`` is true only when the engine provably never saw the request.
Headers are ``[[name, value], ...]`` byte pairs: exactly what HTTP carried, repeated
headers and non-ASCII values included.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Any

import msgpack
from libp2p.custom_types import TProtocol
from libp2p.network.stream.exceptions import StreamEOF

HTTP_PROTOCOL = TProtocol("/otela/http/2")
HEADER = struct.Struct(">IBI")
MAX_PAYLOAD = 32 * 1024 * 1024  # a request body larger than this is refused, not buffered


class Kind(enum.IntEnum):
    REQUEST = 1
    CANCEL = 2
    HEAD = 3
    DATA = 4
    END = 5
    ERROR = 6


class FrameError(Exception):
    """The peer sent something that is not a valid frame; the stream must be dropped."""


@dataclass(frozen=True)
class Frame:
    request_id: int
    kind: Kind
    payload: bytes = b""

    def encode(self) -> bytes:
        return HEADER.pack(self.request_id, int(self.kind), len(self.payload)) + self.payload

    def fields(self) -> dict[str, Any]:
        """The msgpack map of a REQUEST, HEAD or ERROR frame."""
        try:
            value = msgpack.unpackb(self.payload, raw=False)
        except Exception as exc:
            raise FrameError(f"bad {self.kind.name} payload: {exc}") from exc
        if not isinstance(value, dict):
            raise FrameError(f"bad {self.kind.name} payload: not a map")
        return value


def packed(request_id: int, kind: Kind, fields: dict[str, Any]) -> Frame:
    return Frame(request_id, kind, msgpack.packb(fields, use_bin_type=True))


# RFC 9110 token characters: what a header name may hold. Anything else (CR, LF, ':',
# spaces, NUL) would let the sender write its own header lines, or a second request,
# into the HTTP/1.1 that the receiving node writes to its engine or to its client.
_TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789"
                   b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_FORBIDDEN_IN_VALUES = (b"\r", b"\n", b"\0")


def header_pairs(value: Any) -> list[tuple[bytes, bytes]]:
    """Headers from a frame: a list of [name, value] byte pairs; ``FrameError`` otherwise,
    also for names that are not tokens and values holding CR, LF or NUL (header
    injection). Other bytes in values (non-ASCII included) pass as they are."""
    if not isinstance(value, list | tuple):
        raise FrameError("headers must be a list of pairs")
    pairs = []
    for item in value:
        if (not isinstance(item, list | tuple) or len(item) != 2
                or not all(isinstance(x, bytes) for x in item)):
            raise FrameError("headers must be [name, value] byte pairs")
        name, text = item
        if not name or not _TOKEN.issuperset(name):
            raise FrameError(f"invalid header name {name[:64]!r}")
        if any(c in text for c in _FORBIDDEN_IN_VALUES):
            raise FrameError(f"header {name[:64]!r} has CR, LF or NUL in its value")
        pairs.append((name.lower(), text))
    return pairs


def request_path(value: Any) -> str:
    """A REQUEST frame's path, without spaces or control characters (``FrameError``
    otherwise). Over HTTP the parser guarantees it; over libp2p a member could send
    ``/v1/x HTTP/1.1\\r\\n...`` and write a request line and headers of its own to the
    engine. Non-ASCII passes as over HTTP (UTF-8 bytes, never a line break)."""
    if not isinstance(value, str) or not value.startswith("/") or len(value) > 8192:
        raise FrameError("path must be a string starting with '/'")
    if any(c <= " " or c == "\x7f" for c in value):
        raise FrameError("path holds spaces or control characters")
    return value


class FrameReader:
    """Reads whole frames from a libp2p stream (whose ``read`` raises ``StreamEOF`` at end)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self._buffer = bytearray()

    async def _fill(self, size: int) -> bool:
        while len(self._buffer) < size:
            try:
                chunk = await self.stream.read(max(65536, size - len(self._buffer)))
            except StreamEOF:
                return False
            if not chunk:
                return False
            self._buffer += chunk
        return True

    async def next(self) -> Frame | None:
        """The next frame, or ``None`` at a clean end of stream between frames."""
        if not await self._fill(HEADER.size):
            if self._buffer:
                raise FrameError("stream ended inside a frame header")
            return None
        request_id, kind, length = HEADER.unpack(bytes(self._buffer[: HEADER.size]))
        if length > MAX_PAYLOAD:
            raise FrameError(f"frame of {length} bytes exceeds the {MAX_PAYLOAD} byte limit")
        try:
            frame_kind = Kind(kind)
        except ValueError:
            raise FrameError(f"unknown frame kind {kind}") from None
        if not await self._fill(HEADER.size + length):
            raise FrameError("stream ended inside a frame")
        payload = bytes(self._buffer[HEADER.size : HEADER.size + length])
        del self._buffer[: HEADER.size + length]
        return Frame(request_id, frame_kind, payload)

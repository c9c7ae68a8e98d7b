"""Socket I/O for the request path: non-blocking stdlib sockets, waiting only when needed.

trio's socket objects wait for readiness behind a checkpoint on every call, and its
``SocketStream`` adds more layers; on a proxy hop that is several of the ~300 µs a request
may cost. Here a call first tries the operation and parks the task (``wait_readable`` /
``wait_writable``) only when the kernel has nothing to give or no room, which on a busy
keep-alive connection is the exception. Callers own timeouts (cancel scopes) and must call
``close`` rather than ``socket.close`` so that trio forgets the descriptor first.
"""

from __future__ import annotations

import os
import socket

import trio

RECV_SIZE = 65536


class Closed(Exception):
    """The peer reset the connection (``reset``), or it is closed."""

    def __init__(self, message: str, reset: bool = False) -> None:
        super().__init__(message)
        self.reset = reset


async def recv(sock: socket.socket, size: int = RECV_SIZE) -> bytes:
    """Up to ``size`` bytes; ``b""`` at end of stream; ``Closed`` if the connection broke."""
    while True:
        try:
            return sock.recv(size)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(sock.fileno())
        except OSError as exc:
            raise Closed(exc.strerror or str(exc), isinstance(exc, ConnectionResetError)
                         ) from None


def try_send(sock: socket.socket, data: bytes | memoryview) -> int:
    """Send what the kernel takes now, without waiting; ``Closed`` if it broke."""
    try:
        return sock.send(data)
    except BlockingIOError:
        return 0
    except OSError as exc:
        raise Closed(exc.strerror or str(exc), isinstance(exc, ConnectionResetError)) from None


async def send_all(sock: socket.socket, data: bytes) -> None:
    """Send all of ``data``, waiting for room as needed; ``Closed`` if it broke."""
    sent = try_send(sock, data)
    if sent == len(data):
        return
    view = memoryview(data)[sent:]
    while view:
        await trio.lowlevel.wait_writable(sock.fileno())
        view = view[try_send(sock, view):]


def close(sock: socket.socket) -> None:
    """Close ``sock``, waking any task waiting on it (trio must forget it first)."""
    if sock.fileno() >= 0:
        trio.lowlevel.notify_closing(sock.fileno())
    sock.close()


def connected_socket(family: socket.AddressFamily) -> socket.socket:
    """A new TCP socket set up for the request path: non-blocking, Nagle off."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


async def connect(sock: socket.socket, address: tuple[str, int]) -> None:
    """Connect a non-blocking socket; ``OSError`` if it fails."""
    try:
        sock.connect(address)
        return
    except BlockingIOError:
        pass
    await trio.lowlevel.wait_writable(sock.fileno())
    error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if error:
        raise OSError(error, os.strerror(error))

"""Whether anything still listens at a peer's addresses: a TCP connect, no libp2p.

A peer whose every direct address refuses a TCP connection (RST to our SYN) has its host
up and no process listening: a crashed or killed daemon. A slow, frozen or partitioned
peer never refuses; its connects are accepted by its kernel or time out. The failure
detector asks this of a neighbour whose connection just dropped and whose probes failed
(``otela.liveness.prober``), so that a crash is suspected without first waiting out the
recent-contact window meant for slow peers. It also asks, now and then, of a member it
holds no connection to (``answer_at``): one that does not accept a connect is probed in
full, which is how a member nobody on our side of a partition watches gets noticed.

A plain connect, not a libp2p dial: py-libp2p retries a refused dial with backoff
(~0.7 s) and then blocks the peer in a negative cache, and a cancelled dial reports
nothing; a connect answers in one round trip, and a live listener just sees a connection
reset before the handshake.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterable
from typing import Literal

import multiaddr
import trio

CONNECT_TIMEOUT_S = 0.5

# How addresses answer a connect; see ``answer_at`` (``none``: there was no address to try).
ConnectAnswer = Literal["accepted", "refused", "unknown", "none"]


def direct_tcp_addresses(addrs: Iterable[multiaddr.Multiaddr]) -> list[tuple[str, int]]:
    """The (host, port) of each plain TCP address (relayed and other transports left out)."""
    found = []
    for addr in addrs:
        names = [p.name for p in addr.protocols()]
        if len(names) < 2 or names[0] not in ("ip4", "ip6") or names[1] != "tcp" or any(
                name not in ("ip4", "ip6", "tcp", "p2p") for name in names):
            continue
        found.append((addr.value_for_protocol(names[0]), int(addr.value_for_protocol("tcp"))))
    return found


async def nothing_listens_at(addrs: Iterable[multiaddr.Multiaddr]) -> bool:
    """``nothing_listens`` at a peer's multiaddrs (its plain TCP ones)."""
    return await nothing_listens(direct_tcp_addresses(addrs))


async def answer_at(addrs: Iterable[multiaddr.Multiaddr],
                    timeout: float = CONNECT_TIMEOUT_S) -> ConnectAnswer:
    """How a peer's plain TCP addresses answer a connect: ``accepted`` (one did: some
    process listens, stop there), ``refused`` (every one refused: nothing listens),
    ``unknown`` (no answer in time from at least one, none accepted: cut off, or a host too
    busy to answer) or ``none`` (no plain TCP address to try: behind a NAT, say)."""
    addresses = direct_tcp_addresses(addrs)
    if not addresses:
        return "none"
    answers: set[ConnectAnswer] = set()
    for host, port in addresses:
        answer = await _connect(host, port, timeout)
        if answer == "accepted":
            return answer
        answers.add(answer)
    return "refused" if answers == {"refused"} else "unknown"


async def nothing_listens(addresses: list[tuple[str, int]],
                          timeout: float = CONNECT_TIMEOUT_S) -> bool:
    """True only if there is at least one address and every one refused a connection."""
    if not addresses:
        return False
    for host, port in addresses:
        if not await _refused(host, port, timeout):
            return False
    return True


async def accepts_connections(host: str, port: int, timeout: float = CONNECT_TIMEOUT_S) -> bool:
    """True only if a TCP connect to ``host:port`` completed: some process listens there."""
    return await _connect(host, port, timeout) == "accepted"


async def _refused(host: str, port: int, timeout: float) -> bool:
    return await _connect(host, port, timeout) == "refused"


async def _connect(host: str, port: int, timeout: float) -> ConnectAnswer:
    """``accepted``, ``refused`` (the host is up, nothing listens) or ``unknown`` (no
    answer in time, no route: maybe there, maybe cut off)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = trio.socket.socket(family, socket.SOCK_STREAM)
    # Closed with a reset, not a FIN: the daemon listening there then drops the connection
    # at its first read. After a FIN it tried a libp2p handshake first, 6.3 ms of its CPU
    # per connect against 1.6 (benchmarks: a reach sample asks 8 members at once, and on
    # 2 cores 16 daemons sampling together after a kill delayed detection by 0.2-0.3 s).
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    try:
        with trio.move_on_after(timeout):
            await sock.connect((host, port))
            return "accepted"
        return "unknown"
    except ConnectionRefusedError:
        return "refused"
    except OSError:
        return "unknown"
    finally:
        sock.close()

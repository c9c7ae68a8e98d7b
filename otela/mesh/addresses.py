"""Which addresses a node advertises, so that other hosts can actually dial it.

A node listening on a wildcard (``0.0.0.0``) must put real addresses in its record and
print them. ``gethostbyname(gethostname())`` is not one: Debian and many cluster images
map the host name to ``127.0.1.1`` in ``/etc/hosts``, so a second host was told to dial
itself. Instead we list the host's IPv4 interface addresses (``SIOCGIFCONF``; no new
dependency, no subprocess) and order them so the routable one comes first: the source
address of the default route (a UDP ``connect`` sends no packet), then the other
non-loopback ones, loopback last and only when nothing else exists or alongside others.

Order matters beyond printing: py-libp2p dials at most one TCP address per peer, the first
non-loopback one it holds, so the first address is the one peers use.

``select_hosts`` and ``expand`` are pure (tested without a network); ``interface_ipv4``
and ``default_route_ipv4`` read the machine.
"""

from __future__ import annotations

import array
import ipaddress
import socket
import struct
import sys
from collections.abc import Iterable

WILDCARDS = frozenset({"", "0.0.0.0"})
MAX_ADVERTISED = 16  # a record stays small on hosts with many bridges and aliases
_SIOCGIFCONF = 0x8912
_IFREQ_SIZE = 40  # struct ifreq on 64-bit Linux: 16-byte name + 24-byte union
_MAX_INTERFACES = 256
# TEST-NET-1 (RFC 5737): never routed, so connecting a UDP socket to it only asks the
# kernel which source address the default route would use.
_PROBE_TARGET = ("192.0.2.1", 9)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _rank(host: str) -> int:
    """Lower is more likely to be reachable from other hosts."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return 1  # a name: the operator chose it
    if ip.is_loopback:
        return 4
    if ip.is_link_local:
        return 3
    if ip.is_private:
        return 2
    return 1


def select_hosts(interfaces: Iterable[str], preferred: str | None = None) -> list[str]:
    """The hosts to advertise for a wildcard listener, routable first.

    ``preferred`` (the default route's source address) leads when it is one of ours; the
    rest go public, private, link-local, then loopback (kept alongside the others: local
    tools may use it, and libp2p dialers skip loopback when anything else is offered).
    Unusable entries (wildcards, non-IPv4) are dropped; with nothing left, ``127.0.0.1``.
    """
    seen: list[str] = []
    for host in interfaces:
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            continue
        if ip.version != 4 or ip.is_unspecified or ip.is_multicast or str(ip) in seen:
            continue
        seen.append(str(ip))
    lead = [preferred] if preferred in seen else []
    rest = sorted((h for h in seen if h not in lead), key=_rank)  # stable within a rank
    hosts = (lead + rest)[:MAX_ADVERTISED]
    return hosts or ["127.0.0.1"]


def advertised_hosts(listen_host: str, public_host: str | None) -> list[str]:
    """What replaces the listen IP in advertised addresses: ``--public-host`` when given,
    else the listen host itself, else (a wildcard) this machine's interfaces."""
    if public_host:
        return [public_host]
    if listen_host not in WILDCARDS:
        return [listen_host]
    return select_hosts(interface_ipv4(), default_route_ipv4())


def loopback_url(listen_host: str, port: int) -> str:
    """The URL a process on this host reaches a port listening on ``listen_host`` at: the
    loopback address for a wildcard, else the listen address itself."""
    if listen_host in WILDCARDS:
        host = "127.0.0.1"
    elif listen_host == "::":
        host = "[::1]"
    else:
        host = f"[{listen_host}]" if ":" in listen_host else listen_host
    return f"http://{host}:{port}"


def expand(listen_addrs: Iterable[str], listen_host: str, hosts: list[str]) -> list[str]:
    """Each listen multiaddr once per advertised host, hosts in order (routable first)."""
    listen_ip = "0.0.0.0" if listen_host in WILDCARDS else listen_host
    prefix = f"/ip4/{listen_ip}/"
    out: list[str] = []
    for host in hosts:
        for addr in listen_addrs:
            text = str(addr)
            if text.startswith(prefix):
                text = f"/ip4/{host}/" + text[len(prefix):]
            if text not in out:
                out.append(text)
    return out


def interface_ipv4() -> list[str]:
    """IPv4 addresses of this host's interfaces that are up, aliases included, in the
    kernel's order; ``[]`` where ``SIOCGIFCONF`` is not available (non-Linux)."""
    if not sys.platform.startswith("linux"):
        return []
    import fcntl

    buf = array.array("B", b"\0" * (_IFREQ_SIZE * _MAX_INTERFACES))
    address, length = buf.buffer_info()
    request = struct.pack("iL", length, address)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            answer = fcntl.ioctl(sock.fileno(), _SIOCGIFCONF, request)
    except OSError:
        return []
    used = struct.unpack("iL", answer)[0]
    raw = buf.tobytes()[:used]
    return parse_ifconf(raw)


def parse_ifconf(raw: bytes) -> list[str]:
    """The IPv4 addresses in an ``SIOCGIFCONF`` answer (an array of ``struct ifreq``)."""
    out = []
    for offset in range(0, len(raw) - _IFREQ_SIZE + 1, _IFREQ_SIZE):
        family = struct.unpack_from("H", raw, offset + 16)[0]
        if family == socket.AF_INET:
            out.append(socket.inet_ntoa(raw[offset + 20:offset + 24]))
    return out


def default_route_ipv4() -> str | None:
    """The source address the default route would use, or ``None`` without one."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect(_PROBE_TARGET)
            host = sock.getsockname()[0]
    except OSError:
        return None
    return None if host in WILDCARDS else str(host)

"""Stay connected to bootstrap peers: dial with exponential backoff and jitter, redial on loss.

On HPC clusters the bootstrap node may start after the workers, or be briefly
unreachable; a node keeps retrying until it gets through (paper §3.2), and syncs the
full registry with the bootstrap peer every time it (re)connects.

py-libp2p 0.8.1 refuses, for 60 s, to redial a peer whose addresses all failed once
(its "negative cache"); left alone, that turns our backoff schedule into a silent
minute-long outage after the bootstrap peer comes back. We own the retry schedule, so
each deliberate redial first lifts that block.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import multiaddr
import trio
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr

from otela.mesh.host import MeshHost
from otela.mesh.netlog import NetLog

log = logging.getLogger("otela.mesh")

DIAL_TIMEOUT_S = 10.0
BACKOFF_INITIAL_S = 0.5
BACKOFF_MAX_S = 30.0
CHECK_INTERVAL_S = 2.0


LIST_REFRESH_S = 300.0
MAX_LIST_BYTES = 1024 * 1024


def is_url(entry: str) -> bool:
    return entry.startswith(("http://", "https://"))


def parse_bootstrap_list(body: str) -> list[str]:
    """Multiaddrs from a bootstrap list: a JSON list, ``{"peers": [...]}``, or one per line."""
    text = body.strip()
    if text.startswith(("[", "{")):
        data = json.loads(text)
        items = data.get("peers", []) if isinstance(data, dict) else data
        if not isinstance(items, list) or not all(isinstance(a, str) for a in items):
            raise ValueError("expected a JSON list of multiaddr strings")
        return [a.strip() for a in items if a.strip()]
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


class BootstrapAddressError(ValueError):
    """A bootstrap address that is not a ``/.../p2p/<peer id>`` multiaddr."""


def parse_bootstrap(addr: str) -> PeerInfo:
    try:
        return info_from_p2p_addr(multiaddr.Multiaddr(addr))
    except Exception as exc:
        raise BootstrapAddressError(
            f"bad bootstrap address {addr!r}: expected e.g. "
            f"/ip4/10.0.0.1/tcp/43905/p2p/12D3KooW... ({exc})"
        ) from exc


def next_backoff(current: float, rng: random.Random) -> tuple[float, float]:
    """(sleep now, next base delay): full jitter within ±20 %, doubling up to the cap."""
    return current * rng.uniform(0.8, 1.2), min(current * 2, BACKOFF_MAX_S)


async def dial(host: Any, peer: PeerInfo, timeout: float = DIAL_TIMEOUT_S) -> None:
    """Connect to ``peer`` within ``timeout`` (``trio.TooSlowError`` past it), first lifting
    py-libp2p's negative cache for it (module docstring): we own the retry schedule."""
    host.get_network().unblock_peer(peer.peer_id)
    with trio.fail_after(timeout):
        await host.connect(peer)


def isolated_below(mesh: MeshHost, minimum: int) -> Callable[[], bool]:
    """A check for "we hold fewer than ``minimum`` connections" (so we need a bootstrap)."""
    return lambda: len(mesh.host.get_connected_peers()) < minimum


# Anti-entropy with a peer just connected to (``Replicator.sync_with``): whether it worked.
Sync = Callable[[ID], Awaitable[bool]]


async def keep_connected(
    mesh: MeshHost,
    sync: Sync,
    peer: PeerInfo,
    needs_bootstrap: Callable[[], bool] | None = None,
    netlog: NetLog | None = None,
) -> None:
    """Join through ``peer``; later redial it only while ``needs_bootstrap()`` says we are
    isolated. Bootstrap peers are for joining and rejoining, not permanent links: random
    peering takes over, so bootstrap nodes do not become hubs. ``netlog`` records each
    dial's outcome for ``otela doctor``."""
    host = mesh.host
    where = ",".join(str(a) for a in peer.addrs)
    if peer.peer_id == host.get_id():
        return  # our own address in a shared bootstrap list
    rng = random.Random()
    delay = BACKOFF_INITIAL_S
    failures = 0
    joined = False
    while True:
        connected = peer.peer_id in host.get_connected_peers()
        if connected or (joined and needs_bootstrap is not None and not needs_bootstrap()):
            await trio.sleep(CHECK_INTERVAL_S)
            continue
        try:
            await dial(host, peer)
        except Exception as exc:  # the library raises many types for one failed dial
            failures += 1
            if netlog is not None:
                netlog.bootstrap_attempt(where, peer.peer_id.to_base58(), f"{exc!r}")
            sleep, delay = next_backoff(delay, rng)
            level = logging.WARNING if failures in (1, 5) or failures % 20 == 0 else logging.DEBUG
            log.log(
                level,
                "bootstrap %s unreachable (attempt %d, retry in %.1fs): %s",
                peer.peer_id,
                failures,
                sleep,
                exc,
            )
            await trio.sleep(sleep)
            continue
        log.info("connected to bootstrap peer %s", peer.peer_id)
        if netlog is not None:
            netlog.bootstrap_attempt(where, peer.peer_id.to_base58(), None)
        failures, delay = 0, BACKOFF_INITIAL_S
        joined = await sync(peer.peer_id) or joined


async def follow_bootstrap_list(
    url: str,
    mesh: MeshHost,
    sync: Sync,
    client: httpx.AsyncClient,
    needs_bootstrap: Callable[[], bool],
) -> None:
    """Fetch a bootstrap list from ``url`` (with backoff until it answers), keep every
    address in it connected, and re-read it every few minutes for new entries."""
    rng = random.Random()
    followed: set[str] = set()
    delay = BACKOFF_INITIAL_S
    async with trio.open_nursery() as nursery:
        while True:
            try:
                response = await client.get(url, timeout=DIAL_TIMEOUT_S)
                response.raise_for_status()
                if len(response.content) > MAX_LIST_BYTES:
                    raise ValueError(f"bootstrap list larger than {MAX_LIST_BYTES} bytes")
                addrs = parse_bootstrap_list(response.text)
            except (httpx.HTTPError, ValueError) as exc:
                sleep, delay = next_backoff(delay, rng)
                log.warning("bootstrap list %s unavailable (retry in %.1fs): %s", url, sleep, exc)
                await trio.sleep(sleep)
                continue
            delay = BACKOFF_INITIAL_S
            for addr in addrs:
                if addr in followed:
                    continue
                try:
                    peer = parse_bootstrap(addr)
                except BootstrapAddressError as exc:
                    log.warning("ignoring entry of bootstrap list %s: %s", url, exc)
                    followed.add(addr)
                    continue
                followed.add(addr)
                nursery.start_soon(keep_connected, mesh, sync, peer, needs_bootstrap)
            await trio.sleep(LIST_REFRESH_S)

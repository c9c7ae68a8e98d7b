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

import logging
import random

import multiaddr
import trio
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr

from otela.mesh.host import MeshHost
from otela.mesh.netlog import NetLog
from otela.mesh.replication import Replicator

log = logging.getLogger("otela.mesh")

DIAL_TIMEOUT_S = 10.0
BACKOFF_INITIAL_S = 0.5
BACKOFF_MAX_S = 30.0
CHECK_INTERVAL_S = 2.0


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


async def keep_connected(
    mesh: MeshHost, replicator: Replicator, peer: PeerInfo, netlog: NetLog | None = None
) -> None:
    """Dial ``peer`` until connected, redial on loss; ``netlog`` records each outcome."""
    host = mesh.host
    where = ",".join(str(a) for a in peer.addrs)
    if peer.peer_id == host.get_id():
        return  # our own address in a shared bootstrap list
    rng = random.Random()
    delay = BACKOFF_INITIAL_S
    failures = 0
    while True:
        if peer.peer_id in host.get_connected_peers():
            await trio.sleep(CHECK_INTERVAL_S)
            continue
        host.get_network().unblock_peer(peer.peer_id)
        try:
            with trio.fail_after(DIAL_TIMEOUT_S):
                await host.connect(peer)
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
        await replicator.sync_with(peer.peer_id)

"""NAT traversal for one node: reachability, relay reservations, hole punching, dialing.

``NatTraversal.run`` supervises (in its own nursery):
- the circuit relay v2 protocol (STOP for everyone, HOP with ``--relay``);
- DCUtR hole punching with ``dial_timeout=2``: py-libp2p first tries a "unilateral upgrade"
  that dials every known address of the peer, private ones on other sites included, under
  ``dial_timeout``; the default 10 s made upgrades take ~11.5 s (and one in three never
  happened within 40 s), 2 s gives ~3.4 s (docs/nat.md);
- the dial-back server, and the reachability loop: ask up to ``ASK_PEERS`` connected peers
  (relays first) to dial us back; when private, hold reservations on up to
  ``max_reservations`` relays found in the registry, publish the circuit addresses, and
  re-reserve when a relay connection drops;
- a connection watcher that notes, per peer, relayed vs direct and hole-punch upgrades.

Private addresses are never stripped from what the host advertises: DCUtR reads its own
listen port from ``host.get_addrs()`` and hole punching stops working without it.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import multiaddr
import trio
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.relay.circuit_v2.dcutr import DCUtRProtocol
from libp2p.tools.anyio_service import background_trio_service

from otela.mesh.addresses import is_loopback
from otela.mesh.circuit_relay import Relay, RelayError, is_circuit
from otela.mesh.connections import connection_kinds, remote_ips
from otela.mesh.netlog import NetLog
from otela.mesh.reachability import (
    DialBackAnswer,
    DialBackServer,
    ask,
    listen_ports,
    only_local,
    reachability,
    verdict,
)
from otela.registry.records import UNKNOWN, NodeRecord

log = logging.getLogger("otela.nat")

ASK_PEERS = 3
UPKEEP_INTERVAL_S = 2.0  # reservation upkeep and, while unknown, reachability retries
RECHECK_INTERVAL_S = 600.0  # re-run the dial-back check this often once settled
LOCAL_RECHECK_S = 10.0  # only local peers answered: ask again this soon once another connects
WATCH_INTERVAL_S = 1.0
DCUTR_DIAL_TIMEOUT_S = 2
DIRECT_DIAL_TIMEOUT_S = 3.0

Publish = Callable[[str, tuple[str, ...]], Awaitable[None]]


@dataclass
class Reservation:
    relay_id: str
    circuit_addrs: tuple[str, ...]
    reserved_at: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "relay_peer_id": self.relay_id,
            "circuit_addrs": list(self.circuit_addrs),
            "reserved_at": self.reserved_at,
        }


def peer_info(record: NodeRecord) -> PeerInfo:
    """The libp2p dial info of a record's direct (non-circuit) addresses."""
    addrs = [multiaddr.Multiaddr(a) for a in record.addrs if not is_circuit(a)]
    return PeerInfo(ID.from_base58(record.peer_id), addrs)


def known_relays(registry: Any, own_peer_id: str) -> list[NodeRecord]:
    """Live records (JOIN or SERVING) of other nodes that offer relay reservations."""
    return [
        r for r in registry.snapshot()
        if r.relay and r.peer_id != own_peer_id and r.state.name in ("JOIN", "SERVING")
    ]


class NatTraversal:
    def __init__(
        self,
        host: Any,
        *,
        offer_relay: bool,
        relays: Callable[[], list[NodeRecord]],
        publish: Publish,
        max_reservations: int = 2,
        netlog: NetLog | None = None,
        hole_punch: bool = True,
    ) -> None:
        self.host = host
        self.relay = Relay(host, offer=offer_relay)
        self.dcutr = DCUtRProtocol(host, dial_timeout=DCUTR_DIAL_TIMEOUT_S) if hole_punch else None
        self.dialback = DialBackServer()
        self.relays = relays
        self.publish = publish
        self.max_reservations = max_reservations
        self.netlog = netlog or NetLog()
        self.public: bool | None = None
        self.local_only = False  # peers answered, all on this host (loopback): undecided
        self.answers: list[DialBackAnswer] = []
        self.checked_at: float | None = None
        self.reservations: dict[str, Reservation] = {}
        self.reservation_errors: dict[str, str] = {}
        self._published: tuple[str, tuple[str, ...]] = (UNKNOWN, ())
        self._rng = random.Random()

    # -- state read by /v1/network --------------------------------------------------------

    @property
    def state(self) -> str:
        return reachability(self.public, len(self.reservations))

    def circuit_addrs(self) -> tuple[str, ...]:
        return tuple(a for r in self.reservations.values() for a in r.circuit_addrs)

    def report(self) -> dict[str, Any]:
        return {
            "reachability": self.state,
            "local_only": self.local_only,
            "offers_relay": self.relay.offer,
            "hole_punch": self.dcutr is not None,
            "dial_back": {
                "checked_at": self.checked_at,
                "listen_ports": listen_ports(self.host),
                "answers": [a.to_dict() for a in self.answers],
            },
            "reservations": [r.to_dict() for r in self.reservations.values()],
            "reservation_errors": dict(self.reservation_errors),
            "known_relays": [r.peer_id for r in self.relays()],
            "peer_ips": self.peer_ips(),
        }

    def peer_ips(self) -> list[str]:
        """The IPs of our direct connections: ``otela doctor`` tells from them whether
        peers on other hosts (or other networks) are connected."""
        ips: set[str] = set()
        for peer in list(self.host.get_connected_peers()):
            try:
                ips |= remote_ips(self.host, peer)
            except Exception:  # library internals; the report is best effort
                continue
        return sorted(ips)

    # -- running ------------------------------------------------------------------------

    def install(self) -> None:
        self.dialback.install(self.host)

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self._service, self.relay.protocol, "circuit relay")
            if self.dcutr is not None:
                await nursery.start(self._service, self.dcutr, "hole punching (DCUtR)")
            task_status.started()
            nursery.start_soon(self._watch_connections)
            await self._reachability_loop(nursery)

    async def _service(
        self, service: Any, name: str, *, task_status: Any = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run a libp2p service in a task of its own.

        When a py-libp2p service stops (it did, mid hole punch, in the NAT test), its manager
        cancels the body of ``background_trio_service``; sharing that body with our loops
        silently stopped them. Isolated, only the service stops, and we say so.
        """
        try:
            async with background_trio_service(service) as manager:
                task_status.started()
                await manager.wait_finished()
        except Exception as exc:
            log.warning("%s stopped: %r", name, exc)
            return
        log.warning("%s stopped", name)

    async def _reachability_loop(self, nursery: trio.Nursery) -> None:
        next_check = last_check = 0.0
        while True:
            now = time.monotonic()
            early = self.local_only and now >= last_check + LOCAL_RECHECK_S \
                and self._peer_elsewhere()
            if now >= next_check or early:
                settled = await self.check_reachability()
                last_check = now
                next_check = now + (RECHECK_INTERVAL_S if settled else UPKEEP_INTERVAL_S)
            if self.public is False:
                await self._keep_reservations(nursery)
            await self._publish_if_changed()
            await trio.sleep(UPKEEP_INTERVAL_S)

    async def check_reachability(self) -> bool:
        """Ask up to ``ASK_PEERS`` connected peers to dial us back; True once decided, or
        once only peers on this host answered (they cannot tell; the recheck asks again).

        Relays first, then peers on other hosts: a peer on this host can only say that
        loopback works."""
        connected = set(self.host.get_connected_peers())
        if not connected:
            return False
        relay_ids = {r.peer_id for r in self.relays()}
        ordered = sorted(connected, key=lambda p: (p.to_base58() not in relay_ids,
                                                   self._on_this_host(p),
                                                   self._rng.random()))
        ports = listen_ports(self.host)
        answers: list[DialBackAnswer] = []

        async def one(peer: ID) -> None:
            answers.append(await ask(self.host, peer, ports))

        async with trio.open_nursery() as nursery:
            for peer in ordered[:ASK_PEERS]:
                nursery.start_soon(one, peer)
        decided = verdict(answers)
        self.answers = answers
        self.checked_at = time.time()
        if decided is not None and decided != self.public:
            log.info("reachability: %s", "public" if decided else "private (NAT or firewall)")
        if decided is not None:
            self.public = decided
        self.local_only = decided is None and only_local(answers)
        return decided is not None or self.local_only

    def _peer_elsewhere(self) -> bool:
        """A peer on another host is connected (it can tell what only-local ones could not)."""
        for peer in self.host.get_connected_peers():
            try:
                if any(not is_loopback(ip) for ip in remote_ips(self.host, peer)):
                    return True
            except Exception:  # library internals
                continue
        return False

    def _on_this_host(self, peer: ID) -> bool:
        try:
            ips = remote_ips(self.host, peer)
        except Exception:  # library internals; ordering is only a preference
            return False
        return bool(ips) and all(is_loopback(ip) for ip in ips)

    async def _keep_reservations(self, nursery: trio.Nursery) -> None:
        for relay_id in list(self.reservations):
            if not self.relay.holds_reservation(ID.from_base58(relay_id)):
                log.warning("lost the reservation on relay %s; reserving again", relay_id)
                del self.reservations[relay_id]
        own = self.host.get_id().to_base58()
        candidates = [r for r in self.relays() if r.peer_id != own
                      and r.peer_id not in self.reservations]
        self._rng.shuffle(candidates)
        for record in candidates:
            if len(self.reservations) >= self.max_reservations:
                break
            try:
                addrs = await self.relay.reserve(peer_info(record), nursery)
            except RelayError as exc:
                self.reservation_errors[record.peer_id] = str(exc)
                self.netlog.dial_failed(record.peer_id, "reserve", str(exc))
                continue
            self.reservation_errors.pop(record.peer_id, None)
            self.reservations[record.peer_id] = Reservation(record.peer_id, tuple(addrs),
                                                            time.time())
            log.info("reserved a slot on relay %s: %s", record.peer_id, ", ".join(addrs))

    async def _publish_if_changed(self) -> None:
        current = (self.state, self.circuit_addrs())
        if current != self._published:
            await self.publish(*current)
            self._published = current

    async def _watch_connections(self) -> None:
        seen: set[str] = set()
        while True:
            now = time.time()
            current = set()
            for peer in list(self.host.get_connected_peers()):
                name = peer.to_base58()
                current.add(name)
                try:
                    kinds = connection_kinds(self.host, peer)
                except Exception as exc:  # library internals; never let this task die
                    log.warning("cannot inspect connections to %s: %r", name, exc)
                    kinds = set()
                self.netlog.observe_connections(name, kinds, now)
            for gone in seen - current:
                self.netlog.disconnected(gone)
            seen = current
            await trio.sleep(WATCH_INTERVAL_S)

    # -- dialing a peer for the data path ---------------------------------------------------

    async def connect(self, record: NodeRecord) -> None:
        """Make sure we have a connection to ``record``'s node: direct, else via a relay.

        Raises ``RelayError`` naming every address tried when none worked.
        """
        peer_id = ID.from_base58(record.peer_id)
        if peer_id in self.host.get_connected_peers():
            return
        errors = []
        info = peer_info(record)
        if info.addrs and not record.needs_relayed_path():
            try:
                self.host.get_network().unblock_peer(peer_id)
                with trio.fail_after(DIRECT_DIAL_TIMEOUT_S):
                    await self.host.connect(info)
                return
            except Exception as exc:
                message = f"{type(exc).__name__}: {exc}"
                errors.append(f"direct: {message}")
                self.netlog.dial_failed(record.peer_id, "direct", message)
        for addr in record.circuit_addrs:
            try:
                await self.relay.dial(addr)
                return
            except RelayError as exc:
                errors.append(str(exc))
                self.netlog.dial_failed(record.peer_id, addr, str(exc))
        if not errors:
            errors.append("no direct address and no relay circuit address advertised")
        raise RelayError(f"cannot reach peer {record.peer_id}: " + "; ".join(errors))

"""Membership admission: which connected peers we talk to.

In an open federation (no authority configured: demos, tests, a single lab) every
connected peer is admitted. With a membership authority, peers exchange certificates
over ``/otela/admission/1.0.0`` right after connecting; a peer that does not present a
valid, unexpired, unrevoked certificate for its own peer id within ``grace`` seconds
is disconnected, and until admitted its gossip and anti-entropy are ignored. Records
carry their owner's certificate too (see ``otela.registry.wire``), so a non-member's
record never enters a registry even when an admitted peer relays it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import trio
from libp2p.crypto.keys import PublicKey
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from otela.logbudget import LogBudget
from otela.mesh.framing import read_frame, write_frame
from otela.mesh.quota import SMALL_STREAMS, set_capped_handler
from otela.registry.certificate import (
    Certificate,
    MembershipError,
    Revocation,
    verify_certificate,
)
from otela.registry.store import Registry
from otela.registry.wire import Trust

log = logging.getLogger("otela.mesh")

ADMISSION_PROTOCOL = TProtocol("/otela/admission/1.0.0")
HANDSHAKE_TIMEOUT_S = 5.0
# Refused peers remembered (shown in /v1/health, and disconnected at once by ``enforce``):
# anyone can mint peer ids, so the oldest are forgotten past this many.
MAX_REFUSALS = 1024
MAX_CERT_FRAME = 8 * 1024


@dataclass
class Refusal:
    peer_id: str
    reason: str
    at: float


class Admission:
    def __init__(
        self,
        authority: PublicKey | None,
        own_certificate: bytes | None,
        clock: Callable[[], float] = time.time,
        grace: float = 5.0,
        revoked: Collection[str] = frozenset(),
    ) -> None:
        self.authority = authority
        self.own_certificate = own_certificate
        self.clock = clock
        self.grace = grace
        # Revoked certificate serials: the registry's own store (revocations gossip into
        # it), read here, never copied, so the two can never disagree.
        self.revoked = revoked
        self._admitted: dict[ID, Certificate] = {}
        self._first_seen: dict[ID, float] = {}
        self.refusals: dict[str, Refusal] = {}
        # Anyone who connects can cause a refusal: its warning is logged within a budget.
        self._log_budget = LogBudget(burst=20, window=60.0)

    @property
    def open(self) -> bool:
        return self.authority is None

    def trust(self, registry: Registry) -> Trust:
        def is_member(peer_id: str) -> bool:
            # In an open federation a member is a node the federation knows, in any state.
            # Requiring a *live* evictor would deadlock after a partition: each side has
            # evicted the other side's evictors and would reject their evictions forever.
            return registry.knows(peer_id)

        return Trust(self.authority, registry.revoked_serials(), is_member)

    def is_admitted(self, peer: ID) -> bool:
        if self.open:
            return True
        cert = self._admitted.get(peer)
        if cert is None:
            return False
        if cert.expires_at <= self.clock() or cert.serial in self.revoked:
            del self._admitted[peer]
            self._refuse(peer, "certificate expired or revoked")
            return False
        return True

    def on_revocation(self, revocation: Revocation) -> None:
        """Drop a newly revoked peer at once (the revocation is already in ``revoked``)."""
        for peer, cert in list(self._admitted.items()):
            if cert.serial == revocation.serial:
                del self._admitted[peer]
                self._refuse(peer, f"certificate {cert.serial} revoked")

    def _verify(self, peer: ID, data: bytes) -> Certificate:
        assert self.authority is not None
        cert = verify_certificate(
            data, self.authority, now=self.clock(), revoked_serials=self.revoked
        )
        if cert.peer_id != peer.to_base58():
            raise MembershipError(f"certificate is for {cert.peer_id}, presented by {peer}")
        return cert

    def _refuse(self, peer: ID, reason: str) -> None:
        key = peer.to_base58()
        self.refusals.pop(key, None)  # re-inserted last: the newest refusal is kept longest
        self.refusals[key] = Refusal(key, reason, self.clock())
        while len(self.refusals) > MAX_REFUSALS:
            del self.refusals[next(iter(self.refusals))]
        skipped = self._log_budget.take()
        if skipped is not None:
            log.warning("refusing peer %s: %s%s", peer, reason,
                        f" ({skipped} refusals not logged)" if skipped else "")

    def _accept(self, peer: ID, data: bytes) -> bool:
        try:
            self._admitted[peer] = self._verify(peer, data)
        except MembershipError as exc:
            self._refuse(peer, str(exc))
            return False
        self.refusals.pop(peer.to_base58(), None)
        return True

    # -- protocol --------------------------------------------------------------------

    def install(self, host: Any) -> None:
        if not self.open:
            set_capped_handler(host, ADMISSION_PROTOCOL, self._handle, SMALL_STREAMS)

    async def _handle(self, stream: Any) -> None:
        peer = stream.muxed_conn.peer_id
        with trio.move_on_after(HANDSHAKE_TIMEOUT_S):
            try:
                theirs = await read_frame(stream, MAX_CERT_FRAME)
                await write_frame(stream, self.own_certificate or b"")
                self._accept(peer, theirs)
            except Exception as exc:  # whatever the peer sends, the handler survives
                self._refuse(peer, f"admission handshake failed: {exc}")
            finally:
                try:
                    await stream.close()
                except Exception:
                    log.debug("closing admission stream failed", exc_info=True)

    async def handshake(self, host: Any, peer: ID) -> bool:
        with trio.move_on_after(HANDSHAKE_TIMEOUT_S):
            try:
                stream = await host.new_stream(peer, [ADMISSION_PROTOCOL])
                try:
                    await write_frame(stream, self.own_certificate or b"")
                    theirs = await read_frame(stream, MAX_CERT_FRAME)
                finally:
                    await stream.close()
                return self._accept(peer, theirs)
            except Exception as exc:
                self._refuse(peer, f"admission handshake failed: {exc}")
                return False
        self._refuse(peer, "admission handshake timed out")
        return False

    async def enforce(self, host: Any, interval: float = 0.5) -> None:
        """Handshake with new peers; disconnect those not admitted within ``grace``."""
        if self.open:
            return
        attempted: set[ID] = set()
        async with trio.open_nursery() as nursery:
            while True:
                now = self.clock()
                connected = set(host.get_connected_peers())
                for peer in connected:
                    if self.is_admitted(peer):
                        continue
                    first = self._first_seen.setdefault(peer, now)
                    if peer not in attempted:
                        attempted.add(peer)
                        nursery.start_soon(self.handshake, host, peer)
                    elif now - first > self.grace or peer.to_base58() in self.refusals:
                        log.info("disconnecting unadmitted peer %s", peer)
                        nursery.start_soon(_disconnect, host, peer)
                        attempted.discard(peer)
                        self._first_seen.pop(peer, None)
                for peer in set(self._first_seen) - connected:
                    self._first_seen.pop(peer, None)
                    attempted.discard(peer)
                await trio.sleep(interval)


async def _disconnect(host: Any, peer: ID) -> None:
    try:
        await host.disconnect(peer)
    except Exception:
        log.debug("disconnecting %s failed", peer, exc_info=True)

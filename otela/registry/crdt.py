"""The registry CRDT: a grow-only map from session id to a lifecycle-lattice value.

Each value is an ``Entry``: a lifecycle state (JOIN < SERVING < DOWN < LEFT), the owner's
version counter within that session, and the signed proof it arrived with. Merge is the
lattice join on ``rank() = (state, version, tiebreak)``: the higher lifecycle state wins,
then the higher version, then the larger tiebreak (a hash of the signed bytes, so every
replica breaks the same tie the same way). A total order's max is commutative,
associative and idempotent, so replicas that see the same entries in any order, with
duplicates, converge; and because LEFT is the top state, a LEFT entry can only ever be
replaced by another LEFT statement about the same session, never revived. That is only
safe because a session has one writer: ``admit`` refuses any record whose signer did not
create the session (``otela.registry.session``), so a higher (state, version) can only
ever come from the owner, or from an eviction that embeds the owner's own record.

One session per peer: of all the entries about one peer's sessions, the map keeps only
the greatest in the order ``(epoch, session id, rank)`` (the epoch is read from the
session id, ``otela.registry.session.epoch_of``). A newer session supersedes the peer's
older one, which is dropped; an entry for an older session than the one held is refused
(``Superseded``). That order is total over every entry a peer can sign, so keeping its
maximum per peer is again a lattice join: replicas converge whatever order sessions
arrive in, and the newer session is the older one's tombstone (late gossip about the
older one is refused wherever the newer one is held). So a member costs every replica
one entry, however many sessions it announces, and routing, which counts the registry's
sessions, counts each peer once.

Garbage collection (two tiers, see docs/registry.md):
- LEFT entries leave the application views ``retention`` seconds after they were signed;
- every entry is compacted (dropped from the map) ``horizon`` seconds after its signer's
  ``updated_at``. Live owners re-sign their entry well within the horizon (a lease, not a
  heartbeat), and ``admit`` rejects anything signed before ``now - horizon``: so late or
  replayed gossip about a compacted session is refused instead of resurrecting it.
Pure: no I/O, no clock reads; callers pass ``now``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from otela.registry.records import Lifecycle, NodeRecord
from otela.registry.session import epoch_of, owns

BUCKETS = 256
_HASH_BYTES = 16


@dataclass(frozen=True, slots=True)
class Entry:
    """One G-Map value. ``record`` is the payload views show (its ``state`` is the entry's)."""

    key: str
    state: Lifecycle
    version: int
    updated_at: float
    tiebreak: bytes
    record: NodeRecord
    # The signed envelope, relayed verbatim to other replicas; not part of the value's identity.
    proof: Any = field(default=None, compare=False, repr=False)
    evicted_by: str | None = None
    cert_serial: str | None = None  # the owner's membership certificate, when there is one
    cert_expires_at: float | None = None
    _fingerprint: bytes | None = field(default=None, init=False, compare=False, repr=False)

    def rank(self) -> tuple[int, int, bytes]:
        return (int(self.state), self.version, self.tiebreak)

    def digest_item(self) -> tuple[int, int, bytes]:
        """What anti-entropy compares: enough to tell which of two entries wins."""
        return (int(self.state), self.version, self.tiebreak[:8])

    def fingerprint(self) -> bytes:
        """The value's hash in its bucket's digest; kept on the entry, which is immutable:
        the map hashes a value when it stores it and again when it replaces or drops it."""
        fingerprint = self._fingerprint
        if fingerprint is None:
            item = f"{self.key}|{int(self.state)}|{self.version}|".encode() + self.tiebreak
            fingerprint = hashlib.blake2b(item, digest_size=_HASH_BYTES).digest()
            object.__setattr__(self, "_fingerprint", fingerprint)
        return fingerprint


def tiebreak_of(signed_bytes: bytes) -> bytes:
    return hashlib.blake2b(signed_bytes, digest_size=_HASH_BYTES).digest()


def join(a: Entry, b: Entry) -> Entry:
    """The lattice join of two values for the same key."""
    return a if a.rank() >= b.rank() else b


def bucket_of(key: str) -> int:
    return hashlib.blake2b(key.encode(), digest_size=1).digest()[0]


def _xor(a: bytes, b: bytes) -> bytes:
    return (int.from_bytes(a, "big") ^ int.from_bytes(b, "big")).to_bytes(_HASH_BYTES, "big")


class Rejected(Exception):
    """An entry the map refuses (stale, from the future); the caller counts it."""


class Superseded(Rejected):
    """An entry for a session older than the one its peer holds here (one per peer)."""


class NotOwner(Rejected):
    """A record for a session its signer did not create (``otela.registry.session``)."""

    def __init__(self, message: str, signer: str) -> None:
        super().__init__(message)
        self.signer = signer


@dataclass(frozen=True)
class GCPolicy:
    retention: float = 24 * 3600.0  # LEFT entries visible in views this long
    horizon: float = 48 * 3600.0  # every entry compacted this long after its signature
    max_clock_skew: float = 600.0  # entries signed further in the future are refused

    def __post_init__(self) -> None:
        if not 0 < self.retention <= self.horizon:
            raise ValueError("need 0 < retention <= horizon")

    @property
    def refresh_interval(self) -> float:
        """How often a live owner re-signs its entry so it never nears the horizon."""
        return self.horizon / 8


class GMap:
    """The map itself, with incrementally maintained bucket digests for anti-entropy."""

    def __init__(self, policy: GCPolicy | None = None) -> None:
        self.policy = policy or GCPolicy()
        self._entries: dict[str, Entry] = {}
        self._session_of: dict[str, str] = {}  # peer id -> the one session key it holds
        self._buckets: list[bytes] = [bytes(_HASH_BYTES)] * BUCKETS
        self._bucket_keys: list[set[str]] = [set() for _ in range(BUCKETS)]
        # The root over the bucket hashes, computed once per change: every liveness message
        # carries a summary of it (``otela/replication/drift.py``), ~4 KiB hashed each time.
        self._root: bytes | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._entries.values())

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def get(self, key: str) -> Entry | None:
        return self._entries.get(key)

    def admit(self, entry: Entry, now: float) -> None:
        """Raise ``Rejected`` for entries no replica may accept at ``now``.

        Ownership is checked here as well as at signature verification, so no path into
        the map (gossip, anti-entropy, an eviction's embedded record) can store a record
        for a session whose owner did not sign it, and a forged entry never gets to win
        a merge against the owner's."""
        if entry.record.session_id != entry.key or not owns(entry.record.peer_id, entry.key):
            raise NotOwner(
                f"record for session {entry.key} is signed by {entry.record.peer_id}, "
                "which did not create that session",
                entry.record.peer_id,
            )
        if entry.updated_at < now - self.policy.horizon:
            raise Rejected(f"entry for {entry.key} is older than the compaction horizon")
        if entry.updated_at > now + self.policy.max_clock_skew:
            raise Rejected(f"entry for {entry.key} is signed in the future")

    def session_of(self, peer_id: str) -> str | None:
        """The one session ``peer_id`` holds here, if any."""
        return self._session_of.get(peer_id)

    def outranked(self, peer_id: str, key: str) -> bool:
        """Whether ``peer_id`` holds a newer session than ``key`` here: an entry for ``key``
        would be refused (``Superseded``). Cheap: gossip validators ask it."""
        held = self._session_of.get(peer_id)
        return held is not None and held != key and \
            (epoch_of(held), held) > (epoch_of(key), key)

    def merge(self, entry: Entry, now: float) -> tuple[bool, Entry | None]:
        """Join ``entry``; return (whether the map changed, the value it replaced: the
        same session's older value, or the older session of the same peer that it
        superseded). Raises ``Superseded`` for an older session than the peer's."""
        self.admit(entry, now)
        current = self._entries.get(entry.key)
        if current is not None:
            if join(current, entry) is current:
                return False, None
            self._store(entry, current)
            return True, current
        peer_id = entry.record.peer_id
        if self.outranked(peer_id, entry.key):
            raise Superseded(f"session {entry.key} of {peer_id} is older than its session "
                             f"{self._session_of[peer_id]} held here")
        older_key = self._session_of.get(peer_id)
        older = None if older_key is None else self._entries[older_key]
        if older is not None:
            self._remove(older)
        self._store(entry, None)
        return True, older

    def digest_root(self) -> bytes:
        if self._root is None:
            self._root = hashlib.blake2b(b"".join(self._buckets),
                                         digest_size=_HASH_BYTES).digest()
        return self._root

    def bucket_hashes(self) -> list[bytes]:
        return list(self._buckets)

    def bucket_digest(self, bucket: int) -> dict[str, tuple[int, int, bytes]]:
        return {k: self._entries[k].digest_item() for k in self._bucket_keys[bucket]}

    def newer_than(self, remote: dict[str, tuple[int, int, bytes]], buckets: Iterable[int]
                   ) -> tuple[list[Entry], list[str]]:
        """Given a peer's digest of ``buckets``: our entries it lacks or holds older, and the
        keys where it holds something we lack or hold older (to ask it for)."""
        send: list[Entry] = []
        want: list[str] = []
        for bucket in buckets:
            for key in self._bucket_keys[bucket]:
                theirs = remote.get(key)
                if theirs is None or tuple(theirs) < self._entries[key].digest_item():
                    send.append(self._entries[key])
        for key, theirs in remote.items():
            ours = self._entries.get(key)
            if ours is None or ours.digest_item() < tuple(theirs):
                want.append(key)
        return send, want

    def compact(self, now: float) -> list[Entry]:
        """Drop every entry signed before ``now - horizon``; return what was dropped."""
        cutoff = now - self.policy.horizon
        dropped = [e for e in self._entries.values() if e.updated_at < cutoff]
        for entry in dropped:
            self._remove(entry)
        return dropped

    def _store(self, entry: Entry, current: Entry | None) -> None:
        bucket = bucket_of(entry.key)
        h = entry.fingerprint()
        if current is not None:
            h = _xor(h, current.fingerprint())
        self._buckets[bucket] = _xor(self._buckets[bucket], h)
        self._root = None
        self._bucket_keys[bucket].add(entry.key)
        self._entries[entry.key] = entry
        self._session_of[entry.record.peer_id] = entry.key

    def _remove(self, entry: Entry) -> None:
        bucket = bucket_of(entry.key)
        self._buckets[bucket] = _xor(self._buckets[bucket], entry.fingerprint())
        self._root = None
        self._bucket_keys[bucket].discard(entry.key)
        del self._entries[entry.key]
        if self._session_of.get(entry.record.peer_id) == entry.key:
            del self._session_of[entry.record.peer_id]

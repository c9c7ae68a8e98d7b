"""Authenticating the engine hop: only federation members may reach a node's engine.

A node's ``/v1/engine/...`` hop relays straight to its engine, so it must not be an open
proxy around the ingress (keys, trust filter, accounting). Over libp2p the stream is
already authenticated by the peer id; over plain HTTP the calling node proves who it is
with one header per request::

    x-otela-hop: 1.<caller peer id>.<epoch>.<counter>.<unix ms>.<mac>

``mac`` is a keyed BLAKE2b over the method, path, caller, epoch, counter, timestamp and a
digest of the body, under a key only the caller and the target can compute: both derive
it from a static X25519 Diffie-Hellman of their Ed25519 node keys (the same keys their
peer ids are made of). So a token

- proves the caller holds its node key (nobody else can compute the pairwise key),
- is bound to this request (method, path, body) and useless at any other node (the key
  is pairwise),
- expires: the timestamp must be within ``window`` seconds of the target's clock,
- is accepted once: ``counter`` rises per (caller process, target), and the target keeps
  a sliding window of the counters it has seen per caller epoch, like IPsec's
  anti-replay window, in memory that does not grow with the request rate.

Per request this costs two BLAKE2b calls on each side (microseconds, where an Ed25519
signature and its check would cost about 110 µs); the X25519 agreement runs once per
peer. Membership is the caller's business with the registry: a peer with a live session
(in authority mode the registry only shows peers with a valid certificate). Pure apart
from the clock and randomness passed in.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import secrets
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from libp2p.peer.id import ID
from nacl import bindings

HOP_HEADER = "x-otela-hop"
VERSION = "1"
_MAC_DOMAIN = b"otela/hop/v1\0"
_KEY_DOMAIN = b"otela/hop-key/v1\0"
DEFAULT_WINDOW_S = 60.0  # clock skew tolerated between members (and a token's lifetime)
REPLAY_WINDOW = 4096  # out-of-order arrivals tolerated per caller process and target
MAX_EPOCHS_PER_CALLER = 64  # caller processes (restarts, workers) remembered per peer


class HopRefused(Exception):
    """The hop request is not from an authenticated member; ``status`` is 401 or 403."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def _x25519_secret(private_seed: bytes) -> bytes:
    _, secret64 = bindings.crypto_sign_seed_keypair(private_seed)
    return bytes(bindings.crypto_sign_ed25519_sk_to_curve25519(secret64))


def _x25519_public(peer_id: str) -> bytes:
    key = ID.from_base58(peer_id).extract_public_key()
    if key is None or len(key.to_bytes()) != 32:
        raise ValueError(f"{peer_id} is not an Ed25519 peer id")
    return bytes(bindings.crypto_sign_ed25519_pk_to_curve25519(key.to_bytes()))


def pairwise_key(own_seed: bytes, own_peer_id: str, other_peer_id: str) -> bytes:
    """The key two members share: X25519 of their node keys, bound to both peer ids."""
    shared = bindings.crypto_scalarmult(_x25519_secret(own_seed), _x25519_public(other_peer_id))
    low, high = sorted((own_peer_id, other_peer_id))
    return hashlib.blake2b(
        _KEY_DOMAIN + shared + low.encode() + b"\0" + high.encode(), digest_size=32
    ).digest()


def body_digest(body: bytes) -> bytes:
    return hashlib.blake2b(body, digest_size=16).digest()


def _mac(key: bytes, method: str, path: str, caller: str, epoch: str, counter: int,
         stamp: int, digest: bytes) -> str:
    message = f"{method} {path}\n{caller}\n{epoch}.{counter}.{stamp}\n".encode() + digest
    return hashlib.blake2b(_MAC_DOMAIN + message, key=key, digest_size=16).hexdigest()


class _PairwiseKeys:
    """Pairwise keys by peer, computed once each (an X25519 agreement costs ~50 µs)."""

    def __init__(self, own_seed: bytes, own_peer_id: str, limit: int = 65536) -> None:
        self._seed = own_seed
        self._peer_id = own_peer_id
        self._keys: OrderedDict[str, bytes] = OrderedDict()
        self._limit = limit

    def __call__(self, peer_id: str) -> bytes:
        key = self._keys.get(peer_id)
        if key is None:
            key = pairwise_key(self._seed, self._peer_id, peer_id)
            self._keys[peer_id] = key
            if len(self._keys) > self._limit:
                self._keys.popitem(last=False)
        return key


class HopSigner:
    """The calling side: a token per request to a member's engine hop."""

    def __init__(self, own_seed: bytes, own_peer_id: str,
                 clock: Callable[[], float] = time.time) -> None:
        self.peer_id = own_peer_id
        self.epoch = secrets.token_hex(8)  # this process; a restart starts a new epoch
        self._keys = _PairwiseKeys(own_seed, own_peer_id)
        self._counters: dict[str, Iterator[int]] = {}
        self._clock = clock

    def token(self, target_peer_id: str, method: str, path: str, body: bytes) -> str:
        counter = next(self._counters.setdefault(target_peer_id, itertools.count()))
        stamp = int(self._clock() * 1000)
        mac = _mac(self._keys(target_peer_id), method, path, self.peer_id, self.epoch, counter,
                   stamp, body_digest(body))
        return f"{VERSION}.{self.peer_id}.{self.epoch}.{counter}.{stamp}.{mac}"


class ReplayWindow:
    """Which counters of one caller epoch were accepted: the highest, and a bitmap of the
    ``size`` below it. A counter below the window, or seen before, is a replay."""

    def __init__(self, size: int = REPLAY_WINDOW) -> None:
        self.size = size
        self.top = -1
        self.bits = 0  # bit i set: counter top - i was accepted

    def accept(self, counter: int) -> bool:
        if counter > self.top:
            shift = counter - self.top
            self.bits = ((self.bits << shift) | 1) & ((1 << self.size) - 1)
            self.top = counter
            return True
        offset = self.top - counter
        if offset >= self.size or self.bits >> offset & 1:
            return False
        self.bits |= 1 << offset
        return True


@dataclass
class _Epoch:
    window: ReplayWindow
    last_stamp: float


class HopVerifier:
    """The serving side: checks a token and says which member sent it, or refuses."""

    def __init__(self, own_seed: bytes, own_peer_id: str, is_member: Callable[[str], bool],
                 clock: Callable[[], float] = time.time,
                 window: float = DEFAULT_WINDOW_S) -> None:
        self._keys = _PairwiseKeys(own_seed, own_peer_id)
        self._is_member = is_member
        self._clock = clock
        self.window = window
        self._epochs: dict[str, OrderedDict[str, _Epoch]] = {}
        self.refusals: Counter[str] = Counter()  # by code, for /v1/health and metrics

    def verify(self, token: str | None, method: str, path: str, body: bytes) -> str:
        """The caller's peer id; raises ``HopRefused`` (401: not authenticated, 403: an
        authenticated peer that is not a member) for anything else."""
        try:
            return self._verify(token, method, path, body)
        except HopRefused as refused:
            self.refusals[refused.code] += 1
            raise

    def _verify(self, token: str | None, method: str, path: str, body: bytes) -> str:
        if not token:
            raise HopRefused(401, "hop_unauthenticated",
                             "the engine hop is for federation members: route requests "
                             "through an ingress node")
        parts = token.split(".")
        if len(parts) != 6 or parts[0] != VERSION:
            raise HopRefused(401, "hop_unauthenticated", "malformed x-otela-hop token")
        _, caller, epoch, counter_text, stamp_text, mac = parts
        try:
            counter, stamp = int(counter_text), int(stamp_text)
        except ValueError:
            raise HopRefused(401, "hop_unauthenticated", "malformed x-otela-hop token") from None
        now = self._clock()
        if abs(now - stamp / 1000) > self.window:
            raise HopRefused(401, "hop_unauthenticated",
                             f"x-otela-hop token is more than {self.window:.0f} s off this "
                             "node's clock (stale, or the clocks disagree)")
        if not self._is_member(caller):
            raise HopRefused(403, "not_a_member",
                             "the caller is not a member of this federation")
        try:
            key = self._keys(caller)
        except ValueError:
            raise HopRefused(401, "hop_unauthenticated", "malformed x-otela-hop token") from None
        expected = _mac(key, method, path, caller, epoch, counter, stamp, body_digest(body))
        if not hmac.compare_digest(expected, mac):
            raise HopRefused(401, "hop_unauthenticated",
                             "x-otela-hop token does not match this request")
        if not self._fresh(caller, epoch, counter, now):
            raise HopRefused(401, "hop_replayed", "x-otela-hop token was already used")
        return caller

    def _fresh(self, caller: str, epoch: str, counter: int, now: float) -> bool:
        epochs = self._epochs.setdefault(caller, OrderedDict())
        state = epochs.get(epoch)
        if state is None:
            # Forget epochs whose every token is past the window already; then, if a
            # caller still has too many (a member minting epochs), its oldest.
            for name in [n for n, e in epochs.items() if e.last_stamp < now - self.window]:
                del epochs[name]
            if len(epochs) >= MAX_EPOCHS_PER_CALLER:
                epochs.popitem(last=False)
            state = epochs[epoch] = _Epoch(ReplayWindow(), now)
        epochs.move_to_end(epoch)
        state.last_stamp = now
        return state.window.accept(counter)

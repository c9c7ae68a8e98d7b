"""Session ids that name their owner: only the peer that created a session can write it.

A registry entry is keyed by session id and signed by the record's ``peer_id``. A valid
signature alone proves only that *some* peer signed the record; without a binding between
the key and the signer, any member could sign a record for another node's session (a
higher version, its own URL) and every replica would take it. So a session id commits to
its creator's peer id:

    session_id = nonce || tag,   tag = BLAKE2b-96(domain || peer_id || nonce)

(``nonce``: 8 bytes, both parts in hex; 40 characters in all). Anyone can check
``owns(peer_id, session_id)`` from the two strings alone, and writing a record for a
victim's session would need a key pair whose peer id hits the victim's 96-bit tag: a
second preimage, not a forgery a member can make.

The nonce also orders a peer's sessions: its first 11 hex digits are the session's
*epoch* (milliseconds since 1970 when the owner created it, or one past its last epoch if
its clock went back), the other 5 random. A registry keeps one session per peer, the one
with the highest ``(epoch, session id)`` (``otela.registry.crdt``): a node that restarts
or rejoins supersedes its old session everywhere the new one arrives, and a member
cannot hold more than one entry however many sessions it announces. The epoch is read
from the id, so it is the same in every version of a session's record, and the order is
the same at every replica. Pure: no I/O, no clock.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import secrets

_DOMAIN = b"otela/session/v1\0"
NONCE_HEX = 16
EPOCH_HEX = 11  # of the nonce: milliseconds, good until the year 2527
MAX_EPOCH = 16**EPOCH_HEX - 1
TAG_HEX = 24
SESSION_ID_LENGTH = NONCE_HEX + TAG_HEX
_HEX = frozenset("0123456789abcdef")


def _tag(peer_id: str, nonce: str) -> str:
    digest = hashlib.blake2b(
        _DOMAIN + peer_id.encode() + b"\0" + nonce.encode(), digest_size=TAG_HEX // 2
    )
    return digest.hexdigest()


def session_id_for(peer_id: str, nonce: str) -> str:
    """The session id that ``nonce`` (16 hex digits) names for ``peer_id``."""
    if len(nonce) != NONCE_HEX or not set(nonce) <= _HEX:
        raise ValueError(f"a session nonce is {NONCE_HEX} lowercase hex digits, got {nonce!r}")
    return nonce + _tag(peer_id, nonce)


def new_session_id(peer_id: str, epoch: int) -> str:
    """A fresh session id owned by ``peer_id`` at ``epoch`` (milliseconds; a new one on
    every start and every rejoin, each with a higher epoch than the last)."""
    if not 0 <= epoch <= MAX_EPOCH:
        raise ValueError(f"session epoch {epoch} is out of range")
    random_hex = secrets.token_hex(4)[: NONCE_HEX - EPOCH_HEX]
    return session_id_for(peer_id, f"{epoch:0{EPOCH_HEX}x}{random_hex}")


def epoch_of(session_id: str) -> int:
    """The epoch a session id was created at (0 for an id too short to carry one: such an
    id fails ``owns`` anyway)."""
    try:
        return int(session_id[:EPOCH_HEX], 16)
    except ValueError:
        return 0


def owns(peer_id: str, session_id: str) -> bool:
    """Whether ``session_id`` was created by ``peer_id`` (the only peer that may write it)."""
    if len(session_id) != SESSION_ID_LENGTH:
        return False
    return _owns(peer_id, session_id)


@functools.lru_cache(maxsize=16384)
def _owns(peer_id: str, session_id: str) -> bool:
    """``owns`` for a well-sized id, remembered: every copy of a gossiped record (~7 per
    change through a mesh of ~8) and every anti-entropy entry asks it again of the same
    pair, and each answer is a BLAKE2b (~5 us). A pure function of its two strings, so a
    remembered answer is the answer."""
    nonce, tag = session_id[:NONCE_HEX], session_id[NONCE_HEX:]
    if not set(nonce) <= _HEX:
        return False
    return hmac.compare_digest(tag, _tag(peer_id, nonce))

"""Signed suspicions: the failure detector's evidence that justifies an eviction. Pure.

An eviction makes another member's session LEFT on every replica, so it must not be one
member's word (a member that evicts a rival's every session the moment it appears would
otherwise keep it out of the federation). A member that suspects a peer first-hand signs
the statement "I suspect session S of peer P at incarnation i, at time t"; the statement
rides on liveness news like any suspicion, so the member that signs the eviction holds the
other suspecters' statements too, and embeds them. Every replica then accepts an eviction
of S only with statements of ``witnesses_required`` distinct members, none of them the
evictee, each about S itself and signed within ``MAX_AGE_S`` before the eviction
(``otela.registry.wire``), ``WITNESSES`` (2) of them: a lone member, or a lone liar,
cannot evict anyone. The number is the same at every replica, whatever it knows, so every
replica accepts or refuses an eviction alike, however late it learns of it (a count that
followed each replica's view of the federation had a node that joined after an eviction
refuse what the others had accepted). The price: a federation of two never evicts; a
dead member of it stays listed, suspected, out of routing where another node serves its
model, until a third member joins and confirms it. The session id binds a statement to
one session: after a node rejoins, statements about its old session are worthless
against the new one, and an eviction dated before its session began is refused.

Wire form of one statement: ``[by, session, incarnation, at_ms, signature]``; on liveness
news the suspecter and incarnation travel in the news item itself and the rest in its
``proof`` bytes (``pack_proof``).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from libp2p.peer.id import ID

from otela.registry.session import SESSION_ID_LENGTH

DOMAIN = b"otela/liveness/suspect/v1\0"
MAX_AGE_S = 600.0  # a statement older than this (at the eviction's time) proves nothing
WITNESSES = 2  # distinct members whose statements every eviction needs
MAX_WITNESSES = 3  # an eviction carries at most this many statements
_SIG_BYTES = 64
_PROOF_BYTES = SESSION_ID_LENGTH + 8 + _SIG_BYTES


class EvidenceError(ValueError):
    """A statement that is malformed or whose signature does not verify."""


@dataclass(frozen=True, slots=True)
class Suspicion:
    """One member's signed statement that it suspects ``suspect``'s ``session``."""

    by: str
    suspect: str
    session: str
    incarnation: int
    at_ms: int
    signature: bytes

    def payload(self) -> bytes:
        return payload(self.by, self.suspect, self.session, self.incarnation, self.at_ms)

    def verify(self) -> bool:
        try:
            key = ID.from_base58(self.by).extract_public_key()
        except Exception:
            return False
        return key is not None and key.verify(self.payload(), self.signature)

    def pack_proof(self) -> bytes:
        """The part that rides in a liveness news item's ``proof``."""
        return self.session.encode() + struct.pack(">Q", self.at_ms) + self.signature

    def to_wire(self) -> list[Any]:
        return [self.by, self.session, self.incarnation, self.at_ms, self.signature]


def payload(by: str, suspect: str, session: str, incarnation: int, at_ms: int) -> bytes:
    return DOMAIN + f"{by}|{suspect}|{session}|{incarnation}|{at_ms}".encode()


def sign(sign_bytes: Callable[[bytes], bytes], by: str, suspect: str, session: str,
         incarnation: int, at: float) -> Suspicion:
    """``by``'s statement, signed with its node key (``sign_bytes``)."""
    at_ms = int(at * 1000)
    return Suspicion(by, suspect, session, incarnation, at_ms,
                     sign_bytes(payload(by, suspect, session, incarnation, at_ms)))


def from_proof(by: str, suspect: str, incarnation: int, proof: Any) -> Suspicion:
    """A statement from a news item (``pack_proof``); ``EvidenceError`` if malformed."""
    if not isinstance(proof, bytes) or len(proof) != _PROOF_BYTES:
        raise EvidenceError("a suspicion's proof is not session, time and signature")
    session = proof[:SESSION_ID_LENGTH].decode("ascii", "replace")
    (at_ms,) = struct.unpack(">Q", proof[SESSION_ID_LENGTH:SESSION_ID_LENGTH + 8])
    return Suspicion(by, suspect, session, incarnation, at_ms, proof[-_SIG_BYTES:])


def from_wire(suspect: str, item: Any) -> Suspicion:
    """A statement from an eviction's evidence list; ``EvidenceError`` if malformed."""
    try:
        by, session, incarnation, at_ms, signature = item
    except (TypeError, ValueError):
        raise EvidenceError("evidence item is not [by, session, incarnation, at, sig]") from None
    if not (isinstance(by, str) and isinstance(session, str) and isinstance(signature, bytes)
            and isinstance(incarnation, int) and isinstance(at_ms, int)
            and 0 <= incarnation < 2**63 and 0 <= at_ms < 2**63):
        raise EvidenceError("evidence item has fields of the wrong types")
    return Suspicion(by, suspect, session, incarnation, at_ms, signature)


def justified(statements: Iterable[Suspicion], suspect: str, session: str, at: float,
              is_member: Callable[[str], bool], required: int = WITNESSES
              ) -> list[Suspicion]:
    """The distinct valid statements about ``session`` of ``suspect`` among
    ``statements``: signed by members other than the suspect, within ``MAX_AGE_S`` before
    ``at`` (or up to a minute after it: clocks differ). Raises ``EvidenceError`` when fewer
    than ``required`` remain. Signatures are checked last, and only until enough hold."""
    at_ms = at * 1000
    seen: set[str] = set()
    valid: list[Suspicion] = []
    for statement in statements:
        if (statement.by in seen or statement.by == suspect or statement.suspect != suspect
                or statement.session != session
                or not at_ms - MAX_AGE_S * 1000 <= statement.at_ms <= at_ms + 60_000
                or not is_member(statement.by) or not statement.verify()):
            continue
        seen.add(statement.by)
        valid.append(statement)
        if len(valid) >= required:
            return valid
    raise EvidenceError(f"{len(valid)} of the {required} independent suspicions an eviction "
                        "needs")

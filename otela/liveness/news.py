"""Liveness news: merging what others tell us, refuting suspicions of us, and what we
publish to every node.

News (``suspect P@i``, ``alive P@i``, ``confirmed P@i``) rides on probe messages (SWIM's
piggybacking: ``piggyback``/``receive``), so spreading it costs nothing extra. First-hand
suspicions backed by strong evidence (``LivenessTable.suspicion_to_publish``) are also
published on the liveness topic, so that every node (and every ingress) stops routing to
a crashed node within milliseconds, not after an epidemic of probe rounds; those go
through ``broadcasts`` to the detector's publishing task, woken by ``pending``.

A suspect that hears of its suspicion raises its incarnation and spreads a *signed*
``alive`` (no one else can refute on its behalf); if the suspicion was published, or
was signed ``OLD_SUSPICION_S`` before it reached us, so is the refutation, and a
refutation that old suspicions keep outliving is published again (``_suspicion_of_us``).
A suspicion of another member counts only when it carries its
suspecter's signed statement about the suspect's current session
(``otela.registry.evidence``): those statements are what an eviction must embed, and an
unsigned "suspect P by Q" could come from anyone, naming anyone as Q. Published
suspicions of others are verified first-hand by the few members every node picks alike
(``LivenessTable.should_verify``): their probes go first (``NeighbourWatch.verify``). A
published suspicion rides on probes too, marked as published (``published_among``), so
a verifier the topic missed still hears that it is to verify. An
``alive`` signature is checked only when the news would change our view: most news is
old.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

import trio
from libp2p.peer.id import ID

from otela.liveness.events import EventLog
from otela.liveness.health import LocalHealth
from otela.liveness.table import LivenessTable, Status, Update
from otela.liveness.watch import NeighbourWatch
from otela.registry import evidence

log = logging.getLogger("otela.liveness")

ALIVE_DOMAIN = b"otela/liveness/alive/v1\0"
# A suspect refutes by announcing its incarnation + 1, and every message carries
# incarnations as msgpack integers (at most 2**64 - 1): news of an incarnation at or past
# 2**63 from a misbehaving member would push ours past what we can encode, and every
# probe and ack after it would fail. Suspicions stop one below, so that the refutation of
# any suspicion we accept is itself accepted.
MAX_INCARNATION = 2**63 - 1
# A suspicion of us signed this long ago, or one we refuted this long ago and still passed
# on, gets our refutation published (``News._suspicion_of_us``).
OLD_SUSPICION_S = 10.0
MAX_NEWS_ITEMS = 256  # per message: honest piggybacking sends a few dozen at most

Sign = Callable[[bytes], bytes]  # our node key's Ed25519 signature


def alive_payload(peer_id: str, incarnation: int) -> bytes:
    return ALIVE_DOMAIN + f"{peer_id}|{incarnation}".encode()


def encode_updates(updates: list[Update]) -> list[list[Any]]:
    return [[u.peer_id, u.status.value, u.incarnation, u.proof, u.by] for u in updates]


def verify_alive(update: Update) -> bool:
    """Whether an ``alive`` carries the peer's own signature of its incarnation."""
    try:
        key = ID.from_base58(update.peer_id).extract_public_key()
    except Exception:
        return False
    return key is not None and update.proof is not None and key.verify(
        alive_payload(update.peer_id, update.incarnation), update.proof)


def well_formed(items: Any) -> bool:
    """Whether a message's news is a list of at most ``MAX_NEWS_ITEMS`` entries (or
    absent); single entries are checked as they are applied. A map, a number or a string
    here used to crash the node (the loop over it raised ``TypeError``)."""
    return items is None or (isinstance(items, list) and len(items) <= MAX_NEWS_ITEMS)


def published_marks(marks: Any) -> frozenset[int]:
    """A probe's marks of published items (``News.published_among``), or none where they
    are not a short list of indices: the marks are a hint, never worth an error."""
    if not isinstance(marks, list) or len(marks) > MAX_NEWS_ITEMS:
        return frozenset()
    return frozenset(m for m in marks if type(m) is int and 0 <= m < MAX_NEWS_ITEMS)


class News:
    def __init__(self, self_id: str, table: LivenessTable, watch: NeighbourWatch,
                 health: LocalHealth, events: EventLog, sign: Sign,
                 stats: dict[str, int],
                 session_of: Callable[[str], str | None] = lambda peer_id: None,
                 wall: Callable[[], float] = time.time) -> None:
        self.self_id = self_id
        self.table = table
        self.watch = watch
        self.health = health
        self.events = events
        self.sign = sign
        self.stats = stats
        self.session_of = session_of  # a member's live session, as our registry has it
        self.wall = wall  # the clock suspicion statements are signed by
        self.pending = trio.Event()  # set when a suspicion or refutation must go out
        self.broadcasts: list[list[Any]] = []  # first-hand news waiting to be published
        # Whether a suspicion of us came on the liveness topic (then so must our refutation).
        self._refute_loudly = False
        self._refuted_at = -math.inf  # when a suspicion of us last called for a refutation
        self._republished_at = -math.inf  # when we last published a refutation again

    # -- what we send ------------------------------------------------------------------

    def piggyback(self, to: str | None = None) -> list[list[Any]]:
        """News to attach to an outgoing probe message to ``to`` (refuting first, if we
        must). Lifeguard's buddy system: a message to a member we suspect carries that
        suspicion, whatever our news budget says, so a live suspect learns of it from the
        first message that reaches it and refutes in its answer. News rides on a bounded
        number of messages (``LivenessTable.piggyback``); without this, a suspicion whose
        budget ran out while the suspect was unreachable (a partition) was never heard by
        the suspect once it was reachable again, so it never refuted, and the suspicion
        ran its course to an eviction of a live node after the heal."""
        if self.table.refute_needed:
            self.refute()
        updates = self.table.piggyback()
        buddy = None if to is None else self.table.suspicion_of(to)
        if buddy is not None and all(u.peer_id != to for u in updates):
            updates.insert(0, buddy)
        return encode_updates(updates)

    def published_among(self, items: list[list[Any]]) -> list[int]:
        """Which of ``items`` (``piggyback``'s) are suspicions published on the liveness
        topic, by us or others: the message marks them so that a receiver treats them as
        if the topic had brought them (verifies them if chosen, refutes loudly if it is
        the suspect). GossipSub delivers to its mesh only, and a mesh of a few nodes
        around one hub flaps (py-libp2p B2): a member that missed the one publication of
        a suspicion it was picked to verify never probed the suspect, and a node killed
        in a federation of three waited ~40 s for its eviction instead of ~7 s."""
        return [i for i, (peer_id, status, incarnation, *_rest) in enumerate(items)
                if status == Status.SUSPECT.value
                and (peer_id, incarnation) in self.table.published]

    def publish_suspicion(self, target: str, connection_lost: bool,
                          corroborate: bool = False) -> bool:
        """Publish our suspicion of ``target`` if the evidence is now strong enough, or
        ``corroborate`` (an eviction waits for a second signer)
        (``LivenessTable.suspicion_to_publish``); return whether it will be."""
        update = self.table.suspicion_to_publish(target, connection_lost, corroborate)
        if update is None:
            return False
        self._broadcast(encode_updates([update])[0])
        return True

    def refute(self) -> None:
        self.health.worse()  # others could not reach us in time: we are probably slow
        incarnation = self.table.incarnation
        proof = self.sign(alive_payload(self.self_id, incarnation))
        self.table.announce_alive(proof)  # rides on our probes and acks in any case
        # Loudly too while cut off or just after (``LivenessTable.observe_reach``): the
        # other side of the cut may hold suspicions of us, which the probes we answer
        # would not tell of our refutation in time.
        table = self.table
        if self._refute_loudly or table.cut_off or table.refute_loudly:
            self._refute_loudly = False
            if not table.cut_off:  # the first refutation after the cut is this one
                table.refute_loudly = False
            self._broadcast([self.self_id, Status.ALIVE.value, incarnation, proof, None])
        log.warning("refuting a suspicion of this node (incarnation %d)", incarnation)

    def take_broadcasts(self) -> list[list[Any]]:
        """What to publish now (refuting first, if we must); resets ``pending``."""
        self.pending = trio.Event()
        if self.table.refute_needed:
            self.refute()
        news, self.broadcasts = self.broadcasts, []
        return news

    def _broadcast(self, item: list[Any]) -> None:
        self.broadcasts.append(item)
        self.pending.set()

    # -- what we hear ------------------------------------------------------------------

    def receive(self, items: Any, now: float, source: str, published: bool = False,
                marks: Any = None) -> None:
        """Merge a message's news (from a probe, or ``published`` on the topic);
        ``marks``: the indices of the probe's items that were published
        (``published_among``)."""
        if not well_formed(items):
            self.stats["malformed_news"] = self.stats.get("malformed_news", 0) + 1
            return
        marked = published_marks(marks)
        for index, item in enumerate(items or []):
            self.apply(item, now, source, published or index in marked)
        if self.table.refute_needed:
            self.pending.set()

    def _suspicion_of_us(self, update: Update, now: float, published: bool) -> None:
        """Whether our refutation must be published, not only ride on probes: when the
        suspicion has outlived what a refutation on probes can catch up with.

        - Published: everyone heard it, so everyone must hear us.
        - Signed ``OLD_SUSPICION_S`` or more ago (its suspecter's statement says when): it
          has been passing from member to member all that while. After a 60 s cut of 112
          of 300 nodes, suspicions made on the cut side struck live members of the larger
          side in waves of 100-200 holders for 97 s after the heal, each refuted on
          probes that trailed it. A fresh false alarm (a slow peer) is still refuted on
          probes only: publishing each of those cost every node a message per alarm on a
          loaded machine (``LivenessTable.suspicion_to_publish``).
        - Of an incarnation we refuted ``OLD_SUSPICION_S`` or more ago: our refutation
          missed members that still pass the suspicion on. Our refutation is published
          again, at most every ``OLD_SUSPICION_S``.
        """
        if update.incarnation >= self.table.incarnation:
            self._refuted_at = now  # the refutation this suspicion calls for
            if published or self._age(update) >= OLD_SUSPICION_S:
                self._refute_loudly = True
            return
        refutation = self.table.current_refutation()
        if (refutation is None or now - self._refuted_at < OLD_SUSPICION_S
                or now - self._republished_at < OLD_SUSPICION_S):
            return
        self._republished_at = now
        self.stats["refutations_republished"] = self.stats.get("refutations_republished", 0) + 1
        self._broadcast(encode_updates([refutation])[0])

    def _age(self, update: Update) -> float:
        """How long ago the suspicion was signed, by its statement (0 if unreadable)."""
        if update.by is None:
            return 0.0
        try:
            statement = evidence.from_proof(update.by, update.peer_id, update.incarnation,
                                            update.proof)
        except evidence.EvidenceError:
            return 0.0
        return self.wall() - statement.at_ms / 1000

    def _signed(self, update: Update) -> bool:
        """Whether a suspicion of another member carries its suspecter's valid statement
        about the member's current session. Checked only where the news would change our
        view (a new suspecter, or a newer incarnation): most news is old."""
        member = self.table.members.get(update.peer_id)
        if member is None or update.incarnation < member.incarnation or (
                update.incarnation == member.incarnation and update.by in member.suspecters):
            return True  # the table ignores it anyway
        if update.by is None:
            return False
        try:
            statement = evidence.from_proof(update.by, update.peer_id, update.incarnation,
                                            update.proof)
        except evidence.EvidenceError:
            return False
        session = self.session_of(update.peer_id)
        return (session is None or statement.session == session) and statement.verify()

    def apply(self, item: Any, now: float, source: str, published: bool = False) -> None:
        """Merge one piece of news; ``published``: it came on the liveness topic."""
        try:
            peer_id, status, incarnation, proof, by = item
            update = Update(str(peer_id), Status(status), incarnation, proof,
                            str(by) if by else None)
            limit = MAX_INCARNATION - (update.status is not Status.ALIVE)
            if not isinstance(incarnation, int) or not 0 <= incarnation <= limit:
                return  # inf, nan, strings and out-of-range numbers alike
        except (TypeError, ValueError):
            return
        if (update.status is Status.SUSPECT and update.peer_id != self.self_id
                and not self._signed(update)):
            self.stats["unsigned_suspicions"] = self.stats.get("unsigned_suspicions", 0) + 1
            return
        if published and update.status is Status.SUSPECT:
            self.table.published_elsewhere(update.peer_id, update.incarnation)
        if update.peer_id == self.self_id and update.status is not Status.ALIVE:
            self._suspicion_of_us(update, now, published)
        member = self.table.members.get(update.peer_id)
        valid = (update.status is Status.ALIVE and isinstance(update.proof, bytes)
                 and member is not None and update.incarnation > member.incarnation
                 and verify_alive(update))
        was_suspect = update.peer_id in self.table.suspected()
        changed = self.table.apply(update, now, proof_valid=valid)
        if (published and update.status is Status.SUSPECT
                and self.table.should_verify(update.peer_id)
                and self.watch.verify(update.peer_id, now)):
            self.events.record(update.peer_id, "verifying",
                               f"{source} published a suspicion; probing it first-hand")
        if not changed:
            return
        if update.status is Status.SUSPECT:
            self.events.record(update.peer_id, "suspected", f"reported by {source}")
            # Our own suspicion, now corroborated, may have become worth publishing.
            self.publish_suspicion(update.peer_id, update.peer_id in self.watch.lost)
        elif update.status is Status.CONFIRMED:
            self.events.record(update.peer_id, "confirmed", f"reported by {source}")
        elif was_suspect:
            self.stats["refuted"] += 1
            self.events.record(update.peer_id, "refuted", f"incarnation {update.incarnation}")
            log.info("%s refuted its suspicion (incarnation %d)", update.peer_id,
                     update.incarnation)

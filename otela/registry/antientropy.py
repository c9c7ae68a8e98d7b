"""Anti-entropy: find and transfer only what two replicas lack, in three round trips.

    initiator                                   responder
    opening   {root, revoked}            ->
              <-  {same} | {buckets, revocations, want_revocations}   answer_opening
    digests   {digests of differing buckets, revocations}   ->
              <-  {entries, want}                                answer_digests
    entries   {entries the responder wants}   ->

Equal replicas stop after the first round trip having sent 16 bytes of root hash (plus
revocation serials). Otherwise the 256 bucket hashes (4 KiB) narrow the comparison to
the buckets that differ, and only those buckets' digests (session id -> state, version,
tiebreak prefix) and then only the missing or older entries cross the wire. A node
joining a large federation therefore converges in one exchange, without replaying
history. Pure: functions take a ``Registry`` and return messages; the caller verifies
and applies the envelopes it receives.
"""

from __future__ import annotations

from typing import Any

from otela.registry.store import Registry

Message = dict[str, Any]

# Entries per message (~450 B each): keeps every frame far below the 8 MiB limit. A joiner
# to a larger federation receives the rest in the next exchanges (the initiator repeats
# while it keeps receiving full batches).
MAX_ENTRIES_PER_MESSAGE = 5000


def opening(registry: Registry) -> Message:
    return {"kind": "ae-open", "root": registry.map.digest_root(),
            "revoked": sorted(registry.revocations)}


def _revocation_exchange(registry: Registry, their_serials: list[str]) -> Message:
    theirs = set(their_serials)
    return {
        "revocations": [proof for serial, (_, proof) in registry.revocations.items()
                        if serial not in theirs],
        "want_revocations": sorted(theirs - set(registry.revocations)),
    }


def answer_opening(registry: Registry, message: Message) -> Message:
    exchange = _revocation_exchange(registry, list(message.get("revoked") or []))
    if message.get("root") == registry.map.digest_root():
        return {"kind": "ae-same", **exchange}
    return {"kind": "ae-buckets", "buckets": registry.map.bucket_hashes(), **exchange}


def digests(registry: Registry, answer: Message) -> Message | None:
    """The initiator's digests of differing buckets; ``None`` when the maps are equal."""
    wanted = [registry.revocations[s][1] for s in answer.get("want_revocations") or []
              if s in registry.revocations]
    if answer.get("kind") == "ae-same":
        return {"kind": "ae-digests", "digests": {}, "revocations": wanted} if wanted else None
    theirs = answer.get("buckets") or []
    ours = registry.map.bucket_hashes()
    differing = [b for b, h in enumerate(ours) if b >= len(theirs) or theirs[b] != h]
    return {
        "kind": "ae-digests",
        "digests": {b: registry.map.bucket_digest(b) for b in differing},
        "revocations": wanted,
    }


def answer_digests(registry: Registry, message: Message) -> Message:
    per_bucket = message.get("digests") or {}
    remote: dict[str, tuple[int, int, bytes]] = {}
    for items in per_bucket.values():
        remote.update({k: tuple(v) for k, v in items.items()})
    send, want = registry.map.newer_than(remote, (int(b) for b in per_bucket))
    return {"kind": "ae-entries", "entries": [e.proof for e in send[:MAX_ENTRIES_PER_MESSAGE]],
            "want": want[:MAX_ENTRIES_PER_MESSAGE]}


def entries(registry: Registry, keys: list[str]) -> Message:
    found = (registry.map.get(k) for k in keys)
    return {"kind": "ae-entries", "entries": [e.proof for e in found if e is not None],
            "want": []}

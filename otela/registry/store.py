"""The local registry replica: the CRDT map, plus the two views routing and operators read.

- Node view: every session's record (state from the map), minus LEFT sessions past the
  retention window and nodes whose membership certificate was revoked or has expired.
- Model view: model id -> sessions listing it. Routing's lookup of SERVING candidates
  is one dict read returning a cached tuple; the cache is rebuilt per model, only
  when an entry touching that model changes.
Pure and synchronous: the mesh layer feeds it verified entries, the HTTP layer reads it.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from otela.registry.certificate import Revocation
from otela.registry.crdt import Entry, GCPolicy, GMap, Rejected, Superseded
from otela.registry.records import Lifecycle, NodeRecord

__all__ = ["ModelEntry", "Registry", "Rejected", "Superseded"]

# Generations ``changes_since`` reaches back: a reader polls once a probe period, and even
# heavy churn at 10,000 nodes changes a few sessions a second.
JOURNAL_LENGTH = 4096


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One model id and every visible session that lists it, in any lifecycle state."""

    model_id: str
    sessions: tuple[NodeRecord, ...]

    def serving(self) -> tuple[NodeRecord, ...]:
        return tuple(r for r in self.sessions if r.state is Lifecycle.SERVING)


class Registry:
    def __init__(self, policy: GCPolicy | None = None) -> None:
        self.map = GMap(policy)
        self.revocations: dict[str, tuple[Revocation, dict[str, Any]]] = {}
        self._visible: dict[str, NodeRecord] = {}
        self._by_model: dict[str, dict[str, NodeRecord]] = {}
        self._serving: dict[str, tuple[NodeRecord, ...]] = {}
        self._live_by_peer: dict[str, set[str]] = {}  # peer id -> its visible non-LEFT sessions
        # When this replica received the version it holds (local clock): operators read it
        # as "last update", the convergence benchmark as the apply time.
        self.received_at: dict[str, float] = {}
        # Bumped on every change to the views: lets periodic readers skip unchanged state.
        self.generation = 0
        # The session each of the last JOURNAL_LENGTH generations changed (the journal's
        # last item is this generation's): a reader that tracks the views follows only what
        # changed since it last looked (``changes_since``) instead of re-reading N records.
        self._journal: deque[str] = deque(maxlen=JOURNAL_LENGTH)
        self.superseded = 0  # sessions dropped for a newer session of the same peer

    @property
    def policy(self) -> GCPolicy:
        return self.map.policy

    # -- writes ----------------------------------------------------------------------

    def apply(self, entry: Entry, now: float) -> bool:
        """Merge a verified entry; return whether the map changed. Raises ``Rejected``."""
        changed, replaced = self.map.merge(entry, now)
        if changed:
            if replaced is not None and replaced.key != entry.key:  # a superseded session
                self.superseded += 1
                self._hide(replaced.key)
                self.received_at.pop(replaced.key, None)
            self.received_at[entry.key] = now
            self._refresh_view(entry.key, now)
        return changed

    def add_revocation(self, revocation: Revocation, proof: dict[str, Any], now: float) -> bool:
        """Record a certificate revocation (grow-only) and hide the revoked node's sessions."""
        if revocation.serial in self.revocations:
            return False
        self.revocations[revocation.serial] = (revocation, proof)
        for entry in list(self.map):
            if entry.cert_serial == revocation.serial:
                self._refresh_view(entry.key, now)
        return True

    def revoked_serials(self) -> set[str]:
        return set(self.revocations)

    def maintain(self, now: float) -> list[Entry]:
        """Periodic GC: compact expired entries, hide LEFT past retention and expired certs."""
        dropped = self.map.compact(now)
        for entry in dropped:
            self._hide(entry.key)
            self.received_at.pop(entry.key, None)
        for key in list(self._visible):
            self._refresh_view(key, now)
        return dropped

    # -- reads -----------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._visible)

    def __iter__(self) -> Iterator[NodeRecord]:
        return iter(self._visible.values())

    def get(self, session_id: str) -> NodeRecord | None:
        return self._visible.get(session_id)

    def entry(self, session_id: str) -> Entry | None:
        return self.map.get(session_id)

    def snapshot(self) -> list[NodeRecord]:
        return sorted(self._visible.values(), key=lambda r: r.session_id)

    def model(self, model_id: str) -> ModelEntry | None:
        sessions = self._by_model.get(model_id)
        if not sessions:
            return None
        return ModelEntry(model_id, tuple(sessions[k] for k in sorted(sessions)))

    def models(self) -> list[ModelEntry]:
        return [m for m in (self.model(k) for k in sorted(self._by_model)) if m is not None]

    def is_member(self, peer_id: str) -> bool:
        """Whether ``peer_id`` has a live session here (JOIN, SERVING or DOWN, visible: in
        authority mode, with a valid certificate). Who may use a node's engine hop."""
        return peer_id in self._live_by_peer

    def has_left(self, peer_id: str) -> bool:
        """Whether ``peer_id``'s session here is LEFT (it left, or was evicted)."""
        key = self.map.session_of(peer_id)
        entry = None if key is None else self.map.get(key)
        return entry is not None and entry.state is Lifecycle.LEFT

    def knows(self, peer_id: str) -> bool:
        """Whether ``peer_id`` has a session here, in any state."""
        return self.map.session_of(peer_id) is not None

    def serving_candidates(self, model_id: str) -> tuple[NodeRecord, ...]:
        """SERVING sessions for ``model_id``: the routing hot path, one dict lookup."""
        cached = self._serving.get(model_id)
        if cached is None:
            sessions = self._by_model.get(model_id, {})
            cached = tuple(r for r in sessions.values() if r.state is Lifecycle.SERVING)
            self._serving[model_id] = cached
        return cached

    def changes_since(self, generation: int) -> list[str] | None:
        """The sessions whose view changed after ``generation`` (each once, in the order of
        their last change; look each up with ``get``: None if it is hidden now), or None
        if the journal no longer reaches back that far and the reader must re-read all."""
        behind = self.generation - generation
        if behind < 0 or behind > len(self._journal):
            return None
        if behind == 0:
            return []
        journal, end = self._journal, len(self._journal)
        recent = [journal[i] for i in range(end - 1, end - 1 - behind, -1)]  # newest first
        return list(dict.fromkeys(recent))[::-1]

    def _changed(self, key: str) -> None:
        self.generation += 1
        self._journal.append(key)

    # -- views -----------------------------------------------------------------------

    def _is_visible(self, entry: Entry, now: float) -> bool:
        if entry.state is Lifecycle.LEFT and entry.updated_at < now - self.policy.retention:
            return False
        if entry.cert_serial is not None and entry.cert_serial in self.revocations:
            return False
        return entry.cert_expires_at is None or entry.cert_expires_at > now

    def _refresh_view(self, key: str, now: float) -> None:
        entry = self.map.get(key)
        if entry is None or not self._is_visible(entry, now):
            self._hide(key)
            return
        record = entry.record
        if record.state is not entry.state:
            record = dataclasses.replace(record, state=entry.state)
        previous = self._visible.get(key)
        if previous == record:
            return
        self._hide(key)
        self._visible[key] = record
        self._changed(key)
        if entry.state is not Lifecycle.LEFT:
            self._live_by_peer.setdefault(record.peer_id, set()).add(key)
            for model in record.models:
                self._by_model.setdefault(model.id, {})[key] = record
                self._serving.pop(model.id, None)

    def _hide(self, key: str) -> None:
        previous = self._visible.pop(key, None)
        if previous is None:
            return
        self._changed(key)
        live = self._live_by_peer.get(previous.peer_id)
        if live is not None:
            live.discard(key)
            if not live:
                del self._live_by_peer[previous.peer_id]
        for model in previous.models:
            sessions = self._by_model.get(model.id)
            if sessions is not None:
                sessions.pop(key, None)
                if not sessions:
                    del self._by_model[model.id]
            self._serving.pop(model.id, None)

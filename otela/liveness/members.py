"""The member list: which peers the failure detector tracks, taken from the registry.

Members are the peers with a session that is not LEFT (ourselves excluded). The list
follows the registry's changes: a registry that keeps a journal of them
(``Registry.changes_since``) costs O(changed sessions) per change, and anything else, or
a journal that no longer reaches back, a re-read of every record (O(N): 27-32 ms at
10,000 members, which under churn there was several re-reads a second on every node,
``benchmarks/liveness_scale.py``). Never work per probe period. A member whose set of
sessions gained one rejoined after an eviction, and starts afresh in the liveness table.
Pure: callers pass records and times.
"""

from __future__ import annotations

from collections.abc import Iterable

from otela.liveness.events import EventLog
from otela.liveness.rtt import RoundTrips
from otela.liveness.table import LivenessTable
from otela.registry.records import Lifecycle, NodeRecord
from otela.registry.store import Registry


class MemberList:
    def __init__(self, self_id: str, table: LivenessTable, round_trips: RoundTrips,
                 events: EventLog) -> None:
        self.self_id = self_id
        self.table = table
        self.round_trips = round_trips
        self.events = events
        self.generation = -1  # the registry generation last synced
        self.sessions: dict[str, set[str]] = {}  # live session ids per member
        self.peers: dict[str, tuple[str, ...]] = {}  # each member's addresses
        self.known: set[str] = set()  # every peer the registry names, LEFT ones included
        self._named: dict[str, str] = {}  # every visible session -> its peer
        self._names: dict[str, int] = {}  # peer -> how many visible sessions name it
        # The peers the last sync looked at (their addresses may have changed); None after
        # a re-read of every record.
        self.touched: set[str] | None = None

    def sync(self, records: Iterable[NodeRecord], generation: int, now: float
             ) -> dict[str, tuple[str, ...]] | None:
        """Track the registry's non-LEFT peers if ``generation`` is new; returns each
        member's addresses then (for probing peers we hold no connection to; read-only),
        else None."""
        if generation == self.generation:
            return None
        previous, self.generation = self.generation, generation
        journal = records if isinstance(records, Registry) and previous >= 0 else None
        changed = None if journal is None else journal.changes_since(previous)
        if journal is None or changed is None:
            self._reread(records, now)
            self.touched = None
        else:
            self.touched = self._follow(journal, changed, now)
        return self.peers

    def _reread(self, records: Iterable[NodeRecord], now: float) -> None:
        peers: dict[str, tuple[str, ...]] = {}
        sessions: dict[str, set[str]] = {}
        named: dict[str, str] = {}
        names: dict[str, int] = {}
        for record in records:
            named[record.session_id] = record.peer_id
            names[record.peer_id] = names.get(record.peer_id, 0) + 1
            if record.state is not Lifecycle.LEFT and record.peer_id != self.self_id:
                peers[record.peer_id] = record.addrs
                sessions.setdefault(record.peer_id, set()).add(record.session_id)
        for peer_id, ids in sessions.items():
            if ids - self.sessions.get(peer_id, ids):
                self.table.new_session(peer_id, now)  # it rejoined after an eviction
        self.sessions, self.peers, self._named, self._names = sessions, peers, named, names
        self.known = set(names)
        self.table.sync_members(set(peers), now)
        self.round_trips.forget_except(set(peers))
        self.events.keep_only(self.table.members)

    def _follow(self, registry: Registry, changed: list[str], now: float) -> set[str]:
        """``_reread``'s outcome from the sessions that changed alone; the peers touched."""
        before: dict[str, set[str]] = {}  # each touched peer's live sessions before
        for key in changed:
            old_peer = self._named.pop(key, None)
            if old_peer is not None:
                before.setdefault(old_peer, set(self.sessions.get(old_peer, ())))
                self._unname(old_peer)
                self.sessions.get(old_peer, set()).discard(key)
            record = registry.get(key)
            if record is None:
                continue
            peer_id = record.peer_id
            before.setdefault(peer_id, set(self.sessions.get(peer_id, ())))
            self._named[key] = peer_id
            self._names[peer_id] = self._names.get(peer_id, 0) + 1
            self.known.add(peer_id)
            if record.state is not Lifecycle.LEFT and peer_id != self.self_id:
                self.sessions.setdefault(peer_id, set()).add(key)
                self.peers[peer_id] = record.addrs
        for peer_id, ids_before in before.items():
            ids = self.sessions.get(peer_id)
            if not ids:
                self.sessions.pop(peer_id, None)
                self.peers.pop(peer_id, None)
                self.table.remove_member(peer_id)
                self.round_trips.forget(peer_id)
                self.events.forget(peer_id)
                continue
            if ids_before and ids - ids_before:
                self.table.new_session(peer_id, now)  # it rejoined after an eviction
            self.table.add_member(peer_id, now)
        return set(before)

    def _unname(self, peer_id: str) -> None:
        left = self._names[peer_id] - 1
        if left:
            self._names[peer_id] = left
        else:
            del self._names[peer_id]
            self.known.discard(peer_id)

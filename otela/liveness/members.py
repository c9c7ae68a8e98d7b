"""The member list: which peers the failure detector tracks, taken from the registry.

Members are the peers with a session that is not LEFT (ourselves excluded). The list is
rebuilt only when the registry changed (its ``generation``): O(N) work per registry change,
never per probe period. A member whose set of sessions gained one rejoined after an
eviction, and starts afresh in the liveness table. Pure: callers pass records and times.
"""

from __future__ import annotations

from collections.abc import Iterable

from otela.liveness.events import EventLog
from otela.liveness.rtt import RoundTrips
from otela.liveness.table import LivenessTable
from otela.registry.records import Lifecycle, NodeRecord


class MemberList:
    def __init__(self, self_id: str, table: LivenessTable, round_trips: RoundTrips,
                 events: EventLog) -> None:
        self.self_id = self_id
        self.table = table
        self.round_trips = round_trips
        self.events = events
        self.generation = -1  # the registry generation last synced
        self.sessions: dict[str, set[str]] = {}  # live session ids per member
        self.known: set[str] = set()  # every peer the registry names, LEFT ones included

    def sync(self, records: Iterable[NodeRecord], generation: int, now: float
             ) -> dict[str, tuple[str, ...]] | None:
        """Track the registry's non-LEFT peers if ``generation`` is new; returns each
        member's addresses then (for probing peers we hold no connection to), else None."""
        if generation == self.generation:
            return None
        self.generation = generation
        peers: dict[str, tuple[str, ...]] = {}
        sessions: dict[str, set[str]] = {}
        known: set[str] = set()
        for record in records:
            known.add(record.peer_id)
            if record.state is not Lifecycle.LEFT and record.peer_id != self.self_id:
                peers[record.peer_id] = record.addrs
                sessions.setdefault(record.peer_id, set()).add(record.session_id)
        for peer_id, ids in sessions.items():
            if ids - self.sessions.get(peer_id, ids):
                self.table.new_session(peer_id, now)  # it rejoined after an eviction
        self.sessions = sessions
        self.known = known
        self.table.sync_members(set(peers), now)
        self.round_trips.forget_except(set(peers))
        self.events.keep_only(self.table.members)
        return peers

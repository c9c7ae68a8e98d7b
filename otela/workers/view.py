"""What a data-path worker knows of the federation: a snapshot the control process sends
whenever it changes (registry records, suspected peers, this node's own state), rebuilt
into the same ``Registry`` views the router and the engine hop read in a single process.
Pure: snapshots in, views out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from otela.registry.crdt import Entry
from otela.registry.records import NodeRecord
from otela.registry.store import Registry


def snapshot_of(records: list[NodeRecord], suspected: frozenset[str], session_id: str,
                engine_url: str | None, models: frozenset[str], warming: bool = False
                ) -> dict[str, Any]:
    """The control process's side: everything a worker routes with."""
    return {"records": [r.to_dict() for r in records], "suspected": sorted(suspected),
            "session_id": session_id, "engine_url": engine_url, "models": sorted(models),
            "warming": warming}


@dataclass
class WorkerView:
    registry: Registry = field(default_factory=Registry)
    suspected: frozenset[str] = frozenset()
    session_id: str = ""
    engine_url: str | None = None  # this node's engine, while SERVING
    models: frozenset[str] = frozenset()
    warming: bool = False  # the node's replica is catching up after its start
    busy: dict[str, int] = field(default_factory=dict)  # federation-wide per session
    load: dict[str, Any] = field(default_factory=dict)  # the node's, and others' reports

    def update(self, snapshot: dict[str, Any], now: float) -> None:
        """Take a snapshot: the views are rebuilt (O(sessions), on changes only); or just
        the federation-wide per-session load."""
        if "busy" in snapshot:
            self.busy = dict(snapshot["busy"])
        if "load" in snapshot:
            self.load = dict(snapshot["load"])
        if "records" not in snapshot:
            return
        registry = Registry()
        for data in snapshot.get("records", ()):
            record = NodeRecord.from_dict(data)
            registry.apply(Entry(record.session_id, record.state, record.version,
                                 record.updated_at, b"", record), now)
        self.registry = registry
        self.suspected = frozenset(snapshot.get("suspected", ()))
        self.session_id = str(snapshot.get("session_id", ""))
        self.engine_url = snapshot.get("engine_url")
        self.models = frozenset(snapshot.get("models", ()))
        self.warming = bool(snapshot.get("warming", False))

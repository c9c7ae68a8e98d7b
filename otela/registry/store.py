"""The local registry replica: merge incoming records, and answer routing's questions.

Pure and synchronous: the mesh layer feeds it records, the HTTP layer reads it. The
model index is rebuilt on every accepted change, so a routing lookup is one dict read.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from otela.registry.records import Lifecycle, NodeRecord


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One model id and every known session that lists it, in any lifecycle state."""

    model_id: str
    sessions: tuple[NodeRecord, ...]

    def serving(self) -> tuple[NodeRecord, ...]:
        return tuple(r for r in self.sessions if r.state is Lifecycle.SERVING)


class Registry:
    """One record per session; the record with the highest precedence wins."""

    def __init__(self) -> None:
        self._records: dict[str, NodeRecord] = {}
        self._signed: dict[str, Any] = {}
        self._models: dict[str, ModelEntry] = {}

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[NodeRecord]:
        return iter(self._records.values())

    def get(self, session_id: str) -> NodeRecord | None:
        return self._records.get(session_id)

    def merge(self, record: NodeRecord, signed: Any = None) -> bool:
        """Keep ``record`` if it is newer than what we hold; return whether anything changed.

        Commutative, associative and idempotent per session, so replicas that see the
        same records in any order, any number of times, hold the same state. ``signed``
        is the record's opaque signed form, kept so it can be relayed to other replicas.
        """
        current = self._records.get(record.session_id)
        if current is not None and current.precedence() >= record.precedence():
            return False
        self._records[record.session_id] = record
        if signed is None:
            self._signed.pop(record.session_id, None)
        else:
            self._signed[record.session_id] = signed
        self._reindex()
        return True

    def snapshot(self) -> list[NodeRecord]:
        return sorted(self._records.values(), key=lambda r: r.session_id)

    def signed_snapshot(self) -> list[Any]:
        """The signed form of every record that has one, for full-state exchange."""
        return [self._signed[sid] for sid in sorted(self._signed)]

    def model(self, model_id: str) -> ModelEntry | None:
        return self._models.get(model_id)

    def models(self) -> list[ModelEntry]:
        return [self._models[k] for k in sorted(self._models)]

    def serving_candidates(self, model_id: str) -> tuple[NodeRecord, ...]:
        """The sessions routing may pick for ``model_id``: SERVING ones that list it."""
        entry = self._models.get(model_id)
        return () if entry is None else entry.serving()

    def _reindex(self) -> None:
        by_model: dict[str, list[NodeRecord]] = {}
        for record in self._records.values():
            if record.state is Lifecycle.LEFT:
                continue
            for model in record.models:
                by_model.setdefault(model.id, []).append(record)
        self._models = {
            model_id: ModelEntry(model_id, tuple(sorted(recs, key=lambda r: r.session_id)))
            for model_id, recs in by_model.items()
        }

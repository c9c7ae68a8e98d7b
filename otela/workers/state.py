"""The control process's side of what data-path workers (``--workers``) route with: the
federation's state as a snapshot (and a cheap key that changes whenever it would), the
node's load and the load reports others sent here, and where the workers' trace records
go. ``WorkerPool`` calls these; the node builds one from its parts."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import trio

from otela.load.source import LoadSource
from otela.registry.store import Registry
from otela.routing.router import Router
from otela.tracing.recorder import TraceRecorder
from otela.workers.view import snapshot_of


class WorkerState:
    def __init__(self, registry: Registry, avoided: Callable[[], frozenset[str]],
                 session_id: Callable[[], str], engine_url: Callable[[], str | None],
                 served_models: Callable[[], Collection[str]], load: LoadSource,
                 router: Router, recorder: TraceRecorder | None,
                 warming: Callable[[], bool] = lambda: False) -> None:
        self.registry = registry
        self.avoided = avoided
        self.session_id = session_id
        self.engine_url = engine_url
        self.served_models = served_models
        self.load = load
        self.router = router
        self.recorder = recorder
        self.warming = warming
        # cache_aware: each node's summary version and freshness last pushed to workers
        self._cache_sent: dict[str, tuple[int, int, float]] = {}

    def key(self) -> tuple[Any, ...]:
        """Changes whenever ``snapshot`` would (checked every push interval)."""
        return (self.registry.generation, self.avoided(), self.session_id(),
                self.engine_url(), frozenset(self.served_models()), self.warming())

    def snapshot(self) -> dict[str, Any]:
        return snapshot_of(self.registry.snapshot(), self.avoided(), self.session_id(),
                           self.engine_url(), frozenset(self.served_models()),
                           self.warming())

    def record_traces(self, records: list[dict[str, Any]]) -> None:
        if self.recorder is not None:
            for record in records:
                self.recorder.record(**record)

    def load_state(self, whole_cache: bool = False) -> dict[str, Any]:
        """The node's engine figures and in-flight total, the load reports serving nodes
        sent here (workers see only their own answers' reports), and the cache summaries
        that changed since the last push (all of them for a worker starting)."""
        engine = self.load.engine
        now = trio.current_time()
        return {"engine": {"running": engine.running, "waiting": engine.waiting,
                           "kv_usage": engine.kv_usage}, "capacity": self.load.capacity,
                "slots": self.load.slots,
                "engine_in_flight": self.load.in_flight + self.load.others_in_flight(),
                "reports": self.router.loads.snapshot(now),
                "cache": self.router.cache.board.export(
                    now, None if whole_cache else self._cache_sent)}

    def start_state(self) -> dict[str, Any]:
        """What a (re)started worker is sent after the federation's snapshot."""
        return {"load": self.load_state(whole_cache=True)}

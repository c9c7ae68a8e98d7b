"""What ``/metrics`` copies from the running node at each scrape (the ``NodeParts`` that
``otela.api.node_metrics`` reads): counters kept by the replicator, the failure detector,
the request path and the data-path workers, added up over every process of the node."""

from __future__ import annotations

from collections import Counter
from typing import Any

from otela.dataplane.hop_auth import HopVerifier
from otela.dataplane.inflight import Inflight
from otela.dataplane.p2p_server import EngineStreamServer
from otela.dataplane.pool import HttpPool
from otela.liveness.detector import FailureDetector
from otela.node.routing_status import RoutingStatus
from otela.registry.store import Registry
from otela.replication import Replicator
from otela.workers.control import WorkerPool


class NodeMetricsSource:
    def __init__(self, *, registry: Registry, replicator: Replicator,
                 detector: FailureDetector, inflight: Inflight, pool: HttpPool,
                 routing: RoutingStatus, hop_verifier: HopVerifier,
                 engine_streams: EngineStreamServer, workers: WorkerPool | None) -> None:
        self.registry = registry
        self.replicator = replicator
        self.detector = detector
        self.inflight = inflight
        self.pool = pool
        self.routing = routing
        self.hop_verifier = hop_verifier
        self.engine_streams = engine_streams
        self.workers = workers

    def in_flight(self) -> int:
        """Requests being relayed by this node, data-path workers included."""
        return self.inflight.count + (self.workers.in_flight() if self.workers else 0)

    def data_path_totals(self) -> dict[str, int]:
        router = self.routing.router
        totals = {"retries": router.retries, "resent": router.resent,
                  "migrated": router.migrated,
                  "abandoned": router.watch.abandoned, "connects": self.pool.connects,
                  "connect_failures": self.pool.connect_failures}
        if self.workers is not None:
            for key in totals:
                totals[key] += self.workers.total(key)
        return totals

    def worker_metric_states(self) -> list[dict[str, Any]]:
        return self.workers.metric_states() if self.workers else []

    def replication_stats(self) -> Counter[str]:
        return self.replicator.stats

    def liveness_stats(self) -> dict[str, int]:
        return self.detector.stats

    def hop_refusals(self) -> dict[str, int]:
        return {**self.hop_verifier.refusals, "not_a_member_libp2p": self.engine_streams.refused}

    def suspected_count(self) -> int:
        return len(self.detector.suspected())

    def routing_stats(self) -> dict[str, int]:
        return self.routing.stats()

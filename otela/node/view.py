"""What the node's HTTP API shows of it (``otela.api.app.NodeView``): ``/v1/health``,
``/v1/network`` and the scope of the model catalog for a caller.

Read-only: the view reads the parts the node runs and the facts it learns as it starts
(``RunFacts``); it changes nothing. The request path's parts arrive once the path is
assembled (``attach``), because the path's fallback handler is this view's API.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from otela import __version__
from otela.config import NodeConfig
from otela.dataplane.p2p_client import EngineStreamClient
from otela.engine.command import EngineCommand
from otela.engine.supervisor import Supervisor
from otela.hostload import cpu_pressure
from otela.liveness.detector import FailureDetector
from otela.looplag import LagSampler, SlowSteps
from otela.mesh.host import MeshHost
from otela.mesh.nat import NatTraversal
from otela.mesh.netlog import NetLog
from otela.mesh.quota import quotas_of
from otela.netreport import network_report
from otela.node.metrics_source import NodeMetricsSource
from otela.node.routing_status import RoutingStatus
from otela.registry.records import Lifecycle, SlurmJob, display_state
from otela.registry.store import Registry
from otela.replication import LocalReplica
from otela.routing.trust import TrustSet
from otela.services import IngressService
from otela.workers.control import WorkerPool


@dataclass
class RunFacts:
    """What the node learns as it starts and runs (addresses once it listens; an engine
    once an assignment launches one; the Slurm job's end once asked)."""

    peer_id: str
    provider_id: str
    addrs: list[str] = field(default_factory=list)
    http_url: str = ""
    slurm_job: SlurmJob | None = None
    engine_command: EngineCommand | None = None
    supervisor: Supervisor | None = None


@dataclass
class AssembledParts:
    """What exists once the request path is assembled (``otela.api.assembly``)."""

    routing: RoutingStatus
    metrics: NodeMetricsSource
    p2p: EngineStreamClient
    lag: LagSampler  # reads the metrics registry the path's observers count into


class NodeInspection:
    def __init__(self, config: NodeConfig, facts: RunFacts, replica: LocalReplica,
                 session_id: Callable[[], str], mesh: MeshHost, detector: FailureDetector,
                 nat: NatTraversal, netlog: NetLog, slow_steps: SlowSteps,
                 ingress_service: IngressService | None,
                 warming: Callable[[], bool] = lambda: False) -> None:
        self.config = config
        self.facts = facts
        self.replica = replica
        self.registry: Registry = replica.registry
        self.session_id = session_id
        self.mesh = mesh
        self.detector = detector
        self.nat = nat
        self.netlog = netlog
        self.slow_steps = slow_steps
        self.ingress_service = ingress_service
        self.registry_warming = warming
        self.workers: WorkerPool | None = None
        self._parts: AssembledParts | None = None

    def attach(self, parts: AssembledParts, workers: WorkerPool | None) -> None:
        """The request path, once assembled (before the node serves anything)."""
        self._parts, self.workers = parts, workers

    @property
    def parts(self) -> AssembledParts:
        assert self._parts is not None, "the view is read before the path was attached"
        return self._parts

    def health(self) -> dict[str, Any]:
        facts, record = self.facts, self.replica.record
        replicator, detector = self.replica.replicator, self.detector
        lag = self.parts.lag
        return {
            "status": "ok",
            "version": __version__,
            "peer_id": facts.peer_id,
            "session_id": self.session_id(),
            "provider_id": facts.provider_id,
            "state": record.state.name if record else Lifecycle.JOIN.name,
            "display_state": display_state(record) if record else Lifecycle.JOIN.name,
            "registry_warming": self.registry_warming(),
            "addrs": facts.addrs,
            "http_url": facts.http_url,
            "ingress": self.config.ingress,
            "engine": facts.engine_command.kind if facts.engine_command else None,
            "models": [m.id for m in record.models] if record else [],
            "in_flight": self.parts.metrics.in_flight(),
            "workers": None if self.workers is None else {
                "count": self.workers.count, "restarts": self.workers.restarts},
            "slurm": facts.slurm_job.to_dict() if facts.slurm_job else None,
            "engine_failure": facts.supervisor.failure if facts.supervisor else None,
            "connected_peers": len(replicator.connected_peers()),
            "registry_size": len(self.registry),
            "replication": {**replicator.stats,
                            "sessions_superseded": self.registry.superseded},
            "membership": "open" if self.replica.admission.open else "authority",
            "suspected_peers": sorted(detector.suspected()),
            "misbehaving_peers": replicator.misconduct.snapshot(time.time()),
            "reachability": self.nat.state,
            "liveness": {**detector.stats, "local_health": detector.local_health,
                         "health_multiplier": detector.health.multiplier,
                         "host_cpu_pressure": cpu_pressure()},
            "event_loop": {"lag_worst_ms": round(lag.worst * 1e3, 2),
                           "lag_p99_bucket_ms": _ms(lag.lag.quantile_bound(0.99, lag.label)),
                           **self.slow_steps.report()},
            "hop_refusals": self.parts.metrics.hop_refusals(),
            "inbound_streams": quotas_of(self.mesh.host).report(),
            "ingress_service": None if self.ingress_service is None
            else self.ingress_service.report(),
            "refused_peers": {
                peer: refusal.reason for peer, refusal in self.replica.admission.refusals.items()
            },
        }

    def network(self, peer: str | None = None) -> dict[str, Any]:
        connected = {p.to_base58() for p in self.mesh.host.get_connected_peers()}
        parts = self.parts
        return network_report(
            peer_id=self.facts.peer_id,
            addrs=self.facts.addrs,
            nat=self.nat,
            netlog=self.netlog,
            registry=self.registry,
            suspected=self.detector.suspected(),
            bootstrap=self.netlog.bootstrap_report(connected),
            connected=len(connected),
            data_path={"served": parts.metrics.engine_streams.served,
                       "streams": parts.p2p.stats()},
            liveness=self.detector.report(),
            peer=peer,
        ) | {"routing": parts.routing.report()}

    def catalog_scope(self, authorization: str | None) -> tuple[TrustSet, frozenset[str] | None]:
        """What ``/v1/models`` may list for this caller: with the ingress service and a
        key, its trusted providers and models (a wrong key: 401); otherwise everything."""
        router = self.parts.routing.router
        if self.ingress_service is None or authorization is None:
            return router.base_trust(), None
        key = self.ingress_service.authenticate(authorization.encode("latin-1"))
        return router.base_trust(key.providers), key.models


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3

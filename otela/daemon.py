"""One otela node: a libp2p host, a registry replica, an HTTP API and, optionally, an engine.

Everything runs in one trio process under one nursery. The node walks its lifecycle
JOIN -> SERVING -> DOWN -> LEFT and announces every step: its own record is the only
one it writes, each change bumps the record's version and is signed, gossiped, and (for
DOWN and LEFT, after which the node exits) pushed to every connected peer directly.

A clean stop (SIGTERM/SIGINT, or a Slurm job nearing its wall time) drains: DOWN first,
so no new requests arrive; in-flight ones get ``drain_grace`` seconds; then the engine is
stopped and the node announces LEFT. Engine supervision lives in ``otela.engine``, Slurm
awareness in ``otela.slurm``.

Exit codes: 0 after a clean stop (SIGTERM/SIGINT), 3 when the engine failed (fail-stop).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections import Counter
from typing import Any

import httpx
import trio
from libp2p.tools.anyio_service import background_trio_service

from otela import __version__, hardware
from otela.api import load_reports as load_report_routes
from otela.api import node_metrics
from otela.api.app import create_app
from otela.api.assembly import Surroundings, assemble
from otela.api.observe import AccessLog, Observer, RequestMetrics, TraceRecording
from otela.assignments import routes as assignment_routes
from otela.assignments.acceptor import REPLAY_FILE, Acceptor, load_policy
from otela.assignments.message import Assignment
from otela.config import NodeConfig
from otela.dataplane.asgi import AsgiHandler
from otela.dataplane.hop_auth import HopSigner, HopVerifier
from otela.dataplane.p2p_client import EngineStreamClient
from otela.dataplane.p2p_server import EngineStreamServer
from otela.engine.command import EngineCommand, attached_engine, parse_engine_command
from otela.engine.metadata import split_overrides
from otela.engine.supervisor import Supervisor
from otela.failures import os_error_in
from otela.hostload import cpu_pressure
from otela.identity import Identity, load_or_create
from otela.liveness.detector import DetectorConfig, FailureDetector
from otela.load.capacity import capacity_of
from otela.load.reports import LoadReports
from otela.load.source import LoadSource, poll_engine
from otela.looplag import LagSampler, SlowSteps, freeze_startup_objects
from otela.mesh.addresses import advertised_hosts, expand
from otela.mesh.bootstrap import (
    follow_bootstrap_list,
    is_url,
    isolated_below,
    keep_connected,
    parse_bootstrap,
)
from otela.mesh.host import build_host
from otela.mesh.nat import NatTraversal, known_relays
from otela.mesh.netlog import NetLog
from otela.mesh.peer_cache import PeerCache
from otela.mesh.peering import Peering
from otela.mesh.quota import quotas_of
from otela.metrics import Registry as MetricsRegistry
from otela.netreport import network_report
from otela.registry.crdt import GCPolicy
from otela.registry.records import Lifecycle, ModelInfo, NodeRecord, display_state
from otela.replication import (
    LocalReplica,
    MembershipConfigError,
    load_authority,
    load_own_certificate,
)
from otela.routing.hold import ModelFirstByte
from otela.routing.load import NodeLoad
from otela.routing.trust import TrustSet
from otela.services import ingress_plugin, require_ingress_plugin
from otela.slurm import fleet_tag_from_env, job_from_env, watch_wall_time, with_end_time
from otela.tracing.recorder import TraceRecorder
from otela.workers.control import InternalRoutes, WorkerPool
from otela.workers.view import snapshot_of

log = logging.getLogger("otela.node")

EXIT_OK = 0
EXIT_ENGINE_FAILED = 3


class Node:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.identity: Identity = load_or_create(config.home)
        authority = load_authority(config.authority)
        certificate, cert = load_own_certificate(
            self.identity, config.home, config.certificate, authority, time.time()
        )
        if cert is not None and config.provider_id not in (None, cert.provider_id):
            raise MembershipConfigError(
                f"--provider-id {config.provider_id!r} differs from the certified provider "
                f"{cert.provider_id!r}"
            )
        self.provider_id = (
            cert.provider_id if cert else config.provider_id or self.identity.default_provider_id
        )
        self.engine_command: EngineCommand | None = None
        if config.process:
            self.engine_command = parse_engine_command(config.process, config.engine_url)
        elif config.engine_url:
            self.engine_command = attached_engine(config.engine_url)
        split_overrides(config.model_meta)  # reject bad --model-meta before starting
        self.hardware = hardware.discover(config.hw_cpus, config.hw_memory_gb, config.hw_gpus)
        self.slurm_job = job_from_env(os.environ)
        self.bootstrap_peers = [parse_bootstrap(a) for a in config.bootstrap if not is_url(a)]
        self.bootstrap_urls = [a for a in config.bootstrap if is_url(a)]
        # Peers remembered from the last run: how a node restarted without a bootstrap
        # (the bootstrap node itself) finds the federation again.
        self.peer_cache = PeerCache(config.home, self.identity.peer_id.to_base58(),
                                    lambda: self.registry)
        self.mesh = build_host(self.identity, config.listen_host, config.p2p_port)
        self.replica = LocalReplica(
            self.identity,
            self.mesh,
            config.home,
            policy=GCPolicy(retention=config.registry_retention, horizon=config.registry_horizon),
            authority=authority,
            certificate=certificate,
            anti_entropy_interval=config.anti_entropy_interval,
        )
        self.registry = self.replica.registry
        self.replicator = self.replica.replicator
        self._first_session_id = self.replica.new_session_id()
        self.detector = FailureDetector(
            self.identity,
            self.mesh.host,
            self.replica,
            DetectorConfig.from_settings(config.probe_interval, config.suspicion_timeout),
            pubsub=self.mesh.pubsub,
        )
        self.netlog = NetLog()
        self.nat = NatTraversal(
            self.mesh.host,
            offer_relay=config.relay,
            relays=lambda: known_relays(self.registry, self.identity.peer_id.to_base58()),
            publish=self._publish_reachability,
            max_reservations=config.relay_reservations,
            hole_punch=config.hole_punch,
            netlog=self.netlog,
        )
        # Control-plane HTTP (engine health checks, bootstrap lists); requests use the pool.
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(10.0), trust_env=False)
        self.peering = Peering(
            self.mesh.host,
            self.registry,
            suspected=self.detector.suspected,
            reconcile=self.replicator.sync_with,
            keep=lambda: set(self.nat.reservations),
            on_trim=self.detector.part,
        )
        self.exit_code = EXIT_OK
        self._stop = trio.Event()
        self._stopping = False
        self.supervisor = None if self.engine_command is None else \
            self._supervisor_for(self.engine_command)
        # Engines a planner may start here (``--accept-assignments``; refused otherwise).
        self._nursery: trio.Nursery | None = None
        self.assignments = Acceptor(
            load_policy(config.accept_assignments, config.engine_allowlist, config.home,
                        node_peer_id=self.identity.peer_id.to_base58(),
                        federation_authority=authority, local_gpus=len(self.hardware.gpus)),
            launch=self._launch_assigned, busy=self._busy,
            replay_path=config.home / REPLAY_FILE)
        # The request path (otela.dataplane, otela.routing, otela.api), assembled as a
        # data-path worker assembles it (otela.api.assembly).
        peer_id, key = self.identity.peer_id.to_base58(), self.identity.key_pair.private_key
        self.hop_signer = HopSigner(key.to_bytes(), peer_id)
        self.hop_verifier = HopVerifier(key.to_bytes(), peer_id, self.registry.is_member)
        self.p2p = EngineStreamClient(self.mesh.host, self.nat.connect)
        # Load: ours, reported on every answer and sent to the ingresses; others', read by
        # the router.
        plausible = capacity_of(self.hardware)
        if config.capacity is not None and config.capacity > plausible:
            log.warning("--capacity %g is more than this node's GPUs serve (%g): ingresses "
                        "count at most %g (docs/routing.md)", config.capacity, plausible,
                        plausible)
        self.load = LoadSource(
            config.capacity if config.capacity is not None else plausible,
            others=lambda: self.workers.total("engine_in_flight") if self.workers else 0)
        self.api = create_app(self)
        assignment_routes.install(self.api, self.assignments)
        # What watches the request path: metrics always; access log and trace on demand.
        self.metrics = MetricsRegistry()
        self.lag = LagSampler(node_metrics.install(self.metrics, self))
        self.slow_steps = SlowSteps()  # installed by whoever runs the loop (trio.run)
        observers: list[Observer] = [RequestMetrics(self.metrics), ModelFirstByte(self.metrics)]
        self.access_log = AccessLog(config.access_log) if config.access_log else None
        if self.access_log is not None:
            observers.append(self.access_log)
        self.recorder = None if config.record_trace is None else TraceRecorder(
            config.record_trace, max_bytes=config.record_trace_max,
            backups=config.record_trace_backups, hash_ids=config.record_trace_hash_ids,
            record_prompts=config.record_prompts)
        if self.recorder is not None:
            observers.append(TraceRecording(self.recorder))
        # The public ingress service (--ingress-db): keys, limits, usage, admin API, /ui
        # (an ingress shows the dashboard's page even without it). A plugin: ingress/.
        self.ingress_service = None if config.ingress_db is None else (
            require_ingress_plugin().open(config, peer_id))
        if self.ingress_service is not None:
            observers += self.ingress_service.observers(self.metrics)
        plugin = ingress_plugin()
        if plugin is not None and (config.ingress or self.ingress_service is not None):
            plugin.install(self.api, self.ingress_service)
        path = assemble(config, Surroundings(
            registry=lambda: self.registry, session=lambda: self.session_id,
            engine_url=self.serving_engine_url, served_models=self.served_models,
            avoided=self.avoided, relayed=self.p2p, signer=self.hop_signer,
            verifier=self.hop_verifier, load=self.load, fallback=AsgiHandler(self.api),
            observers=observers, metrics=self.metrics, keys=self.ingress_service))
        self.pool, self.upstreams, self.router = path.pool, path.upstreams, path.router
        self.dispatch, self.http, self.inflight = path.dispatch, path.server, path.inflight
        self.engine_streams = EngineStreamServer(path.hop_core, path.inflight,
                                                 self.registry.is_member)
        self.load_reports = LoadReports(
            lambda: self.registry, self.load, self._take_load_report,
            session=lambda: self.session_id,
            serving=lambda: self.serving_engine_url() is not None, client=self.client,
            signer=self.hop_signer, verifier=self.hop_verifier, receive=config.ingress,
            min_interval=config.load_interval)
        load_report_routes.install(self.api, self.load_reports)
        # With --workers N the port is served by N data-path processes instead.
        self.workers = None if config.workers <= 1 else WorkerPool(
            config, config.workers, self._worker_state_key, self._worker_snapshot,
            self._record_worker_traces, self._worker_load_state)
        self.addrs: list[str] = []
        self.http_url = ""

    # -- what the node's metrics read (otela.api.node_metrics) -----------------------

    def replication_stats(self) -> Counter[str]:
        return self.replicator.stats

    def liveness_stats(self) -> dict[str, int]:
        return self.detector.stats

    def in_flight(self) -> int:
        """Requests being relayed by this node, data-path workers included."""
        return self.inflight.count + (self.workers.in_flight() if self.workers else 0)

    def data_path_totals(self) -> dict[str, int]:
        totals = {"retries": self.router.retries, "resent": self.router.resent,
                  "abandoned": self.router.watch.abandoned, "connects": self.pool.connects,
                  "connect_failures": self.pool.connect_failures}
        if self.workers is not None:
            for key in totals:
                totals[key] += self.workers.total(key)
        return totals

    def worker_metric_states(self) -> list[dict[str, Any]]:
        return self.workers.metric_states() if self.workers else []

    def suspected_count(self) -> int:
        return len(self.detector.suspected())

    def hop_refusals(self) -> dict[str, int]:
        return {**self.hop_verifier.refusals, "not_a_member_libp2p": self.engine_streams.refused}

    # -- NodeView (read by the HTTP layer) --------------------------------------------

    @property
    def record(self) -> NodeRecord | None:
        return self.replica.record

    @property
    def session_id(self) -> str:
        """Our current session (a new one after rejoining, see ``otela.replication.local``)."""
        record = self.replica.record
        return record.session_id if record is not None else self._first_session_id

    def avoided(self) -> frozenset[str]:
        """Peers routing leaves out: suspected by the failure detector, or caught
        misbehaving (``otela.replication.misconduct``)."""
        suspected = self.detector.suspected()
        excluded = self.replicator.excluded()
        return suspected | excluded if excluded else suspected

    def health(self) -> dict[str, Any]:
        record = self.record
        return {
            "status": "ok",
            "version": __version__,
            "peer_id": self.identity.peer_id.to_base58(),
            "session_id": self.session_id,
            "provider_id": self.provider_id,
            "state": record.state.name if record else Lifecycle.JOIN.name,
            "display_state": display_state(record) if record else Lifecycle.JOIN.name,
            "addrs": self.addrs,
            "http_url": self.http_url,
            "ingress": self.config.ingress,
            "engine": self.engine_command.kind if self.engine_command else None,
            "models": [m.id for m in record.models] if record else [],
            "in_flight": self.in_flight(),
            "workers": None if self.workers is None else {
                "count": self.workers.count, "restarts": self.workers.restarts},
            "slurm": self.slurm_job.to_dict() if self.slurm_job else None,
            "engine_failure": self.supervisor.failure if self.supervisor else None,
            "connected_peers": len(self.replicator.connected_peers()),
            "registry_size": len(self.registry),
            "replication": {**self.replicator.stats,
                            "sessions_superseded": self.registry.superseded},
            "membership": "open" if self.replica.admission.open else "authority",
            "suspected_peers": sorted(self.detector.suspected()),
            "misbehaving_peers": self.replicator.misconduct.snapshot(time.time()),
            "reachability": self.nat.state,
            "liveness": {**self.detector.stats, "local_health": self.detector.local_health,
                         "health_multiplier": self.detector.health.multiplier,
                         "host_cpu_pressure": cpu_pressure()},
            "event_loop": {"lag_worst_ms": round(self.lag.worst * 1e3, 2),
                           "lag_p99_bucket_ms": _ms(self.lag.lag.quantile_bound(
                               0.99, self.lag.label)),
                           **self.slow_steps.report()},
            "hop_refusals": self.hop_refusals(),
            "inbound_streams": quotas_of(self.mesh.host).report(),
            "ingress_service": None if self.ingress_service is None
            else self.ingress_service.report(),
            "refused_peers": {
                peer: refusal.reason for peer, refusal in self.replica.admission.refusals.items()
            },
        }

    def network(self, peer: str | None = None) -> dict[str, Any]:
        connected = {p.to_base58() for p in self.mesh.host.get_connected_peers()}
        return network_report(
            peer_id=self.identity.peer_id.to_base58(),
            addrs=self.addrs,
            nat=self.nat,
            netlog=self.netlog,
            registry=self.registry,
            suspected=self.detector.suspected(),
            bootstrap=self.netlog.bootstrap_report(connected),
            connected=len(connected),
            data_path={"served": self.engine_streams.served, "streams": self.p2p.stats()},
            liveness=self.detector.report(),
            peer=peer,
        ) | {"routing": self.routing_report()}

    async def _publish_reachability(self, reachability: str, circuits: tuple[str, ...]) -> None:
        if not self._stopping:
            await self.announce(reachability=reachability, circuit_addrs=circuits)

    def serving_engine_url(self) -> str | None:
        if self.engine_command and self.record and self.record.state is Lifecycle.SERVING:
            return self.engine_command.url
        return None

    def served_models(self) -> frozenset[str]:
        record = self.record
        return frozenset(m.id for m in record.models) if record else frozenset()

    # -- lifecycle ----------------------------------------------------------------------

    async def announce(self, *, push: bool = False, **changes: Any) -> None:
        """Sign and spread our next record version; ``push`` waits for peers to have it."""
        await self.replica.announce(**changes)
        if push:
            await self.replicator.push_to_all(self.config.leave_linger)

    def request_stop(self, exit_code: int) -> None:
        if not self._stopping:
            self._stopping = True
            self.exit_code = exit_code
            self._stop.set()

    async def run(self) -> int:
        config = self.config
        self.replica.install(self.mesh.host)
        self.detector.install()
        self.nat.install()
        self.engine_streams.install(self.mesh.host)
        async with (
            self.client,
            self.mesh.host.run(listen_addrs=[self.mesh.listen_addr]),
            background_trio_service(self.mesh.pubsub),
            background_trio_service(self.mesh.gossipsub),
        ):
            await self.mesh.pubsub.wait_until_ready()
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._watch_signals)
                nursery.start_soon(self._sweep_pool)
                nursery.start_soon(self.router.watch_failures)
                nursery.start_soon(self.lag.run)
                if self.access_log is not None:
                    await nursery.start(self.access_log.run)
                if self.recorder is not None:
                    await nursery.start(self.recorder.run)
                if self.ingress_service is not None:
                    await nursery.start(self.ingress_service.run)
                await nursery.start(self.replica.run, self.mesh.host)
                await nursery.start(self.load_reports.run)
                hosts = advertised_hosts(config.listen_host, config.public_host)
                self.addrs = expand([str(a) for a in self.mesh.host.get_addrs()],
                                    config.listen_host, hosts)
                if not self.addrs:  # py-libp2p logs a failed listen and carries on
                    raise OSError(f"cannot listen for libp2p on {config.listen_host} port "
                                  f"{config.p2p_port} (in use, or not an address of this host)")
                try:
                    port = await self._serve_http(nursery)
                except BaseException as exc:
                    cause = os_error_in(exc)
                    if cause is None:
                        raise
                    raise OSError(f"cannot listen for HTTP on {config.listen_host} port "
                                  f"{config.http_port}: {cause.strerror or cause}") from None
                self.http_url = f"http://{hosts[0]}:{port}"
                if self.slurm_job is not None:
                    self.slurm_job = await with_end_time(self.slurm_job)
                await self.replica.start(NodeRecord(
                    session_id=self._first_session_id,
                    peer_id=self.identity.peer_id.to_base58(),
                    provider_id=self.provider_id,
                    state=Lifecycle.JOIN,
                    version=0,
                    http_url=self.http_url,
                    addrs=tuple(self.addrs),
                    hardware=self.hardware,
                    ingress=config.ingress,
                    engine=self.engine_command.kind if self.engine_command else None,
                    idle=self.engine_command is None,
                    slurm=self.slurm_job,
                    relay=config.relay,
                    fleet=fleet_tag_from_env(os.environ),
                ))
                self._report_started()
                freeze_startup_objects()
                nursery.start_soon(self.detector.run)
                await nursery.start(self.p2p.run)
                await nursery.start(self.nat.run)
                nursery.start_soon(self.peering.run)
                # Bootstrap peers only rejoin a node that lost every connection; below
                # ``low`` peering finds peers in the registry itself. (Redialing them
                # whenever below ``low`` kept the bootstrap node above ``high``: it trimmed,
                # the trimmed redialed, for ever.)
                isolated = isolated_below(self.mesh, 1)
                for url in self.bootstrap_urls:
                    nursery.start_soon(
                        follow_bootstrap_list, url, self.mesh, self.replicator.sync_with,
                        self.client, isolated
                    )
                for peer in self.bootstrap_peers:
                    nursery.start_soon(
                        keep_connected, self.mesh, self.replicator.sync_with, peer, isolated,
                        self.netlog
                    )
                nursery.start_soon(self.peer_cache.rejoin, self.mesh.host, isolated,
                                   self.replicator.sync_with)
                nursery.start_soon(self.peer_cache.keep_saving)
                if self.supervisor is not None:
                    self._start_engine(nursery, self.supervisor)
                if self.slurm_job is not None:
                    nursery.start_soon(self._watch_wall_time, self.slurm_job.job_id)
                await self._stop.wait()
                await self._shutdown()
                nursery.cancel_scope.cancel()
        return self.exit_code

    def _supervisor_for(self, command: EngineCommand) -> Supervisor:
        return Supervisor(command, self.config, self.client, self._engine_ready,
                          lambda reason: self.request_stop(EXIT_ENGINE_FAILED), self._stop)

    def _start_engine(self, nursery: trio.Nursery, supervisor: Supervisor) -> None:
        nursery.start_soon(supervisor.run)
        nursery.start_soon(poll_engine, self.load, self.pool, self.serving_engine_url,
                           self.config.load_interval)

    # -- assignments (otela.assignments.acceptor) ---------------------------------------

    def _busy(self) -> bool:
        """An assignment cannot run now: an engine is already ours, or we are stopping."""
        return self.engine_command is not None or self._stopping or self._nursery is None \
            or self.record is None

    def _launch_assigned(self, command: EngineCommand, assignment: Assignment) -> None:
        """Run an accepted assignment's engine exactly as ``--process`` runs one: the node
        stops being idle at once, and announces SERVING when the engine answers."""
        assert self._nursery is not None
        self.engine_command = command
        self.supervisor = self._supervisor_for(command)
        print(f"otela: assignment {assignment.id} from {assignment.issuer}: launching "
              f"{' '.join(command.argv)}", flush=True)
        self._nursery.start_soon(self._run_assigned, self._nursery, self.supervisor)

    async def _run_assigned(self, nursery: trio.Nursery, supervisor: Supervisor) -> None:
        assert self.engine_command is not None
        await self.announce(idle=False, engine=self.engine_command.kind)
        self._start_engine(nursery, supervisor)

    async def _shutdown(self) -> None:
        """Fail-stop: DOWN, stop the engine, keep its logs. Clean stop: drain, then LEFT."""
        with trio.CancelScope(shield=True):
            self.peer_cache.save()  # whom to call after a restart
            supervisor = self.supervisor
            assert self.record is not None
            if self.record.state < Lifecycle.DOWN:
                await self.announce(state=Lifecycle.DOWN, push=True)
            drained = self.exit_code != EXIT_OK or await self._drain(self.config.drain_grace)
            if not drained:
                log.warning(
                    "%d request(s) still in flight after the %.0fs drain grace",
                    self.in_flight(),
                    self.config.drain_grace,
                )
            if self.workers is not None:
                await self.workers.stop()
            if supervisor is not None:
                await supervisor.stop(self.config.engine_stop_grace)
            if self.exit_code == EXIT_OK:
                await self.announce(state=Lifecycle.LEFT, push=True)
            elif supervisor is not None:
                where = supervisor.collect_logs(f"{self.provider_id}-{self.session_id[:12]}")
                if where is not None:
                    print(f"otela: engine logs copied to {where}", flush=True)

    async def _drain(self, grace: float) -> bool:
        """Wait until no request is in flight anywhere on this node, at most ``grace`` s."""
        deadline = trio.current_time() + grace
        if self.workers is not None and not await self.workers.wait_idle(grace):
            return False
        # this process relays too (requests arriving over libp2p streams)
        return await self.inflight.wait_idle(max(0.0, deadline - trio.current_time()))

    async def _serve_http(self, nursery: trio.Nursery) -> int:
        """Serve the HTTP port, in this process or through data-path workers; the port."""
        if self.workers is None:
            binds = await nursery.start(self.http.run, self.config.listen_host,
                                        self.config.http_port)
            return int(binds[0][1])
        internal = InternalRoutes(self.workers, self.registry, self.p2p, self.dispatch,
                                  self.config.response_timeout)
        return int(await nursery.start(self.workers.run, internal))

    # -- data-path workers (``--workers``) -------------------------------------------

    def _worker_state_key(self) -> tuple[Any, ...]:
        return (self.registry.generation, self.avoided(), self.session_id,
                self.serving_engine_url(), self.served_models())

    def _worker_snapshot(self) -> dict[str, Any]:
        return snapshot_of(self.registry.snapshot(), self.avoided(),
                           self.session_id, self.serving_engine_url(), self.served_models())

    def _record_worker_traces(self, records: list[dict[str, Any]]) -> None:
        if self.recorder is not None:
            for record in records:
                self.recorder.record(**record)

    async def _engine_ready(self, models: list[ModelInfo]) -> None:
        if self._stopping:
            return
        await self.announce(state=Lifecycle.SERVING, models=tuple(models))
        print(f"otela: serving {', '.join(m.id for m in models)}", flush=True)

    async def _watch_wall_time(self, job_id: str) -> None:
        def drain(left: float) -> None:
            print(f"otela: Slurm job {job_id} ends in {left:.0f}s: draining", flush=True)
            self.request_stop(EXIT_OK)

        await watch_wall_time(
            job_id, self.config.slurm_drain_margin, self.config.slurm_poll_interval, drain
        )

    async def _watch_signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                if self._stopping:
                    log.warning("second %s: exiting now", signal.Signals(signum).name)
                    os._exit(self.exit_code or 1)
                log.info("%s received: leaving the federation", signal.Signals(signum).name)
                self.request_stop(EXIT_OK)

    # -- helpers ------------------------------------------------------------------------

    async def _sweep_pool(self) -> None:
        """Close upstream connections idle past the pool's timeout; forget routing state
        (ejections, load reports) of sessions that are gone."""
        while True:
            await trio.sleep(self.pool.idle_timeout)
            self.pool.sweep()
            self.router.prune()

    # -- load (otela.load, otela.routing.load) ----------------------------------------

    def ejected_nodes(self) -> dict[str, dict[str, float]]:
        """Nodes ejected now by any of this node's data-path processes (the longest
        remaining ejection of each)."""
        now = trio.current_time()
        merged = dict(self.router.ejections.report(now))
        for report in self.workers.reports() if self.workers else ():
            for session, ejection in report.get("ejected", {}).items():
                if session not in merged or \
                        ejection["remaining_s"] > merged[session]["remaining_s"]:
                    merged[session] = ejection
        return merged

    def routing_stats(self) -> dict[str, int]:
        ejections = self.router.ejections.total + (
            self.workers.total("ejections") if self.workers else 0)
        return {"ejections": ejections, "ejected": len(self.ejected_nodes()),
                **self.load_reports.stats}

    def routing_report(self) -> dict[str, Any]:
        """For /v1/network: how this node routes, whom it keeps out, what loads it sees."""
        now = trio.current_time()
        router = self.router
        return {"policy": router.policies.default.name,
                "trusted_providers": None if router.trust.providers is None
                else sorted(router.trust.providers),
                "ejected": self.ejected_nodes(),
                "loads": router.loads.snapshot(now),
                # Capacity claims as checked (``otela.routing.speed``): the share of its
                # claimed weight each node keeps for how fast it answers here.
                "speed_factors": {r.session_id: f for r in self.registry
                                  if (f := router.speeds.report(r.session_id))},
                "own_load": self.load.current().to_dict(),
                "engine_metrics": self.load.engine_source,
                "load_reports": dict(self.load_reports.stats)}

    def catalog_scope(self, authorization: str | None) -> tuple[TrustSet, frozenset[str] | None]:
        """What ``/v1/models`` may list for this caller: with the ingress service and a
        key, its trusted providers and models (a wrong key: 401); otherwise everything."""
        if self.ingress_service is None or authorization is None:
            return self.router.base_trust(), None
        key = self.ingress_service.authenticate(authorization.encode("latin-1"))
        return self.router.base_trust(key.providers), key.models

    def _own_load(self) -> NodeLoad | None:
        """Our own load, for routing to our own engine (no hop, so no report header)."""
        return self.load.current() if self.serving_engine_url() else None

    def _take_load_report(self, session: str, load: NodeLoad, ttl: float) -> None:
        self.router.loads.report(session, load, trio.current_time(), ttl)

    def _worker_load_state(self) -> dict[str, Any]:
        """For data-path workers: the node's engine figures and in-flight total, and the
        load reports serving nodes sent here (workers see only their own answers' reports)."""
        engine = self.load.engine
        return {"engine": {"running": engine.running, "waiting": engine.waiting,
                           "kv_usage": engine.kv_usage}, "capacity": self.load.capacity,
                "engine_in_flight": self.load.in_flight + self.load.others_in_flight(),
                "reports": self.router.loads.snapshot(trio.current_time())}

    def _report_started(self) -> None:
        peer_id = self.identity.peer_id.to_base58()
        print(
            f"otela: node {peer_id} provider={self.provider_id} session={self.session_id}",
            flush=True,
        )
        for addr in self.addrs:
            print(f"otela: p2p {addr}", flush=True)
        print(f"otela: http {self.http_url}", flush=True)
        if self.config.status_file is not None:
            status = {
                "peer_id": peer_id,
                "session_id": self.session_id,
                "provider_id": self.provider_id,
                "addrs": self.addrs,
                "http_url": self.http_url,
                "pid": os.getpid(),
            }
            tmp = self.config.status_file.with_suffix(".tmp")
            tmp.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(status, indent=2))
            tmp.replace(self.config.status_file)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3

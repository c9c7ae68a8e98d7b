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
from typing import Any

import httpx
import trio
from libp2p.tools.anyio_service import background_trio_service

from otela import hardware
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
from otela.engine.command import (
    EngineCommand,
    attached_engine,
    command_concurrency,
    parse_engine_command,
)
from otela.engine.kv_events import events_endpoint, follow_events
from otela.engine.metadata import split_overrides
from otela.engine.supervisor import Supervisor
from otela.failures import os_error_in
from otela.identity import Identity, load_or_create
from otela.kvcache.index import CacheIndex
from otela.liveness.detector import DetectorConfig, FailureDetector
from otela.load.capacity import capacity_of
from otela.load.reports import LoadReports
from otela.load.source import LoadSource, poll_engine
from otela.looplag import LagSampler, SlowSteps, freeze_startup_objects
from otela.mesh.addresses import advertised_hosts, expand, loopback_url
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
from otela.metrics import Registry as MetricsRegistry
from otela.node.metrics_source import NodeMetricsSource
from otela.node.routing_status import RoutingStatus
from otela.node.view import AssembledParts, NodeInspection, RunFacts
from otela.registry.crdt import GCPolicy
from otela.registry.records import Lifecycle, ModelInfo, NodeRecord, SlurmJob
from otela.replication import (
    LocalReplica,
    MembershipConfigError,
    load_authority,
    load_own_certificate,
)
from otela.routing.hold import ModelFirstByte, Warmup
from otela.routing.load import NodeLoad
from otela.services import ingress_plugin, require_ingress_plugin
from otela.slurm import fleet_tag_from_env, job_from_env, watch_wall_time, with_end_time
from otela.tracing.recorder import TraceRecorder
from otela.workers.control import InternalRoutes, WorkerPool
from otela.workers.state import WorkerState

log = logging.getLogger("otela.node")

EXIT_OK = 0
EXIT_ENGINE_FAILED = 3
OWN_CACHE_TTL_S = 3600.0  # our own engine's summary is current for as long as we run


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
        # What the node learns as it runs (addresses, engine, Slurm job), read by its view.
        self.facts = RunFacts(self.identity.peer_id.to_base58(), self.provider_id,
                              slurm_job=job_from_env(os.environ))
        if config.process:
            self.facts.engine_command = parse_engine_command(config.process, config.engine_url)
        elif config.engine_url:
            self.facts.engine_command = attached_engine(config.engine_url)
        split_overrides(config.model_meta)  # reject bad --model-meta before starting
        self.hardware = hardware.discover(config.hw_cpus, config.hw_memory_gb, config.hw_gpus)
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
        if self.engine_command is not None:
            self.facts.supervisor = self._supervisor_for(self.engine_command)
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
            others=lambda: self.workers.total("engine_in_flight") if self.workers else 0,
            slots=config.max_concurrency or command_concurrency(config.process))
        # What watches the request path: metrics always; access log and trace on demand.
        self.metrics = MetricsRegistry()
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
        # After a start, a model we do not know yet may be served: no 404 until the replica
        # has caught up with a peer (there is one to catch up with) or the warm-up passed.
        someone = bool(self.bootstrap_peers or self.bootstrap_urls or self.peer_cache.remembered)
        self.warmup = Warmup(lambda: bool(self.replicator.stats["ae_completed"]
                                          or self.replicator.stats["ae_answered"]),
                             config.registry_warmup if someone else 0.0)
        # What the HTTP API shows (its request-path parts are attached once assembled).
        self.view = NodeInspection(config, self.facts, self.replica, lambda: self.session_id,
                                   self.mesh, self.detector, self.nat, self.netlog,
                                   self.slow_steps, self.ingress_service, self.warmup.warming)
        self.api = create_app(self.view)
        assignment_routes.install(self.api, self.assignments)
        plugin = ingress_plugin()
        if plugin is not None and (config.ingress or self.ingress_service is not None):
            plugin.install(self.api, self.ingress_service)
        path = assemble(config, Surroundings(
            registry=lambda: self.registry, session=lambda: self.session_id,
            engine_url=self.serving_engine_url, served_models=self.served_models,
            avoided=self.avoided, relayed=self.p2p, signer=self.hop_signer,
            verifier=self.hop_verifier, load=self.load, fallback=AsgiHandler(self.api),
            observers=observers, metrics=self.metrics, keys=self.ingress_service,
            warming=self.warmup.warming))
        self.pool, self.upstreams, self.router = path.pool, path.upstreams, path.router
        self.dispatch, self.http, self.inflight = path.dispatch, path.server, path.inflight
        self.engine_streams = EngineStreamServer(path.hop_core, path.inflight,
                                                 self.registry.is_member)
        self.load_reports = LoadReports(
            lambda: self.registry, self.load, self._take_load_report,
            session=lambda: self.session_id,
            serving=lambda: self.serving_engine_url() is not None, client=self.client,
            signer=self.hop_signer, verifier=self.hop_verifier, receive=config.ingress,
            min_interval=config.load_interval, on_cache=self.router.take_cache)
        load_report_routes.install(self.api, self.load_reports)
        # With --workers N the port is served by N data-path processes instead.
        worker_state = WorkerState(self.registry, self.avoided, lambda: self.session_id,
                                   self.serving_engine_url, self.served_models, self.load,
                                   self.router, self.recorder, self.warmup.warming)
        self.workers = None if config.workers <= 1 else WorkerPool(
            config, config.workers, worker_state.key, worker_state.snapshot,
            worker_state.record_traces, worker_state.load_state, worker_state.start_state)
        if self.workers is not None and self.ingress_service is not None:
            # A key made or revoked through this node's admin API: in force on every
            # worker when the call returns.
            self.ingress_service.tell_others_with(self.workers.refresh_keys)
        self.routing = RoutingStatus(self.router, lambda: self.registry, self.load,
                                     self.load_reports, self.workers, path.inference.queue)
        self.metrics_source = NodeMetricsSource(
            registry=self.registry, replicator=self.replicator, detector=self.detector,
            inflight=self.inflight, pool=self.pool, routing=self.routing,
            hop_verifier=self.hop_verifier, engine_streams=self.engine_streams,
            workers=self.workers)
        self.lag = LagSampler(node_metrics.install(self.metrics, self.metrics_source))
        self.view.attach(AssembledParts(self.routing, self.metrics_source, self.p2p, self.lag),
                         self.workers)

    # -- the facts the node's parts read (``self.facts``) -----------------------------

    @property
    def addrs(self) -> list[str]:
        return self.facts.addrs

    @property
    def http_url(self) -> str:
        return self.facts.http_url

    @property
    def engine_command(self) -> EngineCommand | None:
        return self.facts.engine_command

    @property
    def supervisor(self) -> Supervisor | None:
        return self.facts.supervisor

    @property
    def slurm_job(self) -> SlurmJob | None:
        return self.facts.slurm_job

    def in_flight(self) -> int:
        """Requests being relayed by this node, data-path workers included."""
        return self.metrics_source.in_flight()

    # -- what the request path reads of the node -------------------------------------

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
                self.facts.addrs = expand([str(a) for a in self.mesh.host.get_addrs()],
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
                self.facts.http_url = f"http://{hosts[0]}:{port}"
                if self.ingress_service is not None:
                    self._ingress_serving_at(port)
                if self.slurm_job is not None:
                    self.facts.slurm_job = await with_end_time(self.slurm_job)
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
        self._follow_kv_events(nursery, supervisor.command)
        nursery.start_soon(supervisor.run)
        nursery.start_soon(poll_engine, self.load, self.pool, self.serving_engine_url,
                           self.config.load_interval)

    def _follow_kv_events(self, nursery: trio.Nursery, command: EngineCommand) -> None:
        """Index what the engine's KV cache holds, from its events, for the ingresses'
        cache-aware routing (sent with our load reports; straight to our own router when
        this node is an ingress too). Connected before the engine starts: nothing missed."""
        found = events_endpoint(command.argv, self.config.kv_events)
        if found is None:
            return
        index = self.load_reports.cache = CacheIndex()

        def own_board() -> None:
            summary = index.summary_for(self.router.cache.board.held(self.session_id))
            if summary is not None:
                # our own engine: no report interval to wait for, so no ttl to speak of
                self.router.take_cache(self.session_id, summary, OWN_CACHE_TTL_S)

        nursery.start_soon(follow_events, found[0], found[1], index,
                           own_board if self.config.ingress else lambda: None)

    # -- assignments (otela.assignments.acceptor) ---------------------------------------

    def _busy(self) -> bool:
        """An assignment cannot run now: an engine is already ours, or we are stopping."""
        return self.engine_command is not None or self._stopping or self._nursery is None \
            or self.record is None

    def _launch_assigned(self, command: EngineCommand, assignment: Assignment) -> None:
        """Run an accepted assignment's engine exactly as ``--process`` runs one: the node
        stops being idle at once, and announces SERVING when the engine answers."""
        assert self._nursery is not None
        self.facts.engine_command = command
        self.facts.supervisor = self._supervisor_for(command)
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

    def _ingress_serving_at(self, port: int) -> None:
        """Tell the ingress service where its own port is: its batch runner sends there
        (with data-path workers, to them: their services check the runner's credential
        with the node's shared secret, ``ingress.plugin.node_secret``)."""
        assert self.ingress_service is not None
        self.ingress_service.serving_at(loopback_url(self.config.listen_host, port))

    async def _serve_http(self, nursery: trio.Nursery) -> int:
        """Serve the HTTP port, in this process or through data-path workers; the port."""
        if self.workers is None:
            binds = await nursery.start(self.http.run, self.config.listen_host,
                                        self.config.http_port)
            return int(binds[0][1])
        internal = InternalRoutes(self.workers, self.registry, self.p2p, self.dispatch,
                                  self.config.response_timeout)
        return int(await nursery.start(self.workers.run, internal))

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

    def _take_load_report(self, session: str, load: NodeLoad, ttl: float) -> None:
        self.router.loads.report(session, load, trio.current_time(), ttl)

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


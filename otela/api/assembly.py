"""The request path, assembled once: for the node's own HTTP port and for each data-path
worker (``--workers``) alike.

Everything a request meets, in the order it meets it: the HTTP server (limits, and the
screen that refuses a keyless request before its body), ``Dispatch``, the OpenAI routes
(``InferenceRoutes``: key gate, waiting room, router), the router (candidates, policies,
load board, capacity checks) and its upstreams (own engine, engine hops, libp2p), and the
engine hop's serving side (``HopCore``, behind the HTTP hop and the libp2p server). What
differs between a node and a worker comes in through ``Surroundings``: where the registry
and the node's own state are read (the node's replica, or the worker's snapshot of it),
how nodes behind NAT are reached (the libp2p client, or the control process), what else
the port serves, and what watches the requests. Defaults are the settings' (``config``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from otela.api.dispatch import Dispatch
from otela.api.hop import EngineHop
from otela.api.inference import InferenceRoutes
from otela.api.keygate import KeyGate
from otela.api.observe import Observer
from otela.config import NodeConfig
from otela.dataplane.gate import EngineGate, Routes
from otela.dataplane.hop_auth import HopSigner, HopVerifier
from otela.dataplane.hop_core import HopCore
from otela.dataplane.http import Handler, HttpServer, ServerLimits
from otela.dataplane.inflight import Inflight
from otela.dataplane.pool import HttpPool
from otela.dataplane.upstream import RelayedSender, Upstreams
from otela.load.capacity import capacity_of
from otela.load.source import LoadSource
from otela.metrics import Registry as MetricsRegistry
from otela.registry.store import Registry
from otela.routing.admission import admission_queue
from otela.routing.hold import hold_room
from otela.routing.load import NodeLoad
from otela.routing.router import Router, first_byte_timeouts, routing_settings


@dataclass
class Surroundings:
    """What the request path reads of, and gets from, the process it runs in."""

    registry: Callable[[], Registry]  # the replica (a worker's is replaced by snapshots)
    session: Callable[[], str]  # ours (it changes when we rejoin)
    engine_url: Callable[[], str | None]  # our engine's, while we serve
    served_models: Callable[[], Collection[str]]
    avoided: Callable[[], frozenset[str]]  # suspected or misbehaving peers
    relayed: RelayedSender  # how nodes behind NAT are reached
    signer: HopSigner
    verifier: HopVerifier
    load: LoadSource  # our own load, counted and reported
    fallback: Handler  # what the port serves besides the request path (the node's API)
    observers: list[Observer]
    metrics: MetricsRegistry
    keys: KeyGate | None = None  # the ingress service, with --ingress-db
    serve_metrics: bool = True  # ``/metrics`` here (a worker's are served by its control)
    warming: Callable[[], bool] | None = None  # the replica is catching up after a start
    reuse_port: bool = False  # several processes share the port (--workers)


@dataclass
class RequestPath:
    pool: HttpPool
    upstreams: Upstreams
    router: Router
    gate: EngineGate
    hop_core: HopCore
    hop: EngineHop
    inference: InferenceRoutes
    dispatch: Dispatch
    inflight: Inflight
    server: HttpServer


def settings_limits(config: NodeConfig) -> ServerLimits:
    """What one client may cost the HTTP server, from the settings."""
    return ServerLimits(max_body_bytes=config.max_body_bytes,
                        header_timeout=config.header_timeout,
                        body_timeout=config.body_timeout,
                        max_connections_per_client=config.max_connections_per_client)


def assemble(config: NodeConfig, around: Surroundings) -> RequestPath:
    """The request path for ``config`` in ``around`` (module docstring)."""
    pool = HttpPool(connect_timeout=config.connect_timeout)
    upstreams = Upstreams(pool, self_session=around.session, local_engine=around.engine_url,
                          hop_signer=around.signer, p2p=around.relayed)

    def own_load() -> NodeLoad | None:  # our engine's, for routing to it (no hop header)
        return around.load.current() if around.engine_url() is not None else None

    def replica() -> Registry:
        return around.registry()

    # (A worker replaces ``router.registry`` with every snapshot it takes.)
    router = Router(replica(), upstreams, routing_settings(config),
                    suspected=around.avoided, own_load=own_load,
                    plausible=lambda record: capacity_of(record.hardware))
    routes = Routes(config.inference_routes)
    gate = EngineGate(around.engine_url, around.served_models, config.max_body_bytes,
                      routes, first_byte_timeouts(config))
    hop_core = HopCore(gate, pool, around.load)
    hop = EngineHop(around.verifier, hop_core)
    keep_prompts = config.record_prompts or (config.log_prompts and around.keys is not None)
    inference = InferenceRoutes(router, around.observers, keep_prompts,
                                config.affinity_prefix, keys=around.keys,
                                hold=hold_room(config, replica, around.metrics),
                                warming=around.warming,
                                queue=admission_queue(config, around.metrics))
    inflight = Inflight()
    dispatch = Dispatch(inference, hop, around.fallback, inflight,
                        around.metrics if around.serve_metrics else None, routes)
    server = HttpServer(dispatch, settings_limits(config), reuse_port=around.reuse_port,
                        screen=dispatch.screen)
    return RequestPath(pool, upstreams, router, gate, hop_core, hop, inference, dispatch,
                       inflight, server)

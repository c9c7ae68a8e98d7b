"""Every node setting, declared once: ``NodeConfig``'s fields.

A field declared with ``setting(...)`` carries everything the rest of otela needs to know
about it: its type (the annotation), default, help, TOML section and key, ``OTELA_*``
environment variable, command-line flag, parser (validation) and an example value. From
these the command-line options (``options.py``), the config file ``otela init`` writes,
``otela config show``, the resolution of the four layers (``layers.py``) and the settings
table in docs/config.md are all generated, so adding a setting is one edit here plus its
use. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otela.config import values as v
from otela.config.visibility import parse_visibility
from otela.paths import default_home

DEFAULT_HTTP_PORT = 8092
DEFAULT_P2P_PORT = 43905

# Engine log lines after which the engine cannot be trusted to answer correctly again
# (paper §7.1: fail-stop rather than attempt recovery). Case-insensitive regexes.
DEFAULT_FATAL_PATTERNS: tuple[str, ...] = (
    r"NCCL.*(timeout|timed out|timing out)",
    r"Watchdog caught collective operation timeout",
    r"CUDA out of memory",
    r"torch\.(cuda\.)?OutOfMemoryError",
    r"CUDA error: an illegal memory access",
    r"uncorrectable ECC error",
    r"RuntimeError: Engine core initialization failed",
    r"EngineDeadError",
)


@dataclass(frozen=True)
class Setting:
    """What the CLI, the environment, the config file and the docs know of one field."""

    attr: str  # NodeConfig attribute
    section: str  # TOML table
    key: str  # TOML key
    parse: Callable[[Any], Any]
    help: str
    example: str  # a valid value other than the default, as one would type it
    flag: str | None  # command-line flag; None: file and environment only (advanced)
    env: str
    short: str | None = None
    repeatable: bool = False  # a list given by repeating the flag
    switch: bool = False  # a boolean given as --flag/--no-flag
    shown_default: str | None = None  # how --help states the default, when not derivable
    metavar: str | None = None

    @property
    def default(self) -> Any:
        spec = NodeConfig.__dataclass_fields__[self.attr]
        if spec.default_factory is not dataclasses.MISSING:
            return spec.default_factory()
        return spec.default

    def describe_default(self) -> str | None:
        """The default as ``--help`` states it (``None``: nothing worth stating)."""
        if self.shown_default is not None:
            return self.shown_default
        value = self.default
        if value is None or value == [] or value == {}:
            return None
        if self.parse is v.as_duration:
            return v.format_duration(value)
        if self.parse is v.as_size:
            return v.format_size(value)
        if isinstance(value, bool):
            return "on" if value else "off"
        return str(value)


def setting(
    section: str,
    default: Any = None,
    *,
    parse: Callable[[Any], Any],
    help: str,
    example: str,
    factory: Callable[[], Any] | None = None,
    key: str | None = None,
    flag: str | bool | None = True,
    env: str | None = None,
    short: str | None = None,
    shown_default: str | None = None,
    metavar: str | None = None,
) -> Any:
    """Declare a ``NodeConfig`` field as a setting (see the module docstring). The key
    defaults to the attribute name, the flag to ``--key`` (``flag=False``: no flag), the
    environment variable to ``OTELA_KEY``."""
    meta = {"section": section, "parse": parse, "help": help, "example": example, "key": key,
            "flag": flag, "env": env, "short": short, "shown_default": shown_default,
            "metavar": metavar}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _setting_of(spec: dataclasses.Field[Any]) -> Setting:
    meta = spec.metadata
    key = meta["key"] or spec.name
    flag = meta["flag"]
    flag_name = None if flag is False else (flag if isinstance(flag, str) else
                                            "--" + key.replace("_", "-"))
    annotation = str(spec.type)
    return Setting(
        attr=spec.name, section=meta["section"], key=key, parse=meta["parse"],
        help=meta["help"], example=meta["example"], flag=flag_name,
        env=meta["env"] or "OTELA_" + key.upper(), short=meta["short"],
        repeatable=annotation.startswith(("list[", "dict[")),
        switch=annotation == "bool", shown_default=meta["shown_default"],
        metavar=meta["metavar"],
    )


@dataclass
class NodeConfig:
    """The resolved settings a node runs with. Each field is one setting, declared once."""

    # -- [node] ------------------------------------------------------------------------
    home: Path = setting(
        "node", factory=default_home, parse=v.as_path, example="/scratch/otela-node",
        help="Node home: identity key, certificate, logs.",
        shown_default="$XDG_CONFIG_HOME/otela/node", metavar="DIR")
    listen_host: str = setting(
        "node", "0.0.0.0", key="host", parse=v.as_str, example="127.0.0.1", metavar="ADDR",
        help="Address to listen on (HTTP and libp2p).")
    public_host: str | None = setting(
        "node", parse=v.as_opt_str, example="10.0.0.5", metavar="ADDR",
        help="Address other nodes reach us at. Default: --host, or (listening on 0.0.0.0) "
        "every interface address of this host, the default route's first.")
    http_port: int = setting(
        "node", DEFAULT_HTTP_PORT, parse=v.as_port, example="18092", metavar="PORT",
        help="HTTP port (OpenAI API, inspection, engine hop); 0: any.")
    p2p_port: int = setting(
        "node", DEFAULT_P2P_PORT, parse=v.as_port, example="43906", metavar="PORT",
        help="libp2p TCP port; 0: any.")
    bootstrap: list[str] = setting(
        "node", factory=list, parse=v.as_addresses, short="-b", metavar="MULTIADDR",
        example="/ip4/10.0.0.5/tcp/43905/p2p/12D3KooWBootstrapPeer",
        help="Multiaddr of a peer (or URL of a list of them) to join through. Repeatable; "
        "env: comma or space separated.")
    provider_id: str | None = setting(
        "node", parse=v.as_opt_str, example="my-lab", metavar="NAME",
        help="Who contributes this node; users allowlist providers. Default: derived from "
        "the key.")
    ingress: bool = setting(
        "node", False, parse=v.as_bool, example="true",
        help="Mark this node as an ingress (public entry point).")
    status_file: Path | None = setting(
        "node", parse=v.as_opt_path, example="/tmp/otela-status.json", metavar="FILE",
        help="Write this node's peer id, addresses and HTTP URL as JSON here once listening "
        "(for Slurm scripts that bootstrap other jobs).")

    # -- [engine] ----------------------------------------------------------------------
    process: str | None = setting(
        "engine", parse=v.as_opt_str, metavar="COMMAND",
        example="vllm serve Qwen/Qwen3-8B --port 8000",
        help='Engine command to launch and supervise, e.g. "vllm serve Qwen/Qwen3-8B '
        '--port 8000" (vLLM, SGLang, llama.cpp\'s llama-server or any OpenAI-compatible '
        "server). Without it (and without --engine-url) the node joins as idle capacity.")
    engine_url: str | None = setting(
        "engine", parse=v.as_opt_str, example="http://127.0.0.1:8000", metavar="URL",
        help="Engine base URL, when it cannot be read from the command's --port/--host; "
        "without --process: an already running server to front (it must be reachable).")
    model_meta: dict[str, str] = setting(
        "engine", factory=dict, parse=v.as_meta, example="quantization=awq-4bit",
        metavar="KEY=VALUE",
        help="Metadata for the served models, overriding what the engine and its command "
        "line say (dtype, quantization, tensor_parallel, max_context or any key). "
        "Repeatable; env: comma separated.")
    kv_events: str = setting(
        "engine", "auto", parse=v.as_kv_events, example="tcp://127.0.0.1:5557",
        metavar="auto|off|ENDPOINT",
        help="Where this node reads its engine's KV-cache events (blocks stored and "
        "removed) for cache-aware routing: auto reads the endpoint from a vLLM command's "
        "--kv-events-config (ZMQ publisher, prefix caching on); or an explicit ZMQ "
        "endpoint; off: none. The node then reports which prompt prefixes its engine "
        "holds to the ingresses with its load (docs/routing.md, cache_aware).")
    ready_timeout: float = setting(
        "engine", 1800.0, parse=v.as_float, example="600", metavar="SECONDS",
        help="Seconds to wait for the engine to answer before giving up; large models load "
        "slowly.")
    health_interval: float = setting(
        "engine", 5.0, parse=v.as_float, example="2", metavar="SECONDS",
        help="Seconds between engine health checks.")
    health_failures: int = setting(
        "engine", 3, parse=v.as_positive_int, example="5", metavar="N",
        help="Failed health checks in a row that mean fail-stop.")
    fatal_patterns: list[str] = setting(
        "engine", factory=lambda: list(DEFAULT_FATAL_PATTERNS), parse=v.as_patterns,
        flag="--fatal-pattern", example="Segmentation fault", metavar="REGEX",
        shown_default="NCCL timeouts, CUDA out of memory... (see `otela config show`)",
        help="Regex: an engine log line matching it means fail-stop. Repeatable; replaces "
        "the defaults. Env: one regex (use | for several).")

    # -- [logs] ------------------------------------------------------------------------
    log_max_bytes: int = setting(
        "logs", 50 * 1024 * 1024, parse=v.as_positive_int, flag=False, example="1000000",
        help="Size at which the engine log is rotated.")
    log_backups: int = setting(
        "logs", 5, parse=v.as_int, flag=False, example="2",
        help="Rotated engine logs kept.")
    log_sink: Path | None = setting(
        "logs", parse=v.as_opt_path, example="/scratch/failed-engines", metavar="DIR",
        help="Directory to copy engine logs to when the engine fails.")
    log_level: str = setting(
        "logs", "INFO", parse=v.as_log_level, example="DEBUG", metavar="LEVEL",
        help="Daemon log level (DEBUG, INFO, WARNING, ERROR).")
    access_log: str | None = setting(
        "logs", parse=v.as_opt_str, example="/var/log/otela/access.jsonl", metavar="FILE",
        help="Write one JSON line per routed request here (- for stdout): request id, "
        "model, status, serving node, timings, tokens.")
    trace_loop: bool = setting(
        "logs", False, parse=v.as_bool, example="true",
        help="Time every event-loop step and keep the slowest in /v1/health (event_loop), "
        "to find what stalls requests; costs a few percent of request throughput.")

    # -- [shutdown] --------------------------------------------------------------------
    # Together below Slurm's default KillWait (30 s), so the engine is never SIGKILLed by
    # Slurm mid-drain.
    drain_grace: float = setting(
        "shutdown", 15.0, parse=v.as_float, example="5", metavar="SECONDS",
        help="On SIGTERM, seconds in-flight requests get to finish; keep drain grace + "
        "engine stop grace below Slurm's KillWait.")
    engine_stop_grace: float = setting(
        "shutdown", 8.0, parse=v.as_float, example="3", metavar="SECONDS",
        help="Seconds between SIGTERM and SIGKILL for the engine.")
    leave_linger: float = setting(
        "shutdown", 2.0, parse=v.as_duration, flag=False, example="1s",
        help="After announcing DOWN or LEFT, how long to push the news to every peer.")

    # -- [slurm] -----------------------------------------------------------------------
    slurm_drain_margin: float = setting(
        "slurm", 300.0, parse=v.as_float, example="120", metavar="SECONDS",
        help="Inside a Slurm job: start draining this many seconds before the wall time.")
    slurm_poll_interval: float = setting(
        "slurm", 30.0, parse=v.as_float, flag=False, example="10",
        help="Seconds between squeue polls for the job's time left.")

    # -- [hardware] (override discovery) -----------------------------------------------
    hw_cpus: int | None = setting(
        "hardware", key="cpus", parse=v.as_opt_int, example="32", metavar="N",
        help="Advertise this many CPU cores.")
    hw_memory_gb: float | None = setting(
        "hardware", key="memory_gb", parse=v.as_opt_float, example="256", metavar="GB",
        help="Advertise this much memory.")
    hw_gpus: str | None = setting(
        "hardware", key="gpus", parse=v.as_opt_str, example="4xA100-SXM4-80GB:80",
        metavar="SPEC",
        help='Advertise these GPUs instead of what nvidia-smi/rocm-smi report, e.g. '
        '"4xA100-SXM4-80GB:80,L40S:48" (memory in GB).')

    # -- [membership] ------------------------------------------------------------------
    authority: str | None = setting(
        "membership", parse=v.as_opt_str, example="ed25519:AAAA", metavar="KEY",
        help="Membership authority (the string `otela membership init` prints, or a file "
        "holding it). With it, only nodes holding a valid certificate join. Without: open.")
    certificate: Path | None = setting(
        "membership", parse=v.as_opt_path, example="/etc/otela/node.cert", metavar="FILE",
        shown_default="<home>/certificate.cert", help="This node's membership certificate.")

    # -- [registry] --------------------------------------------------------------------
    registry_retention: float = setting(
        "registry", 24 * 3600.0, key="retention", flag="--registry-retention",
        parse=v.as_duration, example="12h", metavar="DURATION",
        help="How long LEFT nodes stay visible.")
    registry_horizon: float = setting(
        "registry", 48 * 3600.0, key="horizon", flag="--registry-horizon",
        parse=v.as_duration, example="3d", metavar="DURATION",
        help="Entries are compacted this long after their last signed update; live nodes "
        "re-sign every horizon/8. At least the retention.")
    anti_entropy_interval: float = setting(
        "registry", 30.0, parse=v.as_duration, flag=False, example="1m",
        help="Mean time between anti-entropy exchanges with a random peer: a backstop, as "
        "a peer whose replica drifted from ours is synced with when liveness messages "
        "show it (a few seconds).")

    # -- [liveness] --------------------------------------------------------------------
    probe_interval: float = setting(
        "liveness", 1.0, parse=v.as_duration, example="2s",
        metavar="DURATION", help="Failure detector probe period.")
    suspicion_timeout: float = setting(
        "liveness", 6.0, parse=v.as_duration, example="10s", metavar="DURATION",
        help="How long a suspected node (no traffic meanwhile) has to refute before it is "
        "evicted.")

    # -- [nat] -------------------------------------------------------------------------
    relay: bool = setting(
        "nat", False, parse=v.as_bool, example="true",
        help="Offer circuit-relay reservations, so nodes behind NAT become reachable "
        "through this one. Run it on a host with a public address (see docs/nat.md).")
    relay_reservations: int = setting(
        "nat", 2, parse=v.as_positive_int, example="3", metavar="N",
        help="When this node is behind NAT: how many relays to hold a reservation on.")
    hole_punch: bool = setting(
        "nat", True, parse=v.as_bool, example="false",
        help="Try to upgrade relayed connections to direct ones (DCUtR). Turn off to keep "
        "traffic on relays, e.g. to measure or debug them.")

    # -- [http]: what one client may cost a node (docs/security.md) --------------------
    max_body_bytes: int = setting(
        "http", 32 * 1024 * 1024, key="max_body", parse=v.as_size, example="1MiB",
        metavar="SIZE", help="Largest request body accepted on the HTTP port; larger: 413.")
    header_timeout: float = setting(
        "http", 10.0, parse=v.as_duration, example="5s", metavar="DURATION",
        help="A request's headers must arrive within this time, and a new connection must "
        "start one (slow clients cannot pin connections); else 408.")
    body_timeout: float = setting(
        "http", 60.0, parse=v.as_duration, example="30s", metavar="DURATION",
        help="A request's body must arrive within this time; else 408.")
    first_byte_timeout: float = setting(
        "http", 60.0, parse=v.as_duration, example="2m", metavar="DURATION",
        help="An engine that takes a streamed request but sends nothing for this long gets "
        "it cancelled and the client a 504. A non-streamed answer (its first byte is its "
        "last) gets this plus 0.1 s per requested token (max_tokens), at most "
        "--response-timeout.")
    response_timeout: float = setting(
        "http", 300.0, parse=v.as_duration, example="10m", metavar="DURATION",
        help="The longest an engine may take to answer a non-streamed request, and the wait "
        "for one that sets no max_tokens; keep it above your longest generation.")
    inference_routes: list[str] = setting(
        "http", factory=list, parse=v.as_routes, example="/v1/images/edits", metavar="PATHS",
        help="Inference routes relayed to engines besides the built-in ones (chat and text "
        "completions, embeddings, responses, messages, rerank, score, pooling, tokenize...; "
        "docs/security.md). Engine administration is never relayed unless named here.")
    workers: int = setting(
        "http", 1, parse=v.as_workers, example="2", metavar="N|auto",
        help="Processes serving the HTTP port (SO_REUSEPORT); with more than one, the node "
        "runs libp2p and the registry in a control process and requests in N data-path "
        "workers. auto: one per CPU core.")
    connect_timeout: float = setting(
        "http", 5.0, parse=v.as_duration, example="2s", metavar="DURATION",
        help="A node (or engine) that does not accept a connection within this time did "
        "not get the request: another node is tried, and this ingress stops routing to "
        "it for a while (ejection). The last node a request may try gets this long; "
        "earlier ones get --failover-connect-timeout. Connections nobody answers use up "
        "none of --route-attempts until a request has spent this long routing.")
    failover_connect_timeout: float = setting(
        "http", 1.0, parse=v.as_duration, example="0.5s", metavar="DURATION",
        help="While another node could still take a request, a node that has not accepted "
        "the connection within this time is given up for the next one (nothing was sent, "
        "so nothing runs twice). 1 s: TCP resends a lost connection request after 1 s, "
        "so a connection not made by then has lost a packet or its host is gone.")
    max_connections_per_client: int = setting(
        "http", 256, parse=v.as_positive_int, example="64", metavar="N",
        help="Open connections one client address may hold; more get 429.")

    # -- [routing]: which node serves a request (docs/routing.md) ---------------------
    routing_policy: str = setting(
        "routing", "power_of_two", parse=v.as_policy, example="least_in_flight",
        metavar="NAME",
        help="How this ingress picks among the nodes that may serve a request: random, "
        "round_robin, weighted, least_in_flight, power_of_two, prefix_affinity, cache_aware "
        "(what the engines' KV caches hold; --tokenizer), or an installed plugin's name. "
        "A request may ask for another with X-Otela-Policy.")
    trusted_providers: list[str] = setting(
        "routing", factory=list, parse=v.as_providers, example="cscs,epfl", metavar="IDS",
        help="Providers whose nodes this ingress ever sends requests to (default: any). "
        "Requests (X-Otela-Providers) and API keys can narrow the set, never widen it.")
    route_attempts: int = setting(
        "routing", 3, parse=v.as_positive_int, example="2", metavar="N",
        help="Nodes tried for one request, when the earlier ones provably did not take it "
        "(not serving, no answer to the connection attempt). Nodes that refuse the "
        "connection outright (down), or do not know this node's session yet (asked again "
        "later), do not use up an attempt, nor do connections nobody answers until the "
        "request has spent --connect-timeout routing. A request an engine may have started "
        "is never sent again.")
    balance_providers: bool = setting(
        "routing", False, parse=v.as_bool, example="true",
        help="Share requests between providers before nodes: two random providers serving "
        "the model, the less loaded one wins, then the routing policy picks among its "
        "nodes. A provider with many nodes then gets no more than an equal share "
        "(default: every node, whoever runs it, gets an equal share).")
    retry_broken: bool = setting(
        "routing", True, parse=v.as_bool, example="false",
        help="Also send a request to another node when its node broke the connection "
        "before answering (it died, most likely), or was suspected by the failure "
        "detector while the request waited (it froze, or was cut off); a stream too, "
        "before its answer begins (once begun, --stream-migrations continues it). Clients "
        "then see no error and no long wait while another node serves the model, but a "
        "request may run twice (--no-retry-broken: a 502 instead).")
    stream_migrations: int = setting(
        "routing", 2, parse=v.as_int, example="0", metavar="N",
        help="How many times a chat or completions stream whose node breaks off "
        "mid-answer may be continued on another node (the client sees one uninterrupted "
        "stream; the new node continues the partial answer: vLLM's "
        "continue_final_message for chat, the prompt followed by the partial text for "
        "completions); 0: never, the stream ends with an error event. A request may ask "
        "for fewer with the X-Otela-Migrations header.")
    affinity_prefix: int = setting(
        "routing", 512, parse=v.as_positive_int, example="2048", metavar="CHARS",
        help="prefix_affinity: how many leading characters of the prompt form a request's "
        "key when it has no `user` field.")
    affinity_balance: float = setting(
        "routing", 2.0, parse=v.as_balance, example="1.5", metavar="FACTOR",
        help="prefix_affinity and cache_aware: a key's (or cached prefix's) node is passed "
        "over while its load would exceed this many times the mean (lower: evener load, "
        "fewer warm-cache hits; > 1).")
    cache_balance: float = setting(
        "routing", 1.5, parse=v.as_balance, example="2", metavar="FACTOR",
        help="cache_aware: a node holding a request's prefix is passed over while its load, "
        "with the request, would exceed this many times the mean, so the busiest node "
        "stays within about this factor of the mean (higher: more cache hits, less even "
        "load; > 1).")
    tokenizers: dict[str, str] = setting(
        "routing", factory=dict, parse=v.as_tokenizer_dirs, flag="--tokenizer",
        example="tiny-llama=/models/tiny-llama", metavar="MODEL=DIR",
        help="cache_aware: where a model's tokenizer is (the directory with its "
        "tokenizer.json, tokenizer_config.json and chat template, as the engine loads "
        "it), so this ingress can hash a request's prompt as the engine's prefix cache "
        "does. A model without one routes as prefix_affinity. Repeatable; env: comma "
        "separated.")
    hold_models: list[str] = setting(
        "routing", factory=list, parse=v.as_globs, example="Qwen/*,meta-llama/*",
        metavar="GLOBS",
        help="Models whose requests wait for a first serving node instead of failing when "
        "none serves (scale to zero with `otela fleet`; docs/fleet.md). Shell-style "
        "globs, comma separated.")
    hold_timeout: float = setting(
        "routing", 120.0, parse=v.as_duration, example="5m", metavar="DURATION",
        help="--hold-models: how long a request waits for a first serving node before a "
        "503 with Retry-After.")
    registry_warmup: float = setting(
        "routing", 10.0, parse=v.as_duration_or_off, example="30s", metavar="DURATION",
        help="After a start, how long a request for a model this node does not know may "
        "wait for its registry replica to catch up with a peer (then 503 registry_warming "
        "with Retry-After, never a 404 while it may still learn of the model); 0 or off: "
        "no warm-up.")
    hold_queue: int = setting(
        "routing", 256, parse=v.as_positive_int, example="64", metavar="N",
        help="--hold-models: requests that may wait at once (per data-path process); more "
        "get a 503 with Retry-After at once.")
    queue_timeout: float = setting(
        "routing", 30.0, parse=v.as_duration, example="10s", metavar="DURATION",
        help="How long a request waits at this ingress for room on a node serving its "
        "model (nodes declare room with --max-concurrency) before a 429 with Retry-After; "
        "a request may ask for another wait with X-Otela-Queue-Timeout (docs/scheduling.md)."
        )
    queue_max_timeout: float = setting(
        "routing", 3600.0, parse=v.as_duration, example="10m", metavar="DURATION",
        help="The longest wait a request may ask for with X-Otela-Queue-Timeout (an API "
        "key's own maximum may be lower).")
    queue_depth: int = setting(
        "routing", 10_000, parse=v.as_positive_int, example="1000", metavar="N",
        help="Requests that may wait per model (per data-path process); more get a 429 "
        "with Retry-After at once.")
    priority_classes: list[str] = setting(
        "routing", factory=lambda: ["interactive", "default", "batch"],
        parse=v.as_class_names, example="realtime,default,bulk,batch", metavar="NAMES",
        help="Priority classes, best first: a request chooses one with X-Otela-Priority "
        "(within what its API key allows); waiting requests of a better class are "
        "dispatched first.")
    default_priority: str = setting(
        "routing", "default", parse=v.as_class_name, example="interactive", metavar="NAME",
        help="The class of a request that names none (one of --priority-classes).")
    priority_reserve: float = setting(
        "routing", 0.1, parse=v.as_fraction, example="0.25", metavar="FRACTION",
        help="Of each node's slots (--max-concurrency, rounded down), the share only the "
        "best priority class may use: an interactive request finds room at once even "
        "while other classes fill the node (docs/scheduling.md).")
    starvation_after: float = setting(
        "routing", 10.0, parse=v.as_duration, example="30s", metavar="DURATION",
        help="A lower class whose oldest waiting request has waited this long gets one "
        "dispatch in ten until it no longer starves (docs/scheduling.md).")
    eject_after: int = setting(
        "routing", 5, parse=v.as_positive_int, example="3", metavar="N",
        help="Consecutive failures (no connection, 5xx, no first byte) after which this "
        "ingress stops sending a node requests for a while.")
    eject_time: float = setting(
        "routing", 10.0, parse=v.as_duration_or_off, example="30s", metavar="DURATION",
        help="How long a first ejection lasts; each further one of the same node lasts "
        "twice as long.")
    eject_max_time: float = setting(
        "routing", 300.0, parse=v.as_duration, example="10m", metavar="DURATION",
        help="Longest ejection.")
    eject_max_share: float = setting(
        "routing", 0.5, parse=v.as_fraction, example="0.3", metavar="FRACTION",
        help="Largest share of a model's nodes ejected at once (the oldest ejection ends "
        "first): failures everywhere must not turn into an outage.")
    load_interval: float = setting(
        "routing", 2.0, parse=v.as_duration, example="5s", metavar="DURATION",
        help="How often a serving node reads its engine's metrics, and the least time "
        "between two load reports it sends the ingresses (which grows with the federation: "
        "0.5 s per member, so an ingress hears at most ~2 reports a second whatever the "
        "federation's size).")
    max_concurrency: int | None = setting(
        "routing", parse=v.as_opt_int, example="64", metavar="N",
        shown_default="the engine command's --max-num-seqs or --max-running-requests, "
        "else unbounded",
        help="Requests this node's engine takes at once: ingresses queue requests (in "
        "priority and fair-share order) rather than send it more. Unbounded: ingresses "
        "never hold a request back for this node.")
    capacity: float | None = setting(
        "routing", parse=v.as_opt_float, example="2.5", metavar="WEIGHT",
        shown_default="from the GPUs' memory bandwidth (1 = 2 TB/s)",
        help="Relative serving capacity this node reports to ingresses (weighted and "
        "load-aware policies divide load by it).")

    # -- [assignments]: engines a planner may start on this idle node (docs/placer.md) --
    accept_assignments: list[str] = setting(
        "assignments", factory=list, parse=v.as_issuers, metavar="FROM",
        example="authority",
        help="Let these issuers start an engine on this idle node (`otela plan --assign`): "
        "peer ids, authority strings, or `authority` (this federation's --authority). Only "
        "signed, unexpired, never-seen assignments naming an engine of --engine-allowlist "
        "run. Without it the node refuses every assignment. Repeatable; env: comma "
        "separated.")
    engine_allowlist: Path | None = setting(
        "assignments", parse=v.as_opt_path, example="/etc/otela/engines.toml",
        metavar="FILE", shown_default="<home>/engines.toml",
        help="TOML file of the engine command templates assignments may start: one table "
        "per engine name with a command using {model}, {tp} and {port} (docs/placer.md).")

    # -- [ingress]: the public ingress service (docs/ingress.md) -----------------------
    ingress_db: str | None = setting(
        "ingress", parse=v.as_opt_str, key="db", flag="--ingress-db", env="OTELA_INGRESS_DB",
        example="postgresql://otela@db.example.org/otela", metavar="URL",
        help="Run the public ingress service on this database: API keys on every OpenAI "
        "route, usage accounting, per-key limits, the admin API and the /ui dashboard. A "
        "SQLite file path (`default`: ingress.db in the node's home) or postgresql://... "
        "for several ingress nodes sharing one database.")
    open_access: bool = setting(
        "ingress", False, parse=v.as_bool, key="open", flag="--open", env="OTELA_OPEN",
        example="true",
        help="With --ingress-db: also serve requests that carry no API key (counted as "
        "anonymous usage). Requests with a key are still checked.")
    admin_token: str | None = setting(
        "ingress", parse=v.as_opt_str, flag=False, example="a-long-random-string",
        help="The bearer token of the ingress's admin API (/v1/admin/...: keys and usage "
        "across the federation). Environment or config file only, never a flag (flags are "
        "visible to every user of the host). Unset: the admin API is off.")
    visibility: dict[str, str] = setting(
        "ingress", factory=dict, parse=parse_visibility, example="network=public",
        metavar="ENDPOINT=WHO", shown_default="models=public, health=key, registry=key, "
        "network=key, key_metrics=admin",
        help="With --ingress-db: who may read each inspection endpoint (public, key: API "
        "key holders, admin: the admin token). Endpoints: models (/v1/models), health "
        "(/v1/health beyond liveness), registry (/v1/registry/...), network (/v1/network), "
        "key_metrics (/metrics series per API key). Repeatable; env: comma separated; "
        "docs/security.md.")
    batch_max_file_bytes: int = setting(
        "ingress", 32 * 1024 * 1024, key="batch_max_file", parse=v.as_size, flag=False,
        example="100MiB", metavar="SIZE",
        help="With --ingress-db: the largest batch input file POST /v1/files accepts "
        "(larger: 413). The upload is one request body, so --max-body bounds it too "
        "(docs/scheduling.md#the-batch-api).")
    batch_concurrency: int = setting(
        "ingress", 16, parse=v.as_positive_int, flag=False, example="64",
        help="With --ingress-db: lines of one batch this ingress sends at once.")
    batch_in_flight: int = setting(
        "ingress", 64, parse=v.as_positive_int, flag=False, example="256",
        help="With --ingress-db: lines of all batches this ingress sends at once (each is "
        "an ordinary request through its own port).")

    usage_retention: float | None = setting(
        "ingress", parse=v.as_opt_retention, flag=False, example="90d", metavar="DURATION",
        help="With --ingress-db: keep each request's row (the request log) this long, then "
        "sum it into per-day totals that budgets and usage reports go on counting. Unset: "
        "keep every row.")
    log_prompts: bool = setting(
        "ingress", False, parse=v.as_bool, flag=False, example="true",
        help="With --ingress-db: keep each request's prompt text (up to 64 KiB) in the "
        "request log (off: never stored). Opt in only where the users know it.")

    # -- [ingress] sso_*: single sign-on for the dashboard (docs/ingress.md#single-sign-on)
    sso_issuer: str | None = setting(
        "ingress", parse=v.as_opt_str, flag=False, metavar="URL",
        example="https://sso.example.org/realms/uni",
        help="With --ingress-db: the OpenID provider whose users may sign in to the /ui "
        "dashboard (authorization code with PKCE; its /.well-known/openid-configuration is "
        "read). Unset: no single sign-on, the dashboard takes keys and the admin token only.")
    sso_client_id: str | None = setting(
        "ingress", parse=v.as_opt_str, flag=False, example="otela-dashboard",
        help="With sso_issuer: this ingress's client id at the provider.")
    sso_client_secret: str | None = setting(
        "ingress", parse=v.as_opt_str, flag=False, example="a-client-secret",
        help="With sso_issuer: the client secret (environment or config file only, never "
        "logged; or sso_client_secret_file). Neither: a public client (PKCE only).")
    sso_client_secret_file: Path | None = setting(
        "ingress", parse=v.as_opt_path, flag=False, example="/etc/otela/sso-secret",
        metavar="FILE", help="With sso_issuer: a file holding the client secret.")
    sso_redirect_base: str | None = setting(
        "ingress", parse=v.as_opt_str, flag=False, example="https://llm.example.org",
        metavar="URL",
        help="With sso_issuer: this ingress's public base URL as browsers reach it; the "
        "provider sends them back to <URL>/ui/callback (register that redirect URI). An "
        "https URL makes the session cookie Secure.")
    sso_scopes: list[str] = setting(
        "ingress", factory=lambda: ["openid", "email", "profile"], parse=v.as_words,
        flag=False, example="openid email profile groups", shown_default="openid email profile",
        help="With sso_issuer: the scopes asked for (openid is always added).")
    sso_team_claim: str = setting(
        "ingress", "groups", parse=v.as_str, flag=False, example="eduperson_affiliation",
        help="With sso_issuer: the claim (ID token or userinfo) whose value, or one of whose "
        "values, names the user's team through sso_teams.")
    sso_teams: dict[str, str] = setting(
        "ingress", factory=dict, parse=v.as_claim_map, flag=False,
        example="/physics=physics-lab", metavar="VALUE=TEAM",
        help="With sso_issuer: team claim value -> team (the fair-sharing team of keys). "
        "Several matching: the first in this table. None matching: no team.")
    sso_admin_claim: str = setting(
        "ingress", "groups", parse=v.as_str, flag=False, example="roles",
        help="With sso_issuer: the claim whose value, or one of whose values, in "
        "sso_admin_values makes the user an admin of this ingress.")
    sso_admin_values: list[str] = setting(
        "ingress", factory=list, parse=v.as_words, flag=False, example="otela-admins",
        help="With sso_issuer: values of sso_admin_claim that make a user an admin (keys, "
        "teams and usage in the dashboard). Empty: nobody signs in as admin.")
    sso_session_ttl: float = setting(
        "ingress", 8 * 3600.0, parse=v.as_duration, flag=False, example="1h",
        help="With sso_issuer: how long a dashboard sign-in lasts (then: sign in again).")
    sso_user_keys: bool = setting(
        "ingress", False, parse=v.as_bool, flag=False, example="true",
        help="With sso_issuer: signed-in users may create API keys of their own in the "
        "dashboard (in their team, held to its limits, budgets, models and priority; at "
        "most 10 live keys each; a user in no team may not). Off: an admin makes them. "
        "Users can list and revoke their own keys either way.")

    # -- [trace]: recording served requests as an otela trace (docs/traces.md) --------
    record_trace: Path | None = setting(
        "trace", parse=v.as_opt_path, example="/scratch/traces/ingress.jsonl",
        metavar="FILE", help="Record every routed request in this trace file (rotated), "
        "for `otela trace analyze`, `replay` and the simulator. Prompts are never recorded "
        "unless --record-prompts.")
    record_trace_max: int = setting(
        "trace", 256 * 1024 * 1024, parse=v.as_size, example="64MiB", metavar="SIZE",
        help="Rotate the trace file at this size.")
    record_trace_backups: int = setting(
        "trace", 10, parse=v.as_int, example="3", metavar="N",
        help="Rotated trace files kept.")
    record_trace_hash_ids: bool = setting(
        "trace", False, parse=v.as_bool, example="true",
        help="Hash provider and node ids in the trace (API keys are always hashed).")
    record_prompts: bool = setting(
        "trace", False, parse=v.as_bool, example="true",
        help="Also record prompt text in the trace (off: lengths only).")

    @property
    def engine_log(self) -> Path:
        return self.home / "logs" / "engine.log"


SETTINGS: tuple[Setting, ...] = tuple(
    _setting_of(spec) for spec in dataclasses.fields(NodeConfig)
)
SETTINGS_BY_ATTR = {s.attr: s for s in SETTINGS}


def default_of(attr: str) -> Any:
    """A setting's default, for code that needs it without a resolved config (components
    built outside a node, tests): the declaration above stays the only place it is written."""
    return SETTINGS_BY_ATTR[attr].default

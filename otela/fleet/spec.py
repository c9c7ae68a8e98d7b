"""The fleet file: which clusters exist and which deployments should run on them.

A TOML file (``otela fleet init`` writes a commented example) with three parts: ``[fleet]``
(its name, which tags every job, and the federation the jobs join), ``[clusters.NAME]``
(how to reach a cluster's Slurm and what a job there gets) and ``[[deployments]]`` (a
model, its engine command, where it may run and how many replicas). Every error names
the file, the line and the field (``fleet.toml:14: deployments[0].gpus: ...``) and
nothing is submitted while there is one: a typo must never start or stop jobs.
Pure apart from reading the file.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from otela.durations import parse_duration
from otela.engine.command import option_value
from otela.fleet.errors import FleetFileError
from otela.fleet.tomlpos import key_lines, line_of
from otela.hardware.precision import BITS_KEYS, stored_bits

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
COMMAND_FIELDS = ("model", "port", "gpus", "tp")
"""Placeholders an engine command may use; ``{port}`` is chosen free on the job's node."""


@dataclass(frozen=True)
class Autoscale:
    """How a deployment with ``min``/``max`` follows demand (docs/fleet.md, autoscaling)."""

    target_rps: float | None = None  # requests per second one replica should take
    target_in_flight: float | None = None  # concurrent requests per replica
    ttft: float | None = None  # seconds: p90 time to first byte above this adds a replica
    up_cooldown: float = 30.0
    down_cooldown: float = 300.0
    down_window: float = 120.0  # scale down only if the whole window wanted fewer
    idle_timeout: float = 600.0  # with min = 0: no request for this long -> zero replicas
    tolerance: float = 0.1  # a replica's worth of load within this fraction is not a step
    forecast: bool = False  # provision for the SageServe forecast of the next lead time
    forecast_bin: float = 60.0
    season: float = 86400.0


@dataclass(frozen=True)
class CheckpointPrecision:
    """The bits the served checkpoint stores, named as ``otela sim run`` and a placer demand
    name them; the placer and the memory check size the model by it (BF16 unless said)."""

    weight_bits: float = 16
    act_bits: float = 16
    kv_bits: float = 16
    weight_format: str = ""  # one of the simulator's formats; "" for the usual one


@dataclass(frozen=True)
class Deployment:
    name: str
    model: str
    command: str
    clusters: tuple[str, ...]
    gpus: int | None  # None: "auto", the placer decides (placement.py)
    gpu_types: tuple[str, ...] = ()
    replicas: int | None = None
    min: int | None = None
    max: int | None = None
    autoscale: Autoscale | None = None
    otela: Mapping[str, str] = field(default_factory=dict)  # OTELA_* for its nodes
    env: Mapping[str, str] = field(default_factory=dict)
    rate: float | None = None  # expected requests per second (placement with gpus="auto")
    precision: CheckpointPrecision = field(default_factory=CheckpointPrecision)
    line: int | None = None

    @property
    def autoscaled(self) -> bool:
        return self.replicas is None

    @property
    def fixed_count(self) -> int:
        return self.replicas if self.replicas is not None else (self.min or 0)


@dataclass(frozen=True)
class Cluster:
    name: str
    ssh: str | None = None  # user@login-node; None: this machine's sbatch/squeue/scancel
    ssh_options: tuple[str, ...] = ()
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_limit: int = 4 * 3600  # seconds
    gpu_type: str | None = None
    gpus_per_node: int = 0
    whole_nodes: bool = False  # the partition hands out whole nodes: pack replicas
    cpus_per_job: int = 8
    memory: str | None = None
    modules: tuple[str, ...] = ()
    container: str | None = None  # e.g. "apptainer exec --nv img.sif {command}"
    env: Mapping[str, str] = field(default_factory=dict)
    sbatch_args: tuple[str, ...] = ()
    drain_margin: float = 120.0  # the node's hard margin: it drains itself then
    pending_limit: float = 600.0  # a job pending longer is tried on another cluster
    serve_deadline: float = 900.0  # a running job whose node does not serve by then failed
    workdir: str = "~/otela-fleet"
    otela: str | None = None  # the otela command there (default: [fleet] otela)
    # Priors of the handover estimates, until the first jobs there are measured.
    expected_queue_wait: float = 60.0
    expected_engine_start: float = 120.0
    nodes: int = 4  # nodes the partition may give this fleet (placement with "auto")


@dataclass(frozen=True)
class Fleet:
    name: str
    bootstrap: tuple[str, ...]
    ingress: tuple[str, ...]
    clusters: Mapping[str, Cluster]
    deployments: tuple[Deployment, ...]
    provider_id: str | None = None
    otela: str = "otela"
    interval: float = 15.0
    backoff: float = 30.0
    max_backoff: float = 600.0
    failure_window: float = 1800.0
    max_failures: int = 2  # failures of a deployment on one cluster before another is tried
    handover_slack: float = 30.0
    path: Path = Path("fleet.toml")

    def deployment(self, name: str) -> Deployment:
        for deployment in self.deployments:
            if deployment.name == name:
                return deployment
        raise KeyError(name)


# -- reading ------------------------------------------------------------------------------

class _Reader:
    """One table of the file: typed getters that name the field and line on error, and a
    check that nothing unknown is left over (a misspelt key must not be ignored)."""

    def __init__(self, data: Mapping[str, Any], path: tuple[str | int, ...], file: Path,
                 lines: dict[tuple[str | int, ...], int]) -> None:
        self.data, self.path, self.file, self.lines = data, path, file, lines
        self.used: set[str] = set()

    def name(self, key: str | None = None) -> str:
        parts = [*self.path, key] if key is not None else list(self.path)
        out = ""
        for part in parts:
            out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
        return out

    def error(self, key: str | None, message: str) -> FleetFileError:
        where = (*self.path, key) if key is not None else self.path
        return FleetFileError(self.file, line_of(self.lines, where), self.name(key), message)

    def has(self, key: str) -> bool:
        return key in self.data

    def raw(self, key: str) -> Any:
        self.used.add(key)
        return self.data.get(key)

    def get(self, key: str, kind: Callable[[Any], Any], default: Any = None,
            required: bool = False) -> Any:
        value = self.raw(key)
        if value is None:
            if required:
                raise self.error(key, "is required")
            return default
        try:
            return kind(value)
        except (TypeError, ValueError) as exc:
            raise self.error(key, str(exc)) from None

    def table(self, key: str) -> _Reader | None:
        value = self.raw(key)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.error(key, "must be a table")
        return _Reader(value, (*self.path, key), self.file, self.lines)

    def done(self, known: tuple[str, ...] = ()) -> None:
        for key in self.data:
            if key not in self.used and key not in known:
                raise self.error(key, "unknown field")


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"must be a string, not {type(value).__name__}")
    return value


def _name(value: Any) -> str:
    text = _text(value)
    if not NAME.match(text):
        raise ValueError(f"{text!r} is not a valid name (letters, digits, _ . -; at most 63)")
    return text


def _strings(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError("must be a string or a list of strings")
    return tuple(value)


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"must be a whole number, not {value!r}")
    if value < 0:
        raise ValueError(f"must not be negative, not {value}")
    return value


def _positive(value: Any) -> int:
    number = _count(value)
    if number == 0:
        raise ValueError("must be at least 1")
    return number


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"must be a number, not {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"must be a positive number, not {value}")
    return float(value)


def _fraction(value: Any) -> float:
    number = _number(value)
    if number >= 1:
        raise ValueError(f"must be below 1, not {number}")
    return number


def _duration(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError("must be a duration such as 90s, 15m or 2h")
    return parse_duration(str(value))


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, not {value!r}")
    return value


def _env(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ValueError("must be a table of NAME = \"value\"")
    out = {}
    for key, item in value.items():
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            raise ValueError(f"{key!r} is not an environment variable name")
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            raise ValueError(f"{key}: must be a string or a number")
        out[key] = str(item)
    return out


_SLURM_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def parse_time_limit(value: Any) -> int:
    """Seconds from a Slurm time limit: minutes as a number, or ``MM``, ``MM:SS``,
    ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``."""
    if isinstance(value, bool):
        raise ValueError("must be minutes or a Slurm time such as 04:00:00")
    if isinstance(value, int):
        seconds = value * 60
    else:
        match = _SLURM_TIME.match(str(value).strip())
        if not match:
            raise ValueError(f"{value!r} is not a Slurm time limit (minutes, HH:MM:SS or "
                             "D-HH:MM:SS)")
        days, a, b, c = match.groups()
        if days is not None:  # D-HH[:MM[:SS]]
            seconds = int(days) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
        elif c is not None:  # HH:MM:SS
            seconds = int(a) * 3600 + int(b) * 60 + int(c)
        elif b is not None:  # MM:SS
            seconds = int(a) * 60 + int(b)
        else:  # MM
            seconds = int(a) * 60
    if seconds < 60:
        raise ValueError("must be at least one minute")
    return seconds


def format_time_limit(seconds: int) -> str:
    """Seconds as Slurm's ``D-HH:MM:SS`` (whole minutes, rounded up: Slurm's unit)."""
    minutes = -(-seconds // 60)
    days, minutes = divmod(minutes, 1440)
    hours, minutes = divmod(minutes, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:00"


def _command(value: Any) -> str:
    text = _text(value).strip()
    if not text:
        raise ValueError("must not be empty")
    for name in re.findall(r"\{([^{}]*)\}", text):
        if name not in COMMAND_FIELDS:
            raise ValueError(f"unknown placeholder {{{name}}} (use "
                             f"{', '.join('{' + f + '}' for f in COMMAND_FIELDS)})")
    return text


def _container(value: Any) -> str:
    text = _text(value)
    if "{command}" not in text:
        raise ValueError("must contain {command}, where the engine command goes")
    return text


def _otela_options(reader: _Reader) -> dict[str, str]:
    """``[deployments.otela]``: otela settings for the deployment's nodes, by their config
    key (``drain_grace = 15``); each becomes its ``OTELA_*`` variable in the job."""
    from otela.config.schema import SETTINGS

    by_key = {s.key: s for s in SETTINGS}
    out = {}
    for key, value in reader.data.items():
        setting = by_key.get(key)
        if setting is None:
            raise reader.error(key, "not an otela setting (see `otela config show`)")
        reader.used.add(key)
        text = ",".join(str(v) for v in value) if isinstance(value, list) else str(value)
        if isinstance(value, bool):
            text = "true" if value else "false"
        try:
            setting.parse(value)
        except (TypeError, ValueError) as exc:
            raise reader.error(key, str(exc)) from None
        out[setting.env] = text
    return out


def load(path: Path) -> Fleet:
    """Read and check a fleet file; ``FleetFileError`` names the first problem."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise FleetFileError(path, None, "", f"cannot read: {exc.strerror or exc}") from None
    return parse(text, path)


def parse(text: str, path: Path = Path("fleet.toml")) -> Fleet:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"at line (\d+)", str(exc))
        raise FleetFileError(path, int(match.group(1)) if match else None, "",
                             f"not valid TOML: {exc}") from None
    lines = key_lines(text)
    root = _Reader(data, (), path, lines)
    top = root.table("fleet")
    if top is None:
        raise FleetFileError(path, None, "fleet", "a [fleet] table is required")
    fleet_name = top.get("name", _name, required=True)
    bootstrap = top.get("bootstrap", _strings, required=True)
    if not bootstrap:
        raise top.error("bootstrap", "needs at least one address for the jobs to join")
    ingress = top.get("ingress", _strings, required=True)
    for url in ingress:
        if not url.startswith(("http://", "https://")):
            raise top.error("ingress", f"{url!r} is not an http(s) URL")
    settings = dict(
        provider_id=top.get("provider_id", _text),
        otela=top.get("otela", _text, "otela"),
        interval=top.get("interval", _duration, 15.0),
        backoff=top.get("backoff", _duration, 30.0),
        max_backoff=top.get("max_backoff", _duration, 600.0),
        failure_window=top.get("failure_window", _duration, 1800.0),
        max_failures=top.get("max_failures", _positive, 2),
        handover_slack=top.get("handover_slack", _duration, 30.0),
    )
    top.done()

    clusters_table = root.table("clusters")
    if clusters_table is None or not clusters_table.data:
        raise FleetFileError(path, None, "clusters", "at least one [clusters.NAME] is required")
    clusters = {}
    for name in clusters_table.data:
        table = clusters_table.table(name)
        assert table is not None
        try:
            _name(name)
        except ValueError as exc:
            raise clusters_table.error(name, str(exc)) from None
        clusters[name] = _cluster(name, table)
    clusters_table.done()

    raw = root.raw("deployments")
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise root.error("deployments", "must be an array of tables ([[deployments]])")
    deployments: list[Deployment] = []
    for index, item in enumerate(raw):
        reader = _Reader(item, ("deployments", index), path, lines)
        deployment = _deployment(reader, clusters)
        if any(d.name == deployment.name for d in deployments):
            raise reader.error("name", f"{deployment.name!r} is declared twice")
        deployments.append(deployment)
    root.done()
    return Fleet(name=fleet_name, bootstrap=bootstrap, ingress=ingress, clusters=clusters,
                 deployments=tuple(deployments), path=path, **settings)


def _cluster(name: str, t: _Reader) -> Cluster:
    cluster = Cluster(
        name=name,
        ssh=t.get("ssh", _text) or None,
        ssh_options=t.get("ssh_options", _strings, ()),
        partition=t.get("partition", _text),
        account=t.get("account", _text),
        qos=t.get("qos", _text),
        time_limit=t.get("time_limit", parse_time_limit, 4 * 3600),
        gpu_type=t.get("gpu_type", _text),
        gpus_per_node=t.get("gpus_per_node", _count, 0),
        whole_nodes=t.get("whole_nodes", _bool, False),
        cpus_per_job=t.get("cpus_per_job", _positive, 8),
        memory=t.get("memory", _text),
        modules=t.get("modules", _strings, ()),
        container=t.get("container", _container),
        env=t.get("env", _env, {}),
        sbatch_args=t.get("sbatch_args", _strings, ()),
        drain_margin=t.get("drain_margin", _duration, 120.0),
        pending_limit=t.get("pending_limit", _duration, 600.0),
        serve_deadline=t.get("serve_deadline", _duration, 900.0),
        workdir=t.get("workdir", _text, "~/otela-fleet"),
        otela=t.get("otela", _text),
        expected_queue_wait=t.get("expected_queue_wait", _duration, 60.0),
        expected_engine_start=t.get("expected_engine_start", _duration, 120.0),
        nodes=t.get("nodes", _positive, 4),
    )
    t.done()
    if cluster.gpu_type is not None:
        _check_gpu_name(t, "gpu_type", cluster.gpu_type)
    if cluster.drain_margin >= cluster.time_limit:
        raise t.error("drain_margin", f"{cluster.drain_margin:g}s leaves nothing of the "
                      f"time limit ({cluster.time_limit}s)")
    if cluster.whole_nodes and cluster.gpus_per_node == 0:
        raise t.error("whole_nodes", "needs gpus_per_node (how many replicas share a node)")
    return cluster


def _need_extra(t: _Reader, key: str, extra: str, packages: tuple[str, ...],
                what: str) -> None:
    """Refuse, at check time, a setting whose machinery comes with an extra that is not
    installed (rather than failing in the running controller)."""
    import importlib.util

    missing = [p for p in packages if importlib.util.find_spec(p) is None]
    if missing:
        raise t.error(key, f"{what} needs the [{extra}] extra ({', '.join(missing)} not "
                      f"installed): pip install 'otela[{extra}]'")


def _check_gpu_name(t: _Reader, key: str, name: str) -> None:
    from otela.hardware.catalog import get_gpu

    try:
        get_gpu(name)
    except KeyError as exc:
        raise t.error(key, str(exc).strip('"')) from None


def _deployment(t: _Reader, clusters: Mapping[str, Cluster]) -> Deployment:
    name = t.get("name", _name, required=True)
    model = t.get("model", _text, required=True)
    command = t.get("command", _command, required=True)
    allowed = t.get("clusters", _strings, tuple(clusters))
    for cluster in allowed:
        if cluster not in clusters:
            raise t.error("clusters", f"unknown cluster {cluster!r} (declared: "
                          f"{', '.join(clusters)})")
    if not allowed:
        raise t.error("clusters", "must name at least one cluster")
    gpus_raw = t.raw("gpus")
    gpus: int | None
    if gpus_raw == "auto":
        gpus = None
        _need_extra(t, "gpus", "plan", ("numpy", "ortools"), 'gpus = "auto" (the placer)')
    else:
        t.used.discard("gpus")
        gpus = t.get("gpus", _count, 1)
    gpu_types = t.get("gpu_types", _strings, ())
    for gpu in gpu_types:
        _check_gpu_name(t, "gpu_types", gpu)
    replicas = t.get("replicas", _count)
    low, high = t.get("min", _count), t.get("max", _count)
    if replicas is not None and (low is not None or high is not None):
        raise t.error("replicas", "give either replicas or min/max, not both")
    if replicas is None and (low is None or high is None):
        raise t.error("replicas", "give replicas, or min and max with [deployments.autoscale]")
    if low is not None and high is not None and low > high:
        raise t.error("min", f"min ({low}) is above max ({high})")
    if high == 0:
        raise t.error("max", "must be at least 1")
    scale = t.table("autoscale")
    autoscale = None
    if scale is not None:
        if replicas is not None:
            raise scale.error(None, "autoscaling needs min and max instead of replicas")
        autoscale = Autoscale(
            target_rps=scale.get("target_rps", _number),
            target_in_flight=scale.get("target_in_flight", _number),
            ttft=scale.get("ttft", _number),
            up_cooldown=scale.get("up_cooldown", _duration, 30.0),
            down_cooldown=scale.get("down_cooldown", _duration, 300.0),
            down_window=scale.get("down_window", _duration, 120.0),
            idle_timeout=scale.get("idle_timeout", _duration, 600.0),
            tolerance=scale.get("tolerance", _fraction, 0.1),
            forecast=scale.get("forecast", _bool, False),
            forecast_bin=scale.get("forecast_bin", _duration, 60.0),
            season=scale.get("season", _duration, 86400.0),
        )
        scale.done()
        if autoscale.forecast:
            _need_extra(scale, "forecast", "sim", ("numpy",), "forecast = true (SageServe's "
                        "forecaster)")
        if autoscale.target_rps is None and autoscale.target_in_flight is None:
            raise scale.error(None, "needs target_rps or target_in_flight (load per replica)")
    elif replicas is None:
        raise t.error("max", "min/max need a [deployments.autoscale] table with a target")
    options = t.table("otela")
    deployment = Deployment(
        name=name, model=model, command=command, clusters=allowed, gpus=gpus,
        gpu_types=gpu_types, replicas=replicas, min=low, max=high, autoscale=autoscale,
        otela=_otela_options(options) if options is not None else {},
        env=t.get("env", _env, {}), rate=t.get("rate", _number),
        precision=_precision(t, command), line=line_of(t.lines, t.path))
    t.done()
    _check_shape(t, deployment, clusters)
    return deployment


def _precision(t: _Reader, command: str) -> CheckpointPrecision:
    """The checkpoint's precision. An engine command that quantizes while the deployment
    says nothing is refused: the memory check and the placer would size the model as BF16,
    refusing a quantized model that fits or giving it twice the GPUs it needs."""
    bits = {key: t.get(key, stored_bits) for key in BITS_KEYS}
    weight_format = t.get("weight_format", _text, "")
    if weight_format:
        _check_weight_format(t, weight_format)
    argv = command.split()
    quantization = option_value(argv, ("--quantization", "-q")) or ""
    if quantization.startswith("-") or quantization.lower() in ("none", "auto"):
        quantization = ""  # a flag of another engine's (-q for quiet), or no quantization
    if quantization and bits["weight_bits"] is None:
        raise t.error("command", f"quantizes the weights (--quantization {quantization}): "
                      "say what the checkpoint stores (weight_bits, act_bits, weight_format), "
                      "or the placer and the memory check size it as BF16")
    kv_dtype = option_value(argv, ("--kv-cache-dtype",)) or ""
    if kv_dtype.startswith("fp8") and bits["kv_bits"] is None:
        raise t.error("command", f"stores the KV cache in 8 bits (--kv-cache-dtype "
                      f"{kv_dtype}): say kv_bits = 8, or the placer sizes the cache as BF16")
    given = {key: value for key, value in bits.items() if value is not None}
    return CheckpointPrecision(**given, weight_format=weight_format)


def _check_weight_format(t: _Reader, name: str) -> None:
    try:
        from simulator.roofline import WEIGHT_FORMATS
    except ImportError:  # the simulator's extra is not installed: nothing reads the format
        return
    if name not in WEIGHT_FORMATS:
        raise t.error("weight_format", f"{name!r} is not one of {', '.join(WEIGHT_FORMATS)}")


def _check_shape(t: _Reader, d: Deployment, clusters: Mapping[str, Cluster]) -> None:
    """A GPU shape no allowed cluster can give, or a model no allowed GPU can hold, is an
    error now rather than a job that pends forever or an engine that dies loading."""
    hosts = [clusters[c] for c in d.clusters]
    if d.gpus is not None:
        for cluster in hosts:
            if d.gpus > cluster.gpus_per_node:
                have = (f"{cluster.gpus_per_node} GPU(s) per node" if cluster.gpus_per_node
                        else "no GPUs (gpus_per_node = 0)")
                raise t.error("gpus", f"{d.gpus} GPU(s) per replica do not fit cluster "
                              f"{cluster.name!r}, whose nodes have {have}")
    if d.gpu_types:
        from otela.hardware.catalog import get_gpu

        wanted = {get_gpu(g).key for g in d.gpu_types}
        usable = [c for c in hosts if c.gpu_type and get_gpu(c.gpu_type).key in wanted]
        if not usable:
            raise t.error("gpu_types", f"none of the allowed clusters ({', '.join(d.clusters)}) "
                          f"has {' or '.join(d.gpu_types)}")
        hosts = usable
    typed = [c for c in hosts if c.gpu_type and c.gpus_per_node]
    if typed and d.gpus != 0:
        reason = _fits_nowhere(d, typed)
        if reason is not None:
            raise t.error("model", reason)


def _fits_nowhere(d: Deployment, hosts: list[Cluster]) -> str | None:
    """Why the model fits on none of ``hosts`` (the simulator's memory plan), or ``None``
    if it fits somewhere or the simulator does not know the model (nothing to check)."""
    try:
        from simulator.api import Deployment as SimDeployment
        from simulator.api import fits
        from simulator.models import get_model
        from simulator.roofline import Precision
    except ImportError:  # the simulator's extra is not installed: nothing to check with
        return None

    try:
        get_model(d.model)
    except KeyError:
        return None
    reasons = []
    for cluster in hosts:
        assert cluster.gpu_type is not None
        sizes = [d.gpus] if d.gpus is not None else \
            [tp for tp in (1, 2, 4, 8) if tp <= cluster.gpus_per_node]
        for tp in sizes:
            ok, why = fits(SimDeployment(model=d.model, gpu=cluster.gpu_type, tp=tp,
                                         precision=Precision(**asdict(d.precision))))
            if ok:
                return None
            reasons.append(f"{cluster.name} ({cluster.gpu_type} x{tp}): {why}")
    return f"{d.model} fits no allowed GPU: " + "; ".join(reasons)

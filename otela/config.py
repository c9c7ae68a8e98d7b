"""A node's settings: one schema, four layers, and where each value came from.

Every setting is declared once in ``SETTINGS``: its TOML section and key, its
``OTELA_*`` environment variable, its type, default and help. Values are resolved with
the precedence flags > environment > config file > defaults (``resolve``), and every
value remembers its source so ``otela config show`` can explain the effective
configuration. Bad input (an unknown key, a wrong type, an unparsable environment value)
raises ``ConfigError`` naming the setting and where the bad value came from; the CLI
turns that into exit code 2 before anything starts.
"""

from __future__ import annotations

import os
import re
import socket
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otela.durations import parse_duration
from otela.paths import config_dir, default_home

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


class ConfigError(ValueError):
    """A setting has a bad value; the message names the setting and its source."""


@dataclass
class NodeConfig:
    """The resolved settings a node runs with (attribute names are the setting keys)."""

    home: Path = field(default_factory=default_home)
    listen_host: str = "0.0.0.0"
    public_host: str | None = None
    http_port: int = DEFAULT_HTTP_PORT
    p2p_port: int = DEFAULT_P2P_PORT
    bootstrap: list[str] = field(default_factory=list)
    provider_id: str | None = None
    ingress: bool = False
    status_file: Path | None = None
    process: str | None = None
    engine_url: str | None = None
    model_meta: dict[str, str] = field(default_factory=dict)
    ready_timeout: float = 1800.0
    health_interval: float = 5.0
    health_failures: int = 3
    fatal_patterns: list[str] = field(default_factory=lambda: list(DEFAULT_FATAL_PATTERNS))
    log_max_bytes: int = 50 * 1024 * 1024
    log_backups: int = 5
    log_sink: Path | None = None
    # Together below Slurm's default KillWait (30 s), so the engine is never SIGKILLed
    # by Slurm mid-drain.
    drain_grace: float = 15.0
    engine_stop_grace: float = 8.0
    slurm_drain_margin: float = 300.0
    slurm_poll_interval: float = 30.0
    hw_cpus: int | None = None
    hw_memory_gb: float | None = None
    hw_gpus: str | None = None
    leave_linger: float = 2.0
    anti_entropy_interval: float = 5.0
    log_level: str = "INFO"
    authority: str | None = None
    certificate: Path | None = None
    registry_retention: float = 24 * 3600.0
    registry_horizon: float = 48 * 3600.0
    probe_interval: float = 1.0
    suspicion_timeout: float = 6.0
    relay: bool = False
    relay_reservations: int = 2
    hole_punch: bool = True
    max_body_bytes: int = 32 * 1024 * 1024
    header_timeout: float = 10.0
    body_timeout: float = 60.0
    first_byte_timeout: float = 300.0
    max_connections_per_client: int = 256

    def advertised_host(self) -> str:
        """The address other nodes use to reach us (never a wildcard)."""
        if self.public_host:
            return self.public_host
        if self.listen_host not in ("0.0.0.0", ""):
            return self.listen_host
        try:
            return socket.gethostbyname(socket.gethostname())
        except OSError:
            return "127.0.0.1"

    @property
    def engine_log(self) -> Path:
        return self.home / "logs" / "engine.log"


def split_addresses(values: list[str]) -> list[str]:
    """Flatten repeated flags and comma/space separated env values into one list."""
    out: list[str] = []
    for value in values:
        out.extend(part for part in value.replace(",", " ").split() if part)
    return out


# -- value parsers: each takes a raw value (a str from env/flags, or a TOML value) --------


def _as_str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {type(value).__name__}")
    return value


def _as_opt_str(value: Any) -> str | None:
    text = _as_str(value)
    return text or None


def _as_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("expected an integer, got a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise ValueError(f"expected an integer, got {value!r}")


def _as_port(value: Any) -> int:
    port = _as_int(value)
    if not 0 <= port < 65536:
        raise ValueError(f"port out of range: {port}")
    return port


def _as_positive_int(value: Any) -> int:
    number = _as_int(value)
    if number < 1:
        raise ValueError(f"must be at least 1, got {number}")
    return number


def _as_float(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError("expected a number, got a boolean")
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            raise ValueError(f"expected a number, got {value!r}") from None
    else:
        raise ValueError(f"expected a number, got {type(value).__name__}")
    if number < 0:
        raise ValueError(f"must not be negative, got {number}")
    return number


def _as_opt_int(value: Any) -> int | None:
    return None if value in ("", None) else _as_positive_int(value)


def _as_opt_float(value: Any) -> float | None:
    return None if value in ("", None) else _as_float(value)


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _as_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError(f"expected true/false, got {value!r}")


def _as_path(value: Any) -> Path:
    return Path(os.path.expanduser(_as_str(value)))


def _as_opt_path(value: Any) -> Path | None:
    text = _as_str(value)
    return Path(os.path.expanduser(text)) if text else None


def _as_addresses(value: Any) -> list[str]:
    if isinstance(value, str):
        return split_addresses([value])
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return split_addresses(value)
    raise ValueError("expected a list of multiaddrs")


def _as_patterns(value: Any) -> list[str]:
    # From env or a flag a value is one regex (alternation with | covers several).
    patterns = [value] if isinstance(value, str) else value
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise ValueError("expected a list of regular expressions")
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"bad regular expression {pattern!r}: {exc}") from None
    return list(patterns)


_META_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")


def parse_model_meta(items: list[str]) -> dict[str, str]:
    """``["quantization=awq-4bit", ...]`` -> dict; rejects entries without ``=``."""
    meta: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not _META_KEY.match(key):
            raise ValueError(f"expected key=value with a simple key, got {item!r}")
        meta[key] = value.strip()
    return meta


def _as_meta(value: Any) -> dict[str, str]:
    if isinstance(value, dict):
        return parse_model_meta([f"{k}={v}" for k, v in value.items()])
    if isinstance(value, str):
        return parse_model_meta([p for p in value.split(",") if p.strip()])
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return parse_model_meta(value)
    raise ValueError("expected key=value pairs")


_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2,
               "mib": 1024**2, "g": 1000**3, "gb": 1000**3, "gib": 1024**3}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def _as_size(value: Any) -> int:
    """A byte count: an integer, or a number with a unit (``32MiB``, ``500kB``, ``1GB``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        number, unit = float(value), ""
    else:
        match = _SIZE.match(_as_str(value))
        if match is None or match.group(2).lower() not in _SIZE_UNITS:
            raise ValueError(f"expected a size such as 32MiB or 1000000, got {value!r}")
        number, unit = float(match.group(1)), match.group(2).lower()
    size = int(number * _SIZE_UNITS[unit])
    if size < 1:
        raise ValueError(f"must be at least 1 byte, got {value!r}")
    return size


def _as_duration(value: Any) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return parse_duration(str(value))
    return parse_duration(_as_str(value))


def _as_log_level(value: Any) -> str:
    level = _as_str(value).upper()
    if level not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
        raise ValueError(f"unknown log level {value!r}")
    return level


@dataclass(frozen=True)
class Setting:
    """One configurable value: where it lives in each layer and how it is parsed."""

    attr: str  # NodeConfig attribute
    section: str  # TOML table
    key: str  # TOML key and the OTELA_ suffix
    parse: Callable[[Any], Any]
    help: str

    @property
    def env(self) -> str:
        return "OTELA_" + self.key.upper()

    @property
    def default(self) -> Any:
        return getattr(NodeConfig(home=Path("~")), self.attr)


SETTINGS: tuple[Setting, ...] = (
    Setting("home", "node", "home", _as_path, "node home: identity key, logs"),
    Setting("listen_host", "node", "host", _as_str, "address to listen on (HTTP and libp2p)"),
    Setting("public_host", "node", "public_host", _as_opt_str, "address other nodes reach us at"),
    Setting("http_port", "node", "http_port", _as_port, "HTTP API port (0: any)"),
    Setting("p2p_port", "node", "p2p_port", _as_port, "libp2p TCP port (0: any)"),
    Setting("bootstrap", "node", "bootstrap", _as_addresses, "multiaddrs of peers to join"),
    Setting("provider_id", "node", "provider_id", _as_opt_str, "who contributes this node"),
    Setting("ingress", "node", "ingress", _as_bool, "mark this node as an ingress"),
    Setting("status_file", "node", "status_file", _as_opt_path, "write addresses as JSON here"),
    Setting("process", "engine", "process", _as_opt_str, "engine command to supervise"),
    Setting("engine_url", "engine", "engine_url", _as_opt_str, "engine base URL"),
    Setting("model_meta", "engine", "model_meta", _as_meta, "model metadata overrides"),
    Setting("ready_timeout", "engine", "ready_timeout", _as_float, "seconds to become ready"),
    Setting("health_interval", "engine", "health_interval", _as_float, "seconds between checks"),
    Setting(
        "health_failures",
        "engine",
        "health_failures",
        _as_positive_int,
        "failed checks in a row before fail-stop",
    ),
    Setting("fatal_patterns", "engine", "fatal_patterns", _as_patterns, "log regexes => fail-stop"),
    Setting("log_max_bytes", "logs", "log_max_bytes", _as_positive_int, "engine log size cap"),
    Setting("log_backups", "logs", "log_backups", _as_int, "rotated engine logs kept"),
    Setting("log_sink", "logs", "log_sink", _as_opt_path, "copy logs here on failure"),
    Setting("log_level", "logs", "log_level", _as_log_level, "daemon log level"),
    Setting("drain_grace", "shutdown", "drain_grace", _as_float, "seconds for in-flight work"),
    Setting(
        "engine_stop_grace",
        "shutdown",
        "engine_stop_grace",
        _as_float,
        "seconds between SIGTERM and SIGKILL",
    ),
    Setting(
        "slurm_drain_margin",
        "slurm",
        "slurm_drain_margin",
        _as_float,
        "drain this many seconds before the wall time",
    ),
    Setting(
        "slurm_poll_interval", "slurm", "slurm_poll_interval", _as_float, "squeue poll seconds"
    ),
    Setting("hw_cpus", "hardware", "cpus", _as_opt_int, "override the CPU count"),
    Setting("hw_memory_gb", "hardware", "memory_gb", _as_opt_float, "override memory (GB)"),
    Setting("hw_gpus", "hardware", "gpus", _as_opt_str, 'override GPUs, e.g. "4xA100:80"'),
    Setting("authority", "membership", "authority", _as_opt_str, "membership authority"),
    Setting("certificate", "membership", "certificate", _as_opt_path, "membership certificate"),
    Setting(
        "registry_retention", "registry", "retention", _as_duration, "LEFT nodes stay visible"
    ),
    Setting("registry_horizon", "registry", "horizon", _as_duration, "entries compacted after"),
    Setting("probe_interval", "liveness", "probe_interval", _as_duration, "probe period"),
    Setting(
        "suspicion_timeout", "liveness", "suspicion_timeout", _as_duration, "grace to refute"
    ),
)
# NAT traversal (docs/nat.md); kept in its own block so the schema above merges cleanly.
SETTINGS += (
    Setting("relay", "nat", "relay", _as_bool, "offer circuit-relay reservations to NAT'd nodes"),
    Setting(
        "relay_reservations",
        "nat",
        "relay_reservations",
        _as_positive_int,
        "relays a NAT'd node reserves a slot on",
    ),
    Setting("hole_punch", "nat", "hole_punch", _as_bool, "upgrade relayed connections (DCUtR)"),
)
# The HTTP entry points' limits (docs/security.md): what one client may cost a node.
SETTINGS += (
    Setting("max_body_bytes", "http", "max_body", _as_size, "largest request body (413)"),
    Setting("header_timeout", "http", "header_timeout", _as_duration,
            "seconds for a request's headers to arrive (408)"),
    Setting("body_timeout", "http", "body_timeout", _as_duration,
            "seconds for a request's body to arrive (408)"),
    Setting("first_byte_timeout", "http", "first_byte_timeout", _as_duration,
            "an engine silent this long after taking a request: 504"),
    Setting("max_connections_per_client", "http", "max_connections_per_client",
            _as_positive_int, "open connections one client address may hold (429)"),
)
SETTINGS_BY_ATTR = {s.attr: s for s in SETTINGS}
SETTINGS_BY_KEY = {s.key: s for s in SETTINGS}


def default_config_file() -> Path:
    return config_dir() / "config.toml"


def config_file_path(flag: Path | None, env: Mapping[str, str]) -> tuple[Path, bool]:
    """The config file to read, and whether the user named it (then it must exist)."""
    if flag is not None:
        return flag, True
    if env.get("OTELA_CONFIG"):
        return Path(env["OTELA_CONFIG"]), True
    return default_config_file(), False


def read_config_file(path: Path, required: bool) -> dict[str, Any]:
    """Flatten a TOML file to ``{attr: raw value}``; unknown tables or keys are errors."""
    if not path.exists():
        if required:
            raise ConfigError(f"config file {path} does not exist")
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    sections = {s.section for s in SETTINGS}
    out: dict[str, Any] = {}
    for section, table in data.items():
        if section not in sections or not isinstance(table, dict):
            raise ConfigError(
                f"config file {path}: unknown section [{section}] "
                f"(known: {', '.join(sorted(sections))})"
            )
        known = {s.key: s for s in SETTINGS if s.section == section}
        for key, value in table.items():
            if key not in known:
                raise ConfigError(
                    f"config file {path}: unknown key {key!r} in [{section}] "
                    f"(known: {', '.join(sorted(known))})"
                )
            out[known[key].attr] = value
    return out


@dataclass
class Resolved:
    """The effective configuration and, per attribute, which layer set it."""

    config: NodeConfig
    sources: dict[str, str]
    file: Path


def resolve(
    flags: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    config_flag: Path | None = None,
) -> Resolved:
    """Merge defaults < file < environment < flags; raise ``ConfigError`` on bad values.

    ``flags`` maps NodeConfig attributes to raw values given on the command line (only
    those the user actually gave).
    """
    env = os.environ if env is None else env
    path, required = config_file_path(config_flag, env)
    layers: list[tuple[str, Mapping[str, Any]]] = [
        (f"file {path}", read_config_file(path, required)),
        ("env", {s.attr: env[s.env] for s in SETTINGS if s.env in env}),
        ("flag", flags),
    ]
    config = NodeConfig()
    sources = {s.attr: "default" for s in SETTINGS}
    for source, values in layers:
        for attr, raw in values.items():
            setting = SETTINGS_BY_ATTR[attr]
            where = {"env": setting.env, "flag": "--" + setting.key.replace("_", "-")}.get(
                source, f"{setting.section}.{setting.key} in {source[5:]}"
            )
            try:
                value = setting.parse(raw)
            except ValueError as exc:
                raise ConfigError(f"bad value for {setting.key} ({where}): {exc}") from None
            setattr(config, attr, value)
            sources[attr] = source
    return Resolved(config, sources, path)


def render_value(value: Any) -> str:
    """A value as it would appear in TOML (for ``otela config show`` and ``otela init``)."""
    if value is None:
        return '""'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, Path):
        return _toml_string(str(value))
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_string(str(v)) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml_string(str(v))}" for k, v in value.items()) + "}"
    return _toml_string(str(value))


def _toml_string(text: str) -> str:
    # A TOML literal string needs no escaping unless it contains a single quote.
    if "'" not in text and "\n" not in text:
        return f"'{text}'"
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def render_template() -> str:
    """The commented config file ``otela init`` writes: every setting, commented out."""
    lines = [
        "# otela node configuration (TOML).",
        "# Precedence: command-line flags > OTELA_* environment variables > this file > defaults.",
        "# Every setting is listed with its default, commented out; uncomment to change it.",
        "# `otela config show` prints the effective values and where each came from.",
    ]
    section = ""
    for setting in SETTINGS:
        if setting.section != section:
            section = setting.section
            lines += ["", f"[{section}]"]
        default = setting.default
        if setting.attr == "home":
            default = default_home()
        lines.append(f"# {setting.help} (env {setting.env})")
        lines.append(f"# {setting.key} = {render_value(default)}")
    return "\n".join(lines) + "\n"

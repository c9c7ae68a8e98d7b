"""Resolving a node's settings from four layers: flags > environment > file > defaults.

Every value remembers which layer set it, so ``otela config show`` can explain the
effective configuration. Bad input (an unknown key, a wrong type, an unparsable
environment value) raises ``ConfigError`` naming the setting and where the bad value came
from, as the user wrote it: the flag, the environment variable, or the file's
``section.key``. The CLI turns that into exit code 2 before anything starts.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otela.config.schema import SETTINGS, SETTINGS_BY_ATTR, NodeConfig, Setting
from otela.paths import config_dir

CONFIG_ENV = "OTELA_CONFIG"


class ConfigError(ValueError):
    """A setting has a bad value; the message names the setting and its source."""


def default_config_file() -> Path:
    return config_dir() / "config.toml"


def config_file_path(flag: Path | None, env: Mapping[str, str]) -> tuple[Path, bool]:
    """The config file to read, and whether the user named it (then it must exist)."""
    if flag is not None:
        return flag, True
    if env.get(CONFIG_ENV):
        return Path(env[CONFIG_ENV]), True
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


def _where(setting: Setting, source: str) -> str:
    if source == "flag":
        return setting.flag or setting.env
    if source == "env":
        return setting.env
    return f"{setting.section}.{setting.key} in {source.removeprefix('file ')}"


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
            try:
                value = setting.parse(raw)
            except ValueError as exc:
                raise ConfigError(
                    f"bad value for {setting.key} ({_where(setting, source)}): {exc}"
                ) from None
            setattr(config, attr, value)
            sources[attr] = source
    if config.default_priority not in config.priority_classes:
        raise ConfigError(
            f"default_priority {config.default_priority!r} ({sources['default_priority']}) "
            f"is not one of priority_classes ({', '.join(config.priority_classes)}, "
            f"{sources['priority_classes']})")
    return Resolved(config, sources, path)

"""What a node accepts: who may assign (``--accept-assignments FROM``) and which engines
(a local allowlist of command templates). Pure: parsing of already-read text.

``FROM`` entries are peer ids (``12D3KooW...``) or authority strings
(``otela-authority:<base58 key>``, as ``otela membership init`` prints). The allowlist is a
TOML file owned by the node's operator::

    [engines.vllm]
    command = "vllm serve {model} --port {port} --tensor-parallel-size {tp}"
    models = ["meta-llama/*", "Qwen/*"]   # shell-style globs; omitted: any model id
    max_tp = 8                             # omitted: the node's GPU count

Placeholders: ``{model}``, ``{tp}``, ``{port}`` (chosen by the node, never the assigner) and
any name listed in ``params = ["max_model_len"]`` whose value the assignment supplies.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from string import Formatter
from typing import Any

from libp2p.crypto.keys import PublicKey

from otela.registry.certificate import (
    AUTHORITY_PREFIX,
    MembershipError,
    authority_id,
    parse_authority,
    peer_public_key,
)

BUILTIN_PLACEHOLDERS = frozenset({"model", "tp", "port"})


class PolicyError(ValueError):
    """A bad ``--accept-assignments`` entry or allowlist; the message says which."""


@dataclass(frozen=True)
class EngineTemplate:
    name: str
    command: str
    models: tuple[str, ...] = ()  # globs; empty: any
    max_tp: int | None = None
    params: tuple[str, ...] = ()  # extra placeholders the assigner may fill


@dataclass(frozen=True)
class Policy:
    """A node's acceptance rules. Empty `peers` and `authorities`: accept nothing."""

    node_peer_id: str
    peers: frozenset[str] = frozenset()
    authorities: Mapping[str, PublicKey] = field(default_factory=dict)  # authority id -> key
    engines: Mapping[str, EngineTemplate] = field(default_factory=dict)
    local_gpus: int = 0
    max_ttl_s: float = 3600.0  # longer-lived assignments are refused (bounds the replay memory)
    clock_skew_s: float = 300.0

    @property
    def opted_in(self) -> bool:
        return bool(self.peers or self.authorities) and bool(self.engines)


def parse_accept_from(entries: Iterable[str]) -> tuple[frozenset[str], dict[str, PublicKey]]:
    """Peer ids and authority keys from ``--accept-assignments`` values (comma-separated
    values are split too)."""
    peers: set[str] = set()
    auths: dict[str, PublicKey] = {}
    for raw in entries:
        for item in (x.strip() for x in raw.split(",")):
            if not item:
                continue
            try:
                if item.startswith(AUTHORITY_PREFIX):
                    key = parse_authority(item)
                    auths[authority_id(key)] = key
                else:
                    peer_public_key(item)
                    peers.add(item)
            except MembershipError as exc:
                raise PolicyError(f"--accept-assignments {item!r}: {exc}") from None
    return frozenset(peers), auths


def parse_allowlist(text: str, source: str = "allowlist") -> dict[str, EngineTemplate]:
    """Engine templates from the allowlist file's TOML text."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{source}: not valid TOML: {exc}") from None
    engines = data.get("engines")
    if not isinstance(engines, dict) or not engines:
        raise PolicyError(f"{source}: no [engines.NAME] tables")
    out = {}
    for name, raw in engines.items():
        where = f"{source}: engines.{name}"
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
            raise PolicyError(f"{where}: bad engine name")
        if not isinstance(raw, dict) or not isinstance(raw.get("command"), str):
            raise PolicyError(f"{where}: needs a 'command' string")
        unknown = set(raw) - {"command", "models", "max_tp", "params"}
        if unknown:
            raise PolicyError(f"{where}: unknown keys {sorted(unknown)}")
        params = tuple(str(p) for p in raw.get("params", ()))
        _check_command(raw["command"], params, where)
        max_tp = raw.get("max_tp")
        if max_tp is not None and (type(max_tp) is not int or max_tp < 1):
            raise PolicyError(f"{where}: max_tp must be a positive integer")
        models = raw.get("models", [])
        if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
            raise PolicyError(f"{where}: models must be a list of glob strings")
        out[name] = EngineTemplate(name, raw["command"], tuple(models), max_tp, params)
    return out


def _check_command(command: str, params: tuple[str, ...], where: str) -> None:
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise PolicyError(f"{where}: cannot split command: {exc}") from None
    if not argv:
        raise PolicyError(f"{where}: empty command")
    allowed = BUILTIN_PLACEHOLDERS | set(params)
    for token in argv:
        try:
            names = {f for _, f, _, _ in Formatter().parse(token) if f is not None}
        except ValueError as exc:
            raise PolicyError(f"{where}: bad placeholder in {token!r}: {exc}") from None
        bad = names - allowed
        if bad:
            raise PolicyError(f"{where}: unknown placeholders {sorted(bad)} (allowed: "
                              f"{', '.join(sorted(allowed))})")
    if "{port}" not in command:
        raise PolicyError(f"{where}: the command must take the node's {{port}}")


def describe(policy: Policy) -> dict[str, Any]:
    """For logs and `GET` views: what this node accepts (no keys)."""
    return {"peers": sorted(policy.peers), "authorities": sorted(policy.authorities),
            "engines": sorted(policy.engines), "opted_in": policy.opted_in}

"""Who may read each of a node's inspection endpoints: the vocabulary of the
``[ingress] visibility`` setting. Pure.

A node running the public ingress service (``--ingress-db``) is reached by strangers, so
what it shows them is chosen here rather than left to whatever each endpoint happens to
return. Three audiences, each seeing what the one before it sees:

- ``public``: anyone who reaches the port;
- ``key``: a holder of a usable API key (or the admin);
- ``admin``: the holder of the admin token.

A node without the ingress service has no keys and no admin, so these settings do not
apply to it: everything stays public there (docs/security.md).
"""

from __future__ import annotations

from typing import Any

from otela.config.values import pairs

PUBLIC, KEY, ADMIN = "public", "key", "admin"
LEVELS = (PUBLIC, KEY, ADMIN)  # in order: each sees what the ones before it see

# Endpoint group -> who sees it on a node running the ingress service, by default.
DEFAULTS: dict[str, str] = {
    # /v1/models, /v1/models/{id}: what a client needs to start; a key narrows it further.
    "models": PUBLIC,
    # /v1/health beyond liveness (status, state, version are always public): peer ids,
    # addresses, peers' misconduct, the ingress service's counters.
    "health": KEY,
    # /v1/registry/nodes, /v1/registry/nodes/{id}, /v1/registry/models: every member's
    # addresses, hardware and engine.
    "registry": KEY,
    # /v1/network: this node's addresses, relays, contacts and dial errors.
    "network": KEY,
    # /metrics series labelled by API key id (the node's other metrics are public). At
    # ``key`` a key holder sees only its own key's series.
    "key_metrics": ADMIN,
}


def rank(level: str) -> int:
    return LEVELS.index(level)


def parse_visibility(value: Any) -> dict[str, str]:
    """``{"network": "public", ...}``, ``"network=public,registry=admin"`` or a list of
    ``endpoint=level`` strings: the endpoints whose audience differs from ``DEFAULTS``.
    Raises ``ValueError`` naming an unknown endpoint or level."""
    out: dict[str, str] = {}
    for name, level in pairs(value, "endpoint=audience"):
        name = name.strip()
        if name not in DEFAULTS:
            raise ValueError(f"unknown endpoint {name!r} (expected one of "
                             f"{', '.join(DEFAULTS)})")
        if not isinstance(level, str) or level.strip() not in LEVELS:
            raise ValueError(f"{name}: audience must be one of {', '.join(LEVELS)}, got "
                             f"{level!r}")
        out[name] = level.strip()
    return out


def effective(overrides: dict[str, str]) -> dict[str, str]:
    """Every endpoint's audience: the defaults with ``overrides`` applied."""
    return {**DEFAULTS, **overrides}

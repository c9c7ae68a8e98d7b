"""A live federation as input: its idle nodes (the pool) and what already serves (`--from`).

`fetch_nodes` is the only I/O (``GET URL/v1/registry/nodes``); `running_replicas` is pure:
replicas that already serve a planned model count as existing capacity (the paper leaves
running replicas in place, §3.5), so the plan only fills idle nodes, and the diff says what
changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from simulator.placer.demand import Service
from simulator.placer.pool import PoolError, resolve_gpu


class FederationError(RuntimeError):
    """The federation could not be read (unreachable, not otela, bad answer)."""


def fetch_nodes(url: str, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """The registry snapshot of the node at `url` (any node holds a full replica)."""
    target = url.rstrip("/") + "/v1/registry/nodes"
    try:
        resp = httpx.get(target, timeout=timeout_s, trust_env=False)
    except httpx.HTTPError as exc:
        raise FederationError(f"cannot reach {target}: {exc}") from None
    if resp.status_code != 200:
        raise FederationError(f"{target} answered HTTP {resp.status_code}")
    try:
        nodes = resp.json()["nodes"]
    except (ValueError, KeyError, TypeError):
        raise FederationError(f"{target} did not answer with a registry snapshot") from None
    if not isinstance(nodes, list):
        raise FederationError(f"{target}: 'nodes' is not a list")
    return [n for n in nodes if isinstance(n, dict)]


@dataclass(frozen=True)
class Running:
    """A replica serving now: which planned service, on what, where."""

    service: str
    variant: str
    tp: int
    node: str


def running_replicas(nodes: Iterable[Mapping[str, Any]], services: Sequence[Service],
                     gpu_map: Mapping[str, str] | None = None) -> tuple[list[Running],
                                                                        list[str]]:
    """SERVING, non-idle nodes whose models are planned services; and notes about those
    that could not be mapped (unknown GPU)."""
    by_name = {s.name.lower(): s for s in services}
    out: list[Running] = []
    notes: list[str] = []
    for node in nodes:
        if node.get("state") != "SERVING" or node.get("idle"):
            continue
        gpus = list((node.get("hardware") or {}).get("gpus") or [])
        label = f"{node.get('provider_id', '?')}/{str(node.get('peer_id', '?'))[-8:]}"
        for model in node.get("models") or []:
            svc = by_name.get(str(model.get("id", "")).lower())
            if svc is None:
                continue
            if not gpus:
                notes.append(f"{label} serves {svc.name} without advertised GPUs: not counted")
                continue
            try:
                key = resolve_gpu(str(gpus[0].get("name", "")),
                                  int(gpus[0].get("memory_bytes") or 0), gpu_map)
            except PoolError as exc:
                notes.append(f"{label}: {exc}; its {svc.name} replica is not counted")
                continue
            tp = int(model.get("tensor_parallel") or len(gpus))
            out.append(Running(svc.name, key, tp, label))
    return out, notes


def existing_counts(running: Iterable[Running]) -> dict[tuple[str, str, int], int]:
    counts: dict[tuple[str, str, int], int] = {}
    for r in running:
        k = (r.service, r.variant, r.tp)
        counts[k] = counts.get(k, 0) + 1
    return counts

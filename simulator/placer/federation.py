"""A live federation as input: its idle nodes (the pool) and what already serves (`--from`).

`fetch_nodes` reads ``GET URL/v1/registry/nodes`` and `assignable` asks idle nodes whether
they would take an assignment (``GET /v1/assignments``); `running_replicas` is pure:
replicas that already serve a planned model count as existing capacity (the paper leaves
running replicas in place, §3.5), so the plan only fills idle nodes, and the diff says what
changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from otela.assignments.message import AUTHORITY_ISSUER
from simulator.placer.demand import Service
from simulator.placer.pool import PoolError, resolve_gpu


class FederationError(RuntimeError):
    """The federation could not be read (unreachable, not otela, bad answer)."""


def fetch_nodes(url: str, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """The registry snapshot of the node at `url` (any node holds a full replica), page
    by page."""
    target = url.rstrip("/") + "/v1/registry/nodes"
    nodes: list[dict[str, Any]] = []
    after: str | None = None
    while True:
        page, after = _fetch_page(target, after, timeout_s)
        nodes += page
        if not after:
            return nodes


def _fetch_page(target: str, after: str | None, timeout_s: float
                ) -> tuple[list[dict[str, Any]], str | None]:
    params: dict[str, str | int] = {"limit": 1000}
    if after:
        params["after"] = after
    try:
        resp = httpx.get(target, params=params, timeout=timeout_s, trust_env=False)
    except httpx.HTTPError as exc:
        raise FederationError(f"cannot reach {target}: {exc}") from None
    if resp.status_code != 200:
        raise FederationError(f"{target} answered HTTP {resp.status_code}")
    try:
        answer = resp.json()
        nodes, following = answer["nodes"], answer.get("next_after")
    except (ValueError, KeyError, TypeError, AttributeError):
        raise FederationError(f"{target} did not answer with a registry snapshot") from None
    if not isinstance(nodes, list):
        raise FederationError(f"{target}: 'nodes' is not a list")
    return [n for n in nodes if isinstance(n, dict)], \
        following if isinstance(following, str) and following else None


def _is_idle(node: Mapping[str, Any]) -> bool:
    return bool(node.get("idle")) and node.get("state") in ("JOIN", "SERVING")


def accepts(policy: Any, issuer: str, engine: str) -> str | None:
    """Why a node whose ``GET /v1/assignments`` answered `policy` would refuse an
    assignment from `issuer` for `engine`; None if it would take it."""
    if not isinstance(policy, dict) or not policy.get("accepting"):
        return "does not accept assignments (no --accept-assignments)"
    if policy.get("busy"):
        return "already runs an engine"
    if issuer.startswith(AUTHORITY_ISSUER):
        if issuer[len(AUTHORITY_ISSUER):] not in (policy.get("authorities") or []):
            return "does not accept assignments from this authority"
    elif issuer not in (policy.get("peers") or []):
        return "does not accept assignments from this planner"
    if engine not in (policy.get("engines") or []):
        return f"has no engine {engine!r} in its allowlist"
    return None


def assignable(nodes: Sequence[dict[str, Any]], issuer: str, engine: str,
               timeout_s: float = 5.0) -> tuple[list[dict[str, Any]], list[str]]:
    """`nodes` without the idle ones that would refuse an assignment from `issuer` for
    `engine` (asked concurrently), and a note for each left out: a plan to be assigned must
    never count on a node whose owner did not opt in."""
    idle = [n for n in nodes if _is_idle(n)]

    def ask(node: dict[str, Any]) -> str | None:
        if not node.get("http_url"):
            return "advertises no HTTP URL to send an assignment to"
        url = str(node["http_url"]).rstrip("/") + "/v1/assignments"
        try:
            resp = httpx.get(url, timeout=timeout_s, trust_env=False)
            policy = resp.json() if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError) as exc:
            return f"unreachable at {url} ({type(exc).__name__})"
        if policy is None:
            return f"answered HTTP {resp.status_code} at {url}"
        return accepts(policy, issuer, engine)

    with ThreadPoolExecutor(max_workers=min(16, max(1, len(idle)))) as pool:
        verdicts = dict(zip((id(n) for n in idle), pool.map(ask, idle), strict=True))
    kept, notes = [], []
    for node in nodes:
        why = verdicts.get(id(node))
        if why is None:
            kept.append(node)
        else:
            label = f"{node.get('provider_id', '?')}/{str(node.get('peer_id', '?'))[-8:]}"
            notes.append(f"{label} left out of the pool: {why}")
    return kept, notes


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

"""Assemble ``GET /v1/network``: what this node knows about its own and its peers'
connectivity (addresses, reachability, relay reservations, contacts, dial errors, hole
punching), with the verdicts of ``otela.doctor``. Read-only: nothing here changes state."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from otela.doctor import peer_verdict, self_verdict
from otela.mesh.nat import NatTraversal
from otela.mesh.netlog import NetLog
from otela.registry.records import display_state
from otela.registry.store import Registry


def peer_report(
    peer_id: str, registry: Registry, netlog: NetLog, suspected: Collection[str]
) -> dict[str, Any]:
    """One peer: its newest registry session, our log of it, and a verdict."""
    sessions = [r for r in registry.snapshot() if r.peer_id == peer_id]
    record = max(sessions, key=lambda r: (r.updated_at, r.version), default=None)
    entry = registry.entry(record.session_id) if record else None
    log = netlog.get(peer_id)
    out: dict[str, Any] = {
        "peer_id": peer_id,
        "record": {**record.to_dict(), "display_state": display_state(record)} if record
        else None,
        "evicted_by": entry.evicted_by if entry else None,
        "left_at": entry.updated_at if entry and record and record.state.name == "LEFT" else None,
        "suspected": peer_id in suspected,
        "log": log.to_dict() if log else None,
    }
    out["verdict"] = peer_verdict(out)
    return out


def network_report(
    *,
    peer_id: str,
    addrs: list[str],
    nat: NatTraversal,
    netlog: NetLog,
    registry: Registry,
    suspected: Collection[str],
    bootstrap: list[dict[str, Any]],
    connected: int,
    data_path: dict[str, Any],
    liveness: dict[str, Any] | None = None,
    peer: str | None = None,
) -> dict[str, Any]:
    report: dict[str, Any] = {
        "self": {"peer_id": peer_id, "addrs": addrs},
        "nat": nat.report(),
        "bootstrap": bootstrap,
        "connected_peers": connected,
        "data_path": data_path,
        "peers": {pid: log.to_dict() for pid, log in netlog.peers().items()},
        "liveness": liveness or {},
    }
    report["verdict"] = self_verdict(report)
    if peer is not None:
        report["peer"] = peer_report(peer, registry, netlog, suspected)
        report["peer"]["liveness_events"] = [
            e for e in (liveness or {}).get("events", []) if e.get("peer_id") == peer
        ]
    return report

"""How this node routes, as ``/v1/network`` and ``/metrics`` report it: the policy, the
trust set, the nodes ejected now (by this process or any data-path worker), the loads seen
and the capacity claims as checked."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import trio

from otela.load.reports import LoadReports
from otela.load.source import LoadSource
from otela.registry.store import Registry
from otela.routing.admission import AdmissionQueue
from otela.routing.router import Router
from otela.workers.control import WorkerPool


class RoutingStatus:
    def __init__(self, router: Router, registry: Callable[[], Registry], load: LoadSource,
                 load_reports: LoadReports, workers: WorkerPool | None,
                 queue: AdmissionQueue | None = None) -> None:
        self.router = router
        self.queue = queue  # the ingress queue (fair sharing) of this process
        self.registry = registry
        self.load = load
        self.load_reports = load_reports
        self.workers = workers

    def ejected_nodes(self) -> dict[str, dict[str, float]]:
        """Nodes ejected now by any of this node's data-path processes (the longest
        remaining ejection of each)."""
        merged = dict(self.router.ejections.report(trio.current_time()))
        for report in self.workers.reports() if self.workers else ():
            for session, ejection in report.get("ejected", {}).items():
                if session not in merged or \
                        ejection["remaining_s"] > merged[session]["remaining_s"]:
                    merged[session] = ejection
        return merged

    def cache_decisions(self) -> Counter[str]:
        """How cache_aware placed requests, in this process and every data-path worker."""
        total = Counter(self.router.cache.stats)
        for worker in self.workers.workers if self.workers else ():
            total.update({k.removeprefix("cache_"): int(v) for k, v in worker.report.items()
                          if k.startswith("cache_")})
        return total

    def stats(self) -> dict[str, int]:
        """``ejections`` so far, ``ejected`` nodes now, and the load reports' counters."""
        ejections = self.router.ejections.total + (
            self.workers.total("ejections") if self.workers else 0)
        cache = self.load_reports.cache
        decisions = self.cache_decisions()
        return {"ejections": ejections, "ejected": len(self.ejected_nodes()),
                **self.load_reports.stats,
                "cache_routed": decisions["cache_hit_routed"],
                "cache_load_won": decisions["load_won"],
                "cache_fallback": decisions["fallback"],
                "cache_blocks": len(cache.blocks) if cache is not None else 0,
                "cache_anchors": len(cache.anchors) if cache is not None else 0}

    def report(self) -> dict[str, Any]:
        """For /v1/network: how this node routes, whom it keeps out, what loads it sees."""
        router = self.router
        return {"policy": router.policies.default.name,
                "trusted_providers": None if router.trust.providers is None
                else sorted(router.trust.providers),
                "ejected": self.ejected_nodes(),
                "loads": router.loads.snapshot(trio.current_time()),
                # Capacity claims as checked (``otela.routing.speed``): the share of its
                # claimed weight each node keeps for how fast it answers here.
                "speed_factors": {r.session_id: f for r in self.registry()
                                  if (f := router.speeds.report(r.session_id))},
                "own_load": self.load.current().to_dict(),
                "engine_metrics": self.load.engine_source,
                "load_reports": dict(self.load_reports.stats),
                # requests waiting here for room, per model and class (this process's)
                "queue": self.queue.waiting() if self.queue is not None else {},
                # cache_aware: each serving node's KV-cache summary as held here, and how
                # this process's requests were placed (by cache, or load won, or fallback)
                "cache": {"nodes": router.cache.board.report(trio.current_time()),
                          "decisions": dict(self.cache_decisions()),
                          "own": None if self.load_reports.cache is None else
                          self.load_reports.cache.report()}}

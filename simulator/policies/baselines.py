"""Routing rules over `EndpointView`s and the static-deployment baseline.

The routers are the baselines the papers compare against (round-robin, least-loaded /
join-the-shortest-queue); they read only `EndpointView`, so the federation's router could use
them as they are. `StaticPolicy` is "vLLM (static)" in OSERVE's terms and the dedicated
deployment in Prism's: a fixed set of replicas per model for the whole run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from simulator.policies.cluster import BasePolicy, Cluster, Instance, PolicyError
from simulator.policies.interfaces import EndpointView, RequestInfo, Shape


class RoundRobin:
    """Cycle through the endpoints (per model), skipping none."""

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def choose(
        self, request: RequestInfo, endpoints: Sequence[EndpointView], now: float
    ) -> int | None:
        if not endpoints:
            return None
        i = self._next.get(request.model, 0) % len(endpoints)
        self._next[request.model] = i + 1
        return endpoints[i].id


class LeastLoaded:
    """Fewest requests queued or running; ties to the lowest id (OpenTela's shortest queue)."""

    def choose(
        self, request: RequestInfo, endpoints: Sequence[EndpointView], now: float
    ) -> int | None:
        if not endpoints:
            return None
        return min(endpoints, key=lambda e: (e.outstanding, e.id)).id


ROUTERS: Mapping[str, Callable[[], Any]] = {
    "round_robin": RoundRobin,
    "least_loaded": LeastLoaded,
}


def make_router(name: str) -> RoundRobin | LeastLoaded:
    key = name.lower().replace("-", "_")
    if key in ("least_outstanding", "shortest_queue", "llf"):
        key = "least_loaded"
    if key in ("rr",):
        key = "round_robin"
    if key not in ROUTERS:
        raise PolicyError(f"unknown router {name!r}; choose from {', '.join(ROUTERS)}")
    router: RoundRobin | LeastLoaded = ROUTERS[key]()
    return router


def request_info(cluster: Cluster, r: int, now: float) -> RequestInfo:
    """The router's view of request r."""
    b, wl = cluster.wl.base, cluster.wl
    return RequestInfo(
        model=wl.model_name(r),
        input_tokens=int(b.input_len[r]),
        output_tokens=int(b.output_len[r]),
        tier=wl.tier_name(r),
        arrival=now,
    )


def by_id(endpoints: Sequence[Instance], eid: int | None) -> Instance | None:
    if eid is None:
        return None
    for e in endpoints:
        if e.id == eid:
            return e
    raise PolicyError(f"router chose endpoint {eid}, which is not offered")


class StaticPolicy(BasePolicy):
    """Fixed replicas per model for the whole run, behind one router.

    `layout` maps each model to the shapes of its replicas. Replicas are placed on the pool's
    hosts in order (first fit); the run fails if they do not fit.
    """

    def __init__(
        self, layout: Mapping[str, Sequence[Shape]], router: str = "least_loaded",
        name: str = "static",
    ) -> None:
        self.layout = {m: list(s) for m, s in layout.items()}
        self.router_name = router
        self.router = make_router(router)
        self.name = name

    def start(self, cluster: Cluster, now: float) -> None:
        for model, shapes in self.layout.items():
            for shape in sorted(shapes, key=lambda s: -s.gpus):
                cluster.launch(model, shape, now)

    def on_arrival(self, cluster: Cluster, r: int, now: float) -> None:
        info = request_info(cluster, r, now)
        eps = cluster.endpoints(info.model)
        fitting = [e for e in eps if e.max_sequence >= info.input_tokens + info.output_tokens]
        target = by_id(fitting or eps, self.router.choose(info, fitting or eps, now))
        if target is None:
            raise PolicyError(f"no replica serves model {info.model!r}")
        cluster.dispatch(r, target, now)

    def notes(self) -> dict[str, Any]:
        return {
            "layout": {m: [s.label for s in shapes] for m, shapes in self.layout.items()},
            "router": self.router_name,
        }

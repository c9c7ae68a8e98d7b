"""The seams between a policy's decisions and whatever carries them out.

Every companion policy makes two kinds of decision: *routing* (which endpoint serves this
request, or hold it) and *lifecycle* (launch, drain, merge or split replicas, evict or
activate a model). In the simulator both act on `simulator.policies.cluster.Cluster`. The
live federation would implement the same protocols: `EndpointView` from its registry
snapshot (otela/registry: a node's model, GPUs, in-flight count and KV use), `RequestRouter`
inside the routing step (otela/routing), and `ClusterControl` by sending signed assignments
(otela/assignments, as `otela plan --assign` does) and waiting for nodes to report ready.
Nothing here imports the simulator's engine, so the federation can depend on this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class RequestInfo:
    """What a router knows about a request when it arrives.

    `output_tokens` is the known length in simulation; the live federation has only the
    client's `max_tokens` (or a length predictor), which is what it would pass here.
    """

    model: str
    input_tokens: int
    output_tokens: int
    tier: str = "default"
    arrival: float = 0.0


@dataclass(frozen=True)
class Shape:
    """A replica's parallel layout on one GPU type: TP x PP GPUs."""

    gpu: str
    tp: int = 1
    pp: int = 1

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    @property
    def label(self) -> str:
        return f"TP{self.tp}" + (f"PP{self.pp}" if self.pp > 1 else "")


@runtime_checkable
class EndpointView(Protocol):
    """What a routing or lifecycle decision may read about one serving replica."""

    @property
    def id(self) -> int: ...

    @property
    def model(self) -> str: ...

    @property
    def shape(self) -> Shape: ...

    @property
    def outstanding(self) -> int:
        """Requests queued or running."""
        ...

    @property
    def kv_used_fraction(self) -> float:
        """Share of the KV pool in use (SageServe's 'effective memory utilization')."""
        ...

    @property
    def max_sequence(self) -> int:
        """Longest prompt + output this replica can hold."""
        ...

    def ready(self, now: float) -> bool:
        """Serving (not provisioning, transforming or draining)."""
        ...


class RequestRouter(Protocol):
    """Chooses an endpoint for a request, or None to hold it (queue manager, admission)."""

    def choose(
        self, request: RequestInfo, endpoints: Sequence[EndpointView], now: float
    ) -> int | None: ...


class ClusterControl(Protocol):
    """Lifecycle actions a controller takes; returns are endpoint ids."""

    def launch(
        self, model: str, shape: Shape, now: float, delay_s: float = 0.0, host: int | None = None
    ) -> int: ...

    def drain(self, endpoint: int, now: float) -> None:
        """Stop routing to the endpoint; release its GPUs once its requests finish."""
        ...

    def endpoints(self, model: str | None = None) -> Sequence[EndpointView]: ...

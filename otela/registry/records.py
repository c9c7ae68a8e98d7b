"""Node records: what one node says about itself, and the order in which its updates win.

A record is owned by exactly one node session. The owner is the only writer: every
change bumps ``version``; replicas keep the record with the highest (version, state)
pair, so duplicated, reordered or late gossip converges to the owner's latest word.
This module is pure (no I/O, no clock reads): callers pass times in.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, replace
from typing import Any

from otela.names import model_id_problem

# Integers in records (versions, counts, sizes) stay below 2**63: every replica re-encodes
# them (msgpack, SQLite, JSON for other languages), and a member announcing 2**64 or
# ``inf`` must be refused at parsing, not crash a replica or poison its anti-entropy.
MAX_INT = 2**63 - 1

# What one node may announce about itself (docs/security.md#a-member-that-lies-about-
# itself). Every replica holds every member's record, so these bound what one member costs
# all of them; they sit far above what an honest node announces (a node with 8 GPUs, 10
# models with metadata and 10 addresses: ~4 KB; a typical one ~0.8 KB). The record's
# encoded size is capped as well (``otela.registry.wire.MAX_RECORD_BYTES``).
MAX_MODELS = 64
MAX_META = 16  # key=value pairs per model
MAX_GPUS = 64
MAX_ADDRS = 16  # listen addresses, and as many relay circuit addresses
MAX_TEXT = 256  # provider, engine, GPU names, metadata keys and values, Slurm fields
MAX_ADDR_TEXT = 512  # one multiaddr or URL


def count(value: Any, name: str) -> int:
    """A non-negative integer field below ``MAX_INT``; ``ValueError`` for anything else
    (``int(inf)`` raises ``OverflowError``, which callers would not expect)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name} is not a finite number")
    number = int(value)
    if not 0 <= number <= MAX_INT:
        raise ValueError(f"{name} {number} is out of range")
    return number


def finite(value: Any, name: str) -> float:
    """A finite float field (times): nan compares false with everything, so a record
    signed at nan would never be compacted nor refused as too old or too new."""
    try:
        number = float(value)
    except OverflowError as exc:  # an integer too large for a float
        raise ValueError(f"{name} is out of range") from exc
    if not math.isfinite(number):
        raise ValueError(f"{name} is not a finite number")
    return number


def optional_count(value: Any, name: str) -> int | None:
    return None if value is None else count(value, name)


def text(value: Any, name: str, limit: int = MAX_TEXT) -> str:
    """A string field of at most ``limit`` characters; ``ValueError`` otherwise."""
    string = str(value)
    if len(string) > limit:
        raise ValueError(f"{name} is longer than {limit} characters")
    return string


def optional_text(value: Any, name: str, limit: int = MAX_TEXT) -> str | None:
    return None if value is None else text(value, name, limit)


def bounded(items: Any, name: str, limit: int) -> list[Any]:
    """A list field of at most ``limit`` items; ``ValueError`` otherwise."""
    values = list(items)
    if len(values) > limit:
        raise ValueError(f"more than {limit} {name}")
    return values


class Lifecycle(enum.IntEnum):
    """Node lifecycle, strictly ordered: a node only ever moves forward (paper §3.4)."""

    JOIN = 0
    SERVING = 1
    DOWN = 2
    LEFT = 3

    @classmethod
    def parse(cls, name: str) -> Lifecycle:
        return cls[name.upper()]


@dataclass(frozen=True, slots=True)
class Hardware:
    """A summary of what the node contributes; enough for routing and placement to read."""

    cpus: int = 0
    memory_bytes: int = 0
    gpus: tuple[GPU, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "cpus": self.cpus,
            "memory_bytes": self.memory_bytes,
            "gpus": [g.to_dict() for g in self.gpus],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Hardware:
        return cls(
            cpus=count(data.get("cpus", 0), "cpus"),
            memory_bytes=count(data.get("memory_bytes", 0), "memory_bytes"),
            gpus=tuple(GPU.from_dict(g) for g in bounded(data.get("gpus", ()), "gpus",
                                                          MAX_GPUS)),
        )


@dataclass(frozen=True, slots=True)
class GPU:
    name: str
    memory_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "memory_bytes": self.memory_bytes}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GPU:
        return cls(name=text(data["name"], "GPU name"),
                   memory_bytes=count(data.get("memory_bytes", 0), "memory_bytes"))


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """One model id served by a node, as its engine reports it.

    Beyond the id, the execution details the OpenAI API hides (paper §7.1) so routing can
    use them later: numeric format, quantization, tensor-parallel degree; ``meta`` holds
    any further provider-declared ``key=value`` pairs (``--model-meta``).
    """

    id: str
    max_context: int | None = None
    dtype: str | None = None
    quantization: str | None = None
    tensor_parallel: int | None = None
    meta: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "max_context": self.max_context,
            "dtype": self.dtype,
            "quantization": self.quantization,
            "tensor_parallel": self.tensor_parallel,
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelInfo:
        ctx = data.get("max_context")
        tp = data.get("tensor_parallel")
        meta = dict(data.get("meta") or {})
        model_id = str(data["id"])
        problem = model_id_problem(model_id)
        if problem is not None:
            raise ValueError(f"model {model_id[:100]!r}: {problem}")
        bounded(meta, "metadata pairs", MAX_META)
        return cls(
            id=model_id,
            max_context=optional_count(ctx, "max_context"),
            dtype=optional_text(data.get("dtype"), "dtype"),
            quantization=optional_text(data.get("quantization"), "quantization"),
            tensor_parallel=optional_count(tp, "tensor_parallel"),
            meta=tuple(sorted((text(k, "metadata key"), text(v, "metadata value"))
                              for k, v in meta.items())),
        )


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """The Slurm allocation a node runs in, so operators and placers can see it."""

    job_id: str
    partition: str | None = None
    node_list: str | None = None
    cpus: int | None = None
    gpus: int | None = None
    end_time: float | None = None  # unix seconds, when known

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "partition": self.partition,
            "node_list": self.node_list,
            "cpus": self.cpus,
            "gpus": self.gpus,
            "end_time": self.end_time,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SlurmJob:
        def opt_int(key: str) -> int | None:
            return optional_count(data.get(key), key)

        def opt_str(key: str) -> str | None:
            return optional_text(data.get(key), key)

        end = data.get("end_time")
        return cls(
            job_id=text(data["job_id"], "job_id"),
            partition=opt_str("partition"),
            node_list=opt_str("node_list"),
            cpus=opt_int("cpus"),
            gpus=opt_int("gpus"),
            end_time=None if end is None else finite(end, "end_time"),
        )


@dataclass(frozen=True, slots=True)
class FleetTag:
    """Which ``otela fleet`` deployment and Slurm job a node belongs to.

    The fleet controller keeps no state of its own: after a restart it matches the
    registry's nodes to the jobs it finds in Slurm by this tag (``spec`` is the hash of
    what defines the replica, so it can tell old replicas of a rolled deployment from new
    ones).
    """

    fleet: str
    deployment: str
    spec: str
    cluster: str
    job_id: str

    def to_dict(self) -> dict[str, Any]:
        return {"fleet": self.fleet, "deployment": self.deployment, "spec": self.spec,
                "cluster": self.cluster, "job_id": self.job_id}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FleetTag:
        return cls(fleet=text(data["fleet"], "fleet"),
                   deployment=text(data["deployment"], "deployment"),
                   spec=text(data["spec"], "spec"), cluster=text(data["cluster"], "cluster"),
                   job_id=text(data["job_id"], "job_id"))


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """Everything the federation knows about one node session.

    ``session_id`` is new on every start, so a restarted node is a new entry and never
    resurrects an old one; ``peer_id`` is the persistent libp2p identity whose key signs
    the record.
    """

    session_id: str
    peer_id: str
    provider_id: str
    state: Lifecycle
    version: int
    http_url: str
    addrs: tuple[str, ...] = ()
    hardware: Hardware = field(default_factory=Hardware)
    models: tuple[ModelInfo, ...] = ()
    ingress: bool = False
    engine: str | None = None
    updated_at: float = 0.0
    idle: bool = False  # no engine: advertised as capacity for a placer to fill (paper §4)
    slurm: SlurmJob | None = None
    # NAT traversal (docs/nat.md): how peers can reach this node. ``reachability`` is one of
    # ``REACHABILITY``; ``circuit_addrs`` are ``/p2p-circuit`` addresses through relays this
    # node holds a reservation on; ``relay`` says the node offers reservations itself.
    reachability: str = "unknown"
    relay: bool = False
    circuit_addrs: tuple[str, ...] = ()
    fleet: FleetTag | None = None  # started by ``otela fleet`` (docs/fleet.md)

    def evolve(self, *, now: float, **changes: Any) -> NodeRecord:
        """The owner's next version of this record, with ``changes`` applied."""
        return replace(self, version=self.version + 1, updated_at=now, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "peer_id": self.peer_id,
            "provider_id": self.provider_id,
            "state": self.state.name,
            "version": self.version,
            "http_url": self.http_url,
            "addrs": list(self.addrs),
            "hardware": self.hardware.to_dict(),
            "models": [m.to_dict() for m in self.models],
            "ingress": self.ingress,
            "engine": self.engine,
            "updated_at": self.updated_at,
            "idle": self.idle,
            "slurm": None if self.slurm is None else self.slurm.to_dict(),
            "reachability": self.reachability,
            "relay": self.relay,
            "circuit_addrs": list(self.circuit_addrs),
            "fleet": None if self.fleet is None else self.fleet.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NodeRecord:
        """Parse a record; raises ``KeyError``/``ValueError``/``TypeError`` on bad input."""
        models = bounded(data.get("models", ()), "models", MAX_MODELS)
        return cls(
            session_id=text(data["session_id"], "session_id"),
            peer_id=text(data["peer_id"], "peer_id"),
            provider_id=text(data["provider_id"], "provider_id"),
            state=Lifecycle.parse(str(data["state"])),
            version=count(data["version"], "version"),
            http_url=text(data["http_url"], "http_url", MAX_ADDR_TEXT),
            addrs=_addresses(data.get("addrs", ()), "addrs"),
            hardware=Hardware.from_dict(dict(data.get("hardware") or {})),
            models=tuple(ModelInfo.from_dict(dict(m)) for m in models),
            ingress=bool(data.get("ingress", False)),
            engine=optional_text(data.get("engine"), "engine"),
            updated_at=finite(data.get("updated_at", 0.0), "updated_at"),
            idle=bool(data.get("idle", False)),
            slurm=None if not data.get("slurm") else SlurmJob.from_dict(dict(data["slurm"])),
            reachability=_reachability(data.get("reachability", "unknown")),
            relay=bool(data.get("relay", False)),
            circuit_addrs=_addresses(data.get("circuit_addrs", ()), "circuit_addrs"),
            fleet=None if not data.get("fleet") else FleetTag.from_dict(dict(data["fleet"])),
        )

    def needs_relayed_path(self) -> bool:
        """Whether peers must reach this node over libp2p (relay/hole punch), not plain HTTP."""
        return self.reachability in (PRIVATE_RELAYED, UNREACHABLE)


def display_state(record: NodeRecord) -> str:
    """The lifecycle state as people should read it.

    A node without an engine never leaves JOIN (nothing to serve), which read as stuck in
    ``otela demo`` and the registry views. Views show what it is instead: ``INGRESS`` (it
    routes, by design serves nothing itself) or ``IDLE`` (capacity waiting for a placer's
    assignment). Views only: the record, its wire form and the lattice
    JOIN < SERVING < DOWN < LEFT are unchanged, and routing reads ``state``.
    """
    if record.state is Lifecycle.JOIN and record.idle and not record.models:
        return "INGRESS" if record.ingress else "IDLE"
    return record.state.name


PUBLIC = "public"
PRIVATE_RELAYED = "private-relayed"
UNREACHABLE = "unreachable"
UNKNOWN = "unknown"
REACHABILITY = (PUBLIC, PRIVATE_RELAYED, UNREACHABLE, UNKNOWN)


def _addresses(items: Any, name: str) -> tuple[str, ...]:
    return tuple(text(a, name, MAX_ADDR_TEXT) for a in bounded(items, name, MAX_ADDRS))


def _reachability(value: Any) -> str:
    text = str(value)
    if text not in REACHABILITY:
        raise ValueError(f"unknown reachability {text!r} (expected one of {REACHABILITY})")
    return text

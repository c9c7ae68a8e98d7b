"""The pool a plan fills: hosts, each with GPUs of one type and an interconnect.

Pure: parsing a pool file's already-loaded mapping, or a federation's registry records, into
`Pool`. A *variant* is a catalog GPU with the host's interconnect (a TP group is priced with
the bandwidth of the host it runs on), and a *host class* groups identical hosts so the
constraint model stays small on pools of thousands of GPUs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from otela.hardware.catalog import GPU, get_gpu, list_gpus


class PoolError(ValueError):
    """A pool that cannot be used; the message says which entry and why."""


INTERCONNECT_NAMES: Mapping[str, float | None] = {
    "nvlink": None,  # the catalog's intra-node figure for that GPU
    "default": None,
    "pcie4": 64.0,  # GB/s bidirectional, as the catalog quotes interconnects
    "pcie": 64.0,
    "pcie5": 128.0,
}


@dataclass(frozen=True)
class Variant:
    """A GPU type as the simulator prices it: catalog key plus the host's interconnect."""

    gpu: str  # catalog key
    interconnect_gbs: float | None = None  # None: the catalog's value

    @property
    def name(self) -> str:
        if self.interconnect_gbs is None:
            return self.gpu
        return f"{self.gpu}@{self.interconnect_gbs:g}GBs"

    def spec(self) -> GPU:
        """The simulator's GPU with this interconnect (bidirectional GB/s, as in the catalog)."""
        base = get_gpu(self.gpu)
        if self.interconnect_gbs is None:
            return base
        return replace(base, interconnect_bw=self.interconnect_gbs * 1e9)


@dataclass(frozen=True)
class Host:
    """One machine (or one Slurm node, or one idle otela node): GPUs of one variant."""

    name: str
    variant: Variant
    gpus: int
    partition: str | None = None
    constraint: str | None = None
    peer_id: str | None = None  # an idle otela node: who to send an assignment to
    http_url: str | None = None
    provider_id: str | None = None
    one_engine: bool = False  # an otela node runs one engine: one replica, whatever its GPUs


@dataclass(frozen=True)
class HostClass:
    """Identical hosts (same variant, same GPU count, same one-engine rule): the model
    reasons about classes."""

    variant: Variant
    gpus_per_host: int
    hosts: tuple[Host, ...]
    one_engine: bool = False

    @property
    def count(self) -> int:
        return len(self.hosts)


@dataclass(frozen=True)
class Pool:
    hosts: tuple[Host, ...]
    skipped: tuple[str, ...] = field(default=())  # entries not usable, with the reason

    def classes(self) -> list[HostClass]:
        groups: dict[tuple[Variant, int, bool], list[Host]] = {}
        for h in self.hosts:
            groups.setdefault((h.variant, h.gpus, h.one_engine), []).append(h)
        return [
            HostClass(v, g, tuple(hs), one)
            for (v, g, one), hs in sorted(groups.items(),
                                          key=lambda kv: (kv[0][0].name, kv[0][1], kv[0][2]))
        ]

    def variants(self) -> list[Variant]:
        return sorted({h.variant for h in self.hosts}, key=lambda v: v.name)

    def gpus_of(self, variant: Variant) -> int:
        return sum(h.gpus for h in self.hosts if h.variant == variant)

    @property
    def total_gpus(self) -> int:
        return sum(h.gpus for h in self.hosts)

    def summary(self) -> str:
        parts = [f"{self.gpus_of(v)}x{v.name}" for v in self.variants()]
        return f"{self.total_gpus} GPUs on {len(self.hosts)} hosts ({', '.join(parts)})"


# ---- GPU names ----------------------------------------------------------------------------

_FAMILY = re.compile(r"(gh200|gb200|h200|h100|h20|b200|a100|a10g|a10|l40s|l4|v100|t4|"
                     r"mi300x|mi325x|rtx\s*4090|rtx\s*3090|4090|3090)")


def resolve_gpu(name: str, memory_bytes: int = 0,
                aliases: Mapping[str, str] | None = None) -> str:
    """The catalog key for a GPU name as a node reports it (``NVIDIA A100-SXM4-80GB``).

    Exact keys and catalog aliases first, then the operator's `aliases` map, then the
    family in the name (A100, GH200, ...) with the memory size and form factor deciding
    between catalog entries. Raises PoolError naming the GPU when nothing matches, so an
    operator can add ``--gpu-map NAME=KEY``.
    """
    if aliases and name in aliases:
        return get_gpu(aliases[name]).key
    try:
        return get_gpu(name).key
    except KeyError:
        pass
    low = name.lower()
    found = _FAMILY.search(low)
    if not found:
        raise PoolError(f"unknown GPU {name!r}: map it to a catalog key with --gpu-map "
                        f"'{name}=KEY' (`otela sim list` shows the keys)")
    family = found.group(1).replace(" ", "").replace("rtx", "")
    candidates = [g for g in list_gpus() if _family_of(g.key) == family]
    if not candidates:
        raise PoolError(f"GPU {name!r} ({family}) is not in the simulator's catalog")
    pcie = "pcie" in low
    mem_gb = memory_bytes / 1e9 if memory_bytes else 0.0

    def score(g: GPU) -> tuple[float, int]:
        mem_err = abs(g.runtime_bytes / 1e9 - mem_gb) if mem_gb else 0.0
        form = 0 if ("pcie" in g.key) == pcie else 1
        return (mem_err, form)

    return min(candidates, key=score).key


def _family_of(key: str) -> str:
    found = _FAMILY.search(key.lower())
    return found.group(1).replace(" ", "").replace("rtx", "") if found else key


def parse_interconnect(value: Any) -> float | None:
    """``nvlink``/omitted = catalog value; ``pcie4``/``pcie5``; or a number of GB/s."""
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        if value <= 0:
            raise PoolError(f"interconnect must be > 0 GB/s, not {value}")
        return float(value)
    text = str(value).strip().lower()
    if text in INTERCONNECT_NAMES:
        return INTERCONNECT_NAMES[text]
    try:
        return parse_interconnect(float(text.removesuffix("gb/s").removesuffix("gbs")))
    except ValueError:
        raise PoolError(f"unknown interconnect {value!r}: use nvlink, pcie4, pcie5 or GB/s"
                        ) from None


# ---- pool files ---------------------------------------------------------------------------

_HOST_KEYS = {"name", "gpu", "gpus_per_host", "gpus", "count", "interconnect", "partition",
              "constraint"}


def pool_from_mapping(data: Mapping[str, Any], gpu_map: Mapping[str, str] | None = None) -> Pool:
    """A pool file's content (TOML or JSON, already parsed): ``[[hosts]]`` entries with
    ``gpu``, ``gpus_per_host`` (or ``gpus``), optional ``count`` of identical hosts,
    ``name``, ``interconnect``, ``partition`` and ``constraint`` (used by --emit-sbatch)."""
    entries = data.get("hosts", data.get("host"))
    if not isinstance(entries, list) or not entries:
        raise PoolError("pool has no [[hosts]] entries")
    hosts: list[Host] = []
    for i, raw in enumerate(entries):
        where = f"hosts[{i}]"
        if not isinstance(raw, Mapping):
            raise PoolError(f"{where}: expected a table")
        unknown = set(raw) - _HOST_KEYS
        if unknown:
            raise PoolError(f"{where}: unknown keys {sorted(unknown)} (known: "
                            f"{', '.join(sorted(_HOST_KEYS))})")
        if "gpu" not in raw:
            raise PoolError(f"{where}: missing 'gpu' (a catalog key such as a100-80g-sxm)")
        try:
            key = resolve_gpu(str(raw["gpu"]), aliases=gpu_map)
        except KeyError as exc:
            raise PoolError(f"{where}: {exc.args[0]}") from None
        except PoolError as exc:
            raise PoolError(f"{where}: {exc}") from None
        per_host = _positive_int(raw.get("gpus_per_host", raw.get("gpus")),
                                 f"{where}.gpus_per_host")
        count = _positive_int(raw.get("count", 1), f"{where}.count")
        try:
            variant = Variant(key, parse_interconnect(raw.get("interconnect")))
        except PoolError as exc:
            raise PoolError(f"{where}: {exc}") from None
        base = str(raw.get("name") or f"{key}-{i}")
        for j in range(count):
            hosts.append(Host(
                name=base if count == 1 else f"{base}-{j}",
                variant=variant,
                gpus=per_host,
                partition=_opt_str(raw.get("partition")),
                constraint=_opt_str(raw.get("constraint")),
            ))
    names = [h.name for h in hosts]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise PoolError(f"duplicate host names {dupes}: give each [[hosts]] entry its own name")
    return Pool(tuple(hosts))


def _positive_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value \
            or value < 1:
        raise PoolError(f"{where} must be a positive integer, not {value!r}")
    return int(value)


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


# ---- live federations ---------------------------------------------------------------------

def pool_from_records(nodes: Iterable[Mapping[str, Any]],
                      gpu_map: Mapping[str, str] | None = None) -> Pool:
    """Idle nodes of a registry snapshot (``GET /v1/registry/nodes``) as hosts.

    A node counts when it advertises itself idle (no engine) and is JOIN or SERVING; a node
    with GPUs of several types becomes one host per type (a TP group never mixes types).
    Nodes that cannot be used are listed in ``skipped`` with the reason.
    """
    hosts: list[Host] = []
    skipped: list[str] = []
    for node in nodes:
        if not node.get("idle") or node.get("state") not in ("JOIN", "SERVING"):
            continue
        label = f"{node.get('provider_id', '?')}/{str(node.get('peer_id', '?'))[-8:]}"
        gpus = list((node.get("hardware") or {}).get("gpus") or [])
        if not gpus:
            skipped.append(f"{label}: idle but advertises no GPUs")
            continue
        by_key: dict[str, int] = {}
        try:
            for g in gpus:
                key = resolve_gpu(str(g.get("name", "")), int(g.get("memory_bytes") or 0),
                                  gpu_map)
                by_key[key] = by_key.get(key, 0) + 1
        except PoolError as exc:
            skipped.append(f"{label}: {exc}")
            continue
        for key, n in sorted(by_key.items()):
            suffix = "" if len(by_key) == 1 else f"-{key}"
            hosts.append(Host(
                name=f"{label}{suffix}",
                variant=Variant(key),
                gpus=n,
                peer_id=str(node.get("peer_id")),
                http_url=str(node.get("http_url")),
                provider_id=str(node.get("provider_id")),
                partition=((node.get("slurm") or {}).get("partition")),
                one_engine=True,
            ))
    return Pool(tuple(hosts), tuple(skipped))

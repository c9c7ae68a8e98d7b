"""What the federation says about the fleet: its nodes (from any ingress's registry
replica) and, for autoscaling, the load per model (from the ingresses' metrics and the
serving nodes' own in-flight counts).

The controller asks the first ingress of the fleet file that answers; every node holds
the whole registry, so any one will do.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import trio

from otela.fleet.errors import FleetError
from otela.fleet.state import Node

log = logging.getLogger("otela.fleet")

TIMEOUT_S = 5.0


class FederationUnreachable(FleetError):
    """No ingress of the fleet file answered: the controller cannot tell which replicas
    serve, so it changes nothing until one does."""


def nodes_of(records: Iterable[dict[str, Any]], fleet: str) -> list[Node]:
    """The registry entries of this fleet's nodes. Pure."""
    out = []
    for record in records:
        tag = record.get("fleet") or None
        if not isinstance(tag, dict) or tag.get("fleet") != fleet:
            continue
        try:
            slurm = record.get("slurm") or {}
            out.append(Node(
                session_id=str(record["session_id"]), cluster=str(tag["cluster"]),
                job_id=str(tag["job_id"]), deployment=str(tag["deployment"]),
                spec=str(tag["spec"]), state=str(record["state"]),
                http_url=str(record.get("http_url") or ""),
                models=tuple(str(m["id"]) for m in record.get("models") or ()),
                end_time=slurm.get("end_time"), version=int(record.get("version", 0))))
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("ignoring a malformed fleet node record: %s", exc)
    return out


@dataclass
class ModelLoad:
    """One model's load as the ingresses see it now."""

    requests: float = 0.0  # answered so far (a counter; the rate comes from two reads)
    held: float = 0.0  # requests waiting at an ingress for a first replica (scale to zero)
    in_flight: float = 0.0  # on its serving nodes
    queued: float = 0.0  # waiting at an ingress for room on a serving node (fair sharing)
    ttft_sum: float = 0.0  # first-byte seconds so far, and how many (for a mean)
    ttft_count: float = 0.0


@dataclass
class Snapshot:
    nodes: list[Node]
    loads: dict[str, ModelLoad] = field(default_factory=dict)


class Federation:
    def __init__(self, ingress: Sequence[str], fleet: str) -> None:
        self.ingress = [url.rstrip("/") for url in ingress]
        self.fleet = fleet

    async def _get(self, client: httpx.AsyncClient, path: str) -> tuple[str, httpx.Response]:
        errors = []
        for url in self.ingress:
            try:
                response = await client.get(url + path)
                if response.status_code == 200:
                    return url, response
                errors.append(f"{url}: HTTP {response.status_code}")
            except httpx.HTTPError as exc:
                errors.append(f"{url}: {exc or type(exc).__name__}")
        raise FederationUnreachable("no ingress answered (" + "; ".join(errors) + ")")

    async def _registry(self, client: httpx.AsyncClient) -> list[dict[str, Any]]:
        """Every entry of an ingress's registry replica, page by page."""
        entries: list[dict[str, Any]] = []
        after = ""
        while True:
            query = "/v1/registry/nodes?limit=1000" + (f"&after={after}" if after else "")
            _, response = await self._get(client, query)
            page = response.json()
            entries += page.get("nodes", [])
            after = page.get("next_after") or ""
            if not after:
                return entries

    async def nodes(self) -> list[Node]:
        async with httpx.AsyncClient(timeout=TIMEOUT_S, trust_env=False) as client:
            return nodes_of(await self._registry(client), self.fleet)

    async def snapshot(self, models: Sequence[str], with_load: bool) -> Snapshot:
        """The fleet's nodes and, with ``with_load``, the load of ``models``."""
        async with httpx.AsyncClient(timeout=TIMEOUT_S, trust_env=False) as client:
            nodes = nodes_of(await self._registry(client), self.fleet)
            if not with_load:
                return Snapshot(nodes)
            loads = {model: ModelLoad() for model in models}
            async with trio.open_nursery() as nursery:
                for url in self.ingress:
                    nursery.start_soon(self._ingress_load, client, url, loads)
                for node in nodes:
                    if node.state == "SERVING" and node.http_url:
                        nursery.start_soon(self._node_load, client, node, loads)
            return Snapshot(nodes, loads)

    async def held(self, models: Sequence[str]) -> dict[str, float]:
        """Requests the ingresses hold for each of ``models`` right now."""
        loads = {model: ModelLoad() for model in models}
        async with httpx.AsyncClient(timeout=TIMEOUT_S, trust_env=False) as client, \
                trio.open_nursery() as nursery:
            for url in self.ingress:
                nursery.start_soon(self._ingress_load, client, url, loads)
        return {model: load.held for model, load in loads.items()}

    async def _ingress_load(self, client: httpx.AsyncClient, url: str,
                            loads: dict[str, ModelLoad]) -> None:
        try:
            response = await client.get(url + "/metrics")
        except httpx.HTTPError as exc:
            log.debug("cannot read %s/metrics: %s", url, exc)
            return
        if response.status_code == 200:
            add_ingress_metrics(response.text, loads)

    async def _node_load(self, client: httpx.AsyncClient, node: Node,
                         loads: dict[str, ModelLoad]) -> None:
        try:
            response = await client.get(node.http_url.rstrip("/") + "/v1/health")
            in_flight = float(response.json().get("in_flight") or 0)
        except (httpx.HTTPError, ValueError, AttributeError):
            return
        for model in node.models:
            if model in loads:
                loads[model].in_flight += in_flight / max(len(node.models), 1)


_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')
_WANTED = ("otela_requests_total", "otela_held_requests", "otela_queue_requests",
           "otela_model_first_byte_seconds_sum", "otela_model_first_byte_seconds_count")


def samples(text: str, names: Sequence[str]) -> Iterable[tuple[str, dict[str, str], float]]:
    """``(name, labels, value)`` of the samples named ``names`` in Prometheus text
    exposition: only what the controller reads, so no parser dependency. Pure."""
    for line in text.splitlines():
        if not line.startswith(tuple(names)):
            continue
        match = _SAMPLE.match(line)
        if match is None or match.group(1) not in names:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        labels = {k: v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
                  for k, v in _LABEL.findall(match.group(2) or "")}
        yield match.group(1), labels, value


def add_ingress_metrics(text: str, loads: dict[str, ModelLoad]) -> None:
    """Add one ingress's per-model counters to ``loads``: requests answered
    (``otela_requests_total``), requests held for a first replica
    (``otela_held_requests``), requests queued for room on a node
    (``otela_queue_requests``, every class), and first-byte time
    (``otela_model_first_byte_seconds``). Pure."""
    for name, labels, value in samples(text, _WANTED):
        model = labels.get("model")
        load = loads.get(model) if model is not None else None
        if load is None or not math.isfinite(value):
            continue
        if name == "otela_requests_total":
            load.requests += value
        elif name == "otela_held_requests":
            load.held += value
        elif name == "otela_queue_requests":
            load.queued += value
        elif name == "otela_model_first_byte_seconds_sum":
            load.ttft_sum += value
        else:
            load.ttft_count += value

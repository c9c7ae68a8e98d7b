"""What shape a deployment's replicas take, and which clusters may host them.

A deployment that names its GPUs (``gpus = 2``) keeps that shape, on its allowed
clusters whose GPU type it accepts. One with ``gpus = "auto"`` asks the placer
(``simulator.placer``: the simulator's memory plan and latency curves, CP-SAT) which GPU
type and tensor-parallel degree serve its expected rate best across the clusters'
partitions (``autoplan.py``); the answer is cached per pool, so it is re-planned when the
clusters in the file change, not on every pass.
"""

from __future__ import annotations

from otela.fleet.identity import Shape
from otela.fleet.spec import Cluster, Deployment, Fleet


def _gpu_key(name: str) -> str:
    from otela.hardware.catalog import get_gpu

    return get_gpu(name).key


class Placement:
    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self._auto: dict[str, tuple[Shape, tuple[str, ...]]] = {}

    def shape(self, deployment: Deployment) -> tuple[Shape, tuple[str, ...]]:
        """The replica shape (part of the spec hash) and the clusters that can host it,
        in the deployment's order of preference."""
        if deployment.gpus is None:
            planned = self._auto.get(deployment.name)
            if planned is None:
                from otela.fleet.autoplan import plan_shape

                planned = self._auto[deployment.name] = plan_shape(self.fleet, deployment)
            return planned
        if not deployment.gpu_types:
            return Shape(deployment.gpus), deployment.clusters
        wanted = {_gpu_key(g) for g in deployment.gpu_types}
        clusters = tuple(c for c in deployment.clusters
                         if self.fleet.clusters[c].gpu_type
                         and _gpu_key(self.fleet.clusters[c].gpu_type or "") in wanted)
        return Shape(deployment.gpus, ",".join(sorted(wanted))), clusters

    @staticmethod
    def per_job(shape: Shape, cluster: Cluster) -> int:
        """Replicas one job holds on ``cluster``: on a partition that hands out whole
        nodes, as many as its GPUs fit (a node is paid for whole; replicas planned for one
        host share its job); elsewhere one."""
        if cluster.whole_nodes and shape.gpus > 0:
            return max(1, cluster.gpus_per_node // shape.gpus)
        return 1

    def job_shape(self, shape: Shape, cluster: Cluster, deployment: Deployment) -> Shape:
        """What to ask ``cluster`` for: a typed GPU request (``--gres=gpu:TYPE:N``) only
        when the deployment restricts GPU types (or the placer chose one) and the cluster
        names its type; partitions of one GPU type need no type."""
        if shape.gpu_type and cluster.gpu_type:
            return Shape(shape.gpus, cluster.gpu_type)
        return Shape(shape.gpus)

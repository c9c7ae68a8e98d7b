"""``gpus = "auto"``: the placer chooses a deployment's GPU type and tensor parallelism.

The clusters the deployment may use become the placer's pool (one host class per
cluster: its GPU type, GPUs per node and the ``nodes`` it may give), the deployment its
demand (``rate``, default lengths, the autoscaler's ``ttft`` as an SLO, the checkpoint's
precision); the placer simulates each configuration that fits (cached on disk,
``~/.cache/otela/placer``) and solves its CP-SAT model, exactly as ``otela plan`` does.
The replica shape the plan uses most becomes the deployment's shape, and the clusters of
that GPU type its hosts.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict

from otela.fleet.errors import FleetError
from otela.fleet.identity import Shape
from otela.fleet.spec import Deployment, Fleet

DEFAULT_RATE = 1.0  # requests per second, when the deployment does not say
DEFAULT_INPUT, DEFAULT_OUTPUT = "normal:512,256", "normal:256,128"
SIM_REQUESTS = 200
TIME_LIMIT_S = 10.0


def plan_shape(fleet: Fleet, deployment: Deployment) -> tuple[Shape, tuple[str, ...]]:
    from otela.hardware.catalog import get_gpu
    from simulator.models import get_model
    from simulator.placer.cpsat import PlanError
    from simulator.placer.demand import SLO, Lengths, Service
    from simulator.placer.demand import Demand as PlacerDemand
    from simulator.placer.plan import make_plan
    from simulator.placer.pool import Host, Pool, Variant
    from simulator.placer.profile import Profiler, default_cache_dir
    from simulator.roofline import Precision

    try:
        model = get_model(deployment.model)
    except KeyError as exc:
        raise FleetError(f"deployment {deployment.name}: gpus = \"auto\" needs a model the "
                         f"simulator knows: {exc.args[0]}") from None
    hosts = []
    for name in deployment.clusters:
        cluster = fleet.clusters[name]
        if not cluster.gpu_type or not cluster.gpus_per_node:
            continue
        variant = Variant(get_gpu(cluster.gpu_type).key)
        for i in range(cluster.nodes):
            hosts.append(Host(f"{name}-{i}", variant, cluster.gpus_per_node, cluster.partition))
    if not hosts:
        raise FleetError(f"deployment {deployment.name}: gpus = \"auto\" needs clusters with "
                         "gpu_type and gpus_per_node")
    ttft = deployment.autoscale.ttft if deployment.autoscale else None
    rate = deployment.rate or DEFAULT_RATE
    service = Service(name=deployment.model, model=model.name, rate=rate,
                      input=Lengths.parse(DEFAULT_INPUT), output=Lengths.parse(DEFAULT_OUTPUT),
                      slo=SLO(ttft_s=ttft), precision=Precision(**asdict(deployment.precision)))
    pool = Pool(tuple(hosts))
    profiler = Profiler(default_cache_dir(), requests=SIM_REQUESTS)
    sizes = {h.variant.name: h.gpus for h in hosts}
    candidates, rejected = profiler.candidates([service], pool.variants(),
                                               lambda v: sizes.get(v.name, 0))
    if not candidates:
        why = "; ".join(f"{r.variant} TP{r.tp}: {r.reason}" for r in rejected[:4])
        raise FleetError(f"deployment {deployment.name}: {deployment.model} fits no GPU of "
                         f"its clusters ({why})")
    try:
        plan = make_plan(PlacerDemand((service,)), pool, candidates, rejected,
                         time_limit_s=TIME_LIMIT_S)
    except PlanError as exc:
        raise FleetError(f"deployment {deployment.name}: the placer found no plan: {exc}"
                         ) from None
    shapes = Counter((r.gpu, r.tp) for r in plan.replicas if r.service == deployment.model)
    if not shapes:
        raise FleetError(f"deployment {deployment.name}: the placer planned no replica")
    (gpu, tp), _ = shapes.most_common(1)[0]
    key = get_gpu(gpu).key
    clusters = tuple(c for c in deployment.clusters if fleet.clusters[c].gpu_type
                     and get_gpu(fleet.clusters[c].gpu_type or "").key == key)
    return Shape(tp, key), clusters

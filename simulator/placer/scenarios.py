"""The paper's Table 1 scenario: its pool, demand, and the two published allocations.

Workload and published plans as in upstream's experiment files
(contrib/benchmark/experiments/2_1_placement/{ours,straw_1}.yaml): Poisson arrivals,
Normal lengths, 300 s, and per-group routing weights. Hosts: 4 GPUs each (Alps' GH200
nodes are 4-superchip nodes; the A100 nodes are taken as 4-GPU too, which every published
TP degree fits).
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.placer.demand import Demand, Lengths, Objective, Service
from simulator.placer.pool import Host, Pool, Variant

A100 = "a100-80g-sxm"
GH200 = "gh200"
L13, L34, L70 = ("meta-llama/Llama-2-13b-hf", "meta-llama/CodeLlama-34b-hf",
                 "meta-llama/Llama-3.3-70B-Instruct")


def table1_pool() -> Pool:
    hosts = [Host(f"a100-{i}", Variant(A100), 4) for i in range(6)]
    hosts += [Host(f"gh200-{i}", Variant(GH200), 4) for i in range(8)]
    return Pool(tuple(hosts))


def table1_demand(objective: Objective = Objective.LATENCY, horizon_s: float = 300.0) -> Demand:
    def svc(name: str, model: str, rate: float, inp: str, out: str, tp: tuple[int, ...]
            ) -> Service:
        return Service(name, model, rate, Lengths.parse(inp), Lengths.parse(out), tp=tp)

    return Demand((
        svc(L13, "llama-2-13b", 110.0, "normal:599,822", "normal:74,211", (1, 2, 4)),
        svc(L34, "codellama-34b", 185.5, "normal:1169,1276", "normal:532,435", (1, 2, 4)),
        svc(L70, "llama-3.3-70b", 221.0, "normal:727,777", "normal:64,190", (1, 2, 4)),
    ), objective, horizon_s)


@dataclass(frozen=True)
class Group:
    """Replicas of one service on one GPU type at one TP, and their routing weight."""

    service: str
    gpu: str
    tp: int
    replicas: int
    weight: float


PAPER_PLAN = (
    Group(L13, A100, 1, 6, 1.0),
    Group(L34, A100, 2, 5, 0.1633),
    Group(L34, GH200, 2, 8, 0.8367),
    Group(L70, A100, 4, 2, 0.1662),
    Group(L70, GH200, 4, 4, 0.8338),
)
"""Table 1 "Ours": 13B 6xA100 | 34B 16xGH200+10xA100 | 70B 16xGH200+8xA100."""

PAPER_MEMP = (
    Group(L13, A100, 1, 4, 1.0),
    Group(L34, A100, 2, 8, 1.0),
    Group(L70, A100, 4, 1, 0.11),
    Group(L70, GH200, 4, 8, 0.89),
)
"""Table 1 "MemP": 13B 4xA100 | 34B 16xA100 | 70B 32xGH200+4xA100."""

"""Speed of every companion policy: one simulated hour at 10 req/s on 16 GPUs (goal: <= 10 s
of wall time each on the 2-core development VM), planning included. Prints wall and CPU
seconds (the CPU time of this process varies less than wall time when the VM is shared).

Run: .venv/bin/python benchmarks/companion_speed.py [--policies a,b] [--hours H] [--rate R]
Workloads: each policy's own scenario scaled to the rate (OSERVE: Llama2-70B, Table 1 S3 mix,
16 H100; Gyges: the paper's short/long mix with its TP limits, Llama-3.1-8B on 2 x 8 H100
(Qwen2.5-32B on H20 is overloaded at 10 req/s); SageServe: Llama-2-70B,
3 regions around the daily peak, A100 TP4 instances (elastic, the mean GPU count is printed);
Prism: 32 models (8 bases x 4 fine-tunes) on 16 H100; static: Llama-3.1-8B on 16 H100).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable
from typing import Any

from simulator.models import get_model
from simulator.policies.baselines import StaticPolicy
from simulator.policies.cluster import ClusterPolicy, Pool, run_cluster
from simulator.policies.interfaces import Shape
from simulator.policies.metrics import summarize
from simulator.policies.workload import ClusterWorkload, Part
from simulator.workload import synthetic


def _oserve(layout: str, routing: str, rate: float, secs: float) -> tuple[Any, ...]:
    from simulator.policies.oserve import scenario
    from simulator.policies.oserve.policy import OservePolicy

    wl = scenario.workload(scenario.TABLE1["S3"][1], rate, secs, seed=1)
    return wl, OservePolicy(scenario.MODEL, layout=layout, routing=routing), \
        Pool.uniform(scenario.GPU, 16), {}


def _gyges(mode: str, rate: float, secs: float) -> tuple[Any, ...]:
    from simulator.policies.gyges import scenario
    from simulator.policies.gyges.core import PAPER_MAX_SEQ
    from simulator.policies.gyges.policy import GygesPolicy

    # the paper's mix (one long request per 60 short ones) at 10 req/s overloads 16 H20s
    # serving Qwen2.5-32B (the baselines' queues grow without bound), so the speed case
    # serves Llama-3.1-8B on H100s with the paper's per-TP sequence limits
    per_req = 1.0 + 1.0 / 60
    model = "llama-3.1-8b"
    wl = scenario.workload(secs, rate / per_req, seed=1, model=model)
    spec = dataclasses.replace(get_model(model), max_context=131_072)
    return wl, GygesPolicy(model, mode, PAPER_MAX_SEQ), Pool.uniform("h100-sxm", 16), \
        {model: spec}


def _sageserve(mode: str, rate: float, secs: float) -> tuple[Any, ...]:
    from simulator.policies.sageserve import scenario
    from simulator.policies.sageserve.policy import SageServePolicy

    start = 11 * 3600.0
    wl = scenario.day(rate / 1.4, seed=1, duration_s=secs, start_s=start)  # 1.4x at noon
    hist = scenario.history(rate / 1.4, days=2)
    hist = {k: v[: len(v) - 288 + int(start // 300)] for k, v in hist.items()}
    return wl, SageServePolicy(mode, history=hist), Pool(), {}


def _prism(mode: str, rate: float, secs: float) -> tuple[Any, ...]:
    from simulator.policies.prism import scenario
    from simulator.policies.prism.policy import PrismPolicy

    base = scenario.workload(rate, secs, seed=1)
    # four fine-tunes of each base model: the same architecture under another name
    rng_parts = []
    specs = {}
    for i, name in enumerate(base.models):
        spec = scenario.EXTRA_MODELS.get(name) or get_model(name)
        mask = base.model_mask(name)
        arr = base.base.arrival[mask]
        for v in range(4):
            sel = slice(v, None, 4)
            tuned = f"{name}-ft{v}"
            specs[tuned] = dataclasses.replace(spec, name=tuned)
            rng_parts.append(Part(arr[sel], base.base.input_len[mask][sel],
                                  base.base.output_len[mask][sel], tuned))
        del i
    wl = ClusterWorkload.from_parts(rng_parts)
    if mode == "dedicated":
        names = wl.models[:16]
        wl = ClusterWorkload.from_parts([p for p in rng_parts if p.model in names])
        return wl, StaticPolicy({m: [Shape(scenario.GPU)] for m in names}, name="dedicated"), \
            Pool.uniform(scenario.GPU, 16), specs
    return wl, PrismPolicy(mode), Pool.uniform(scenario.GPU, 16), specs


def _static(rate: float, secs: float) -> tuple[Any, ...]:
    wl = ClusterWorkload.single(
        synthetic(rate, duration=secs, input_dist="normal:764,561", output_dist="normal:674,412"),
        "llama-3.1-8b")
    return wl, StaticPolicy({"llama-3.1-8b": [Shape("h100-sxm")] * 16}), \
        Pool.uniform("h100-sxm", 16), {}


CASES: dict[str, Callable[[float, float], tuple[Any, ...]]] = {
    "static": _static,
    "oserve": lambda r, s: _oserve("search", "lp", r, s),
    "homogeneous": lambda r, s: _oserve("homogeneous", "least_loaded", r, s),
    "gyges": lambda r, s: _gyges("gyges", r, s),
    "gyges-rr": lambda r, s: _gyges("round_robin", r, s),
    "gyges-llf": lambda r, s: _gyges("least_loaded", r, s),
    "sageserve": lambda r, s: _sageserve("lt-ua", r, s),
    "reactive": lambda r, s: _sageserve("reactive", r, s),
    "prism": lambda r, s: _prism("prism", r, s),
    "muxserve": lambda r, s: _prism("muxserve", r, s),
    "static-partition": lambda r, s: _prism("static", r, s),
    "dedicated": lambda r, s: _prism("dedicated", r, s),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--policies", default=",".join(CASES))
    ap.add_argument("--rate", type=float, default=10.0)
    ap.add_argument("--hours", type=float, default=1.0)
    a = ap.parse_args()
    secs = 3600 * a.hours
    print(f"{'policy':18s}{'requests':>9s}{'GPUs':>6s}{'wall s':>8s}{'CPU s':>8s}{'done':>8s}"
          f"{'TTFT p50':>10s}")
    for name in a.policies.split(","):
        wl, pol, pool, models = CASES[name](a.rate, secs)
        policy: ClusterPolicy = pol
        t, c = time.perf_counter(), time.process_time()
        run = run_cluster(wl, policy, pool, models=models, horizon=secs)
        wall = time.perf_counter() - t
        cpu = time.process_time() - c  # this process's CPU time: less noisy on a shared VM
        s = summarize(run)
        print(f"{name:18s}{len(wl):9d}{s['mean_gpus']:6.1f}{wall:8.2f}{cpu:8.2f}{s['completed']:8d}"
              f"{s['ttft_s']['p50']:10.3f}")


if __name__ == "__main__":
    main()

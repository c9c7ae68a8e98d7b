"""What an engine's Prometheus ``/metrics`` says about its load. Pure.

Read (summed over label sets, e.g. one per served model name):

- vLLM (V1, >= 0.10): ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
  ``vllm:kv_cache_usage_perc`` (0..1); older vLLM: ``vllm:gpu_cache_usage_perc``;
- SGLang: ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``, ``sglang:token_usage``.

KV use is the highest over label sets (one engine, one cache). Engines without these
metrics give nothing, and the node reports its own in-flight count only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs")
WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")
_WANTED = frozenset(RUNNING + WAITING + KV_USAGE)


@dataclass(frozen=True)
class EngineLoad:
    running: int | None = None
    waiting: int | None = None
    kv_usage: float | None = None

    @property
    def empty(self) -> bool:
        return self.running is None and self.waiting is None and self.kv_usage is None


def parse_engine_metrics(text: str) -> EngineLoad:
    """The load figures in a Prometheus text exposition (missing ones are ``None``)."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#" or not line.startswith(("vllm:", "sglang:")):
            continue
        name_end = min((i for i in (line.find("{"), line.find(" ")) if i >= 0), default=-1)
        if name_end < 0:
            continue
        name = line[:name_end]
        if name not in _WANTED:
            continue
        fields = line[line.rfind("}") + 1:].split() if "{" in line else line.split()[1:]
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        if not math.isfinite(value) or value < 0:
            continue
        if name in KV_USAGE:
            sums[name] = max(sums.get(name, 0.0), value)
        else:
            sums[name] = sums.get(name, 0.0) + value

    def first(names: tuple[str, ...]) -> float | None:
        return next((sums[n] for n in names if n in sums), None)

    running, waiting, kv = first(RUNNING), first(WAITING), first(KV_USAGE)
    return EngineLoad(
        running=None if running is None else int(running),
        waiting=None if waiting is None else int(waiting),
        kv_usage=None if kv is None else min(kv, 1.0))

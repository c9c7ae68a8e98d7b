"""The widened validation set: published figures (catalog/validation.toml), their split into a
calibration half and a held-out half, and the simulator's prediction of each.

Every figure is reproduced with the protocol that measured it (`simulator.protocols`) and the
engine that served it (`simulator.engines`): a TensorRT-LLM throughput table as
`trtllm-bench` runs it (its own batch and token limits, the KV share of free memory, all
requests queued at once, offline), a static batch as one context pass and its decode steps,
a scaling table as ratios of the simulator's own predictions.

The split is computed, never chosen: within each table the figure ids are ordered by a
salted SHA-256 and alternate calibration / held-out, so each half gets every table's kinds of
figures in about equal number; figures simulated before the split was fixed
(`seen_before_split` in the data file) are calibration figures whatever their hash. Nothing is
fitted to the held-out half: `python -m simulator.validation` prints the calibration half
unless asked for the held-out one.
"""

from __future__ import annotations

import hashlib
import math
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from otela.hardware.catalog import get_gpu
from simulator.api import analyze
from simulator.engine import simulate
from simulator.engines import Deployment, deployment, trtllm_bench_settings, trtllm_kv_pool_gb
from simulator.models import get_model
from simulator.protocols import ClientProtocol, client_workload, measure
from simulator.report import per_request
from simulator.roofline import Precision

DATA = Path(__file__).with_name("catalog") / "validation.toml"
SPLIT_SALT = "otela-issue-37/validation-split/v1"
CALIBRATION, HELD_OUT = "calibration", "held-out"


@dataclass(frozen=True)
class Figure:
    """One published number and everything needed to reproduce it."""

    id: str
    table: str
    source: str
    url: str
    model: str
    gpu: str
    tp: int
    pp: int
    bits: tuple[float, float, float]
    engine: str
    protocol: str
    metric: str
    published: float
    isl: int
    osl: int
    n: int = 0
    batch: int = 0
    kv_fraction: float = 0.95
    offline: bool = True
    inner: str = ""
    layouts: tuple[tuple[int, int], ...] = ()
    layout: int = 0  # ratio figures: which layout is over layouts[0]
    rate: float = 0.0  # serve figures: the client's request rate (0: all at once)
    mem_util: float = 0.9  # serve figures: the engine's share of GPU memory (weights + KV)
    weight_format: str = ""  # the checkpoint's weight format ("": the default for its bits)
    head_bits: float = 0.0  # its embedding / lm_head precision (0: the format's, BF16)

    @property
    def precision(self) -> Precision:
        """Weight / activation / KV bits with the checkpoint's format and head precision."""
        return Precision(*self.bits, weight_format=self.weight_format,
                         head_bits=self.head_bits or None)

    @property
    def setting(self) -> str:
        """A short human description (tables in the docs)."""
        lay = f"TP{self.tp}" + (f"PP{self.pp}" if self.pp > 1 else "")
        if self.protocol == "ratio":
            a, b = self.layouts[self.layout], self.layouts[0]
            lay = f"TP{a[0]}PP{a[1]}/TP{b[0]}PP{b[1]}"
        bits = "FP8" if self.bits[0] == 8 else "FP4" if self.bits[0] == 4 else "BF16/FP16"
        extra = f" b={self.batch}" if self.batch else ""
        return f"{self.model} {bits} {self.gpu} {lay}{extra} {self.isl}/{self.osl} {self.metric}"


def spans_nodes(f: Figure) -> bool:
    """Whether one replica of figure f spans several nodes (its TP x PP group is larger than
    the GPU's node): the figures that exercise the inter-node link model."""
    per_node = get_gpu(f.gpu).efficiency.gpus_per_node
    return per_node > 0 and f.tp * f.pp > per_node


def _row_id(table: str, row: dict[str, Any]) -> str:
    parts = []
    if "model" in row:
        parts.append(str(row["model"]))
    if "tp" in row:
        parts.append(f"tp{row['tp']}")
    if "batch" in row:
        parts.append(f"b{row['batch']}")
    if "rate" in row:
        parts.append(f"rps{row['rate']:g}")
    parts.append(f"{row['isl']}-{row['osl']}")
    return table + "/" + "/".join(parts)


def _figures_of(t: dict[str, Any]) -> Iterable[Figure]:
    common = {
        "table": t["id"],
        "source": t["source"],
        "url": t["url"],
        "bits": tuple(float(b) for b in t["bits"]),
        "engine": t["engine"],
        "protocol": t["protocol"],
        "metric": t["metric"],
        "kv_fraction": float(t.get("kv_fraction", 0.95)),
        "offline": bool(t.get("offline", t["protocol"] != "vllm-bench-serve")),
        "inner": str(t.get("inner", "")),
        "mem_util": float(t.get("gpu_memory_utilization", 0.9)),
        "weight_format": str(t.get("weight_format", "")),
        "head_bits": float(t.get("head_bits", 0.0)),
    }
    layouts = tuple((int(a), int(b)) for a, b in t.get("layouts", ()))
    for row in t["rows"]:
        base = dict(
            common,
            model=str(row.get("model", t.get("model", ""))),
            gpu=str(row.get("gpu", t["gpu"])),
            tp=int(row.get("tp", t.get("tp", 1))),
            pp=int(row.get("pp", t.get("pp", 1))),
            isl=int(row["isl"]),
            osl=int(row["osl"]),
            n=int(row.get("n", 0)),
            batch=int(row.get("batch", 0)),
            rate=float(row.get("rate", 0.0)),
        )
        rid = _row_id(t["id"], row)
        if t["protocol"] == "ratio":
            values = [float(v) for v in row["values"]]
            for i in range(1, len(layouts)):
                a, b = layouts[i], layouts[0]
                yield Figure(
                    id=f"{rid}/tp{a[0]}pp{a[1]}:tp{b[0]}pp{b[1]}",
                    published=values[i] / values[0],
                    layouts=layouts,
                    layout=i,
                    **base,
                )
        else:
            yield Figure(id=rid, published=float(row["value"]), **base)


@lru_cache(maxsize=4)
def _raw(path: Path) -> dict[str, Any]:
    with path.open("rb") as fh:
        return tomllib.load(fh)


def load_figures(path: Path = DATA) -> list[Figure]:
    """Every published figure of the data file, in file order."""
    out = [f for t in _raw(path)["table"] for f in _figures_of(t)]
    ids = [f.id for f in out]
    if len(set(ids)) != len(ids):
        raise ValueError("duplicate figure ids in the validation data")
    return out


def seen_before_split(path: Path = DATA) -> tuple[str, ...]:
    return tuple(_raw(path).get("seen_before_split", ()))


def seen_after_split(path: Path = DATA) -> tuple[str, ...]:
    """Held-out ids whose predictions were printed while calibration misses were examined."""
    return tuple(_raw(path).get("seen_after_split", ()))


def _rank(fid: str) -> str:
    return hashlib.sha256((SPLIT_SALT + "\0" + fid).encode()).hexdigest()


def split(figures: list[Figure], seen: Iterable[str] = ()) -> dict[str, str]:
    """Figure id -> CALIBRATION or HELD_OUT: within each table, ids ordered by salted hash
    alternate calibration, held-out, calibration, ...; `seen` ids are calibration."""
    by_table: dict[str, list[str]] = {}
    for f in figures:
        by_table.setdefault(f.table, []).append(f.id)
    halves: dict[str, str] = {}
    for ids in by_table.values():
        for k, fid in enumerate(sorted(ids, key=_rank)):
            halves[fid] = CALIBRATION if k % 2 == 0 else HELD_OUT
    for fid in seen:
        if fid in halves:
            halves[fid] = CALIBRATION
    return halves


# ---- predictions ---------------------------------------------------------------------------


@lru_cache(maxsize=512)
def trtllm_bench(
    model: str,
    gpu: str,
    tp: int,
    pp: int,
    prec: Precision,
    engine: str,
    isl: int,
    osl: int,
    n: int,
    kv_fraction: float,
) -> dict[str, Any]:
    """`trtllm-bench throughput` of `n` requests of isl/osl on one replica: its figures.

    The maximum batch size bounds the requests in flight over all pipeline micro-batches
    together: read per micro-batch (pp times as many in flight), the published PP8 rows of the
    RTX PRO 6000 table came out 1.5-2x too fast while PP1 matched; read as the total, the PP8
    rows (calibration half) fall within 15 % (docs/simulator.md, "Pipeline parallelism").
    """
    spec, dev = get_model(model), get_gpu(gpu)
    max_bs, max_tokens = trtllm_bench_settings(
        spec, dev.runtime_bytes, tp, pp, prec, isl, osl, kv_fraction
    )
    probe = deployment(spec, gpu, engine, tp=tp, pp=pp, precision=prec,
                       max_num_seqs=max_bs, max_batched_tokens=max_tokens, frontend=False)
    dep = deployment(spec, gpu, engine, tp=tp, pp=pp, precision=prec,
                     max_num_seqs=max_bs, max_batched_tokens=max_tokens, frontend=False,
                     kv_pool_gb=trtllm_kv_pool_gb(probe, kv_fraction),
                     gpu_memory_utilization=1.0)
    proto = ClientProtocol("trtllm-bench", num_prompts=n)
    return _client_run(dep, proto, isl, osl, f"{model} on {tp}x{pp} {gpu}") | {
        "max_batch": max_bs, "max_tokens": max_tokens}


def _client_run(dep: Deployment, proto: ClientProtocol, isl: int, osl: int, what: str
                ) -> dict[str, Any]:
    """One replica of ``dep`` driven by the benchmark client ``proto``: its figures."""
    plan = dep.memory()
    if not plan.fits:
        raise ValueError(f"{what} does not fit: {plan.reason}")
    out = simulate(client_workload(proto, isl, osl), dep.cost(), plan, dep.engine_config, 1,
                   "least_outstanding", None, 0)
    return measure(per_request(out), proto)


@lru_cache(maxsize=64)
def serve(
    model: str,
    gpu: str,
    tp: int,
    pp: int,
    prec: Precision,
    engine: str,
    isl: int,
    osl: int,
    n: int,
    rate: float,
    mem_util: float,
) -> dict[str, Any]:
    """`vllm bench serve` / SGLang's `bench_serving` against an online server: `n` prompts of
    isl/osl (random dataset, `--random-range-ratio 1`: fixed lengths) sent at `rate` requests/s
    (Poisson; 0: all at once), through the HTTP front end; the client's figures."""
    dep = deployment(get_model(model), gpu, engine, tp=tp, pp=pp, precision=prec,
                     gpu_memory_utilization=mem_util)
    proto = ClientProtocol("vllm-bench-serve", num_prompts=n,
                           request_rate=rate if rate > 0 else math.inf)
    return _client_run(dep, proto, isl, osl, f"{model} on {tp}x{pp} {gpu}")


def _static(f: Figure, tp: int, pp: int) -> dict[str, Any]:
    dep = deployment(get_model(f.model), f.gpu, f.engine, tp=tp, pp=pp,
                     precision=f.precision, frontend=not f.offline)
    return analyze(dep, max(f.batch, 1), f.isl, f.osl)["totals"]


def _throughput(f: Figure, tp: int, pp: int) -> float:
    """Output tokens/s of figure f's workload on a tp x pp layout (its inner protocol)."""
    if (f.inner or f.protocol) == "trtllm-bench":
        res = trtllm_bench(f.model, f.gpu, tp, pp, f.precision, f.engine, f.isl, f.osl, f.n,
                           f.kv_fraction)
        return float(res["output_throughput"])
    return float(_static(f, tp, pp)["output_tokens_per_s"])


def predict(f: Figure) -> float:
    """The simulator's value of figure f, in the figure's own unit."""
    if f.protocol == "ratio":
        (ta, pa), (tb, pb) = f.layouts[f.layout], f.layouts[0]
        return _throughput(f, ta, pa) / _throughput(f, tb, pb)
    gpus = f.tp * f.pp
    if f.protocol == "trtllm-bench":
        tput = _throughput(f, f.tp, f.pp)
        return tput / gpus if f.metric.endswith("per_gpu") else tput
    if f.protocol == "static":
        tot = _static(f, f.tp, f.pp)
        if f.metric == "output_tok_s_per_gpu":
            return float(tot["output_tokens_per_s"]) / gpus
        if f.metric == "latency_ms":
            return float(tot["e2e_s"]) * 1e3
        if f.metric == "ttft_ms":
            return float(tot["ttft_s"]) * 1e3
    if f.protocol == "serve":
        res = serve(f.model, f.gpu, f.tp, f.pp, f.precision, f.engine, f.isl, f.osl, f.n,
                    f.rate, f.mem_util)
        if f.metric == "median_tpot_ms":
            return float(res["median_tpot_s"]) * 1e3
        if f.metric == "median_ttft_ms":
            return float(res["median_ttft_s"]) * 1e3
        if f.metric == "output_tok_s":
            return float(res["output_throughput"])
    raise ValueError(f"no prediction for protocol {f.protocol!r} metric {f.metric!r}")


def rel_err(pred: float, ref: float) -> float:
    return (pred - ref) / ref


def evaluate(half: str | None = CALIBRATION, path: Path = DATA) -> list[dict[str, Any]]:
    """Predicted vs published for one half (None: both), in file order."""
    figs = load_figures(path)
    halves = split(figs, seen_before_split(path))
    rows = []
    for f in figs:
        if half is not None and halves[f.id] != half:
            continue
        pred = predict(f)
        rows.append(
            {
                "id": f.id,
                "half": halves[f.id],
                "source": f.source,
                "url": f.url,
                "setting": f.setting,
                "published": f.published,
                "predicted": pred,
                "error": rel_err(pred, f.published),
                "multi_node": spans_nodes(f),
            }
        )
    return rows

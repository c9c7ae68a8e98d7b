"""`otela sim` command line: `analyze` (operator roofline) and `run` (serving simulation).

Mounted by the main CLI as `otela sim`; also runnable as `python -m simulator.cli`.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import typer
from rich.table import Table

from otela.console import make_console
from otela.hardware.catalog import Calibration, list_gpus, parse_calibration
from simulator.api import Deployment, analyze, run
from simulator.engine import EngineConfig
from simulator.engines import engine_profile, trtllm_bench_settings, trtllm_kv_pool_gb
from simulator.models import list_models
from simulator.policies.cli import compare_cmd
from simulator.protocols import ClientProtocol, client_workload, measure
from simulator.report import SLO
from simulator.roofline import Precision
from simulator.router import ROUTERS
from simulator.workload import load_trace, sample_lengths, synthetic

app = typer.Typer(help="Roofline serving simulator for heterogeneous GPUs.", no_args_is_help=True)
console = make_console()


def _fmt_t(s: float) -> str:
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "-"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


def _si(x: float, unit: str) -> str:
    for scale, p in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {p}{unit}"
    return f"{x:.0f} {unit}"


def _dump(obj: Any) -> str:
    def clean(v: Any) -> Any:
        if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v

    return json.dumps(clean(obj), indent=2)


FORMAT_HELP = (
    "the checkpoint's weight format (block scales, embedding/lm_head precision): "
    "bf16, fp8, fp8-block, int8, nvfp4, mxfp4, int4-g128; default: from --weight-bits "
    "(8: fp8, 4: nvfp4 with --act-bits 4, else int4-g128)"
)
HEAD_HELP = "bits of the embedding and lm_head (default: the format's, 16 for quantized ones)"

CALIB_HELP = (
    "override a calibration constant of the GPU profile, FIELD=VALUE (repeatable), e.g. "
    "step_overhead_s=0.002, tp_overhead_s=0.0005, compute_fp8=0.5, runtime_reserve_gib=2; "
    "`otela sim list --calibration` shows every field"
)


def _deployment(
    model: str,
    gpu: str,
    tp: int,
    pp: int,
    weight_bits: float,
    act_bits: float,
    kv_bits: float,
    engine: EngineConfig | None = None,
    mem_util: float = 0.9,
    kv_pool_gb: float | None = None,
    overhead_ms: float | None = None,
    calib: list[str] | None = None,
    ep: bool = False,
    weight_format: str = "",
    head_bits: float | None = None,
) -> Deployment:
    try:
        dep = Deployment(
            model=model if not Path(model).exists() else _load_path(model),
            gpu=gpu,
            tp=tp,
            pp=pp,
            precision=Precision(weight_bits, act_bits, kv_bits, weight_format=weight_format,
                                head_bits=head_bits),
            engine=engine,
            gpu_memory_utilization=mem_util,
            kv_pool_gb=kv_pool_gb,
            step_overhead_s=None if overhead_ms is None else overhead_ms / 1e3,
            ep=tp if ep else 1,
            calibration=parse_calibration(calib or []),
        )
        _ = dep.model_spec, dep.gpu_spec  # resolve names now: clean error, not a traceback
        return dep
    except (KeyError, ValueError) as e:
        console.print(f"[red]{e.args[0] if e.args else e}[/red]")
        raise typer.Exit(2) from e


def _workload_from_trace(path: Path, model: str | None) -> Any:
    """Load a trace file; with `model`, keep only that model's requests (otela traces)."""
    if model is None:
        return load_trace(path)
    from simulator.workload import workload_from_trace
    from traces.io import read_trace

    t = read_trace(path)
    t.records = [r for r in t.records if r.model == model]
    if not t.records:
        raise ValueError(f"{path}: no requests for model {model!r}")
    return workload_from_trace(t)


def _load_path(p: str) -> Any:
    from simulator.models import load_hf_config

    return load_hf_config(p)


@app.command("analyze")
def analyze_cmd(
    model: str = typer.Option(..., "--model", "-m", help="catalog name, HF id or config.json path"),
    gpu: str = typer.Option(..., "--gpu", "-g", help="catalog GPU (see `list`)"),
    tp: int = typer.Option(1, "--tp", help="tensor-parallel degree"),
    pp: int = typer.Option(1, "--pp", help="pipeline-parallel degree"),
    batch: int = typer.Option(1, "--batch", "-b"),
    input_len: int = typer.Option(1024, "--input", "-i", help="prompt tokens"),
    output_len: int = typer.Option(128, "--output", "-o", help="generated tokens"),
    weight_bits: float = typer.Option(16, "--weight-bits"),
    act_bits: float = typer.Option(16, "--act-bits"),
    kv_bits: float = typer.Option(16, "--kv-bits"),
    weight_format: str = typer.Option("", "--weight-format", help=FORMAT_HELP),
    head_bits: float | None = typer.Option(None, "--head-bits", help=HEAD_HELP),
    ep: bool = typer.Option(False, "--ep/--no-ep", help="expert parallelism (MoE: EP = TP)"),
    calib: list[str] = typer.Option([], "--calib", help=CALIB_HELP),
    as_json: bool = typer.Option(False, "--json", help="print machine-readable JSON"),
) -> None:
    """Per-operator roofline breakdown (time, FLOPs, bytes, bound) for prefill and decode."""
    dep = _deployment(model, gpu, tp, pp, weight_bits, act_bits, kv_bits, calib=calib, ep=ep,
                      weight_format=weight_format, head_bits=head_bits)
    res = analyze(dep, batch, input_len, output_len)
    if as_json:
        sys.stdout.write(_dump(res) + "\n")
        return
    mem = res["memory"]
    title = (
        f"{res['model']} on {res['gpu']} TP={tp} PP={pp}, batch {batch}, "
        f"in {input_len} / out {output_len}"
    )
    for phase, label in (
        ("prefill", "prefill"),
        ("decode", f"decode @ ctx {res['decode']['context']}"),
    ):
        t = Table(title=f"{title}: {label}")
        for c in ("operator", "time", "share", "FLOPs", "bytes", "bound"):
            t.add_column(c, justify="left" if c in ("operator", "bound") else "right")
        total = res[phase]["time_s"]
        for o in res[phase]["ops"]:
            t.add_row(
                o["op"],
                _fmt_t(o["time_s"]),
                f"{100 * o['time_s'] / total:.1f}%",
                _si(o["flops"], "FLOP"),
                _si(o["bytes"], "B"),
                o["bound"],
            )
        t.add_row("[b]total[/b]", f"[b]{_fmt_t(total)}[/b]", "100%", "", "", "")
        console.print(t)
    tot = res["totals"]
    s = Table(title="totals")
    s.add_column("metric")
    s.add_column("value", justify="right")
    s.add_row("TTFT", _fmt_t(tot["ttft_s"]))
    s.add_row("TPOT (mean)", _fmt_t(tot["tpot_s"]))
    if pp > 1:  # the tables above are one pass through the stages in sequence
        s.add_row(f"decode cycle @ ctx {res['decode']['context']} (micro-batches overlapped)",
                  _fmt_t(res["decode"]["cycle_s"]))
    s.add_row("end-to-end", _fmt_t(tot["e2e_s"]))
    s.add_row("output tokens/s", f"{tot['output_tokens_per_s']:.1f}")
    s.add_row("decode floor (weights / peak BW)", _fmt_t(tot["decode_floor_s"]))
    s.add_row("weights per GPU", f"{mem['weight_bytes'] / 2**30:.2f} GiB")
    s.add_row(
        "KV cache per GPU", f"{mem['kv_pool_bytes'] / 2**30:.2f} GiB ({mem['kv_tokens']} tokens)"
    )
    s.add_row("max batch at this length", str(mem["max_batch_at_context"]))
    s.add_row("max context", str(mem["max_context"]))
    s.add_row("fits", "yes" if mem["fits"] else f"[red]no: {mem['reason']}[/red]")
    cal = res["calibration"]
    bits = res["precision"]
    compute_eff = (
        cal["compute_fp8"] or cal["compute"]
        if max(bits["weight_bits"], bits["act_bits"]) <= 8
        else cal["compute"]
    )
    s.add_row(
        "calibration profile",
        f"{cal['name']}: compute {compute_eff:g}, memory {cal['memory']:g}, "
        f"comm {cal['comm']:g}; overheads: step {cal['step_overhead_s'] * 1e3:g} ms "
        f"(+{cal['tp_overhead_s'] * 1e3:g} ms per extra rank), "
        f"{cal['seq_overhead_s'] * 1e6:g} us/sequence, "
        f"{cal['launch_per_layer_s'] * 1e6:g} us/layer, "
        f"{cal['request_overhead_s'] * 1e3:g} ms/request (override: --calib FIELD=VALUE)",
    )
    console.print(s)


def _columns(rows: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Per-request JSON rows back to the columns `protocols.measure` reads (NaN: not done)."""
    def col(key: str) -> np.ndarray:
        return np.array([np.nan if r.get(key) is None else r[key] for r in rows], dtype=float)

    return {k: col(k) for k in ("arrival", "ttft", "e2e", "output_len", "input_len")}


def _print_client(m: dict[str, Any], client: ClientProtocol | None) -> None:
    """The client's own figures, laid out as `vllm bench serve` prints them."""
    assert client is not None
    burst = "excluded" if client.exclude_first_burst else "included"
    t = Table(title=f"benchmark client: {m['protocol']} ({client.num_prompts} prompts, "
                    f"rate {client.request_rate:g}/s, max concurrency "
                    f"{client.max_concurrency or 'unbounded'}, first burst {burst})")
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row("measured requests (failed)", f"{m['measured_requests']} ({m['failed_requests']})")
    t.add_row("benchmark duration", f"{m['duration_s']:.2f} s")
    t.add_row("request throughput", f"{m['request_throughput']:.2f} req/s")
    t.add_row("output token throughput", f"{m['output_throughput']:.1f} tok/s")
    t.add_row("total token throughput", f"{m['total_token_throughput']:.1f} tok/s")
    for key, label in (("ttft", "TTFT"), ("tpot", "TPOT (excl. 1st token)"), ("e2el", "E2EL")):
        t.add_row(f"mean / median / p99 {label}",
                  " / ".join(_fmt_t(m[f"{p}_{key}_s"]) for p in ("mean", "median", "p99")))
    console.print(t)


@app.command("run")
def run_cmd(
    model: str = typer.Option(..., "--model", "-m"),
    gpu: str = typer.Option(..., "--gpu", "-g"),
    tp: int = typer.Option(1, "--tp"),
    pp: int = typer.Option(1, "--pp"),
    replicas: int = typer.Option(1, "--replicas", "-r"),
    trace: Path | None = typer.Option(
        None, "--trace", help="trace to simulate exactly (otela trace, or CSV/JSONL columns)"
    ),
    trace_model: str | None = typer.Option(
        None, "--trace-model", help="simulate only this model's requests of a multi-model trace"
    ),
    out_trace: Path | None = typer.Option(
        None,
        "--out-trace",
        help="write the simulated requests as an otela trace (for `otela trace compare`)",
    ),
    rate: float | None = typer.Option(None, "--rate", help="requests per second (generator)"),
    duration: float = typer.Option(300.0, "--duration", help="seconds of generated arrivals"),
    cv: float = typer.Option(1.0, "--cv", help="arrival CV: 1 = Poisson, else Gamma"),
    input_dist: str = typer.Option(
        "normal:764,561",
        "--input-dist",
        help="fixed:N | normal:M,S | uniform:A,B | lognormal:M,S | exp:M",
    ),
    output_dist: str = typer.Option("normal:674,412", "--output-dist"),
    max_concurrency: int | None = typer.Option(
        None, "--max-concurrency", help="closed-loop client"
    ),
    num_prompts: int | None = typer.Option(
        None, "--num-prompts",
        help="send exactly N prompts as a benchmark client does (lengths from --input-dist / "
        "--output-dist); --rate is then the request rate (default inf: all at once, bounded by "
        "--max-concurrency) and the client's figures are printed as --protocol measures them"),
    protocol: str = typer.Option(
        "vllm-bench-serve", "--protocol",
        help="with --num-prompts: vllm-bench-serve (also SGLang's bench_serving) | trtllm-bench "
        "(offline, all queued at once) | aiperf (closed loop, warm-up left out)"),
    exclude_first_burst: bool | None = typer.Option(
        None, "--exclude-first-burst/--include-first-burst",
        help="leave the first burst (the first max-concurrency requests, or every request sent "
        "at once) out of the client's figures; default: as the protocol does (aiperf excludes "
        "its warm-up, the others include everything)"),
    burstiness: float = typer.Option(
        1.0, "--burstiness", help="with --num-prompts and a finite --rate: Gamma shape of the "
        "gaps (1 = Poisson, as vllm bench serve's --burstiness)"),
    engine_name: str = typer.Option(
        "vllm", "--engine",
        help="serving-engine profile (catalog/engines.toml): vllm | trtllm | trtllm-session"),
    router: str = typer.Option("least_outstanding", "--router", help=" | ".join(ROUTERS)),
    chunked_prefill: bool = typer.Option(True, "--chunked-prefill/--no-chunked-prefill"),
    prefix_caching: bool = typer.Option(False, "--prefix-caching/--no-prefix-caching"),
    max_num_seqs: int | None = typer.Option(
        None, "--max-num-seqs", help="default: the engine's default on this GPU (profile)"
    ),
    max_batched_tokens: int | None = typer.Option(
        None, "--max-batched-tokens", help="token budget per step; default: from the profile"
    ),
    ep: bool = typer.Option(False, "--ep/--no-ep", help="expert parallelism (MoE: EP = TP)"),
    calib: list[str] = typer.Option([], "--calib", help=CALIB_HELP),
    mem_util: float = typer.Option(0.9, "--gpu-memory-utilization"),
    kv_pool_gb: float | None = typer.Option(None, "--kv-pool-gb", help="force KV pool size"),
    weight_bits: float = typer.Option(16, "--weight-bits"),
    act_bits: float = typer.Option(16, "--act-bits"),
    kv_bits: float = typer.Option(16, "--kv-bits"),
    weight_format: str = typer.Option("", "--weight-format", help=FORMAT_HELP),
    head_bits: float | None = typer.Option(None, "--head-bits", help=HEAD_HELP),
    slo_ttft: float = typer.Option(10.0, "--slo-ttft", help="seconds"),
    slo_tpot: float = typer.Option(0.1, "--slo-tpot", help="seconds"),
    seed: int = typer.Option(0, "--seed"),
    out: Path = typer.Option(Path("sim-run.json"), "--out", help="where to write the JSON report"),
    per_request: bool = typer.Option(
        True, "--per-request/--no-per-request", help="per-request rows in JSON"
    ),
    as_json: bool = typer.Option(False, "--json", help="print the JSON report instead of tables"),
    policy: str | None = typer.Option(
        None, "--policy",
        help="run a companion policy (oserve, sageserve, prism, gyges, ...: see `otela sim "
        "compare --help`) on --replicas x TP x PP GPUs of --gpu instead of fixed replicas"),
    opt: list[str] = typer.Option([], "--opt", help="policy option KEY=VALUE (repeatable)"),
) -> None:
    """Simulate serving a trace or generated workload; print a report and write JSON."""
    if num_prompts is not None:
        if trace is not None:
            console.print("[red]--num-prompts generates its prompts: drop --trace[/red]")
            raise typer.Exit(2)
        rate = math.inf if rate is None else rate
    elif (trace is None) == (rate is None):
        console.print("[red]give exactly one of --trace FILE, --rate X or --num-prompts N[/red]")
        raise typer.Exit(2)
    if policy is not None:
        from simulator.policies.cli import run_from_sim_run

        run_from_sim_run(policy, model, gpu, replicas * tp * pp, trace, trace_model, rate,
                         duration, cv, input_dist, output_dist, seed, slo_ttft, slo_tpot, opt,
                         out, as_json)
        return
    try:
        prof = engine_profile(engine_name)
        client = (
            ClientProtocol(
                protocol, num_prompts, max_concurrency, rate or math.inf, burstiness,
                protocol == "aiperf" if exclude_first_burst is None else exclude_first_burst,
                seed,
            )
            if num_prompts is not None
            else None
        )
    except (KeyError, ValueError) as e:
        console.print(f"[red]{e.args[0] if e.args else e}[/red]")
        raise typer.Exit(2) from e
    # the engine's own calibration first, then --calib; an offline client has no front end
    calib = [f"{k}={v}" for k, v in prof.calibration.items()] + list(calib)
    if client is not None and not client.frontend:
        calib = ["request_overhead_s=0", *calib]
    probe = _deployment(model, gpu, tp, pp, weight_bits, act_bits, kv_bits, calib=calib, ep=ep,
                        weight_format=weight_format, head_bits=head_bits)
    defaults = probe.engine_config
    if client is not None and client.name == "trtllm-bench" and engine_name == "trtllm":
        # trtllm-bench sizes the batch and token budget itself when not told (engines.py)
        mean_in = float(sample_lengths(input_dist, 1000, np.random.default_rng(seed)).mean())
        mean_out = float(sample_lengths(output_dist, 1000, np.random.default_rng(seed)).mean())
        bs, toks = trtllm_bench_settings(
            probe.model_spec, probe.gpu_spec.runtime_bytes, tp, pp, probe.precision,
            round(mean_in), max(1, round(mean_out)))
        defaults = EngineConfig(max_num_seqs=bs, max_batched_tokens=toks)
        if kv_pool_gb is None:  # its KV cache: 0.95 of the memory left free (not of the total)
            kv_pool_gb = trtllm_kv_pool_gb(
                _deployment(model, gpu, tp, pp, weight_bits, act_bits, kv_bits,
                            EngineConfig(max_num_seqs=bs, max_batched_tokens=toks),
                            calib=calib, ep=ep, weight_format=weight_format,
                            head_bits=head_bits), 0.95)
            mem_util = 1.0
    engine = EngineConfig(
        max_num_seqs=max_num_seqs or defaults.max_num_seqs,
        max_batched_tokens=max_batched_tokens or defaults.max_batched_tokens,
        chunked_prefill=chunked_prefill,
        chunk_prompts=prof.chunk_prompts,
        reserve_output_ratio=prof.reserve_output_ratio,
        prefix_caching=prefix_caching,
    )
    dep = _deployment(
        model,
        gpu,
        tp,
        pp,
        weight_bits,
        act_bits,
        kv_bits,
        engine,
        mem_util,
        kv_pool_gb,
        calib=calib,
        ep=ep,
        weight_format=weight_format,
        head_bits=head_bits,
    )
    try:
        wl = _workload_from_trace(trace, trace_model) if trace is not None else None
        if client is not None:
            rng = np.random.default_rng(seed)
            wl = client_workload(
                client,
                sample_lengths(input_dist, client.num_prompts, rng),
                sample_lengths(output_dist, client.num_prompts, rng),
            )
    except (ValueError, OSError) as e:
        console.print(f"[red]{e}[/red]")
        raise typer.Exit(2) from e
    wl = (
        wl
        if wl is not None
        else synthetic(
            rate or 0.0,
            duration=duration,
            input_dist=input_dist,
            output_dist=output_dist,
            cv=cv,
            seed=seed,
        )
    )
    res = run(
        dep,
        wl,
        replicas=replicas,
        router=router,
        slo=SLO(slo_ttft, slo_tpot),
        max_concurrency=max_concurrency,
        include_requests=per_request or out_trace is not None or client is not None,
        seed=seed,
    )
    if client is not None and res.get("fits"):
        res["client"] = measure(_columns(res["per_request"]), client)
        if not per_request:
            res.pop("per_request", None)
    if out_trace is not None and res.get("fits"):
        from simulator.report import result_trace
        from traces.io import write_trace

        write_trace(
            out_trace,
            result_trace(res, dep.model_spec.name if trace_model is None else trace_model),
        )
        if not per_request:
            res.pop("per_request", None)
    text = _dump(res)
    out.write_text(text + "\n")
    if as_json:
        sys.stdout.write(text + "\n")
        return
    if not res.get("fits"):
        console.print(f"[red]does not fit: {res['reason']}[/red]")
        raise typer.Exit(1)
    d = res["deployment"]
    t = Table(title=f"{d['model']} on {replicas} x {d['gpu']} (TP={tp}, PP={pp}), router {router}")
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row(
        "requests (completed / rejected)",
        f"{res['requests']} ({res['completed']} / {res['rejected']})",
    )
    t.add_row("simulated span", f"{res['duration_s']:.1f} s")
    t.add_row("throughput", f"{res['throughput_rps']:.2f} req/s")
    t.add_row("output tokens/s", f"{res['output_tokens_per_s']:.0f}")
    t.add_row("total tokens/s", f"{res['total_tokens_per_s']:.0f}")
    t.add_row(f"goodput (TTFT<={slo_ttft}s, TPOT<={slo_tpot}s)", f"{res['goodput_rps']:.2f} req/s")
    t.add_row("SLO attainment", f"{100 * res['slo_attainment']:.1f}%")
    t.add_row("GPU busy (mean over replicas)", f"{100 * res['utilization_mean']:.1f}%")
    t.add_row("KV occupancy (time mean)", f"{100 * res['kv_occupancy_mean']:.1f}%")
    t.add_row("preemptions", str(res["preemptions"]))
    t.add_row(
        "prefix-cache hit tokens",
        f"{res['prefix_hit_tokens']} ({100 * res['prefix_hit_rate']:.1f}%)",
    )
    t.add_row("cost", f"${d['cost_per_hour']:.2f}/h")
    console.print(t)
    lt = Table(title="latency")
    for c in ("metric", "mean", "p50", "p90", "p99"):
        lt.add_column(c, justify="right" if c != "metric" else "left")
    for key, label in (
        ("queueing_s", "queueing"),
        ("ttft_s", "TTFT"),
        ("tpot_s", "TPOT"),
        ("e2e_s", "end-to-end"),
        ("max_itl_s", "worst token gap"),
    ):
        v = res[key]
        lt.add_row(label, *(_fmt_t(v[p]) for p in ("mean", "p50", "p90", "p99")))
    console.print(lt)
    if "client" in res:
        _print_client(res["client"], client)
    console.print(f"JSON report written to {out}")


app.command(
    "compare",
    help="Run several policies (OSERVE, SageServe, Prism, Gyges and baselines) on one "
    "workload and pool; print the side-by-side table, write CSV and optionally a plot.",
    no_args_is_help=True,
)(compare_cmd)


@app.command("list")
def list_cmd(
    as_json: bool = typer.Option(False, "--json"),
    calibration: bool = typer.Option(
        False, "--calibration", help="show every GPU's calibration profile instead"
    ),
    engines: bool = typer.Option(
        False, "--engines", help="show the serving-engine profiles (--engine) instead"
    ),
) -> None:
    """List catalog GPUs and models (or the GPUs' calibration or the engines' profiles)."""
    if engines:
        from simulator.engines import describe, engine_profiles

        rows = [describe(name) for name in engine_profiles()]
        if as_json:
            sys.stdout.write(_dump(rows) + "\n")
            return
        et = Table(title="serving-engine profiles (catalog/engines.toml; run --engine NAME)")
        for c in ("engine", "chunk prompts", "reserve output", "calibration", "description"):
            et.add_column(c)
        for r in rows:
            cal = ", ".join(f"{k}={v:g}" for k, v in r["calibration"].items()) or "-"
            et.add_row(r["engine"], str(r["chunk_prompts"]), f"{r['reserve_output_ratio']:g}",
                       cal, r["description"])
        console.print(et)
        return
    if calibration:
        from dataclasses import asdict

        profiles = {g.key: asdict(g.calibration) for g in list_gpus()}
        if as_json:
            sys.stdout.write(_dump(profiles) + "\n")
            return
        names = [f for f in Calibration.__dataclass_fields__ if f != "name"]
        by_profile: dict[str, list[str]] = {}
        for key, prof in profiles.items():
            by_profile.setdefault(prof["name"], []).append(key)
        ct = Table(title="calibration profiles (otela/hardware/catalog.toml; "
                   "override with --calib)")
        ct.add_column("field")
        for name in by_profile:
            ct.add_column(name.replace("-", "-\n", 1), justify="right")
        ct.add_row("GPUs", *(" ".join(g) for g in by_profile.values()))
        for f in names:
            ct.add_row(f, *(f"{profiles[g[0]][f]:g}" for g in by_profile.values()))
        console.print(ct)
        return
    gpus = [
        {
            "gpu": g.key,
            "name": g.name,
            "fp16_tflops": g.fp16_flops / 1e12,
            "fp8_tflops": g.fp8_flops / 1e12,
            "mem_gb": g.mem_bytes / 1e9,
            "mem_bw_gbs": g.mem_bw / 1e9,
            "interconnect_gbs": g.interconnect_bw / 1e9,
            "cost_per_hour": g.cost_per_hour,
            "efficiency_class": g.efficiency.name,
        }
        for g in list_gpus()
    ]
    models = [
        {
            "model": m.name,
            "params_b": m.total_params / 1e9,
            "active_b": m.active_params / 1e9,
            "source": m.source,
        }
        for m in list_models()
    ]
    if as_json:
        sys.stdout.write(_dump({"gpus": gpus, "models": models}) + "\n")
        return
    t = Table(title="GPUs")
    for c in gpus[0]:
        t.add_column(c)
    for g in gpus:
        t.add_row(*(f"{v:g}" if isinstance(v, float) else str(v) for v in g.values()))
    console.print(t)
    mt = Table(title="models")
    for c in models[0]:
        mt.add_column(c)
    for m in models:
        mt.add_row(*(f"{v:.2f}" if isinstance(v, float) else str(v) for v in m.values()))
    console.print(mt)


if __name__ == "__main__":
    app()

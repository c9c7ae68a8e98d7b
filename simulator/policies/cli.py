"""`otela sim compare` and `otela sim run --policy`: policies side by side on one workload.

I/O only: reading the trace and the pool, building each policy from the registry, running it
(`run_cluster`), and printing the table (rich), writing it as CSV and, with `--plot FILE`,
as a bar chart (matplotlib). Exit codes: 0 done, 2 bad input, 1 a policy failed.
"""

from __future__ import annotations

import csv
import json
import math
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from otela.console import make_console
from simulator.policies.cluster import PolicyError, Pool, run_cluster
from simulator.policies.metrics import Slo, summarize
from simulator.policies.registry import POLICIES, Context, get
from simulator.policies.workload import ClusterWorkload, load_cluster_workload

console = make_console()  # off a terminal: no wrapping, tables as wide as their cells
err = make_console(stderr=True)

COLUMNS = (
    ("policy", "policy", "{}"),
    ("mean_gpus", "GPUs (mean)", "{:.1f}"),
    ("gpu_hours", "GPU-h", "{:.2f}"),
    ("cost_usd", "$", "{:.2f}"),
    ("completed", "done", "{}"),
    ("rejected", "rej", "{}"),
    ("throughput_rps", "req/s", "{:.2f}"),
    ("throughput_tokens_per_s", "tok/s", "{:.0f}"),
    ("ttft_p50", "TTFT p50", "{:.3f}"),
    ("ttft_p99", "TTFT p99", "{:.3f}"),
    ("tpot_p50", "TPOT p50", "{:.4f}"),
    ("e2e_p99", "e2e p99", "{:.2f}"),
    ("slo_attainment", "SLO att.", "{:.3f}"),
    ("wall_s", "wall s", "{:.1f}"),
)


def _fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"[red]{message}[/red]")
    return typer.Exit(code)


def parse_options(items: Sequence[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise PolicyError(f"--opt wants KEY=VALUE, got {item!r}")
        out[key.strip().replace("-", "_")] = value.strip()
    return out


def make_pool(gpu: str | None, gpus: int, per_host: int, pool_file: Path | None) -> Pool:
    """The pool from --gpu/--gpus/--gpus-per-host, or from a placer pool file (hosts list)."""
    if pool_file is not None:
        from simulator.placer.pool import pool_from_mapping

        text = pool_file.read_text()
        data = json.loads(text) if pool_file.suffix == ".json" else tomllib.loads(text)
        placer_pool = pool_from_mapping(data)
        from simulator.policies.cluster import HostSpec

        return Pool(tuple(HostSpec(h.variant.gpu, h.gpus) for h in placer_pool.hosts))
    if gpu is None:
        raise PolicyError("give --gpu (with --gpus) or --pool FILE")
    from otela.hardware.catalog import get_gpu

    return Pool.uniform(get_gpu(gpu).key, gpus, per_host)


def row(summary: dict[str, Any]) -> dict[str, Any]:
    """The comparison table's row of one run."""
    return {
        "policy": summary["policy"],
        "mean_gpus": summary["mean_gpus"],
        "gpu_hours": summary["gpu_hours"],
        "cost_usd": summary["cost_usd"],
        "completed": summary["completed"],
        "rejected": summary["rejected"],
        "throughput_rps": summary["throughput_rps"],
        "throughput_tokens_per_s": summary["throughput_tokens_per_s"],
        "ttft_p50": summary["ttft_s"]["p50"],
        "ttft_p99": summary["ttft_s"]["p99"],
        "tpot_p50": summary["tpot_s"]["p50"],
        "e2e_p99": summary["e2e_s"]["p99"],
        "slo_attainment": summary["slo_attainment"],
        "wall_s": summary["wall_s"],
    }


def run_policies(
    names: Sequence[str], wl: ClusterWorkload, pool: Pool, slo: Slo,
    options: dict[str, str], horizon: float | None = None,
) -> list[dict[str, Any]]:
    """Run each named policy on the workload; returns their summaries (in order)."""
    out = []
    models = _model_overrides(wl, options)
    for name in names:
        entry = get(name)
        ctx = Context(wl, pool, dict(slo.ttft_by_model or {}), options, models)
        policy = entry.build(ctx)
        run = run_cluster(wl, policy, Pool() if entry.elastic else pool, horizon=horizon,
                          models=models)
        s = summarize(run, slo)
        s["policy"] = name
        s["system"] = entry.system
        out.append(s)
    return out


def _model_overrides(wl: ClusterWorkload, options: dict[str, str]) -> dict[str, Any]:
    """`--opt max_context=N` raises every model's context limit (e.g. Qwen2.5 with YaRN for
    Gyges's 50K-token requests); the Llama-3.2 configs of the Prism scenario are known too."""
    import dataclasses

    from simulator.models import get_model

    out = known_models(wl)
    if "max_context" in options:
        for m in wl.models:
            base = out.get(m) or get_model(m)
            out[m] = dataclasses.replace(base, max_context=int(options["max_context"]))
    return out


def known_models(wl: ClusterWorkload) -> dict[str, Any]:
    """Specs of the workload's models that are not in the catalog but that otela's scenarios
    define (Llama-3.2-1B/3B of the Prism scenario)."""
    from simulator.policies.prism.scenario import EXTRA_MODELS

    return {m: EXTRA_MODELS[m] for m in wl.models if m in EXTRA_MODELS}


def show_table(rows: Sequence[dict[str, Any]], title: str) -> None:
    t = Table(title=title)
    for _, label, _ in COLUMNS:
        t.add_column(label, justify="left" if label == "policy" else "right")
    for r in rows:
        cells = []
        for key, _, fmt in COLUMNS:
            v = r[key]
            cells.append("-" if isinstance(v, float) and math.isnan(v) else fmt.format(v))
        t.add_row(*cells)
    console.print(t)


def write_csv(rows: Sequence[dict[str, Any]], path: Path) -> None:
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=[k for k, _, _ in COLUMNS])
        w.writeheader()
        for r in rows:
            w.writerow({k: r[k] for k, _, _ in COLUMNS})


def plot(rows: Sequence[dict[str, Any]], path: Path, title: str) -> None:
    """Four bar charts: GPU-hours, throughput, TTFT p99, SLO attainment."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["policy"] for r in rows]
    panels = (("gpu_hours", "GPU-hours"), ("throughput_tokens_per_s", "tokens/s"),
              ("ttft_p99", "TTFT p99 (s)"), ("slo_attainment", "SLO attainment"))
    fig, axes = plt.subplots(1, 4, figsize=(4 * 3.2, 3.4))
    for ax, (key, label) in zip(axes, panels, strict=True):
        vals = [0.0 if math.isnan(r[key]) else r[key] for r in rows]
        ax.bar(range(len(names)), vals, color="#4C72B0")
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
        ax.set_title(label, fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def compare_cmd(
    policies: str = typer.Option(
        ..., "--policies", "-p",
        help="comma-separated: " + ", ".join(POLICIES)),
    trace: Path = typer.Option(..., "--trace", help="otela trace (models, tiers) or CSV/JSONL"),
    model: str | None = typer.Option(
        None, "--model", "-m", help="model of a trace without a model column"),
    trace_model: str | None = typer.Option(
        None, "--trace-model", help="only this model's requests of a multi-model trace"),
    gpu: str | None = typer.Option(None, "--gpu", "-g", help="GPU type of the pool"),
    gpus: int = typer.Option(8, "--gpus", help="GPUs in the pool"),
    per_host: int = typer.Option(8, "--gpus-per-host", help="GPUs per host (TP groups)"),
    pool_file: Path | None = typer.Option(None, "--pool", help="placer pool file instead"),
    slo_ttft: float = typer.Option(10.0, "--slo-ttft", help="TTFT SLO (s)"),
    slo_tpot: float = typer.Option(0.1, "--slo-tpot", help="TPOT SLO (s)"),
    horizon: float | None = typer.Option(
        None, "--horizon", help="seconds over which throughput and GPU-hours are counted "
        "(default: until the last request finishes)"),
    opt: list[str] = typer.Option([], "--opt", help="policy option KEY=VALUE (repeatable)"),
    out_csv: Path = typer.Option(Path("sim-compare.csv"), "--csv", help="table as CSV"),
    plot_file: Path | None = typer.Option(None, "--plot", help="bar charts (PNG/SVG/PDF)"),
    as_json: bool = typer.Option(False, "--json", help="print full summaries as JSON"),
) -> None:
    """Run several policies on one workload and one pool; print the side-by-side table."""
    names = [p.strip() for p in policies.split(",") if p.strip()]
    try:
        for n in names:
            get(n)
        options = parse_options(opt)
        pool = make_pool(gpu, gpus, per_host, pool_file)
        wl = load_cluster_workload(trace, model)
        if trace_model is not None:
            wl = wl.only_model(trace_model)
    except (PolicyError, ValueError, OSError, KeyError) as exc:
        raise _fail(str(exc.args[0] if exc.args else exc)) from exc
    slo = Slo(slo_ttft, slo_tpot)
    try:
        summaries = run_policies(names, wl, pool, slo, options, horizon)
    except PolicyError as exc:
        raise _fail(str(exc), 1) from exc
    rows = [row(s) for s in summaries]
    write_csv(rows, out_csv)
    title = f"{len(wl)} requests ({', '.join(wl.models)}) on {pool.describe()}"
    if plot_file is not None:
        plot(rows, plot_file, title)
    if as_json:
        console.print_json(json.dumps(summaries, default=str))
        return
    show_table(rows, title)
    console.print(f"CSV written to {out_csv}" + (f", plot to {plot_file}" if plot_file else ""))


def run_policy_cmd(
    policy: str, wl: ClusterWorkload, pool: Pool, slo: Slo, options: dict[str, str],
    out: Path, as_json: bool,
) -> None:
    """`otela sim run --policy NAME`: one policy, the comparison row plus its notes."""
    try:
        summaries = run_policies([policy], wl, pool, slo, options)
    except PolicyError as exc:
        raise _fail(str(exc), 1) from exc
    s = summaries[0]
    text = json.dumps(s, indent=2, default=str)
    out.write_text(text + "\n")
    if as_json:
        console.print_json(text)
        return
    show_table([row(s)], f"{policy} on {pool.describe()}")
    notes = s.get("notes") or {}
    for k, v in notes.items():
        console.print(f"[bold]{k}[/]: {v}")
    console.print(f"JSON report written to {out}")


def run_from_sim_run(
    policy: str, model: str, gpu: str, gpus: int, trace: Path | None, trace_model: str | None,
    rate: float | None, duration: float, cv: float, input_dist: str, output_dist: str,
    seed: int, slo_ttft: float, slo_tpot: float, opt: Sequence[str], out: Path, as_json: bool,
) -> None:
    """The `--policy` branch of `otela sim run`: the pool is GPUs x --gpu (8 per host), the
    workload the trace (all its models) or the generator (--model's)."""
    from simulator.workload import synthetic

    try:
        get(policy)
        options = parse_options(opt)
        pool = make_pool(gpu, gpus, 8, None)
        if trace is not None:
            wl = load_cluster_workload(trace, model)
            if trace_model is not None:
                wl = wl.only_model(trace_model)
        else:
            base = synthetic(rate or 0.0, duration=duration, input_dist=input_dist,
                             output_dist=output_dist, cv=cv, seed=seed)
            wl = ClusterWorkload.single(base, model)
    except (PolicyError, ValueError, OSError, KeyError) as exc:
        raise _fail(str(exc.args[0] if exc.args else exc)) from exc
    run_policy_cmd(policy, wl, pool, Slo(slo_ttft, slo_tpot), options, out, as_json)

"""`otela trace`: generate, replay, analyze, compare and convert request traces.

Mounted by the main CLI as `otela trace`; also runnable as `python -m traces.cli`. Bad input
(unreadable trace, bad spec, bad URL) is one red line and exit code 2, never a traceback.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from otela.tracing.schema import TraceError
from traces.compare import compare
from traces.distributions import Diurnal
from traces.generate import PRESETS, GenSpec, generate, parse_models
from traces.io import read_trace, write_trace
from traces.stats import SLO, summarize

app = typer.Typer(
    help="Request traces: generate, replay against any OpenAI endpoint, analyze, compare.",
    no_args_is_help=True,
)
# Off a terminal, never wrap (tables in CI logs and files), as otela.console does; traces
# sits below otela, so the rule is repeated here rather than imported.
_WIDTH = None if sys.stdout.isatty() else 4096
console = Console(width=_WIDTH, soft_wrap=not sys.stdout.isatty())
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 4096,
                      soft_wrap=not sys.stderr.isatty())


@contextmanager
def _clean_errors() -> Iterator[None]:
    """Turn expected failures into one line and exit 2."""
    try:
        yield
    except (TraceError, ValueError, KeyError, OSError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        err_console.print(f"[red]error:[/red] {escape(str(msg))}")
        raise typer.Exit(2) from e


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    return obj


def _print_summary(title: str, summary: dict[str, Any]) -> None:
    from traces.report import summary_rows

    t = Table(title=title, show_header=False)
    t.add_column("metric")
    t.add_column("value", justify="right")
    for label, value in summary_rows(summary):
        t.add_row(label, value)
    console.print(t)


def _empirical(spec: str) -> list[int]:
    """`FILE[:input|output]` -> that column of an otela trace (default: input)."""
    path, _, column = spec.rpartition(":")
    if column not in ("input", "output") or not path:
        path, column = spec, "input"
    trace = read_trace(path)
    return [r.input_tokens if column == "input" else r.output_tokens for r in trace.records]


# ---- gen ---------------------------------------------------------------------------------
@app.command("gen")
def gen_cmd(
    out: Path = typer.Argument(..., help="trace file to write (.jsonl, .jsonl.gz or .csv)"),
    preset: str | None = typer.Option(
        None,
        "--preset",
        help=f"named workload ({', '.join(PRESETS)}: the OpenTela paper's sec. 5 lengths); "
        "explicit options override it",
    ),
    rate: float = typer.Option(1.0, "--rate", help="mean arrivals per second"),
    duration: float | None = typer.Option(None, "--duration", help="seconds of arrivals"),
    requests: int | None = typer.Option(None, "--requests", "-n", help="number of requests"),
    cv: float | None = typer.Option(
        None, "--cv", help="inter-arrival coefficient of variation: 1 = Poisson, >1 bursty Gamma"
    ),
    diurnal: str | None = typer.Option(
        None,
        "--diurnal",
        help="AMP[,PERIOD_S[,PEAK_S]]: rate follows mean*(1+AMP*cos(2pi(t-PEAK)/PERIOD)); "
        "period defaults to 86400 s",
    ),
    input_dist: str | None = typer.Option(
        None,
        "--input",
        help="input lengths: fixed:N | normal:M,S | uniform:A,B | lognormal:M,S | exp:M | "
        "empirical:TRACE[:input|output]",
    ),
    output_dist: str | None = typer.Option(None, "--output", help="output lengths (same forms)"),
    model: list[str] = typer.Option(
        [], "--model", "-m", help="model name, NAME:WEIGHT for a mix (repeatable)"
    ),
    prefix_groups: int = typer.Option(
        0, "--prefix-groups", help="shared system prompts (Zipf popularity), 0 = none"
    ),
    prefix_len: int = typer.Option(0, "--prefix-len", help="tokens of each shared prefix"),
    seed: int = typer.Option(0, "--seed", help="random seed: same options + seed = same trace"),
) -> None:
    """Generate a synthetic trace (seeded): arrivals, lengths and a model mix."""
    with _clean_errors():
        if preset and preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
        base = dict(PRESETS[preset]) if preset else {}
        if duration is None and requests is None:
            raise ValueError("give --duration SECONDS or --requests N")
        curve = None
        if diurnal:
            parts = [float(x) for x in diurnal.split(",")]
            if not 1 <= len(parts) <= 3:
                raise ValueError("--diurnal takes AMP[,PERIOD_S[,PEAK_S]]")
            curve = Diurnal(*parts)
        spec = GenSpec(
            rate=rate,
            duration=duration,
            requests=requests,
            cv=cv if cv is not None else float(base.get("cv", 1.0)),
            diurnal=curve,
            input=input_dist or str(base.get("input", "fixed:512")),
            output=output_dist or str(base.get("output", "fixed:128")),
            models=parse_models(model),
            seed=seed,
            prefix_groups=prefix_groups,
            prefix_len=prefix_len,
        )
        trace = generate(spec, _empirical)
        if preset:
            trace.header["preset"] = preset
        write_trace(out, trace)
    _print_summary(f"{out}: {len(trace)} requests", summarize(trace.records))


# ---- replay ------------------------------------------------------------------------------
class _LiveView:
    """Renders the replay's progress bar from its counters (called from the trio loop)."""

    def __init__(self, progress: Progress, total: int) -> None:
        self.progress = progress
        self.task = progress.add_task("replay", total=total, rate="", errors="0", inflight="0")
        self.last = (time.perf_counter(), 0, 0)

    def __call__(self, live: Any) -> None:
        now = time.perf_counter()
        t, done, toks = self.last
        dt = max(now - t, 1e-9)
        self.progress.update(
            self.task,
            completed=live.done,
            rate=f"{(live.done - done) / dt:7.1f} req/s {(live.out_tokens - toks) / dt:8.0f} tok/s",
            errors=str(live.failed),
            inflight=str(live.inflight),
        )
        self.last = (now, live.done, live.out_tokens)
        self.progress.refresh()


@app.command("replay")
def replay_cmd(
    trace_file: Path = typer.Argument(..., help="trace to replay (.jsonl, .jsonl.gz, .csv)"),
    url: str = typer.Option(
        ..., "--url", envvar="OTELA_REPLAY_URL", help="endpoint base URL, e.g. http://host:8092"
    ),
    speed: float = typer.Option(1.0, "--speed", help="time compression: 2 = twice as fast"),
    api_key: str | None = typer.Option(
        None, "--api-key", envvar="OTELA_API_KEY", help="sent as 'Authorization: Bearer KEY'"
    ),
    closed_loop: bool = typer.Option(
        False,
        "--closed-loop",
        help="ignore arrival times: keep --concurrency requests in flight (like vllm bench)",
    ),
    concurrency: int | None = typer.Option(
        None,
        "--concurrency",
        "-c",
        help="closed loop: requests in flight; open loop: cap on requests in flight",
    ),
    stream: bool = typer.Option(
        True, "--stream/--no-stream", help="stream responses (measures TTFT and inter-token)"
    ),
    api: str = typer.Option(
        "completions",
        "--api",
        help="completions (token-id prompts: exact input lengths) or chat (word prompts)",
    ),
    model: str | None = typer.Option(None, "--model", help="send every request to this model"),
    exact_output: bool = typer.Option(
        True,
        "--exact-output/--natural-output",
        help="pin output length with min_tokens + ignore_eos (vLLM/SGLang extensions)",
    ),
    limit: int | None = typer.Option(None, "--limit", help="replay only the first N requests"),
    timeout: float = typer.Option(600.0, "--timeout", help="seconds per request"),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="result trace (default: <trace>.replay.jsonl here)"
    ),
    summary_json: Path | None = typer.Option(None, "--summary-json", help="write the summary"),
    slo_ttft: float = typer.Option(10.0, "--slo-ttft", help="goodput SLO on TTFT, seconds"),
    slo_tpot: float = typer.Option(0.1, "--slo-tpot", help="goodput SLO on TPOT, seconds"),
    hash_ids: bool = typer.Option(
        False, "--hash-ids", help="hash provider and node ids in the result trace"
    ),
    seed: int | None = typer.Option(
        None,
        "--seed",
        help="seed for the synthetic prompt token ids (default: fresh each run, so a replay "
        "never hits the prefix cache a previous replay filled)",
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar"),
) -> None:
    """Replay a trace against an OpenAI-compatible endpoint (otela, vLLM, any server).

    Open loop by default: request i is sent at its recorded arrival / speed, whatever the
    endpoint does. Writes the measured requests as a new trace and prints a summary
    (TTFT/TPOT/end-to-end percentiles, goodput under the SLOs, errors by kind). Exit codes:
    0 done, 1 every request failed, 2 bad input, 130 interrupted (partial results written).
    """
    from traces.replay.runner import Replayer, ReplayOptions

    with _clean_errors():
        trace = read_trace(trace_file)
        if limit is not None:
            trace.records = trace.records[:limit]
        if not trace.records:
            raise ValueError(f"{trace_file}: no requests to replay")
        opts = ReplayOptions(
            url=url,
            speed=speed,
            api_key=api_key,
            stream=stream,
            api=api,
            closed_loop=closed_loop,
            concurrency=concurrency,
            timeout_s=timeout,
            model=model,
            exact_output=exact_output,
            hash_ids=hash_ids,
            seed=seed,
        )
        import trio

        progress = Progress(
            TextColumn("[bold]replay"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TextColumn("in flight {task.fields[inflight]}"),
            TextColumn("[red]errors {task.fields[errors]}"),
            TimeElapsedColumn(),
            console=err_console,
            auto_refresh=False,  # refreshed from the trio loop: no render thread
            disable=quiet,
        )
        replayer = Replayer(trace, opts)  # checks the URL before anything is drawn
        with progress:
            replayer.progress = None if quiet else _LiveView(progress, len(trace))
            result = trio.run(replayer.run)
        dest = out or Path(trace_file.name.split(".")[0] + ".replay.jsonl")
        write_trace(dest, result)
        summary = summarize(result.records, SLO(slo_ttft, slo_tpot))
        if summary_json:
            summary_json.write_text(json.dumps(_jsonable(summary), indent=2) + "\n")
    note = " (interrupted)" if replayer.live.interrupted else ""
    _print_summary(f"replay of {trace_file} against {url}{note}", summary)
    console.print(f"result trace written to {dest}")
    if replayer.live.interrupted:
        raise typer.Exit(130)
    if summary.get("requests") and not summary.get("succeeded"):
        err_console.print("[red]every request failed[/red] (see errors above)")
        raise typer.Exit(1)


# ---- analyze / compare / convert ---------------------------------------------------------
@app.command("analyze")
def analyze_cmd(
    trace_file: Path = typer.Argument(..., help="trace to analyze"),
    compare_with: Path | None = typer.Option(
        None, "--compare", help="a second trace to overlay and compare against"
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        "-o",
        help="directory for the PNGs and report.html (default <trace>-analysis)",
    ),
    bin_s: float | None = typer.Option(None, "--bin", help="time bin in seconds (default: auto)"),
    slo_ttft: float = typer.Option(10.0, "--slo-ttft"),
    slo_tpot: float = typer.Option(0.1, "--slo-tpot"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
) -> None:
    """The paper's sec. 6 views as PNG plots and a self-contained HTML report, plus a summary:
    arrivals over time, token usage and burstiness per model, length CDFs, output ratio,
    prefix reuse, latency CDFs, per-provider breakdown."""
    from traces import plots
    from traces.analysis import analyze
    from traces.report import html_report

    with _clean_errors():
        trace = read_trace(trace_file)
        if not trace.records:
            raise ValueError(f"{trace_file}: no requests to analyze")
        other = read_trace(compare_with) if compare_with else None
        slo = SLO(slo_ttft, slo_tpot)
        a = analyze(trace.records, bin_s)
        b = analyze(other.records, a.bin_s) if other and other.records else None
        labels = (trace_file.name, compare_with.name if compare_with else "other")
        outdir = out or Path(trace_file.name.split(".")[0] + "-analysis")
        images = plots.render(a, outdir, b, labels)
        summary = summarize(trace.records, slo)
        rows = compare(trace.records, other.records, slo) if other else None
        report = outdir / "report.html"
        report.write_text(html_report(f"Trace {trace_file.name}", summary, a, images, rows, labels))
    if as_json:
        payload = {"summary": summary, "comparison": rows, "burstiness": a.burstiness}
        sys.stdout.write(json.dumps(_jsonable(payload), indent=2) + "\n")
        return
    _print_summary(f"{trace_file} ({a.duration:.1f} s, {len(a.model_tokens)} models)", summary)
    t = Table(title="models")
    for c in ("model", "requests", "input tok", "output tok", "burstiness"):
        t.add_column(c, justify="left" if c == "model" else "right")
    for m, n, i, o in a.model_tokens[:20]:
        t.add_row(m, f"{n:,}", f"{i:,}", f"{o:,}", f"{a.burstiness[m]:.1f}")
    console.print(t)
    if rows:
        _print_comparison(rows, labels)
    console.print(f"{len(images)} plots and {report} written to {outdir}/")


def _print_comparison(rows: list[dict[str, Any]], labels: tuple[str, str]) -> None:
    t = Table(title=f"{labels[0]} vs {labels[1]}")
    for c in ("metric", labels[0], labels[1], "error"):
        t.add_column(c, justify="left" if c == "metric" else "right")
    for r in rows:
        a, b, e = r["first"], r["second"], r["error"]
        t.add_row(
            r["metric"],
            "-" if a is None else f"{a:.4g}",
            "-" if b is None else f"{b:.4g}",
            "-" if e is None else f"{100 * e:+.1f} %",
        )
    console.print(t)


@app.command("compare")
def compare_cmd(
    first: Path = typer.Argument(..., help="e.g. the simulated trace (otela sim run --out-trace)"),
    second: Path = typer.Argument(..., help="e.g. the replayed (measured) trace"),
    slo_ttft: float = typer.Option(10.0, "--slo-ttft"),
    slo_tpot: float = typer.Option(0.1, "--slo-tpot"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Per-metric error of FIRST against SECOND: (first - second) / second for TTFT, TPOT and
    end-to-end percentiles, throughput, output tokens/s and goodput."""
    with _clean_errors():
        a, b = read_trace(first), read_trace(second)
        rows = compare(a.records, b.records, SLO(slo_ttft, slo_tpot))
    if as_json:
        sys.stdout.write(json.dumps(_jsonable(rows), indent=2) + "\n")
        return
    _print_comparison(rows, (first.name, second.name))


@app.command("convert")
def convert_cmd(
    src: Path = typer.Argument(..., help="trace to read (.jsonl, .jsonl.gz, .csv)"),
    dest: Path = typer.Argument(..., help="trace to write; the format follows the suffix"),
) -> None:
    """Convert between JSON Lines and CSV (lossless for every schema field)."""
    with _clean_errors():
        trace = read_trace(src)
        write_trace(dest, trace)
    console.print(f"{len(trace)} requests written to {dest}")


if __name__ == "__main__":
    app()

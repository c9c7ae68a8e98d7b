"""`otela plan`: the typer command (I/O only; the model lives in the pure modules).

Exit codes: 0 a plan; 2 bad input (one line, never a traceback); 3 no plan exists (the
demand cannot be met under the constraints: the line says which model falls short).
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

import typer
from libp2p.crypto.keys import PrivateKey
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from otela.console import make_console
from simulator.placer import exhaustive
from simulator.placer.cpsat import DEFAULT_WORKERS, PlanError
from simulator.placer.demand import (
    SLO,
    Demand,
    DemandError,
    Objective,
    demand_from_mapping,
)
from simulator.placer.evaluate import Group, evaluate, groups_of_plan
from simulator.placer.federation import (
    FederationError,
    Running,
    assignable,
    existing_counts,
    fetch_nodes,
    running_replicas,
)
from simulator.placer.memp import memp
from simulator.placer.plan import DEFAULT_MAX_UTILIZATION, Plan, make_plan
from simulator.placer.pool import Pool, PoolError, Variant, pool_from_mapping, pool_from_records
from simulator.placer.profile import Profiler, default_cache_dir
from simulator.placer.render import diff_rows, show, show_diff, show_rejected
from simulator.placer.sbatch import ENGINES, Job, TemplateError, write_scripts

console = make_console()
err = make_console(stderr=True, soft_wrap=True)

HELP = (
    "Plan which models run on which GPUs, with which tensor parallelism (paper §3.5).\n\n"
    "Every configuration (model x GPU type x TP degree) that fits is simulated once (and "
    "cached) under the demand's token lengths; a CP-SAT model then chooses replica counts so "
    "that per-type GPU counts hold (C1), weights and KV fit (C2), TP groups stay on one host "
    "(C3) and the demand is met, minimising the objective: mean end-to-end latency (the "
    "paper's Eq. 1), or maximising SLO goodput, or the fewest GPUs / lowest $/h meeting "
    "every SLO.\n\n"
    "Input: a pool (--pool FILE, or --from URL for a live federation's idle nodes) and a "
    "demand (--demand FILE, or --trace FILE). Output: a table (or --json), predicted latency "
    "and utilisation per model, the changes against what runs now (--from), sbatch scripts "
    "(--emit-sbatch DIR), signed assignments to idle nodes (--assign). Exit codes: 0 a plan, "
    "2 bad input, 3 no plan meets the demand. Formats: docs/placer.md."
)


def _fail(message: str, code: int = 2) -> NoReturn:
    err.print(f"otela plan: {message}", markup=False, highlight=False)
    raise typer.Exit(code)


def _read_mapping(path: Path, what: str) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        _fail(f"cannot read {what} {path}: {exc.strerror or exc}")
    try:
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        _fail(f"{what} {path} is not valid {'JSON' if path.suffix == '.json' else 'TOML'}: "
              f"{exc}")
    if not isinstance(data, dict):
        _fail(f"{what} {path} must be a table/object")
    return data


def _gpu_map(items: Sequence[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, key = item.rpartition("=")
        if not sep or not name or not key:
            _fail(f"--gpu-map {item!r}: use 'NAME AS REPORTED=catalog-key'")
        out[name] = key
    return out


def _demand_from_trace(path: Path, objective: Objective, horizon: float) -> Demand:
    """One service per model named in the trace (the name must be a catalog model/HF id)."""
    from otela.tracing.schema import TraceError
    from simulator.models import get_model
    from traces.io import read_trace

    try:
        trace = read_trace(path)
    except (OSError, TraceError, ValueError) as exc:
        _fail(f"cannot read trace {path}: {exc}")
    names = sorted({r.model for r in trace.records})
    entries = []
    for name in names:
        try:
            get_model(name)
        except KeyError:
            _fail(f"trace model {name!r} is not in the simulator's catalog; write a --demand "
                  f"file with model = \"<catalog key>\", name = \"{name}\", trace = \"{path}\"")
        entries.append({"model": name, "name": name, "trace": str(path)})
    if not entries:
        _fail(f"trace {path} has no requests")
    return demand_from_mapping({"models": entries, "horizon_s": horizon}, objective=objective)


def _apply_defaults(demand: Demand, ttft: float | None, tpot: float | None,
                    e2e: float | None, horizon: float | None) -> Demand:
    services = []
    for s in demand.services:
        slo = SLO(s.slo.ttft_s if s.slo.ttft_s is not None else ttft,
                  s.slo.tpot_s if s.slo.tpot_s is not None else tpot,
                  s.slo.e2e_s if s.slo.e2e_s is not None else e2e, s.slo.percentile)
        services.append(replace(s, slo=slo))  # every other field as the demand gave it
    return Demand(tuple(services), demand.objective,
                  horizon if horizon is not None else demand.horizon_s)


def plan_command(
    pool_file: Path | None = typer.Option(
        None, "--pool", metavar="FILE", envvar="OTELA_PLAN_POOL",
        help="Pool file (TOML or JSON): a hosts list with gpu, gpus_per_host, count, "
        "interconnect, partition, constraint."),
    from_url: str | None = typer.Option(
        None, "--from", metavar="URL", envvar="OTELA_PLAN_FROM",
        help="A federation node's HTTP URL: plan its idle nodes; replicas already serving "
        "stay and count."),
    demand_file: Path | None = typer.Option(
        None, "--demand", metavar="FILE", envvar="OTELA_PLAN_DEMAND",
        help="Demand file (TOML or JSON): a models list with model, rate, input, output (or "
        "trace), ttft/tpot/e2e SLOs."),
    trace: Path | None = typer.Option(
        None, "--trace", metavar="FILE",
        help="Demand from an otela trace: one model per model name, its rate and lengths."),
    objective: Objective | None = typer.Option(
        None, "--objective", "-o", case_sensitive=False,
        help="latency (paper's Eq. 1, default), goodput, gpus or cost."),
    ttft: float | None = typer.Option(None, "--ttft", metavar="S",
                                      help="TTFT SLO for models without one (seconds)."),
    tpot: float | None = typer.Option(None, "--tpot", metavar="S",
                                      help="TPOT SLO for models without one (seconds)."),
    e2e: float | None = typer.Option(None, "--e2e", metavar="S",
                                     help="End-to-end SLO for models without one (seconds)."),
    horizon: float | None = typer.Option(
        None, "--horizon", metavar="S",
        help="How long an overload lasts when demand exceeds the pool (prices queueing; "
        "default 300 s or the demand file's horizon_s)."),
    max_util: float = typer.Option(
        DEFAULT_MAX_UTILIZATION, "--max-utilization", metavar="F",
        help="Without SLOs, the goodput/gpus/cost objectives load replicas up to this share "
        "of their saturated throughput."),
    time_limit: float = typer.Option(
        10.0, "--time-limit", metavar="S", envvar="OTELA_PLAN_TIME_LIMIT",
        help="CP-SAT time limit (seconds)."),
    gap: float = typer.Option(0.0, "--gap", metavar="F",
                              help="Stop at this relative optimality gap (0: prove optimal)."),
    workers: int = typer.Option(
        DEFAULT_WORKERS, "--workers",
        help="CP-SAT search workers (time-sliced on fewer cores; below 8 CP-SAT leaves out "
        "the subsolvers that prove plans optimal)."),
    cache: Path | None = typer.Option(
        None, "--cache", metavar="DIR",
        help="Simulation cache (default $OTELA_PLACER_CACHE or ~/.cache/otela/placer)."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Simulate everything afresh."),
    requests: int = typer.Option(600, "--sim-requests", metavar="N",
                                 help="Simulated requests per load point."),
    gpu_map: list[str] = typer.Option(
        [], "--gpu-map", metavar="NAME=KEY",
        help="Map a GPU name as nodes report it to a catalog key (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
    out: Path | None = typer.Option(None, "--out", metavar="FILE",
                                    help="Also write the plan as JSON to FILE."),
    compare_memp: bool = typer.Option(False, "--compare-memp",
                                      help="Show the memP baseline's allocation next to it."),
    eval_s: float = typer.Option(
        0.0, "--evaluate", metavar="S",
        help="Check the plan (and memP with --compare-memp) in the event simulator on a "
        "Poisson workload of S seconds."),
    emit_sbatch: Path | None = typer.Option(
        None, "--emit-sbatch", metavar="DIR", help="Write one sbatch script per new replica."),
    engine: str = typer.Option(
        "vllm", "--engine",
        help=f"Engine for sbatch scripts ({', '.join(ENGINES)}) and the allowlist name "
        "sent with --assign."),
    engine_command: str | None = typer.Option(
        None, "--engine-command", metavar="TEMPLATE",
        help="sbatch engine command with {model}, {tp}, {port} (overrides --engine)."),
    templates: Path | None = typer.Option(None, "--templates", metavar="DIR",
                                          help="Directory of sbatch templates (slurm/)."),
    assign: bool = typer.Option(
        False, "--assign", help="Send each new replica, signed, to its idle node (--from)."),
    identity: Path | None = typer.Option(
        None, "--identity", metavar="HOME",
        help="Sign assignments with the node identity kept in HOME (identity.key)."),
    authority: Path | None = typer.Option(
        None, "--authority", metavar="DIR",
        help="Sign assignments with the membership authority key in DIR."),
    assign_ttl: float = typer.Option(600.0, "--assign-ttl", metavar="S",
                                     help="Assignments expire after S seconds."),
    policy: str = typer.Option(
        "cpsat", "--policy",
        help="cpsat (this placer), or a companion planner on --pool and --trace: oserve "
        "(heterogeneous layout and per-type assignment for one model), prism (KV-pressure "
        "model-to-GPU placement), sageserve (next hour's instances per model and region)."),
) -> None:
    if policy != "cpsat":
        from simulator.policies.plan import policy_plan_command

        policy_plan_command(policy, pool_file, trace, as_json, out, _fail)
        return
    if (pool_file is None) == (from_url is None):
        _fail("give exactly one of --pool FILE or --from URL")
    if (demand_file is None) == (trace is None):
        _fail("give exactly one of --demand FILE or --trace FILE")
    if not time_limit > 0 or workers < 1 or not 0 <= gap < 1 or requests < 50:
        _fail("--time-limit must be > 0, --workers >= 1, --gap in [0, 1), "
              "--sim-requests >= 50")
    if not 0 < max_util <= 1:
        _fail("--max-utilization must be in (0, 1]")
    if assign and from_url is None:
        _fail("--assign needs --from URL (assignments go to the federation's idle nodes)")
    if assign and (identity is None) == (authority is None):
        _fail("--assign needs exactly one of --identity HOME or --authority DIR to sign with")
    mapping = _gpu_map(gpu_map)
    signer = _signer(identity, authority) if assign else None

    # -- demand --------------------------------------------------------------------------
    try:
        if demand_file is not None:
            demand = demand_from_mapping(_read_mapping(demand_file, "demand"),
                                         base=demand_file.parent, objective=objective)
        else:
            assert trace is not None
            demand = _demand_from_trace(trace, objective or Objective.LATENCY, horizon or 300)
        demand = _apply_defaults(demand, ttft, tpot, e2e, horizon)
    except (DemandError, ValueError) as exc:
        _fail(str(exc))
    if horizon is not None and horizon <= 0:
        _fail("--horizon must be > 0")

    # -- pool ----------------------------------------------------------------------------
    running: list[Running] = []
    notes: list[str] = []
    try:
        if pool_file is not None:
            pool = pool_from_mapping(_read_mapping(pool_file, "pool"), mapping)
        else:
            assert from_url is not None
            nodes = fetch_nodes(from_url)
            left_out: list[str] = []
            if signer is not None:  # only nodes that would take our assignments
                nodes, left_out = assignable(nodes, signer[1], engine)
            pool = pool_from_records(nodes, mapping)
            running, notes = running_replicas(nodes, demand.services, mapping)
            notes = left_out + notes
    except (PoolError, FederationError) as exc:
        _fail(str(exc))
    if not pool.hosts and not running:
        why = (": " + "; ".join(pool.skipped)) if pool.skipped else ""
        _fail(f"the pool has no usable GPUs{why}")

    # -- simulate and solve --------------------------------------------------------------
    profiler = Profiler(None if no_cache else (cache or default_cache_dir()), requests=requests)
    variants = {v.name: v for v in pool.variants()}
    for r in running:
        variants.setdefault(r.variant, Variant(r.variant))
    max_tp = _max_tp(pool, running)
    try:
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                      console=err, transient=True, disable=as_json) as progress:
            task = progress.add_task("simulating configurations")
            cands, rejected = profiler.candidates(
                demand.services, variants.values(), max_tp,
                lambda label: progress.update(task, description=f"simulating {label}"))
            progress.update(task, description="solving (CP-SAT)")
            plan = make_plan(demand, pool, cands, rejected, time_limit_s=time_limit,
                             workers=workers, gap_limit=gap,
                             existing=existing_counts(running), max_utilization=max_util,
                             simulated=profiler.simulated)
    except PlanError as exc:
        _fail(str(exc), 3)

    result: dict[str, Any] = plan.to_dict()
    rows = diff_rows(plan, running) if from_url is not None else []
    if from_url is not None:
        result["changes"] = rows
        result["notes"] = notes
    if compare_memp:
        result["memp"] = _memp_summary(plan)
    if eval_s > 0:
        result["evaluation"] = _evaluate(plan, eval_s, compare_memp)
    if emit_sbatch is not None:
        result["sbatch"] = _emit(plan, emit_sbatch, engine, engine_command, templates)
    if signer is not None:
        result["assignments"] = _assign(plan, *signer, engine, assign_ttl)

    if out is not None:
        try:
            out.write_text(json.dumps(result, indent=2, default=_json_default) + "\n")
        except OSError as exc:
            _fail(f"cannot write {out}: {exc.strerror or exc}")
    if as_json:
        console.print_json(json.dumps(result, default=_json_default))
        return
    show(plan, console)
    show_rejected(plan, console)
    if from_url is not None:
        show_diff(rows, console)
        for note in notes:
            console.print(f"[yellow]note:[/] {note}")
    if compare_memp:
        _show_memp(result["memp"])
    if eval_s > 0:
        _show_evaluation(result["evaluation"])
    if emit_sbatch is not None:
        console.print(f"wrote {len(result['sbatch'])} sbatch scripts to {emit_sbatch}")
    if assign:
        _show_assignments(result["assignments"])


def _json_default(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return str(v)


def _max_tp(pool: Pool, running: Sequence[Running]) -> Callable[[Variant], int]:
    sizes: dict[str, int] = {}
    for h in pool.hosts:
        sizes[h.variant.name] = max(sizes.get(h.variant.name, 0), h.gpus)
    for r in running:
        sizes[r.variant] = max(sizes.get(r.variant, 0), r.tp)
    return lambda v: sizes.get(v.name, 0)


def _memp_summary(plan: Plan) -> dict[str, Any]:
    groups = memp(plan.demand.services, plan.pool)
    index = {(o.service, o.variant, o.tp): i for i, o in enumerate(plan.problem.options)}
    vec = [0] * len(plan.problem.options)
    missing = []
    for g in groups:
        i = index.get((g.service, g.variant, g.tp))
        if i is None:
            missing.append(f"{g.service} {g.variant} TP{g.tp}")
        else:
            vec[i] += g.replicas
    lat = exhaustive.best_flows(plan.problem, vec) if not missing else None
    total = sum(plan.problem.rates.values())
    return {
        "groups": [{"model": g.service, "gpu": g.variant, "tp": g.tp, "replicas": g.replicas}
                   for g in groups],
        "predicted_mean_latency_s": None if lat is None else lat / total,
        "note": "configurations outside the model: " + ", ".join(missing) if missing else
        ("infeasible under the plan's constraints" if lat is None else ""),
    }


def _show_memp(m: dict[str, Any]) -> None:
    t = Table(title="memP baseline (GPUs in proportion to rate x parameters)")
    for col in ("model", "GPU", "TP", "replicas"):
        t.add_column(col)
    for g in m["groups"]:
        t.add_row(g["model"], g["gpu"], str(g["tp"]), str(g["replicas"]))
    console.print(t)
    lat = m["predicted_mean_latency_s"]
    console.print(f"memP predicted mean latency: {'-' if lat is None else f'{lat:.2f} s'} "
                  f"{m['note']}")


def _evaluate(plan: Plan, seconds: float, with_memp: bool) -> dict[str, Any]:
    out = {"plan": evaluate(plan.demand, groups_of_plan(plan), seconds).to_dict()}
    if with_memp:
        variants = {h.variant.name: h.variant for h in plan.pool.hosts}
        gs = [Group(g.service, variants[g.variant], g.tp, g.replicas, g.replicas)
              for g in memp(plan.demand.services, plan.pool)]
        out["memp"] = evaluate(plan.demand, gs, seconds).to_dict()
    return out


def _show_evaluation(ev: dict[str, Any]) -> None:
    t = Table(title="event simulation (same Poisson workload; latency over served requests)")
    for col in ("plan", "mean e2e", "p99 e2e", "goodput", "throughput", "max util.",
                "unserved"):
        t.add_column(col, justify="left" if col in ("plan", "unserved") else "right")
    for name, e in ev.items():
        unserved = ", ".join(e["unserved"])
        t.add_row(name, f"{e['mean_e2e_s']:.2f} s", f"{e['p99_e2e_s']:.2f} s",
                  f"{e['goodput_rps']:.1f}/s", f"{e['throughput_rps']:.1f}/s",
                  "-" if e["max_utilization"] is None else f"{100 * e['max_utilization']:.0f} %",
                  f"[red]{unserved} ({e['unserved_rps']:.1f} req/s, 0 GPUs)[/red]"
                  if unserved else "-")
    console.print(t)
    m = Table(title="per model")
    for col in ("plan", "model", "offered", "capacity", "utilisation", "mean e2e", "p99 e2e"):
        m.add_column(col, justify="left" if col in ("plan", "model") else "right")
    for name, e in ev.items():
        for s in e["models"]:
            if not s["served"]:
                m.add_row(name, s["service"], f"{s['offered_rps']:.1f}/s", "0",
                          "[red]unserved[/red]", "-", "-")
                continue
            m.add_row(name, s["service"], f"{s['offered_rps']:.1f}/s",
                      f"{s['capacity_rps']:.1f}/s", f"{100 * s['utilization']:.0f} %",
                      f"{s['mean_e2e']:.2f} s", f"{s['p99_e2e']:.2f} s")
    console.print(m)


def _emit(plan: Plan, out_dir: Path, engine: str, custom: str | None,
          templates: Path | None) -> list[str]:
    hosts = {h.name: h for h in plan.pool.hosts}
    jobs = []
    for r in plan.replicas:
        if r.existing:
            continue
        h = hosts.get(r.host or "")
        jobs.append(Job(r.service, r.tp, r.gpu, r.host, h.partition if h else None,
                        h.constraint if h else None))
    try:
        kwargs: dict[str, Any] = {} if templates is None else {"templates": templates}
        paths = write_scripts(out_dir, jobs, engine, custom, **kwargs)
    except (TemplateError, OSError) as exc:
        _fail(f"--emit-sbatch: {exc}")
    return [str(p) for p in paths]


def _signer(identity: Path | None, authority: Path | None) -> tuple[PrivateKey, str]:
    """The key assignments are signed with, and the issuer it stands for."""
    from otela.assignments.message import issuer_for_authority

    if identity is not None:
        from otela.identity import KEY_FILE, load_or_create

        if not (identity / KEY_FILE).exists():
            _fail(f"--identity {identity}: no {KEY_FILE} there")
        try:
            ident = load_or_create(identity)
        except ValueError as exc:
            _fail(f"--identity: {exc}")
        key = ident.key_pair.private_key
        issuer = ident.peer_id.to_base58()
    else:
        assert authority is not None
        from otela.membership.authority import load_authority_key
        from otela.registry.certificate import MembershipError

        try:
            key = load_authority_key(authority)
        except (MembershipError, OSError) as exc:
            _fail(f"--authority: {exc}")
        issuer = issuer_for_authority(key.get_public_key())
    return key, issuer


def _assign(plan: Plan, key: PrivateKey, issuer: str, engine: str,
            ttl: float) -> list[dict[str, Any]]:
    from otela.assignments import sender

    hosts = {h.name: h for h in plan.pool.hosts}
    results = []
    for r in plan.replicas:
        h = hosts.get(r.host or "")
        if r.existing or h is None or not h.peer_id or not h.http_url:
            continue
        a, env = sender.make(issuer, key, target=h.peer_id, engine=engine, model=r.service,
                             tp=r.tp, ttl_s=ttl, plan=f"otela plan {plan.demand.objective}")
        res = sender.send(h.http_url, h.peer_id, a, env)
        results.append({"node": h.name, "peer_id": h.peer_id, "model": r.service, "tp": r.tp,
                        "assignment": a.id, "status": res.status, "accepted": res.accepted,
                        "code": res.code, "detail": res.detail})
    return results


def _show_assignments(rows: Sequence[dict[str, Any]]) -> None:
    t = Table(title="assignments sent")
    for col in ("node", "model", "TP", "HTTP", "accepted", "detail"):
        t.add_column(col)
    for r in rows:
        # the detail is the node's own answer: shown as written, never read as markup
        t.add_row(escape(r["node"]), escape(r["model"]), str(r["tp"]), str(r["status"]),
                  "yes" if r["accepted"] else "[red]no[/]", escape(str(r["detail"])))
    console.print(t)

"""Showing a plan: rich tables (per model, per replica group, solver) and the diff against
what runs now. Pure apart from printing to the console it is given."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from simulator.placer.federation import Running
from simulator.placer.plan import Plan


def _fmt_s(v: float) -> str:
    if v != v:  # NaN
        return "-"
    return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"


def show(plan: Plan, console: Console) -> None:
    sol = plan.solution
    t = Table(title=f"otela plan: {plan.demand.objective.value} objective, "
                    f"{plan.pool.summary()}")
    for col in ("model", "rate", "served", "GPUs", "predicted e2e", "utilisation"):
        t.add_column(col, justify="left" if col == "model" else "right")
    precision = plan.demand.precision_labels()
    for f in plan.forecasts:
        served = f"{f.service} ({precision[f.service]})" if precision.get(f.service) else f.service
        t.add_row(served, f"{f.rate:g}/s", f"{f.served:.4g}/s", str(f.gpus),
                  _fmt_s(f.latency_s), f"{f.utilization:.0%}" if f.utilization == f.utilization
                  else "-")
    console.print(t)
    g = Table(title="replicas")
    for col in ("model", "GPU", "TP", "replicas", "share", "hosts"):
        g.add_column(col, justify="right" if col in ("TP", "replicas", "share") else "left")
    groups: dict[tuple[str, str, int], list[str]] = {}
    for r in plan.replicas:
        groups.setdefault((r.service, r.variant, r.tp), []).append(r.host or "(running)")
    weights = {f.service: f.weights for f in plan.forecasts}
    for (svc, var, tp), hosts in sorted(groups.items()):
        share = weights.get(svc, {}).get(f"{var} TP{tp}", 0.0)
        names = sorted(Counter(hosts).items())
        g.add_row(svc, var, str(tp), str(len(hosts)), f"{share:.0%}",
                  ", ".join(f"{h}" + (f" x{n}" if n > 1 else "") for h, n in names))
    console.print(g)
    s = Table(title="solver (CP-SAT)")
    for col in ("phase", "status", "objective", "best bound", "gap", "time"):
        s.add_column(col, justify="left" if col in ("phase", "status") else "right")
    for p in sol.phases:
        s.add_row(p.name, p.status, f"{p.objective:.6g} {p.unit}", f"{p.bound:.6g}",
                  f"{p.gap:.2%}", f"{p.wall_s:.2f} s")
    console.print(s)
    console.print(f"predicted mean end-to-end latency {_fmt_s(plan.mean_latency_s)}, "
                  f"{plan.gpus_used} of {plan.pool.total_gpus} GPUs used; "
                  f"{plan.simulated} configurations simulated "
                  f"({len(plan.problem.options)} candidate, {len(plan.rejected)} rejected)")
    for note in plan.pool.skipped:
        console.print(f"[yellow]skipped:[/] {note}")


def show_rejected(plan: Plan, console: Console) -> None:
    if not plan.rejected:
        return
    t = Table(title="configurations that do not fit (C2)")
    for col in ("model", "GPU", "TP", "reason"):
        t.add_column(col)
    for r in plan.rejected:
        t.add_row(r.service, r.variant, str(r.tp), r.reason)
    console.print(t)


def diff_rows(plan: Plan, running: Iterable[Running]) -> list[dict[str, Any]]:
    """Per (model, GPU, TP): replicas now, planned, and the change."""
    now = Counter((r.service, r.variant, r.tp) for r in running)
    planned = Counter((r.service, r.variant, r.tp) for r in plan.replicas)
    rows = []
    for key in sorted(set(now) | set(planned)):
        a, b = now.get(key, 0), planned.get(key, 0)
        rows.append({"model": key[0], "gpu": key[1], "tp": key[2], "now": a, "planned": b,
                     "change": b - a})
    return rows


def show_diff(rows: Sequence[dict[str, Any]], console: Console) -> None:
    t = Table(title="changes against what runs now")
    for col in ("model", "GPU", "TP", "now", "planned", "change"):
        t.add_column(col, justify="left" if col in ("model", "GPU") else "right")
    for r in rows:
        change = r["change"]
        mark = f"[green]+{change}[/]" if change > 0 else (f"[red]{change}[/]" if change < 0
                                                             else "0")
        # model and GPU names come from the federation's records: shown as written
        t.add_row(escape(r["model"]), escape(r["gpu"]), str(r["tp"]), str(r["now"]),
                  str(r["planned"]), mark)
    console.print(t)

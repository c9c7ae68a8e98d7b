"""`otela sim compare`, `otela sim run --policy` and `otela plan --policy` end to end on
small workloads."""

from __future__ import annotations

import csv
from pathlib import Path

from typer.testing import CliRunner

from otela.cli import app
from simulator.policies.gyges import scenario as gyges
from simulator.policies.prism import scenario as prism
from traces.io import write_trace

runner = CliRunner()


def test_compare_prints_writes_csv_and_plots(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    write_trace(trace, prism.workload(2.0, 120, seed=1).to_trace())
    out, png = tmp_path / "c.csv", tmp_path / "c.png"
    r = runner.invoke(app, ["sim", "compare", "--policies", "prism,dedicated,static-partition",
                            "--trace", str(trace), "--gpu", "h100", "--gpus", "8",
                            "--csv", str(out), "--plot", str(png)])
    assert r.exit_code == 0, r.output
    rows = list(csv.DictReader(out.open()))
    assert [x["policy"] for x in rows] == ["prism", "dedicated", "static-partition"]
    assert png.stat().st_size > 1000
    assert "prism" in r.output and "SLO att." in r.output
    n = sum(1 for _ in trace.open()) - 1
    assert all(int(x["completed"]) == n for x in rows)


def test_run_policy_and_bad_input(tmp_path: Path) -> None:
    trace = tmp_path / "g.jsonl"
    write_trace(trace, gyges.workload(120, 1.0, seed=2).to_trace())
    r = runner.invoke(app, ["sim", "run", "--model", "qwen2.5-32b", "--gpu", "h20",
                            "--replicas", "8", "--trace", str(trace), "--policy", "gyges",
                            "--opt", "paper_limits=yes", "--opt", "max_context=131072",
                            "--out", str(tmp_path / "r.json")])
    assert r.exit_code == 0, r.output
    assert "merges" in r.output
    r = runner.invoke(app, ["sim", "compare", "--policies", "nope", "--trace", str(trace),
                            "--gpu", "h20"])
    assert r.exit_code == 2
    assert "unknown policy" in r.output


def test_plan_with_a_companion_policy(tmp_path: Path) -> None:
    pool = tmp_path / "pool.toml"
    pool.write_text('[[hosts]]\ngpu = "h100"\ngpus_per_host = 8\ncount = 1\n')
    trace = tmp_path / "p.jsonl"
    write_trace(trace, prism.workload(4.0, 120, seed=3).to_trace())
    r = runner.invoke(app, ["plan", "--policy", "prism", "--pool", str(pool),
                            "--trace", str(trace), "--json"])
    assert r.exit_code == 0, r.output
    assert '"placement"' in r.output
    r = runner.invoke(app, ["plan", "--policy", "gyges", "--pool", str(pool),
                            "--trace", str(trace)])
    assert r.exit_code == 2

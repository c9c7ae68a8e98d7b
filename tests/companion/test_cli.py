"""`otela sim compare`, `otela sim run --policy` and `otela plan --policy` end to end on
small workloads."""

from __future__ import annotations

import csv
import json
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


def test_plan_oserve_shows_the_serving_check(tmp_path: Path) -> None:
    # Llama2-70B on 2 x 8 H100, S3's mix: the search plans a heterogeneous layout that
    # serves less than TP2PP4 x2 in the simulator, and the plan must say what it launches
    # and why (the check's served rates), not only the LP's promise.
    from simulator.policies.oserve import scenario

    pool = tmp_path / "pool.toml"
    pool.write_text('[[hosts]]\ngpu = "h100"\ngpus_per_host = 8\ncount = 2\n')
    trace = tmp_path / "o.jsonl"
    write_trace(trace, scenario.workload(scenario.TABLE1["S3"][1], 10.0, 120.0,
                                         seed=11).to_trace())
    r = runner.invoke(app, ["plan", "--policy", "oserve", "--pool", str(pool),
                            "--trace", str(trace), "--json"], terminal_width=200)
    assert r.exit_code == 0, r.output
    result = json.loads(r.output)
    check = result["check"]
    assert check["chosen"] == result["layout"]
    assert check["homogeneous"] in check["served_rps"] and check["sample_rps"] > 0
    r = runner.invoke(app, ["plan", "--policy", "oserve", "--pool", str(pool),
                            "--trace", str(trace)], terminal_width=200)
    assert r.exit_code == 0, r.output
    assert "serving check" in r.output and f"launched {check['chosen']}" in r.output

"""Analysis views, plots, HTML report, compare, and the `otela trace` CLI's contract."""

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from otela.cli import app as otela_app
from otela.tracing.schema import TraceRecord, make_header
from traces.analysis import analyze
from traces.compare import compare
from traces.generate import GenSpec, generate, parse_models
from traces.io import Trace, read_trace, write_trace

runner = CliRunner()


def _measured_trace(seed: int = 0, scale: float = 1.0) -> Trace:
    """A generated trace with plausible measured latencies, providers and a few errors."""
    t = generate(
        GenSpec(
            rate=20,
            requests=600,
            input="lognormal:700,500",
            output="exp:200",
            models=parse_models(["llama:3", "qwen"]),
            seed=seed,
            prefix_groups=3,
            prefix_len=64,
        )
    )
    rng = np.random.default_rng(seed)
    for i, r in enumerate(t.records):
        r.status = 200
        r.ttft = scale * (0.02 + r.input_tokens * 2e-5 + rng.exponential(0.01))
        r.e2e = r.ttft + scale * 0.01 * r.output_tokens
        r.provider = ["lab-a", "lab-b"][i % 2]
        r.node = f"node-{i % 3}"
        if i % 50 == 0:
            r.status, r.error, r.e2e, r.ttft = 503, "http_503", 0.01, None
    return t


def test_burstiness_and_prefix_reuse_follow_their_definitions() -> None:
    recs = [TraceRecord(float(t), "m", 10, 0) for t in (0, 1, 2, 3)]  # 10 tokens in 4 bins
    recs += [TraceRecord(5.0 + i * 0.01, "m", 10, 0) for i in range(6)]  # 60 in one bin
    a = analyze(recs, bin_s=1.0)
    # active bins carry 10, 10, 10, 10, 60 tokens: peak 60 / mean 20 = 3 (empty bin 4 ignored)
    assert a.burstiness["m"] == pytest.approx(3.0)
    p = [TraceRecord(float(i), "m", 100, 1, prefix_hash="h", prefix_len=40) for i in range(4)]
    assert analyze(p).prefix_reuse["m"] == pytest.approx(3 * 40 / 400)


def test_analyze_cli_writes_plots_report_and_summary(tmp_path: Path) -> None:
    a = write_trace(tmp_path / "a.jsonl", _measured_trace(1))
    b = write_trace(tmp_path / "b.csv", _measured_trace(2, scale=1.2))
    out = tmp_path / "report"
    res = runner.invoke(
        otela_app, ["trace", "analyze", str(a), "--compare", str(b), "-o", str(out)]
    )
    assert res.exit_code == 0, res.output
    names = {p.name for p in out.glob("*.png")}
    assert names == {
        "arrivals.png",
        "model_usage.png",
        "lengths.png",
        "output_ratio.png",
        "latency.png",
        "providers.png",
    }
    for p in out.glob("*.png"):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 6 and "lab-a" in html and "http_503" in html
    assert "TTFT p50" in res.output and "llama" in res.output and "burstiness" in res.output


def test_compare_reports_relative_error(tmp_path: Path) -> None:
    real, sim = _measured_trace(3), _measured_trace(3, scale=1.1)
    rows = {r["metric"]: r for r in compare(sim.records, real.records)}
    assert rows["TTFT p50"]["error"] == pytest.approx(0.10, abs=1e-9)
    assert rows["end-to-end p90"]["error"] == pytest.approx(0.10, abs=1e-9)
    a = write_trace(tmp_path / "sim.jsonl", sim)
    b = write_trace(tmp_path / "real.jsonl", real)
    res = runner.invoke(otela_app, ["trace", "compare", str(a), str(b), "--json"])
    assert res.exit_code == 0, res.output
    data = {r["metric"]: r for r in json.loads(res.output)}
    assert data["TPOT p50"]["error"] == pytest.approx(0.10, abs=1e-9)


def test_gen_convert_and_clean_errors(tmp_path: Path) -> None:
    out = tmp_path / "g.jsonl"
    res = runner.invoke(
        otela_app,
        [
            "trace",
            "gen",
            str(out),
            "--preset",
            "opentela-s5",
            "--rate",
            "5",
            "--duration",
            "20",
            "--seed",
            "4",
        ],
    )
    assert res.exit_code == 0, res.output
    t = read_trace(out)
    assert t.header["preset"] == "opentela-s5" and 60 < len(t) < 140
    res = runner.invoke(otela_app, ["trace", "convert", str(out), str(tmp_path / "g.csv")])
    assert res.exit_code == 0 and len(read_trace(tmp_path / "g.csv")) == len(t)
    for args in (
        ["trace", "gen", str(out), "--rate", "5"],  # no duration / count
        ["trace", "gen", str(out), "--duration", "5", "--input", "gauss:3"],
        ["trace", "gen", str(out), "--duration", "5", "--preset", "nope"],
        ["trace", "gen", str(out), "--duration", "5", "--diurnal", "0.5,1,2,3"],
        ["trace", "gen", str(out), "--duration", "5", "--diurnal", "1.5"],
        ["trace", "gen", str(out), "--duration", "5", "--cv", "0"],
        ["trace", "analyze", str(tmp_path / "missing.jsonl")],
        ["trace", "replay", str(out), "--url", "ftp://x"],
        ["trace", "replay", str(out), "--url", "http://127.0.0.1:1", "--speed", "0"],
    ):
        res = runner.invoke(otela_app, args)
        assert res.exit_code == 2, (args, res.output)
        assert "Traceback" not in res.output and "error" in res.output.lower()


def test_sim_run_consumes_a_trace_and_writes_one(tmp_path: Path) -> None:
    src = generate(
        GenSpec(
            rate=4,
            duration=30,
            input="fixed:400",
            output="fixed:50",
            models=parse_models(["llama-3.1-8b:2", "other"]),
            seed=5,
        )
    )
    path = write_trace(tmp_path / "t.jsonl", src)
    sim = tmp_path / "sim.jsonl"
    res = runner.invoke(
        otela_app,
        [
            "sim",
            "run",
            "-m",
            "llama-3.1-8b",
            "-g",
            "a100",
            "--trace",
            str(path),
            "--trace-model",
            "llama-3.1-8b",
            "--out-trace",
            str(sim),
            "--out",
            str(tmp_path / "r.json"),
        ],
    )
    assert res.exit_code == 0, res.output
    out = read_trace(sim)
    wanted = [r for r in src.records if r.model == "llama-3.1-8b"]
    assert len(out) == len(wanted)
    assert np.allclose(
        [r.arrival for r in out.records], [r.arrival - wanted[0].arrival for r in wanted]
    )
    assert all(r.ok and r.ttft and r.e2e > r.ttft for r in out.records)
    assert out.header["source"] == "otela sim run"
    _ = Trace(make_header("x"), [])

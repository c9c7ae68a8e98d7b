"""The `otela sim` CLI: analyze and run, tables and --json."""

import json

from typer.testing import CliRunner

from simulator.cli import app

runner = CliRunner()


def test_analyze_json_has_operators_and_totals() -> None:
    res = runner.invoke(
        app,
        [
            "analyze",
            "--model",
            "llama-3.1-8b",
            "--gpu",
            "h100",
            "--tp",
            "2",
            "--batch",
            "4",
            "--input",
            "2048",
            "--output",
            "256",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    names = {o["op"] for o in data["prefill"]["ops"]}
    assert {"qkv_proj", "o_proj", "mlp_gate_up", "mlp_down", "lm_head"} <= names
    assert any(n.startswith("all_reduce") for n in names)
    assert {o["bound"] for o in data["decode"]["ops"]} >= {"memory", "comm"}
    t = data["totals"]
    assert 0 < t["ttft_s"] < t["e2e_s"] and t["tpot_s"] > 0
    assert data["memory"]["fits"]


def test_analyze_table_and_does_not_fit_reason() -> None:
    res = runner.invoke(app, ["analyze", "-m", "llama-2-70b", "-g", "rtx3090"])
    assert res.exit_code == 0
    assert "mlp_gate_up" in res.output and "exceed" in res.output


def test_unknown_gpu_is_a_clean_error() -> None:
    res = runner.invoke(app, ["analyze", "-m", "llama-2-7b", "-g", "nope"])
    assert res.exit_code == 2 and "unknown GPU" in res.output


def test_run_generator_writes_json(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "r.json"
    res = runner.invoke(
        app,
        [
            "run",
            "-m",
            "qwen3-8b",
            "-g",
            "l40s",
            "--replicas",
            "2",
            "--rate",
            "2",
            "--duration",
            "30",
            "--input-dist",
            "fixed:512",
            "--output-dist",
            "uniform:50,150",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "goodput" in res.output and "TTFT" in res.output
    data = json.loads(out.read_text())
    assert data["completed"] == data["requests"] > 30
    assert len(data["per_request"]) == data["requests"]
    assert {r["replica"] for r in data["per_request"]} == {0, 1}


def test_run_trace_json_stdout(tmp_path) -> None:  # type: ignore[no-untyped-def]
    trace = tmp_path / "t.csv"
    rows = ["timestamp,input_tokens,output_tokens,prefix_hash,prefix_len"]
    rows += [f"{i * 0.25},{300 + i},{40},sys{i % 2},256" for i in range(40)]
    trace.write_text("\n".join(rows) + "\n")
    res = runner.invoke(
        app,
        [
            "run",
            "-m",
            "llama-3.1-8b",
            "-g",
            "a100",
            "--trace",
            str(trace),
            "--prefix-caching",
            "--json",
            "--out",
            str(tmp_path / "o.json"),
        ],
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["requests"] == 40 and data["prefix_hit_tokens"] > 0


def test_run_needs_exactly_one_source() -> None:
    res = runner.invoke(app, ["run", "-m", "llama-2-7b", "-g", "a100"])
    assert res.exit_code == 2


def _client(tmp_path, *extra: str) -> dict:  # type: ignore[no-untyped-def,type-arg]
    out = tmp_path / "r.json"
    res = runner.invoke(
        app,
        ["run", "-m", "llama-3.1-8b", "-g", "h100", "--num-prompts", "40",
         "--input-dist", "fixed:2000", "--output-dist", "fixed:64", "--out", str(out),
         "--no-per-request", *extra],
    )
    assert res.exit_code == 0, res.output
    assert "benchmark client" in res.output
    return json.loads(out.read_text())


def test_run_as_a_benchmark_client(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # `vllm bench serve --num-prompts 40 --max-concurrency 8`: the first burst counts
    whole = _client(tmp_path, "--max-concurrency", "8")["client"]
    steady = _client(tmp_path, "--max-concurrency", "8", "--exclude-first-burst")["client"]
    assert whole["protocol"] == "vllm-bench-serve" and whole["measured_requests"] == 40
    assert steady["measured_requests"] == 32
    assert whole["mean_ttft_s"] > 0 and whole["output_throughput"] > 0
    # all 40 at once (--request-rate inf, no limit): TTFT includes the queue of prefills
    burst = _client(tmp_path)["client"]
    assert burst["p99_ttft_s"] > 3 * whole["p99_ttft_s"]
    # trtllm-bench: offline (no front-end cost), its own batch settings, TensorRT-LLM engine
    trt = _client(tmp_path, "--protocol", "trtllm-bench", "--engine", "trtllm")
    assert trt["client"]["protocol"] == "trtllm-bench"
    assert trt["client"]["measured_requests"] == 40


def test_run_client_rejects_bad_combinations() -> None:
    res = runner.invoke(app, ["run", "-m", "llama-3.1-8b", "-g", "h100", "--num-prompts", "5",
                              "--protocol", "locust"])
    assert res.exit_code == 2 and "unknown client protocol" in res.output
    res = runner.invoke(app, ["run", "-m", "llama-3.1-8b", "-g", "h100", "--num-prompts", "5",
                              "--engine", "tgi"])
    assert res.exit_code == 2 and "unknown engine" in res.output

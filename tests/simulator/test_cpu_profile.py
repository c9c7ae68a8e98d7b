"""The CPU profile reproduces the real vLLM CPU engine it was calibrated on (the replays in
tests/data/cpu_loop/, made by benchmarks/cpu_loop.py), and predicts a trace it never saw."""

from pathlib import Path

import numpy as np
import pytest

from simulator.calibrate import cpu_deployment, measured_ok, simulate
from traces.io import read_trace
from traces.stats import summarize

DATA = Path(__file__).parent.parent / "data" / "cpu_loop"


def _errors(name: str, data: Path = DATA) -> dict[str, list[float]]:
    """Per replay of trace `name`: relative error of p50 TTFT, p50 TPOT, output tokens/s."""
    dep = cpu_deployment()  # the catalog's cpu-vm profile, nothing refitted here
    errs: dict[str, list[float]] = {"ttft": [], "tpot": [], "tput": [], "ttft_m": [], "tpot_m": []}
    measured_ttft, measured_tpot = [], []
    for path in sorted(data.glob(f"{name}.replay.*.jsonl.gz")):
        ok = measured_ok(read_trace(path))
        sim, real = summarize(simulate(ok, dep)), summarize(ok.records)
        errs["ttft"].append(sim["ttft_s"]["p50"] / real["ttft_s"]["p50"] - 1)
        errs["tpot"].append(sim["tpot_s"]["p50"] / real["tpot_s"]["p50"] - 1)
        errs["tput"].append(sim["output_tokens_per_s"] / real["output_tokens_per_s"] - 1)
        measured_ttft.append(real["ttft_s"]["p50"])
        measured_tpot.append(real["tpot_s"]["p50"])
        sim_ttft, sim_tpot = sim["ttft_s"]["p50"], sim["tpot_s"]["p50"]
    # against the mean of the replays (the machine's load differed between them)
    errs["ttft_m"].append(sim_ttft / float(np.mean(measured_ttft)) - 1)
    errs["tpot_m"].append(sim_tpot / float(np.mean(measured_tpot)) - 1)
    print(name, {k: [round(100 * x, 1) for x in v] for k, v in errs.items()})
    return errs


def test_calibration_replays_are_reproduced() -> None:
    e = _errors("calib")
    assert len(e["ttft"]) == 2
    assert all(abs(x) <= 0.02 for x in e["tput"])
    # the two replays straddle the fit (load average 1.5-2.2 vs 3.5-4.0 during them)
    assert min(e["ttft"]) < 0 < max(e["ttft"]) and min(e["tpot"]) < 0 < max(e["tpot"])
    assert abs(e["ttft_m"][0]) <= 0.10 and abs(e["tpot_m"][0]) <= 0.10


def test_held_out_trace_is_predicted() -> None:
    e = _errors("heldout")  # bursty Gamma CV 2, other lengths, higher rate: never fitted on
    assert all(abs(x) <= 0.02 for x in e["tput"])
    assert abs(e["tpot_m"][0]) <= 0.15  # documented: +0.5 %
    assert abs(e["ttft_m"][0]) <= 0.20  # documented: -15 %
    assert all(abs(x) <= 0.25 for x in e["ttft"] + e["tpot"])


def test_a_later_vllm_session_is_predicted() -> None:
    """session2/: the same two traces replayed in a separate vLLM session half an hour later,
    with other prompts: nothing of it was fitted on."""
    e = _errors("heldout", DATA / "session2")
    assert all(abs(x) <= 0.15 for x in e["ttft"] + e["tpot"]), e  # documented: -9..+12 %
    assert all(abs(x) <= 0.02 for x in e["tput"])
    c = _errors("calib", DATA / "session2")
    assert all(abs(x) <= 0.25 for x in c["ttft"] + c["tpot"]), c  # documented: -20..+10 %


@pytest.mark.parametrize("name", ["calib", "heldout"])
def test_shipped_replays_are_real_vllm_runs(name: str) -> None:
    for path in sorted(DATA.glob(f"{name}.replay.*.jsonl.gz")):
        t = read_trace(path)
        assert t.header["source"] == "otela trace replay" and t.header["replay"]["stream"]
        assert len(measured_ok(t)) >= 300

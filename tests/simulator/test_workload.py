"""Arrival processes, length distributions and trace loading."""

import json

import numpy as np
import pytest

from simulator.workload import (
    gamma_arrivals,
    load_trace,
    poisson_arrivals,
    sample_lengths,
    synthetic,
)


def test_poisson_and_gamma_rates_and_burstiness() -> None:
    rng = np.random.default_rng(0)
    p = np.diff(poisson_arrivals(10, 50_000, rng))
    assert p.mean() == pytest.approx(0.1, rel=0.02)
    assert p.std() / p.mean() == pytest.approx(1.0, rel=0.03)
    g = np.diff(gamma_arrivals(10, 4.0, 50_000, rng))
    assert g.mean() == pytest.approx(0.1, rel=0.05)
    assert g.std() / g.mean() == pytest.approx(4.0, rel=0.1)


def test_length_specs() -> None:
    rng = np.random.default_rng(1)
    assert (sample_lengths("fixed:7", 5, rng) == 7).all()
    assert (sample_lengths("128", 3, rng) == 128).all()
    n = sample_lengths("normal:764,561", 20_000, rng)
    assert n.min() >= 1 and abs(n.mean() - 764) < 120  # clipping at 1 lifts the mean a little
    ln = sample_lengths("lognormal:500,250", 20_000, rng)
    assert ln.mean() == pytest.approx(500, rel=0.03)
    with pytest.raises(ValueError):
        sample_lengths("zipf:1", 3, rng)


def test_synthetic_duration_and_prefixes() -> None:
    w = synthetic(5, duration=100, seed=3, prefix_groups=4, prefix_len=64)
    assert w.arrival.max() < 100 and 400 < len(w) < 600
    assert set(np.unique(w.prefix_hash)) <= {0, 1, 2, 3}
    assert (w.input_len > 64).all() and (w.prefix_len == 64).all()


def test_trace_loading_csv_and_jsonl(tmp_path) -> None:  # type: ignore[no-untyped-def]
    c = tmp_path / "a.csv"
    c.write_text("arrival_time,prompt_tokens,completion_tokens\n10.5,100,20\n10.0,50,5\n")
    w = load_trace(c)
    assert list(w.arrival) == [0.0, 0.5] and list(w.input_len) == [50, 100]
    j = tmp_path / "b.jsonl"
    j.write_text(
        "\n".join(
            json.dumps(
                {
                    "timestamp": f"2025-01-01T00:00:0{i}Z",
                    "input_len": 10,
                    "output_len": 3,
                    "prefix_hash": "abc",
                    "prefix_len": 4,
                }
            )
            for i in range(3)
        )
    )
    w = load_trace(j)
    assert list(w.arrival) == [0.0, 1.0, 2.0] and len(set(w.prefix_hash)) == 1
    bad = tmp_path / "bad.csv"
    bad.write_text("foo,bar\n1,2\n")
    with pytest.raises(ValueError, match="need arrival"):
        load_trace(bad)

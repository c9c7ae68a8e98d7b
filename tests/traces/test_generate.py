"""Generators: statistics match their parameters, seeded and reproducible."""

from pathlib import Path

import numpy as np
import pytest

from traces.distributions import Diurnal, arrivals, parse_lengths
from traces.generate import PRESETS, GenSpec, generate, parse_models
from traces.io import write_trace


def _gaps(spec: GenSpec) -> np.ndarray:
    return np.diff([r.arrival for r in generate(spec).records])


def test_poisson_rate_and_cv() -> None:
    g = _gaps(GenSpec(rate=20, requests=40_000, seed=1))
    assert 1 / g.mean() == pytest.approx(20, rel=0.02)
    assert g.std() / g.mean() == pytest.approx(1.0, abs=0.03)


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_hits_target_cv(cv: float) -> None:
    g = _gaps(GenSpec(rate=10, requests=60_000, cv=cv, seed=2))
    assert 1 / g.mean() == pytest.approx(10, rel=0.05)
    assert g.std() / g.mean() == pytest.approx(cv, rel=0.06)


def test_duration_bounds_arrivals_and_count() -> None:
    t = generate(GenSpec(rate=50, duration=100, seed=3))
    times = [r.arrival for r in t.records]
    assert max(times) < 100 and len(times) == pytest.approx(5000, rel=0.05)


def test_diurnal_curve_shapes_the_rate() -> None:
    day = 1000.0
    curve = Diurnal(0.8, period_s=day, peak_s=250.0)
    t = arrivals(20, np.random.default_rng(4), duration=10 * day, diurnal=curve)
    phase = (t % day) / day
    near_peak = ((phase > 0.15) & (phase < 0.35)).sum()  # around 250 s
    near_trough = ((phase > 0.65) & (phase < 0.85)).sum()  # around 750 s
    # factor averages ~1.75 near the peak and ~0.25 near the trough: ratio ~7
    assert near_peak / near_trough == pytest.approx(7.0, rel=0.2)
    assert len(t) / (10 * day) == pytest.approx(20, rel=0.03)  # mean rate unchanged
    with pytest.raises(ValueError):
        Diurnal(1.2)


@pytest.mark.parametrize(
    ("spec", "mean", "std"),
    [
        ("fixed:300", 300, 0),
        ("normal:2000,300", 2000, 300),
        ("uniform:100,200", 150, 29),
        ("lognormal:500,400", 500, 400),
        ("exp:250", 250, 250),
    ],
)
def test_length_distributions(spec: str, mean: float, std: float) -> None:
    x = parse_lengths(spec).sample(50_000, np.random.default_rng(5))
    assert x.mean() == pytest.approx(mean, rel=0.03)
    assert x.std() == pytest.approx(std, rel=0.05, abs=1.0)
    assert x.min() >= 1


def test_empirical_lengths_resample_another_trace(tmp_path: Path) -> None:
    src = generate(GenSpec(rate=5, requests=500, input="uniform:10,20", output="fixed:7"))
    path = write_trace(tmp_path / "src.jsonl", src)
    from traces.cli import _empirical

    d = parse_lengths(f"empirical:{path}:input", _empirical)
    x = d.sample(5000, np.random.default_rng(6))
    assert set(np.unique(x)) <= set(range(10, 21)) and len(np.unique(x)) == 11
    assert parse_lengths(f"empirical:{path}:output", _empirical).values == (7,) * 500


def test_bad_length_specs_say_what_is_accepted() -> None:
    for bad in ("gauss:1,2", "normal:5", "exp:-3", "normal:a,b", "empirical:"):
        with pytest.raises(ValueError):
            parse_lengths(bad)


def test_seeded_reproducible_and_model_mix() -> None:
    spec = GenSpec(rate=100, requests=20_000, models=parse_models(["a:3", "b"]), seed=7)
    t1, t2 = generate(spec), generate(spec)
    assert [r.to_json() for r in t1.records] == [r.to_json() for r in t2.records]
    spec.seed = 8
    assert generate(spec).records[5].arrival != t1.records[5].arrival
    share = sum(r.model == "a" for r in t1.records) / len(t1)
    assert share == pytest.approx(0.75, abs=0.015)


def test_opentela_preset_lengths() -> None:
    p = PRESETS["opentela-s5"]
    t = generate(GenSpec(rate=10, requests=30_000, input=p["input"], output=p["output"], seed=9))
    inp = np.array([r.input_tokens for r in t.records])
    out = np.array([r.output_tokens for r in t.records])
    # Normal(764, 561) and Normal(674, 412), clipped at 1 token (affects ~9 % / 5 % of draws)
    assert np.median(inp) == pytest.approx(764, rel=0.03)
    assert np.median(out) == pytest.approx(674, rel=0.03)
    assert (inp == 1).mean() == pytest.approx(0.087, abs=0.01)


def test_prefix_groups_share_prefixes() -> None:
    t = generate(GenSpec(rate=10, requests=2000, prefix_groups=4, prefix_len=128, seed=10))
    hashes = {r.prefix_hash for r in t.records}
    assert hashes == {"p0", "p1", "p2", "p3"}
    assert all(r.input_tokens == 512 + 128 and r.prefix_len == 128 for r in t.records)

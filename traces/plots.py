"""PNG plots of an `Analysis` (matplotlib, Agg backend: no display needed).

One function per view; `render` writes all that apply and returns their paths. With a second
analysis (`--compare`), distributions are overlaid so two traces (e.g. simulated and real)
can be read against each other.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from traces.analysis import Analysis

TOP_MODELS = 8


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _cdf(ax: Axes, x: np.ndarray, label: str, style: str = "-") -> None:
    x = np.sort(x[np.isfinite(x)])
    if len(x):
        ax.plot(x, np.arange(1, len(x) + 1) / len(x), style, label=label, lw=1.4)


def _unit(seconds: float) -> str:
    return f"{seconds:g} s" if seconds < 60 else f"{seconds / 60:g} min"


def arrivals(a: Analysis, path: Path, b: Analysis | None, labels: tuple[str, str]) -> Path:
    fig, axes = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True)
    axes[0].step(a.bins, a.requests_per_bin, where="post", label=labels[0])
    if b is not None:
        axes[0].step(b.bins, b.requests_per_bin, where="post", label=labels[1], alpha=0.7)
        axes[0].legend()
    axes[0].set_ylabel(f"requests / {_unit(a.bin_s)}")
    axes[0].set_title("Arrivals over time")
    top = [m for m, *_ in a.model_tokens[:TOP_MODELS]]
    bottom = np.zeros_like(a.tokens_per_bin)
    for m in top:
        axes[1].fill_between(a.bins, bottom, bottom + a.per_model_bins[m], step="post", label=m)
        bottom = bottom + a.per_model_bins[m]
    axes[1].set_ylabel(f"tokens / {_unit(a.bin_s)}")
    axes[1].set_xlabel("seconds since the first request")
    if len(top) > 1:
        axes[1].legend(fontsize=7, loc="upper right")
    return _save(fig, path)


def model_usage(a: Analysis, path: Path) -> Path:
    top = a.model_tokens[:20]
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.35 * len(top) + 1.8))
    names = [m for m, *_ in top][::-1]
    axes[0].barh(names, [i for _, _, i, _ in top][::-1], label="input")
    axes[0].barh(
        names,
        [o for *_, o in top][::-1],
        left=[i for _, _, i, _ in top][::-1],
        label="output",
    )
    axes[0].set_xlabel("tokens")
    axes[0].set_title("Token usage per model")
    axes[0].legend(fontsize=8)
    burst = sorted(a.burstiness.items(), key=lambda kv: kv[1])[-20:]
    axes[1].barh([m for m, _ in burst], [v for _, v in burst], color="tab:red")
    axes[1].set_xlabel(f"peak / mean tokens per active {_unit(a.bin_s)}")
    axes[1].set_title("Burstiness per model")
    return _save(fig, path)


def lengths(a: Analysis, path: Path, b: Analysis | None, labels: tuple[str, str]) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, kind in zip(axes, ("input", "output"), strict=True):
        models = [m for m, *_ in a.model_tokens[:TOP_MODELS]]
        for m in models if len(models) > 1 else ["*"]:
            _cdf(ax, a.lengths[m][kind], m if m != "*" else labels[0])
        if b is not None:
            _cdf(ax, b.lengths["*"][kind], f"{labels[1]} (all)", "--")
        for q, v in a.length_marks[kind].items():
            ax.axvline(max(v, 1), color="grey", ls=":", lw=0.8)
            ax.text(max(v, 1), 0.02, q.upper(), fontsize=7, rotation=90, color="grey")
        ax.set_xscale("log")
        ax.set_xlabel(f"{kind} tokens")
        ax.set_ylabel("CDF")
        ax.set_title(f"{kind.capitalize()} length")
        ax.legend(fontsize=7)
    return _save(fig, path)


def output_ratio(a: Analysis, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(9, 3))
    ax.plot(a.bins, a.output_ratio_bins, ".", ms=3)
    ax.set_ylim(0, 1)
    ax.set_ylabel("output / total tokens")
    ax.set_xlabel("seconds since the first request")
    ax.set_title(f"Output-token ratio per {_unit(a.bin_s)}")
    return _save(fig, path)


def latency(a: Analysis, path: Path, b: Analysis | None, labels: tuple[str, str]) -> Path:
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
    for ax, (key, title) in zip(
        axes, (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "End-to-end")), strict=True
    ):
        models = [m for m, *_ in a.model_tokens[:TOP_MODELS]]
        for m in models if len(models) > 1 else ["*"]:
            _cdf(ax, a.latency[m][key], m if m != "*" else labels[0])
        if b is not None:
            _cdf(ax, b.latency["*"][key], labels[1], "--")
        ax.set_xlabel("seconds")
        ax.set_ylabel("CDF")
        ax.set_title(f"{title} latency")
        ax.legend(fontsize=7)
    return _save(fig, path)


def providers(a: Analysis, path: Path) -> Path:
    rows = a.providers[:20] or a.nodes[:20]
    key = "provider" if a.providers else "node"
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(rows) + 1.8))
    ax.barh([str(r[key])[:24] for r in rows][::-1], [r["requests"] for r in rows][::-1])
    ax.barh(
        [str(r[key])[:24] for r in rows][::-1],
        [r["failed"] for r in rows][::-1],
        color="tab:red",
        label="failed",
    )
    ax.set_xlabel("requests")
    ax.set_title(f"Requests per {key}")
    ax.legend(fontsize=8)
    return _save(fig, path)


def render(
    a: Analysis,
    outdir: Path,
    b: Analysis | None = None,
    labels: tuple[str, str] = ("trace", "other"),
) -> list[Path]:
    """Write every applicable plot into `outdir`; return their paths in display order."""
    outdir.mkdir(parents=True, exist_ok=True)
    paths = [
        arrivals(a, outdir / "arrivals.png", b, labels),
        model_usage(a, outdir / "model_usage.png"),
        lengths(a, outdir / "lengths.png", b, labels),
        output_ratio(a, outdir / "output_ratio.png"),
    ]
    if len(a.latency["*"]["e2e"]) or (b is not None and len(b.latency["*"]["e2e"])):
        paths.append(latency(a, outdir / "latency.png", b, labels))
    if a.providers or a.nodes:
        paths.append(providers(a, outdir / "providers.png"))
    return paths

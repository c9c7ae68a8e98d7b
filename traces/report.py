"""The self-contained HTML report and the plain-text summary of an analysed trace."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

from traces.analysis import Analysis


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if unit == "s":
            return f"{v * 1e3:.1f} ms" if v < 1 else f"{v:.2f} s"
        if unit == "%":
            return f"{100 * v:+.1f} %"
        return f"{v:,.2f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def summary_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) rows of the key figures, shared by the terminal and the HTML report."""
    rows = [
        ("requests", _fmt(summary.get("requests"))),
        ("succeeded / failed", f"{summary.get('succeeded', 0):,} / {summary.get('failed', 0):,}"),
        ("span", _fmt(summary.get("duration_s"), "s")),
        ("offered rate (req/s)", _fmt(summary.get("offered_rps"))),
    ]
    if summary.get("throughput_rps") is not None:
        slo = summary["slo"]
        rows += [
            ("throughput (req/s)", _fmt(summary["throughput_rps"])),
            ("output tokens/s", _fmt(summary["output_tokens_per_s"])),
            (
                f"goodput (TTFT<={slo['ttft_s']:g}s, TPOT<={slo['tpot_s']:g}s)",
                f"{summary['goodput_rps']:.2f} req/s ({100 * summary['slo_attainment']:.1f} %)",
            ),
        ]
    for key, label in (("input_tokens", "input tokens"), ("output_tokens", "output tokens")):
        d = summary.get(key) or {}
        if d.get("mean") is not None:
            rows.append(
                (f"{label} mean / p50 / p99", f"{d['mean']:.0f} / {d['p50']:.0f} / {d['p99']:.0f}")
            )
    for key, label in (
        ("ttft_s", "TTFT"),
        ("tpot_s", "TPOT"),
        ("itl_s", "inter-token (mean per request)"),
        ("e2e_s", "end-to-end"),
        ("send_lag_s", "replay send lag"),
    ):
        d = summary.get(key) or {}
        if d.get("p50") is not None:
            rows.append(
                (
                    f"{label} p50 / p90 / p99",
                    " / ".join(_fmt(d[p], "s") for p in ("p50", "p90", "p99")),
                )
            )
    for kind, count in (summary.get("errors") or {}).items():
        rows.append((f"errors: {kind}", f"{count:,}"))
    return rows


def _table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def html_report(
    title: str,
    summary: dict[str, Any],
    analysis: Analysis,
    images: list[Path],
    comparison: list[dict[str, Any]] | None = None,
    labels: tuple[str, str] = ("trace", "other"),
) -> str:
    """One HTML page with the figures embedded (base64), readable offline and mailable."""
    parts = [f"<h1>{html.escape(title)}</h1>", "<h2>Summary</h2>"]
    parts.append(_table(["metric", "value"], [list(r) for r in summary_rows(summary)]))
    if comparison:
        parts.append(f"<h2>Comparison: {html.escape(labels[0])} vs {html.escape(labels[1])}</h2>")
        parts.append(
            _table(
                ["metric", labels[0], labels[1], "error"],
                [
                    [r["metric"], _fmt(r["first"]), _fmt(r["second"]), _fmt(r["error"], "%")]
                    for r in comparison
                ],
            )
        )
    parts.append("<h2>Models</h2>")
    parts.append(
        _table(
            ["model", "requests", "input tokens", "output tokens", "burstiness"],
            [
                [m, f"{n:,}", f"{i:,}", f"{o:,}", f"{analysis.burstiness.get(m, 0):.1f}"]
                for m, n, i, o in analysis.model_tokens
            ],
        )
    )
    if analysis.prefix_reuse:
        parts.append("<h2>Prefix reuse</h2>")
        parts.append(
            _table(
                ["model", "reused input fraction"],
                [[m, f"{100 * v:.1f} %"] for m, v in analysis.prefix_reuse.items()],
            )
        )
    for rows, key in ((analysis.providers, "provider"), (analysis.nodes, "node")):
        if rows:
            parts.append(f"<h2>Per {key}</h2>")
            parts.append(
                _table(
                    [key, "requests", "failed", "output tokens", "TTFT p50", "e2e p50"],
                    [
                        [
                            r[key],
                            f"{r['requests']:,}",
                            f"{r['failed']:,}",
                            f"{r['output_tokens']:,}",
                            _fmt(r["ttft_p50"], "s"),
                            _fmt(r["e2e_p50"], "s"),
                        ]
                        for r in rows
                    ],
                )
            )
    parts.append("<h2>Figures</h2>")
    for img in images:
        data = base64.b64encode(img.read_bytes()).decode()
        parts.append(f'<figure><img alt="{img.stem}" src="data:image/png;base64,{data}"></figure>')
    style = (
        "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}"
        "table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;"
        "padding:.25em .6em;text-align:right}td:first-child,th:first-child{text-align:left}"
        "img{max-width:100%}figure{margin:1em 0}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body>{''.join(parts)}</body></html>\n"
    )

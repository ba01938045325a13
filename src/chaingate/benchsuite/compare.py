"""``chaingate bench compare A.json B.json``: two runs side by side, per target and figure."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from html import escape
from pathlib import Path
from typing import Any

from chaingate.benchsuite import report

FIGURES: tuple[tuple[str, Callable[[Mapping[str, Any]], Any]], ...] = (
    ("answered/s", lambda s: s["rps"]),
    ("p50 ms", lambda s: s["latency_ms"]["p50"]),
    ("p90 ms", lambda s: s["latency_ms"]["p90"]),
    ("p99 ms", lambda s: s["latency_ms"]["p99"]),
    ("failures", lambda s: s["failures"]),
    ("requests", lambda s: s["requests"]),
)


def rows(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[list[Any]]:
    """[target, figure, A, B, B/A] for every target in both runs (by name)."""
    out: list[list[Any]] = []
    for name, summary_a in a["totals"].items():
        summary_b = b["totals"].get(name)
        if summary_b is None:
            continue
        for label, pick in FIGURES:
            va, vb = pick(summary_a), pick(summary_b)
            ratio = round(vb / va, 3) if va and vb is not None else None
            out.append([name, label, va, vb, ratio])
    return out


def text(a: Mapping[str, Any], b: Mapping[str, Any], names: tuple[str, str]) -> str:
    table = rows(a, b)
    if not table:
        return "no target in common (targets are matched by name: give them one with NAME=URL)"
    width = max(len(r[0]) for r in table)
    lines = [f"{'target':<{width}}  {'figure':<11} {'A':>12} {'B':>12} {'B/A':>8}"]
    lines.append(f"A = {names[0]}; B = {names[1]}")
    for target, label, va, vb, ratio in table:
        lines.append(
            f"{target:<{width}}  {label:<11} {_cell(va):>12} {_cell(vb):>12} {_cell(ratio):>8}"
        )
    return "\n".join(lines)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if value < 100 else f"{value:.1f}"
    return str(value)


def html(a: Mapping[str, Any], b: Mapping[str, Any], names: tuple[str, str]) -> str:
    table = report._table(
        ["target", "figure", "A", "B", "B / A"],
        [[escape(str(r[0])), escape(r[1]), *(_cell(v) for v in r[2:])] for r in rows(a, b)],
        left=2,
    )
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>chaingate bench compare</title><style>{report.STYLE}</style></head><body>"
        f"<h1>chaingate bench compare</h1><p>A = <code>{escape(names[0])}</code> "
        f"({escape(a['scenario'])}); B = <code>{escape(names[1])}</code> "
        f"({escape(b['scenario'])})</p>{table}<h2>A</h2>{report.header(a)}"
        f"<h2>B</h2>{report.header(b)}</body></html>\n"
    )


def write(a: Mapping[str, Any], b: Mapping[str, Any], names: tuple[str, str], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "compare.html"
    path.write_text(html(a, b, names))
    return path

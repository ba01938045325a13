"""report.html: one self-contained page per run (inline CSS and SVG, no script, no CDN)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from chaingate.benchsuite import outcomes, svg

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1320px;color:#222;
padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:6px 0 12px}td,th{border:1px solid #ddd;padding:3px 8px;
text-align:right}th{background:#f4f4f4}td.l,th.l{text-align:left}.warn{color:#b00;font-weight:600}
.charts{display:flex;flex-wrap:wrap;gap:12px}.charts svg{border:1px solid #eee;background:#fff}
svg .title{font:600 13px system-ui,sans-serif}svg .axis,svg .legend{font:11px system-ui,sans-serif}
svg .tick{font:10px system-ui,sans-serif;fill:#555}svg .grid{stroke:#eee}
.muted{color:#666}code{background:#f4f4f4;padding:0 3px}
"""
FAILURE_LABELS = {
    outcomes.ERROR: "errors",
    outcomes.REFUSED: "refused",
    outcomes.RATE_LIMITED: "rate-limited",
    outcomes.WRONG: "wrong answers",
    outcomes.DROPPED: "dropped",
}


def _ms(value: object) -> str:
    return "-" if value is None else f"{float(str(value)):.2f}"


def _table(head: Sequence[str], rows: Sequence[Sequence[object]], left: int = 1) -> str:
    cells = "".join(
        f'<th class="l">{escape(h)}</th>' if i < left else f"<th>{escape(h)}</th>"
        for i, h in enumerate(head)
    )
    body = []
    for row in rows:
        body.append(
            "<tr>"
            + "".join(
                f'<td class="l">{c}</td>' if i < left else f"<td>{c}</td>"
                for i, c in enumerate(row)
            )
            + "</tr>"
        )
    return f"<table><tr>{cells}</tr>{''.join(body)}</table>"


def _failures_cell(summary: Mapping[str, Any]) -> str:
    parts = [
        f"{summary['outcomes'][kind]} {label}"
        for kind, label in FAILURE_LABELS.items()
        if summary["outcomes"].get(kind)
    ]
    return f'<span class="warn">{escape(", ".join(parts))}</span>' if parts else "0"


def header(results: Mapping[str, Any]) -> str:
    machine = results["machine"]
    busy = machine.get("busy_before")
    busy_text = "unknown" if busy is None else f"{busy:.0%} CPU busy over 1 s"
    if machine.get("busy_warning"):
        busy_text = f'<span class="warn">{busy_text}: other work was running</span>'
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(results["started"]))
    rows = [
        ["scenario", escape(results["scenario"])],
        ["started", started],
        ["measured", f"{results['duration_s']:.1f} s"],
        *[[escape(k), escape(str(v))] for k, v in results["settings"].items()],
        [
            "machine",
            escape(
                f"{machine['host']}: {machine['cores']} cores, {machine['cpu']}, "
                f"{machine['system']}, Python {machine['python']}"
            ),
        ],
        ["before start", f"{busy_text}; load average {escape(machine['load_average_before'])}"],
    ]
    return _table(["setting", "value"], rows, left=2)


def summary_table(results: Mapping[str, Any]) -> str:
    rows = []
    for target in results["targets"]:
        s = results["totals"][target["name"]]
        lat = s["latency_ms"]
        rows.append(
            [
                escape(target["name"]),
                f"<code>{escape(target['url'])}</code>",
                s["requests"],
                s["calls"],
                f"{s['rps']:.1f}",
                _ms(lat["p50"]),
                _ms(lat["p90"]),
                _ms(lat["p99"]),
                _ms(lat["max"]),
                _failures_cell(s),
                s["setup_requests"],
            ]
        )
    head = ["target", "url", "requests", "calls", "answered/s", "p50 ms", "p90 ms", "p99 ms"]
    head += ["max ms", "failures", "setup requests"]
    return _table(head, rows, left=2)


def ratio_table(results: Mapping[str, Any]) -> str:
    if not results["ratios"]:
        return '<p class="muted">One target: no ratios.</p>'
    rows = [
        [
            escape(f"{r['target']} / {r['baseline']}"),
            escape(r["label"]),
            "-" if r["value"] is None else f"{r['value']:.3f}",
        ]
        for r in results["ratios"]
    ]
    return _table(["targets", "figure", "ratio"], rows, left=2)


def by_name_table(results: Mapping[str, Any]) -> str:
    rows = []
    for target in results["targets"]:
        for name, s in results["by_name"][target["name"]].items():
            lat = s["latency_ms"]
            rows.append(
                [
                    escape(target["name"]),
                    escape(name),
                    s["requests"],
                    f"{s['rps']:.1f}",
                    _ms(lat["p50"]),
                    _ms(lat["p99"]),
                    _failures_cell(s),
                ]
            )
    head = ["target", "request", "requests", "answered/s", "p50 ms", "p99 ms", "failures"]
    return _table(head, rows, left=2)


def charts(results: Mapping[str, Any]) -> str:
    names = [t["name"] for t in results["targets"]]
    series = results["series"]
    throughput = [
        svg.Line(name, [(p["t"], p[outcomes.OK]) for p in series[name]], svg.color(i))
        for i, name in enumerate(names)
    ]
    failures: list[svg.Line] = []
    for i, name in enumerate(names):
        for j, kind in enumerate(outcomes.FAILURES):
            if any(p[kind] for p in series[name]):
                failures.append(
                    svg.Line(
                        f"{name} {FAILURE_LABELS[kind]}",
                        [(p["t"], p[kind]) for p in series[name]],
                        svg.color(i),
                        dashed=j % 2 == 1,
                    )
                )
    latency: list[svg.Line] = []
    for i, name in enumerate(names):
        latency.append(
            svg.Line(f"{name} p99", [(p["t"], p["p99"]) for p in series[name]], svg.color(i))
        )
        latency.append(
            svg.Line(
                f"{name} p50", [(p["t"], p["p50"]) for p in series[name]], svg.color(i), dashed=True
            )
        )
    edges = results["histogram"]["edges_ms"]
    pictures = [
        svg.line_chart("Throughput (answered requests per second)", throughput, "seconds", "req/s"),
        svg.line_chart("Failures per second", failures, "seconds", "failures/s"),
        svg.line_chart("Latency percentiles per second", latency, "seconds", "ms"),
        *[
            svg.histogram_chart(
                f"Latency histogram: {name}",
                edges,
                results["histogram"]["counts"][name],
                svg.color(i),
            )
            for i, name in enumerate(names)
        ],
    ]
    return f'<div class="charts">{"".join(pictures)}</div>'


def checks_section(results: Mapping[str, Any]) -> str:
    parts = []
    if results["checks"]:
        rows = [
            [
                escape(c["check"]),
                escape(c.get("target", "")),
                "ok" if c["ok"] else '<span class="warn">failed</span>',
                escape(c.get("detail", "")),
            ]
            for c in results["checks"]
        ]
        parts.append(_table(["check", "target", "result", "detail"], rows, left=4))
    for name, samples in results["samples"].items():
        for kind, messages in samples.items():
            items = "".join(f"<li><code>{escape(m)}</code></li>" for m in messages)
            parts.append(
                f"<p>{escape(name)}, {escape(FAILURE_LABELS.get(kind, kind))}:</p><ul>{items}</ul>"
            )
    return "".join(parts) or '<p class="muted">No checks failed and no failures.</p>'


def render(results: Mapping[str, Any]) -> str:
    title = f"chaingate bench {results['scenario']}"
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}'
        f"</title><style>{STYLE}</style></head><body><h1>{escape(title)}</h1>"
        f'<p class="muted">Failures are counted apart from latency: percentiles describe '
        f"answered requests only; a refusal or rate limit is the target saying no, not slow."
        f"</p>{header(results)}<h2>Results</h2>{summary_table(results)}"
        f"<h2>Ratios to the first target</h2>{ratio_table(results)}"
        f"<h2>Over time</h2>{charts(results)}<h2>Per request</h2>{by_name_table(results)}"
        f"<h2>Checks and failures</h2>{checks_section(results)}"
        f'<p class="muted">Every figure is also in results.json and results.csv beside this '
        f"file.</p></body></html>\n"
    )

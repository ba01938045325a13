"""Charts as SVG drawn here, on the server (no script, no library, nothing fetched): a line
chart of one or more series over time, sized by its viewBox and scaled by CSS.  Colours come
from the stylesheet (classes ``s0``, ``s1``, ...), so the markup carries no style attribute
(the CSP allows none)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from markupsafe import Markup, escape

WIDTH, HEIGHT = 640, 200
LEFT, RIGHT, TOP, BOTTOM = 64, 12, 12, 28


def _number(value: float) -> str:
    if value >= 1_000_000:
        return f"{value / 1_000_000:.1f}M"
    if value >= 1_000:
        return f"{value / 1_000:.1f}k"
    if value == int(value):
        return str(int(value))
    return f"{value:.2f}".rstrip("0")  # 12.5, not 12.50: axis labels have little room


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times 10^k at or above ``value`` (axis labels people read)."""
    if value <= 0:
        return 1.0
    magnitude = 10.0 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if step * magnitude >= value:
            return step * magnitude
    return 10 * magnitude


def line_chart(
    title: str,
    labels: Sequence[str],
    series: Sequence[tuple[str, Sequence[float | None]]],
    unit: str = "",
) -> Markup:
    """``labels``: one per point (x axis); ``series``: (name, values) with None for a gap."""
    values = [v for _, points in series for v in points if v is not None]
    top = nice_ceiling(max(values) if values else 0.0)
    count = max(1, len(labels) - 1)
    plot_w = WIDTH - LEFT - RIGHT
    plot_h = HEIGHT - TOP - BOTTOM

    def x(i: int) -> float:
        return LEFT + plot_w * i / count

    def y(v: float) -> float:
        return TOP + plot_h * (1 - v / top)

    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(title)}</title>",
    ]
    for fraction in (0.0, 0.5, 1.0):
        gy = TOP + plot_h * (1 - fraction)
        parts.append(
            f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{gy:.1f}" y2="{gy:.1f}"/>'
        )
        parts.append(
            f'<text class="axis" x="{LEFT - 6}" y="{gy + 4:.1f}" text-anchor="end">'
            f"{escape(_number(top * fraction))}{escape(unit)}</text>"
        )
    if labels:
        parts.append(f'<text class="axis" x="{LEFT}" y="{HEIGHT - 8}">{escape(labels[0])}</text>')
        parts.append(
            f'<text class="axis" x="{WIDTH - RIGHT}" y="{HEIGHT - 8}" text-anchor="end">'
            f"{escape(labels[-1])}</text>"
        )
    for index, (name, points) in enumerate(series):
        runs: list[list[str]] = [[]]
        for i, v in enumerate(points):
            if v is None:
                if runs[-1]:
                    runs.append([])
                continue
            runs[-1].append(f"{x(i):.1f},{y(v):.1f}")
        for run in runs:
            if len(run) == 1:
                cx, cy = run[0].split(",")
                parts.append(f'<circle class="s{index % 6}" cx="{cx}" cy="{cy}" r="2.5"/>')
            elif run:
                parts.append(
                    f'<polyline class="line s{index % 6}" points="{" ".join(run)}">'
                    f"<title>{escape(name)}</title></polyline>"
                )
    parts.append("</svg>")
    legend = "".join(
        f'<li><span class="swatch s{i % 6}" aria-hidden="true"></span>{escape(name)}</li>'
        for i, (name, _) in enumerate(series)
    )
    caption = f"<figcaption>{escape(title)}</figcaption>"
    return Markup(caption + "".join(parts) + f'<ul class="legend">{legend}</ul>')  # noqa: S704

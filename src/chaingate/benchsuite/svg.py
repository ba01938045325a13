"""Charts as inline SVG, drawn here: a report needs no script and no CDN to show them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2")
WIDTH, HEIGHT = 640, 260
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 28, 40


@dataclass(frozen=True)
class Line:
    label: str
    points: Sequence[tuple[float, float | None]]  # (x, y); y None leaves a gap
    color: str
    dashed: bool = False


def color(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def nice_ticks(high: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least ``high``."""
    if high <= 0:
        return [0.0, 1.0]
    raw = high / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    return [step * i for i in range(math.ceil(high / step) + 1)]


def _fmt(value: float) -> str:
    if value >= 1000:
        return f"{value / 1000:g}k"
    return f"{value:g}"


def _frame(title: str, x_label: str, y_label: str, y_ticks: list[float], scale_y: object) -> str:
    assert callable(scale_y)
    parts = [
        f'<text x="{LEFT}" y="16" class="title">{escape(title)}</text>',
        f'<text x="{WIDTH // 2}" y="{HEIGHT - 6}" class="axis" text-anchor="middle">'
        f"{escape(x_label)}</text>",
        f'<text x="12" y="{TOP + (HEIGHT - TOP - BOTTOM) // 2}" class="axis" '
        f'transform="rotate(-90 12 {TOP + (HEIGHT - TOP - BOTTOM) // 2})" text-anchor="middle">'
        f"{escape(y_label)}</text>",
    ]
    for tick in y_ticks:
        y = scale_y(tick)
        parts.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">'
            f"{_fmt(tick)}</text>"
        )
    return "".join(parts)


def _legend(entries: list[tuple[str, str, bool]]) -> str:
    parts = []
    x = LEFT + 8
    for label, stroke, dashed in entries:
        dash = ' stroke-dasharray="5 3"' if dashed else ""
        parts.append(
            f'<line x1="{x}" x2="{x + 18}" y1="{TOP + 8}" y2="{TOP + 8}" stroke="{stroke}" '
            f'stroke-width="2.5"{dash}/><text x="{x + 22}" y="{TOP + 12}" class="legend">'
            f"{escape(label)}</text>"
        )
        x += 30 + 7 * len(label)
    return "".join(parts)


def line_chart(title: str, lines: Sequence[Line], x_label: str, y_label: str) -> str:
    xs = [x for line in lines for x, _ in line.points]
    ys = [y for line in lines for _, y in line.points if y is not None]
    x_low, x_high = (min(xs), max(xs)) if xs else (0.0, 1.0)
    if x_high <= x_low:
        x_high = x_low + 1
    y_ticks = nice_ticks(max(ys) * 1.1 if ys else 1.0)
    y_high = y_ticks[-1]
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def scale_x(x: float) -> float:
        return LEFT + (x - x_low) / (x_high - x_low) * plot_w

    def scale_y(y: float) -> float:
        return TOP + plot_h - (y / y_high) * plot_h

    parts = [_frame(title, x_label, y_label, y_ticks, scale_y)]
    for tick in nice_ticks(x_high - x_low, 8):
        x = scale_x(x_low + tick)
        if x <= WIDTH - RIGHT + 0.5:
            parts.append(
                f'<text x="{x:.1f}" y="{HEIGHT - BOTTOM + 16}" class="tick" '
                f'text-anchor="middle">{_fmt(x_low + tick)}</text>'
            )
    for line in lines:
        dash = ' stroke-dasharray="5 3"' if line.dashed else ""
        for run in _runs(line.points):
            path = " ".join(f"{scale_x(x):.1f},{scale_y(y):.1f}" for x, y in run)
            if len(run) == 1:
                x, y = run[0]
                parts.append(
                    f'<circle cx="{scale_x(x):.1f}" cy="{scale_y(y):.1f}" r="2" '
                    f'fill="{line.color}"/>'
                )
            else:
                parts.append(
                    f'<polyline points="{path}" fill="none" stroke="{line.color}" '
                    f'stroke-width="2"{dash}/>'
                )
    if not ys:
        parts.append(
            f'<text x="{WIDTH // 2}" y="{HEIGHT // 2}" class="axis" text-anchor="middle">'
            "none</text>"
        )
    parts.append(_legend([(line.label, line.color, line.dashed) for line in lines]))
    return _svg(title, "".join(parts))


def _runs(points: Sequence[tuple[float, float | None]]) -> list[list[tuple[float, float]]]:
    runs: list[list[tuple[float, float]]] = [[]]
    for x, y in points:
        if y is None:
            if runs[-1]:
                runs.append([])
        else:
            runs[-1].append((x, y))
    return [run for run in runs if run]


def histogram_chart(title: str, edges: Sequence[float], counts: Sequence[int], fill: str) -> str:
    """Bars over log-spaced latency bins, trimmed to the bins that hold anything."""
    used = [i for i, c in enumerate(counts) if c]
    low, high = (used[0], used[-1]) if used else (0, len(counts) - 1)
    shown = list(range(low, high + 1))
    y_ticks = nice_ticks(max(counts) * 1.1 if used else 1.0)
    y_high = y_ticks[-1]
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def scale_y(y: float) -> float:
        return TOP + plot_h - (y / y_high) * plot_h

    parts = [_frame(title, "latency (ms, log bins)", "requests", y_ticks, scale_y)]
    width = plot_w / max(len(shown), 1)
    for slot, index in enumerate(shown):
        x = LEFT + slot * width
        y = scale_y(counts[index])
        upper = f"{edges[index + 1]:g}" if index + 1 < len(edges) else "∞"
        parts.append(
            f'<rect x="{x + 1:.1f}" y="{y:.1f}" width="{max(width - 2, 1):.1f}" '
            f'height="{TOP + plot_h - y:.1f}" fill="{fill}">'
            f"<title>{edges[index]:g} to {upper} ms: {counts[index]}</title></rect>"
        )
        if slot % max(1, len(shown) // 8) == 0:
            parts.append(
                f'<text x="{x:.1f}" y="{HEIGHT - BOTTOM + 16}" class="tick" '
                f'text-anchor="middle">{edges[index]:g}</text>'
            )
    return _svg(title, "".join(parts))


def _svg(title: str, body: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{escape(title)}">'
        f"{body}</svg>"
    )

"""Prometheus text exposition, built at scrape time from counters the components keep.

Hot-path code never calls into this module: components count in plain dicts and ints (one dict
increment per event), and a scrape walks them.  Only the request latency histogram is updated
per request, with one bisect.
"""

from __future__ import annotations

import bisect
import logging
import math
from collections.abc import Callable, Iterable
from typing import Literal

log = logging.getLogger("chaingate.metrics")

Sample = tuple[dict[str, str], float]
Kind = Literal["counter", "gauge", "histogram"]

LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)


class LatencySeries:
    """Counts and sum of one route's latencies; ``observe`` is the per-request cost."""

    __slots__ = ("buckets", "counts", "sum")

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, seconds)] += 1
        self.sum += seconds


class LatencyHistogram:
    """Request latency per route; cumulative buckets are computed only when scraped."""

    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.buckets = buckets
        self._series: dict[str, LatencySeries] = {}

    def series(self, route: str) -> LatencySeries:
        series = self._series.get(route)
        if series is None:
            series = self._series[route] = LatencySeries(self.buckets)
        return series

    def samples(self, name: str) -> Iterable[str]:
        for route, series in sorted(self._series.items()):
            running = 0
            for bound, count in zip(self.buckets, series.counts, strict=False):
                running += count
                yield f'{name}_bucket{{route="{route}",le="{bound}"}} {running}'
            running += series.counts[-1]
            yield f'{name}_bucket{{route="{route}",le="+Inf"}} {running}'
            yield f'{name}_sum{{route="{route}"}} {series.sum:.6f}'
            yield f'{name}_count{{route="{route}"}} {running}'


def _samples(name: str, collect: Callable[[], Iterable[Sample]]) -> list[str]:
    """One family's sample lines.  A scrape never fails on one value: a sample that is not a
    finite number of float range (a head of 5,000 hex digits) is skipped, and a collector
    that raises loses its own family only."""
    lines: list[str] = []
    try:
        for labels, value in collect():
            try:
                number = float(value)
            except (OverflowError, TypeError, ValueError):
                continue
            if not math.isfinite(number):
                continue
            shown = int(value) if number.is_integer() else value
            lines.append(f"{name}{_labels(labels)} {shown}")
    except Exception:
        log.exception("metrics: collector failed", extra={"fields": {"family": name}})
        return []
    return lines


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{key}="{_escape(value)}"' for key, value in labels.items())
    return "{" + inner + "}"


class Registry:
    """Metric families, each rendered by a callback that reads live component state."""

    def __init__(self) -> None:
        self._families: list[tuple[str, Kind, str, Callable[[], Iterable[Sample]]]] = []
        self._histograms: list[tuple[str, str, LatencyHistogram]] = []

    def family(
        self, name: str, kind: Kind, help_text: str, collect: Callable[[], Iterable[Sample]]
    ) -> None:
        self._families.append((name, kind, help_text, collect))

    def histogram(self, name: str, help_text: str, histogram: LatencyHistogram) -> None:
        self._histograms.append((name, help_text, histogram))

    def render(self) -> bytes:
        lines: list[str] = []
        for name, kind, help_text, collect in self._families:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(_samples(name, collect))
        for name, help_text, histogram in self._histograms:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} histogram")
            lines.extend(histogram.samples(name))
        return ("\n".join(lines) + "\n").encode()

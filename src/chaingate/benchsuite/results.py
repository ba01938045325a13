"""A run's figures as plain data (results.json) and as rows (results.csv).

Built from the master's (or the single process's) recorder once the load has stopped; the HTML
report and ``compare`` read nothing else, so every figure a picture shows is in the JSON too.
"""

from __future__ import annotations

import csv
import json
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from chaingate.benchsuite import outcomes
from chaingate.benchsuite.histogram import Histogram
from chaingate.benchsuite.recorder import Recorder, Tally
from chaingate.benchsuite.targets import Target

FORMAT = "chaingate-bench/1"
PERCENTILES = (("p50", 0.50), ("p90", 0.90), ("p99", 0.99))
# Latency histogram edges (ms): log-spaced, 0.1 ms to 10 s.
HISTOGRAM_EDGES_MS = [float(f"{0.1 * 10 ** (i / 5):.2g}") for i in range(26)]
RATIO_METRICS = (("rps", "answered req/s"), ("p50", "p50 latency"), ("p99", "p99 latency"))


def _latency(histogram: Histogram) -> dict[str, float | None]:
    figures: dict[str, float | None] = {
        name: _round(histogram.percentile(p)) for name, p in PERCENTILES
    }
    figures["mean"] = _round(histogram.mean())
    figures["max"] = _round(histogram.max_ms) if histogram.total else None
    return figures


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _summary(tally: Tally, seconds: float) -> dict[str, Any]:
    answered = tally.outcomes.get(outcomes.OK, 0)
    return {
        "requests": tally.requests,
        "calls": tally.calls,
        "answered": answered,
        "outcomes": {kind: tally.outcomes.get(kind, 0) for kind in outcomes.KINDS},
        "failures": tally.requests - answered,
        "rps": round(answered / seconds, 2) if seconds > 0 else 0.0,
        "latency_ms": _latency(tally.latency),
    }


def build(
    recorder: Recorder,
    *,
    scenario: str,
    targets: list[Target],
    settings: Mapping[str, Any],
    machine: Mapping[str, Any],
    started: float,
    stopped: float,
    checks: list[dict[str, Any]],
) -> dict[str, Any]:
    seconds = max(stopped - started, 1e-9)
    first = int(started)
    results: dict[str, Any] = {
        "format": FORMAT,
        "scenario": scenario,
        "started": started,
        "duration_s": round(seconds, 3),
        "settings": dict(settings),
        "machine": dict(machine),
        "targets": [{"name": t.name, "url": t.shown} for t in targets],
        "totals": {},
        "by_name": {},
        "series": {},
        "histogram": {"edges_ms": HISTOGRAM_EDGES_MS, "counts": {}},
        "samples": {},
        "checks": checks,
    }
    for target in targets:
        record = recorder.targets.get(target.name)
        names = record.names if record else {}
        total = record.total() if record else Tally()
        summary = _summary(total, seconds)
        summary["setup_requests"], summary["setup_calls"] = recorder.setup(target.name)
        results["totals"][target.name] = summary
        results["by_name"][target.name] = {
            name: _summary(tally, seconds) for name, tally in sorted(names.items())
        }
        series = []
        for second, tally in sorted((record.seconds if record else {}).items()):
            point: dict[str, Any] = {
                "t": second - first,
                "requests": tally.requests,
                "calls": tally.calls,
            }
            point.update({kind: tally.outcomes.get(kind, 0) for kind in outcomes.KINDS})
            point.update(_latency(tally.latency))
            series.append(point)
        results["series"][target.name] = series
        results["histogram"]["counts"][target.name] = total.latency.bins(HISTOGRAM_EDGES_MS)
        results["samples"][target.name] = dict(record.samples) if record else {}
    results["ratios"] = ratios(results)
    return results


def ratios(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each target's figures over the first target's (the baseline): >1 means more req/s, or
    slower, than the baseline."""
    names = [t["name"] for t in results["targets"]]
    if len(names) < 2:
        return []
    rows = []
    base = results["totals"][names[0]]
    for name in names[1:]:
        other = results["totals"][name]
        for metric, label in RATIO_METRICS:
            a = _figure(other, metric)
            b = _figure(base, metric)
            rows.append(
                {
                    "metric": metric,
                    "label": label,
                    "target": name,
                    "baseline": names[0],
                    "value": round(a / b, 3) if a is not None and b else None,
                }
            )
    return rows


def _figure(summary: Mapping[str, Any], metric: str) -> float | None:
    value = summary["rps"] if metric == "rps" else summary["latency_ms"][metric]
    return None if value is None else float(value)


def csv_rows(results: Mapping[str, Any]) -> Iterator[list[Any]]:
    """Every figure of results.json, one per row: section, target, name, t, metric, value."""
    for target, summary in results["totals"].items():
        yield from _summary_rows("totals", target, "", summary)
        for name, per_name in results["by_name"][target].items():
            yield from _summary_rows("by_name", target, name, per_name)
        for point in results["series"][target]:
            for metric, value in point.items():
                if metric != "t":
                    yield ["series", target, "", point["t"], metric, value]
        edges = results["histogram"]["edges_ms"]
        for edge, count in zip(edges, results["histogram"]["counts"][target], strict=True):
            yield ["histogram", target, "", "", f"ge_{edge}ms", count]
    for ratio in results["ratios"]:
        yield ["ratios", ratio["target"], ratio["baseline"], "", ratio["metric"], ratio["value"]]


def _summary_rows(
    section: str, target: str, name: str, summary: Mapping[str, Any]
) -> Iterator[list[Any]]:
    for metric, value in summary.items():
        if isinstance(value, dict):
            for key, inner in value.items():
                yield [section, target, name, "", f"{metric}.{key}", inner]
        else:
            yield [section, target, name, "", metric, value]


def check_writable(out: Path) -> None:
    """OSError unless a report can be written in ``out`` (made if missing): asked before the
    load, so that a run is never measured only to be lost."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=out):
        pass


def write(results: Mapping[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    with (out / "results.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["section", "target", "name", "t", "metric", "value"])
        writer.writerows(csv_rows(results))


def load(path: Path) -> dict[str, Any]:
    """A run's results.json; ValueError naming the file and what it expected otherwise."""
    expected = f"expected a chaingate bench results.json (format {FORMAT})"
    try:
        data = json.loads(path.read_bytes())
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not text: {expected}") from None
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno}"
        raise ValueError(f"{path}: not JSON ({exc.msg} at {where}): {expected}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path}: JSON, but not of this format: {expected}")
    return data

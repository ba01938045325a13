"""The overview (requests, compute units, errors, latency over time; by network, method and
key) and usage (per key, network, method and period, with CSV export), read from the
rollups: the last hour from per-minute rows (sixty periods at most), the last day from
usage_hours, 30 days from usage_days — no page sums more than its own periods."""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from quart import Blueprint, Response, g, request

from chaingate.dashboard.charts import line_chart
from chaingate.dashboard.latency import percentile
from chaingate.dashboard.store import UsageTotal
from chaingate.dashboard.web import Dashboard, gather, page, signed_in

# range -> (granularity, minutes per period, periods)
RANGES = {"hour": ("minute", 1, 60), "day": ("hour", 60, 24), "month": ("day", 1440, 30)}
SHOWN_ROWS = 200  # the newest; the CSV has every row
API_ROUTES = ("rpc", "bundler", "rest", "ws")
RANGE_NAMES = {"hour": "Last hour", "day": "Last 24 hours", "month": "Last 30 days"}
# The chart of requests by network draws the busiest few; the rest are summed as one line.
CHARTED_NETWORKS = 5
# What the network '' stands for: REST calls (of no one network) and usage metered before
# networks were (migration 0017).
NO_NETWORK = "(no network)"


def network_name(network: str) -> str:
    return network or NO_NETWORK


def window(range_name: str, now: float) -> tuple[str, int, int, int]:
    """(granularity, period size, first minute, end minute) of a range ending now."""
    granularity, size, periods = RANGES[range_name]
    current = int(now // 60) // size * size
    return granularity, size, current - (periods - 1) * size, current + size


def label(minute: int, size: int) -> str:
    moment = datetime.fromtimestamp(minute * 60, UTC)
    return moment.strftime("%m-%d" if size >= 1440 else "%H:%M")


def chosen_range() -> str:
    value = request.args.get("range", "day")
    return value if value in RANGES else "day"


async def key_names(dash: Dashboard, account_id: str) -> dict[str, str]:
    return {row.id: f"{row.name} ({row.prefix}…)" for row in await dash.store.list_keys(account_id)}


def summarise(rows: list[UsageTotal], first: int, end: int, size: int) -> dict[str, Any]:
    periods = list(range(first, end, size))
    index = {p: i for i, p in enumerate(periods)}
    requests = [0] * len(periods)
    units = [0] * len(periods)
    errors = [0] * len(periods)
    by_method: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    by_key: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    by_network: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    network_requests: dict[str, list[int]] = defaultdict(lambda: [0] * len(periods))
    for row in rows:
        i = index.get(row.period)
        if i is None:
            continue
        requests[i] += row.requests
        units[i] += row.compute_units
        errors[i] += row.errors
        network_requests[row.network][i] += row.requests
        for table, name in (
            (by_method, row.method),
            (by_key, row.key_id),
            (by_network, row.network),
        ):
            slot = table[name]
            slot[0] += row.requests
            slot[1] += row.compute_units
            slot[2] += row.errors
    networks = sorted(by_network.items(), key=lambda item: (-item[1][0], item[0]))
    return {
        "periods": periods,
        "requests": requests,
        "units": units,
        "errors": errors,
        "by_method": sorted(by_method.items(), key=lambda item: -item[1][0])[:50],
        "by_key": sorted(by_key.items(), key=lambda item: -item[1][0]),
        "by_network": [(network_name(name), counts) for name, counts in networks],
        "network_series": network_series(networks, network_requests, len(periods)),
        "totals": [sum(requests), sum(units), sum(errors)],
    }


def network_series(
    networks: list[tuple[str, list[int]]], per_period: dict[str, list[int]], periods: int
) -> list[tuple[str, Sequence[float | None]]]:
    """Requests over time of the busiest networks, one line each, the others summed."""
    series: list[tuple[str, Sequence[float | None]]] = [
        (network_name(name), per_period[name]) for name, _ in networks[:CHARTED_NETWORKS]
    ]
    rest = networks[CHARTED_NETWORKS:]
    if rest:
        summed = [sum(per_period[name][i] for name, _ in rest) for i in range(periods)]
        series.append((f"{len(rest)} other networks", summed))
    return series


def register(bp: Blueprint, dash: Dashboard) -> None:
    @bp.route("/", methods=["GET"])
    @signed_in
    async def overview() -> Any:
        range_name = chosen_range()
        granularity, size, first, end = window(range_name, dash.clock())
        account = g.session.account_id
        rows, latency_rows, keys = await gather(
            lambda: dash.rows.usage(account, granularity, first, end),
            lambda: dash.rows.latency(size, first, end),
            lambda: key_names(dash, account),
        )
        summary = summarise(rows, first, end, size)
        labels = [label(p, size) for p in summary["periods"]]
        merged: dict[int, list[int]] = {}
        for period, route, counts in latency_rows:
            if route not in API_ROUTES:
                continue  # the dashboard's own pages, /metrics: not the API's latency
            slot = merged.setdefault(period, [0] * 16)
            for i, count in enumerate(counts):
                slot[i] += count
        p50: list[float | None] = []
        p99: list[float | None] = []
        for period in summary["periods"]:
            found = merged.get(period)
            low = percentile(found, 0.5) if found else None
            high = percentile(found, 0.99) if found else None
            p50.append(None if low is None else round(low * 1000, 2))
            p99.append(None if high is None else round(high * 1000, 2))
        charts = [
            line_chart(
                "Requests and errors",
                labels,
                [("requests", summary["requests"]), ("errors", summary["errors"])],
            ),
            line_chart("Compute units", labels, [("compute units", summary["units"])]),
            line_chart("Requests by network", labels, summary["network_series"]),
            line_chart(
                "Latency (whole deployment), ms",
                labels,
                [("p50", p50), ("p99", p99)],
                " ms",
            ),
        ]
        return await page(
            "overview.html",
            title="Overview",
            range_name=range_name,
            ranges=RANGE_NAMES,
            summary=summary,
            charts=charts,
            keys=keys,
        )

    async def _asked_usage() -> tuple[str, int, int, int, str, str, list[Any]]:
        """The usage rows the request asks for: its range, the signed-in account, ``?key=``."""
        range_name = chosen_range()
        granularity, size, first, end = window(range_name, dash.clock())
        account = g.session.account_id
        key_id = request.args.get("key", "")[:64]  # filtered by the database
        rows = await dash.rows.usage(account, granularity, first, end, key_id)
        return range_name, size, first, end, account, key_id, list(rows)

    @bp.route("/usage", methods=["GET"])
    @signed_in
    async def usage_page() -> Any:
        range_name, size, first, end, account, key_id, rows = await _asked_usage()
        shown = sorted(rows, key=lambda r: (-r.period, r.key_id, r.network, r.method))
        shown = shown[:SHOWN_ROWS]
        return await page(
            "usage.html",
            title="Usage",
            range_name=range_name,
            ranges=RANGE_NAMES,
            rows=[(_when(r.period, size), r) for r in shown],
            total_rows=len(rows),
            summary=summarise(rows, first, end, size),
            keys=await key_names(dash, account),
            key_id=key_id,
            network_name=network_name,
        )

    @bp.route("/usage.csv", methods=["GET"])
    @signed_in
    async def usage_csv() -> Any:
        range_name, size, _first, _end, account, _key_id, rows = await _asked_usage()
        names = await key_names(dash, account)
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(
            [
                "period_start",
                "key_id",
                "key",
                "network",
                "method",
                "requests",
                "compute_units",
                "errors",
            ]
        )
        for row in rows:
            writer.writerow(
                [
                    _when(row.period, size),
                    row.key_id,
                    _cell(names.get(row.key_id, "")),
                    _cell(row.network),
                    _cell(row.method),
                    row.requests,
                    row.compute_units,
                    row.errors,
                ]
            )
        return Response(
            out.getvalue(),
            mimetype="text/csv",
            headers={
                "Content-Disposition": f'attachment; filename="chaingate-usage-{range_name}.csv"'
            },
        )


def _when(minute: int, size: int) -> str:
    moment = datetime.fromtimestamp(minute * 60, UTC)
    return moment.strftime("%Y-%m-%d" if size >= 1440 else "%Y-%m-%dT%H:%MZ")


def _cell(text: str) -> str:
    """No spreadsheet formula from a name or method (CSV injection)."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text

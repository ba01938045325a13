"""The overview (requests, compute units, errors, latency over time; by network, method and
key) and usage (per key, network, method and period, with CSV export), read from the
rollups: the last hour from per-minute rows (sixty periods at most), the last day from
usage_hours, 30 days from usage_days — no page sums more than its own periods.  Latency is
the account's own (usage_latency, at the same granularity)."""

from __future__ import annotations

import csv
import io
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from markupsafe import Markup
from quart import Blueprint, Response, g, request
from quart.typing import ResponseReturnValue

from chaingate.auth.store import Granularity, UsageLatencyRow, UsageTotal
from chaingate.dashboard.charts import line_chart
from chaingate.dashboard.latency import percentile
from chaingate.dashboard.web import Dashboard, gather, page, signed_in

# range -> (granularity, minutes per period, periods)
RANGES: dict[str, tuple[Granularity, int, int]] = {
    "hour": ("minute", 1, 60),
    "day": ("hour", 60, 24),
    "month": ("day", 1440, 30),
}
SHOWN_ROWS = 200  # the newest; the CSV has every row
SHOWN_METHODS = 50  # the busiest
# A spreadsheet formula's first character, where a reader may start a cell (see _cell).
_FORMULA_START = re.compile(r"(^|[,;\t\r\n])(?=[=+\-@\t\r])")
RANGE_NAMES = {"hour": "Last hour", "day": "Last 24 hours", "month": "Last 30 days"}
# The chart of requests by network draws the busiest few; the rest are summed as one line.
CHARTED_NETWORKS = 5
# What the network '' stands for: REST calls (of no one network) and usage metered before
# networks were (migration 0017).
NO_NETWORK = "(no network)"
NO_VALUE = "—"  # a table cell with nothing measured
# A row of the overview's by-network and by-method tables: name, usage counts (None: latency
# only), p50 and p99 as shown.
TableRow = tuple[str, list[int] | None, str, str]


def network_name(network: str) -> str:
    return network or NO_NETWORK


def window(range_name: str, now: float) -> tuple[Granularity, int, int, int]:
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
    return {
        row.id: f"{row.name} ({row.prefix}…)" for row in await dash.accounts.list_keys(account_id)
    }


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
        "by_method": sorted(by_method.items(), key=lambda item: -item[1][0]),
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


def bucket_sums(pairs: Iterable[tuple[Any, Sequence[int]]]) -> dict[Any, list[int]]:
    """Latency buckets summed per key (histograms add up)."""
    sums: dict[Any, list[int]] = {}
    for key, counts in pairs:
        slot = sums.setdefault(key, [0] * len(counts))
        for i, count in enumerate(counts):
            slot[i] += count
    return sums


def latency_chart(
    title: str,
    labels: Sequence[str],
    periods: Sequence[int],
    rows: Iterable[tuple[int, Sequence[int]]],
) -> Markup:
    """A p50/p99 chart (ms) of (period, bucket counts) rows, summed per period: the
    account's on the overview, the deployment's on the operator's page."""
    per_period = bucket_sums(rows)
    p50: list[float | None] = []
    p99: list[float | None] = []
    for period in periods:
        counts = per_period.get(period, ())
        p50.append(milliseconds(percentile(counts, 0.5)))
        p99.append(milliseconds(percentile(counts, 0.99)))
    return line_chart(title, labels, [("p50", p50), ("p99", p99)], " ms")


def milliseconds(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def shown_ms(counts: Sequence[int] | None, q: float) -> str:
    """A table cell: the q-quantile in ms, or a dash when nothing was measured."""
    value = milliseconds(percentile(counts or (), q))
    return NO_VALUE if value is None else f"{value:.2f}"


def with_latency(
    usage: Sequence[tuple[str, list[int]]], latency: dict[str, list[int]], shown: int | None
) -> list[TableRow]:
    """Table rows (name, usage counts or None, p50, p99), busiest first: the usage's rows and
    the names only latency has (a batch: usage counts its calls, latency the request), ranked
    by the requests measured; ``shown`` rows at most."""
    counts = dict(usage)
    names = list(counts) + [name for name in latency if name not in counts]

    def busy(name: str) -> int:
        found = counts.get(name)
        return found[0] if found is not None else sum(latency[name])

    ranked = sorted(names, key=lambda name: -busy(name))[:shown]
    return [
        (
            name,
            counts.get(name),
            shown_ms(latency.get(name), 0.5),
            shown_ms(latency.get(name), 0.99),
        )
        for name in ranked
    ]


def latency_tables(
    summary: dict[str, Any], rows: Sequence[UsageLatencyRow]
) -> tuple[list[TableRow], list[TableRow]]:
    """The overview's by-network and by-method tables, each row with the range's p50/p99."""
    by_network = bucket_sums((network_name(r.network), r.counts) for r in rows)
    by_method = bucket_sums((r.method, r.counts) for r in rows)
    return (
        with_latency(summary["by_network"], by_network, None),
        with_latency(summary["by_method"], by_method, SHOWN_METHODS),
    )


def register(bp: Blueprint, dash: Dashboard) -> None:
    _register_overview(bp, dash)
    _register_usage(bp, dash)


async def _asked_usage(dash: Dashboard) -> tuple[str, int, int, int, str, str, list[Any]]:
    """The usage rows the request asks for: its range, the signed-in account, ``?key=``."""
    range_name = chosen_range()
    granularity, size, first, end = window(range_name, dash.clock())
    account = g.session.account_id
    key_id = request.args.get("key", "")[:64]  # filtered by the database
    rows = await dash.accounts.usage_totals(account, granularity, first, end, key_id)
    return range_name, size, first, end, account, key_id, list(rows)


def _register_overview(bp: Blueprint, dash: Dashboard) -> None:
    @bp.route("/", methods=["GET"])
    @signed_in
    async def overview() -> ResponseReturnValue:
        range_name = chosen_range()
        granularity, size, first, end = window(range_name, dash.clock())
        account = g.session.account_id
        rows, latency_rows, keys = await gather(
            lambda: dash.accounts.usage_totals(account, granularity, first, end),
            lambda: dash.accounts.usage_latency(account, granularity, first, end),
            lambda: key_names(dash, account),
        )
        summary = summarise(rows, first, end, size)
        networks, methods = latency_tables(summary, latency_rows)
        labels = [label(p, size) for p in summary["periods"]]
        charts = [
            line_chart(
                "Requests and errors",
                labels,
                [("requests", summary["requests"]), ("errors", summary["errors"])],
            ),
            line_chart("Compute units", labels, [("compute units", summary["units"])]),
            line_chart("Requests by network", labels, summary["network_series"]),
            latency_chart(
                "Latency, ms",
                labels,
                summary["periods"],
                ((r.period, r.counts) for r in latency_rows),
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
            networks=networks,
            methods=methods,
        )


def _register_usage(bp: Blueprint, dash: Dashboard) -> None:
    """The usage rows as a table and as CSV."""

    @bp.route("/usage", methods=["GET"])
    @signed_in
    async def usage_page() -> ResponseReturnValue:
        range_name, size, first, end, account, key_id, rows = await _asked_usage(dash)
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
    async def usage_csv() -> ResponseReturnValue:
        range_name, size, _first, _end, account, _key_id, rows = await _asked_usage(dash)
        names = await key_names(dash, account)
        out = io.StringIO()
        writer = csv.writer(out, quoting=csv.QUOTE_ALL)
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
    """No spreadsheet formula from a name or method (CSV injection, OWASP's rule): a
    ``'`` before a cell that starts with ``= + - @``, tab or CR — and before such a character
    after a list separator (``,``, ``;``, tab) or line break inside the cell, which a reader
    splitting on another separator than ours would make the start of a cell.  Every cell is
    quoted too (``csv.QUOTE_ALL``)."""
    return _FORMULA_START.sub(r"\1'", text)

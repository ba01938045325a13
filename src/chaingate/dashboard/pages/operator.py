"""The operator's view (the admin token's holder, or an account flagged operator): the
accounts, newest first a page at a time (searchable by e-mail), with their live keys and
usage today, the upstreams' health, and the whole deployment's API latency over time (each
account's own is on its overview)."""

from __future__ import annotations

from collections import defaultdict

from quart import Blueprint, request
from quart.typing import ResponseReturnValue

from chaingate.dashboard.pages.usage import (
    RANGE_NAMES,
    chosen_range,
    label,
    latency_chart,
    window,
)
from chaingate.dashboard.web import Dashboard, gather, operator_only, page, page_number

ACCOUNTS_PER_PAGE = 100
MAX_SEARCH = 320
# The edge's route classes that are the API (not the dashboard's own pages, nor /metrics).
API_ROUTES = ("rpc", "bundler", "rest", "ws")


def register(bp: Blueprint, dash: Dashboard) -> None:
    @bp.route("/operator", methods=["GET"])
    @operator_only
    async def operator() -> ResponseReturnValue:
        number = int(page_number())
        search = request.args.get("q", "").strip()[:MAX_SEARCH]
        day = int(dash.clock() // 60) // 1440 * 1440
        range_name = chosen_range()
        _, size, first, end = window(range_name, dash.clock())
        # One more than a page: whether there is a next one.
        accounts, latency_rows = await gather(
            lambda: dash.accounts.account_summaries(
                ACCOUNTS_PER_PAGE + 1, (number - 1) * ACCOUNTS_PER_PAGE, day, search
            ),
            lambda: dash.rows.latency(size, first, end),
        )
        periods = range(first, end, size)
        chart = latency_chart(
            "Latency (whole deployment), ms",
            [label(p, size) for p in periods],
            periods,
            ((p, counts) for p, route, counts in latency_rows if route in API_ROUTES),
        )
        return await page(
            "operator.html",
            title="Operator",
            accounts=accounts[:ACCOUNTS_PER_PAGE],
            page_number=number,
            more=len(accounts) > ACCOUNTS_PER_PAGE,
            search=search,
            health=dash.health(),
            upstreams=dash.upstreams(),
            range_name=range_name,
            ranges=RANGE_NAMES,
            latency=chart,
        )

    @bp.route("/operator/accounts/<account_id>", methods=["GET"])
    @operator_only
    async def account(account_id: str) -> ResponseReturnValue:
        found = await dash.accounts.get_account(account_id[:64])
        if found is None:
            return await page("error.html", 404, title="Account", message="No such account.")
        minute = int(dash.clock() // 60)
        day = minute // 1440 * 1440
        keys, rows = await gather(
            lambda: dash.accounts.list_keys(found.id),
            lambda: dash.accounts.usage_totals(found.id, "day", day - 29 * 1440, day + 1440),
        )
        by_key: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
        for row in rows:
            slot = by_key[row.key_id]
            slot[0] += row.requests
            slot[1] += row.compute_units
            slot[2] += row.errors
        return await page(
            "operator_account.html",
            title=f"Account {found.email}",
            account=found,
            keys=keys,
            by_key=by_key,
        )

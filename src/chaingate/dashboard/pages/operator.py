"""The operator's view (the admin token's holder, or an account flagged operator): every
account with its usage today, and the upstreams' health."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from quart import Blueprint

from chaingate.dashboard.web import Dashboard, gather, operator_only, page


def register(bp: Blueprint, dash: Dashboard) -> None:
    @bp.route("/operator", methods=["GET"])
    @operator_only
    async def operator() -> Any:
        accounts = await dash.store.accounts_changed_since(0)
        minute = int(dash.clock() // 60)
        day = minute // 1440 * 1440
        rows = await dash.rows.usage(None, "day", day, day + 1440)
        keys = await dash.store.list_keys()
        today: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
        account_of = {key.id: key.account_id for key in keys}
        for row in rows:
            slot = today[account_of.get(row.key_id, "")]
            slot[0] += row.requests
            slot[1] += row.compute_units
            slot[2] += row.errors
        active_keys: dict[str, int] = defaultdict(int)
        for key in keys:
            if key.revoked_at is None:
                active_keys[key.account_id] += 1
        return await page(
            "operator.html",
            title="Operator",
            accounts=accounts[:500],
            today=today,
            active_keys=active_keys,
            health=dash.health(),
            upstreams=dash.upstreams(),
        )

    @bp.route("/operator/accounts/<account_id>", methods=["GET"])
    @operator_only
    async def account(account_id: str) -> Any:
        found = await dash.store.get_account(account_id[:64])
        if found is None:
            return await page("error.html", 404, title="Account", message="No such account.")
        minute = int(dash.clock() // 60)
        day = minute // 1440 * 1440
        keys, rows = await gather(
            lambda: dash.store.list_keys(found.id),
            lambda: dash.rows.usage(found.id, "day", day - 29 * 1440, day + 1440),
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

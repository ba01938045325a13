"""``GET /v1/usage`` — the calling key's account usage, per method and period.

Query: ``from`` and ``to`` (ISO 8601 UTC or Unix seconds; default: the last 24 hours),
``granularity`` (``minute``, ``hour`` — default — or ``day``).  A window may hold at most
``MAX_PERIODS`` periods, which bounds the answer.  REST calls are recorded under their route
(``GET /v1/tokens/{chain}/balances/{address}``), JSON-RPC calls under their method, whatever
the network's family (``eth_call``, ``getBalance``), WebSocket pushes as ``eth_subscription``
or ``solana_subscription`` (units, no requests); the networks are summed (the spec's shape).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Annotated, Literal

import msgspec

from chaingate.api.deps import ApiDeps
from chaingate.api.errors import ApiError
from chaingate.api.routing import ANY_KEY, Call, NoInput, RestApi
from chaingate.api.types import UnixTime
from chaingate.auth.store import AuthRows

GRANULARITY_MINUTES = {"minute": 1, "hour": 60, "day": 1440}
MAX_PERIODS = 1500


class UsageQuery(msgspec.Struct, forbid_unknown_fields=True, rename={"from_": "from"}):
    from_: UnixTime | None = None
    to: UnixTime | None = None
    granularity: Literal["minute", "hour", "day"] = "hour"


class UsagePeriod(msgspec.Struct):
    period: str
    method: Annotated[
        str,
        msgspec.Meta(
            description="A JSON-RPC method of any network (eth_call, getBalance), "
            "eth_subscription or solana_subscription (units pushed over a WebSocket), "
            "or a REST route (GET /v1/usage)."
        ),
    ]
    requests: int
    compute_units: int
    errors: int


class UsageTotals(msgspec.Struct):
    requests: int
    compute_units: int
    errors: int


class Usage(msgspec.Struct, rename={"from_": "from"}):
    account_id: str
    granularity: str
    from_: str
    to: str
    usage: list[UsagePeriod]
    totals: UsageTotals


def iso_minute(minute: int) -> str:
    return datetime.fromtimestamp(minute * 60, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def window(query: UsageQuery, now: float) -> tuple[int, int]:
    """(from minute, to minute) of the query, validated."""
    to_seconds = int(now) if query.to is None else int(query.to)
    from_seconds = max(0, to_seconds - 86_400) if query.from_ is None else int(query.from_)
    if from_seconds > to_seconds:
        raise ApiError(400, "invalid query parameter 'from': it is after 'to'")
    step = GRANULARITY_MINUTES[query.granularity]
    if (to_seconds - from_seconds) // 60 // step > MAX_PERIODS:
        raise ApiError(
            400,
            f"invalid query parameter 'from': at most {MAX_PERIODS} periods per request "
            "(narrow the window or use a coarser granularity)",
        )
    # The store's ranges are half-open: +1 keeps the minute that contains ``to``.
    return from_seconds // 60, to_seconds // 60 + 1


def register(api: RestApi, deps: ApiDeps) -> None:
    @api.route(
        "GET",
        "/v1/usage",
        name="getUsage",
        summary="Requests, compute units and errors of the calling key's account",
        access=ANY_KEY,
        query=UsageQuery,
        response=Usage,
        errors=(404,),
        tags=("account",),
    )
    async def get_usage(call: Call[NoInput, UsageQuery, None]) -> object:
        principal = call.principal
        store = deps.store
        if principal is None or not principal.account_id or store is None:
            raise ApiError(404, "usage is recorded only when API keys are enabled")
        first, last = window(call.query, time.time())
        granularity = call.query.granularity
        rows = await AuthRows(store).usage(principal.account_id, first, last, granularity)
        return Usage(
            account_id=principal.account_id,
            granularity=granularity,
            from_=iso_minute(first),
            to=iso_minute(last - 1),
            usage=[
                UsagePeriod(
                    iso_minute(row.period_start),
                    row.method,
                    row.requests,
                    row.compute_units,
                    row.errors,
                )
                for row in rows
            ],
            totals=UsageTotals(
                sum(row.requests for row in rows),
                sum(row.compute_units for row in rows),
                sum(row.errors for row in rows),
            ),
        )

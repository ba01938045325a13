"""``GET /v1/usage`` — the calling key's account usage, per method and period.

Query: ``from`` and ``to`` (ISO 8601 UTC or Unix seconds; default: the last 24 hours),
``granularity`` (``minute``, ``hour`` — default — or ``day``).  A window may hold at most
``MAX_PERIODS`` periods, which bounds the answer.
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from typing import Any

from quart import Response, request
from quart_trio import QuartTrio

from chaingate.api.app import error_response, json_response

GRANULARITY_MINUTES = {"minute": 1, "hour": 60, "day": 1440}
MAX_PERIODS = 1500


class QueryError(ValueError):
    pass


# Accepted times: from the Unix epoch to the end of year 9999 (what ISO 8601 can name).
MAX_SECONDS = 253_402_300_799


def parse_time(value: str, name: str) -> int:
    """Unix seconds from an ISO 8601 timestamp or a number of seconds (finite, in range)."""
    problem = f"{name} must be an ISO 8601 timestamp or Unix seconds between 0 and {MAX_SECONDS}"
    if len(value) > 64:
        raise QueryError(problem)
    try:
        number = float(value)
    except ValueError:
        pass
    else:
        if not math.isfinite(number) or not 0 <= number <= MAX_SECONDS:
            raise QueryError(problem)
        return int(number)
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise QueryError(problem) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    try:
        seconds = int(parsed.timestamp())
    except (OverflowError, ValueError):  # year 1 shifted by its offset, and the like
        raise QueryError(problem) from None
    if not 0 <= seconds <= MAX_SECONDS:
        raise QueryError(problem)
    return seconds


def iso_minute(minute: int) -> str:
    return datetime.fromtimestamp(minute * 60, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_query(args: Any, now: float) -> tuple[int, int, str]:
    """(from minute, to minute, granularity) from the query string, validated."""
    granularity = args.get("granularity", "hour")
    if granularity not in GRANULARITY_MINUTES:
        raise QueryError("granularity must be minute, hour or day")
    to_seconds = parse_time(args["to"], "to") if "to" in args else int(now)
    from_seconds = parse_time(args["from"], "from") if "from" in args else to_seconds - 86_400
    if from_seconds > to_seconds:
        raise QueryError("from must not be after to")
    step = GRANULARITY_MINUTES[granularity]
    if (to_seconds - from_seconds) // 60 // step > MAX_PERIODS:
        raise QueryError(f"at most {MAX_PERIODS} periods per request: narrow the window")
    # The store's ranges are half-open: +1 keeps the minute that contains ``to``.
    return from_seconds // 60, to_seconds // 60 + 1, granularity


def register(app: QuartTrio, store: Any) -> None:
    @app.get("/v1/usage")
    async def get_usage() -> Response:
        principal: Any = request.scope.get("chaingate.principal")
        if principal is None or not principal.account_id or store is None:
            return error_response(404, "usage is recorded only when API keys are enabled")
        try:
            first, last, granularity = parse_query(request.args, time.time())
        except QueryError as exc:
            return error_response(400, str(exc))
        rows = await store.usage(principal.account_id, first, last, granularity)
        usage = [
            {
                "period": iso_minute(row.period_start),
                "method": row.method,
                "requests": row.requests,
                "compute_units": row.compute_units,
                "errors": row.errors,
            }
            for row in rows
        ]
        totals = {
            "requests": sum(row.requests for row in rows),
            "compute_units": sum(row.compute_units for row in rows),
            "errors": sum(row.errors for row in rows),
        }
        return json_response(
            {
                "account_id": principal.account_id,
                "granularity": granularity,
                "from": iso_minute(first),
                "to": iso_minute(last - 1),
                "usage": usage,
                "totals": totals,
            }
        )

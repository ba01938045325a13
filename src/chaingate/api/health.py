"""``GET /v1/health`` — public: load balancers and orchestrators probe it without a key."""

from __future__ import annotations

import msgspec
from quart import Response

from chaingate.api.deps import ApiDeps
from chaingate.api.routing import PUBLIC, Call, NoInput, RestApi


class FollowerHealth(msgspec.Struct):
    block: int | None
    finalized: int
    live: bool


class NetworkHealth(msgspec.Struct):
    chain: str
    network: str
    upstreams: int
    upstreams_up: int
    head: int | None
    follower: FollowerHealth | None = None


class HealthQuery(msgspec.Struct):
    """Any query string is ignored: probes add cache busters of their own."""


class Health(msgspec.Struct):
    """``ok`` when every network has an upstream in rotation (HTTP 200), else ``degraded``
    (HTTP 503)."""

    status: str
    version: str
    networks: list[NetworkHealth]
    # The answering process (one of `serve --workers N`, or one of several machines) and the
    # single-writer roles it leads, e.g. "follower:ethereum/devnet".
    worker: int
    leads: list[str]


def register(api: RestApi, deps: ApiDeps) -> None:
    @api.route(
        "GET",
        "/v1/health",
        name="getHealth",
        summary="Whether every network has an upstream in rotation",
        access=PUBLIC,
        query=HealthQuery,
        response=Health,
        other_responses={503: Health},
        tags=("service",),
    )
    async def get_health(call: Call[NoInput, HealthQuery, None]) -> object:
        report = deps.health()
        body = msgspec.json.encode(report)
        return Response(body, 200 if report["status"] == "ok" else 503, mimetype="application/json")

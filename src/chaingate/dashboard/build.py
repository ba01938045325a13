"""The dashboard put together from what the composition root has built (called once; nothing
here runs per request).  It takes the parts it reads by name, not the gateway, so whichever
object builds the REST app can install it."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio
from quart_trio import QuartTrio

from chaingate.api.deps import ApiDeps
from chaingate.api.routing import RestApi
from chaingate.auth.store import AuthRows
from chaingate.config import Settings
from chaingate.config.network import Network
from chaingate.dashboard import install
from chaingate.dashboard.latency import LatencySampler
from chaingate.dashboard.restcalls import RestCalls
from chaingate.dashboard.sharedthrottle import SharedLoginThrottle
from chaingate.dashboard.store import DashboardRows
from chaingate.dashboard.web import Dashboard


class DashboardTasks:
    """What the dashboard runs beside the requests: the latency sampler (and prune), and,
    when processes share Redis, the sign-in throttle's connection to it."""

    def __init__(self, sampler: LatencySampler, throttle: SharedLoginThrottle | None) -> None:
        self.sampler = sampler
        self.throttle = throttle

    async def run(self, interval: float) -> None:
        async with trio.open_nursery() as nursery:
            if self.throttle is not None:
                nursery.start_soon(self.throttle.run)
            nursery.start_soon(self.sampler.run, interval)


def upstream_health(services: Mapping[Network, Any]) -> list[dict[str, Any]]:
    """Each upstream of each RPC service (chaingate.rpc.service.RpcService): up, lagging or
    down, its latency (moving average) and head."""
    found = []
    for key, service in services.items():
        max_lag = service.settings.max_head_lag
        for upstream in service.pool.upstreams:
            health = upstream.health
            state = "down" if health.state_down else "lagging" if health.lag > max_lag else "up"
            found.append(
                {
                    "network": str(key),
                    "name": upstream.name,
                    "state": state,
                    "latency_ms": round(health.latency * 1000, 2),
                    "head": health.head,
                }
            )
    return found


def install_dashboard(
    app: QuartTrio,
    settings: Settings,
    *,
    store: Any,
    rest: RestApi,
    api: ApiDeps,
    health: Callable[[], dict[str, Any]],
    services: Mapping[Network, Any],
    bundlers: Mapping[Network, Any],
    keys_refresh: Callable[[], Awaitable[None]] | None,
    route_latency: Mapping[str, Any],
) -> DashboardTasks | None:
    """Adds the dashboard to the REST app when API keys are on (accounts sign in); returns
    its background tasks (``route_latency``: the edge's histogram series by route), for the
    caller's nursery."""
    if not settings.dashboard.enabled or not settings.auth.enabled or store is None:
        return None
    rows = DashboardRows(store)
    dash = Dashboard(
        rows=rows,
        accounts=AuthRows(store),
        rest=RestCalls(rest),
        api=api,
        settings=settings.dashboard,
        pepper=settings.auth.pepper.encode(),
        admin_token=settings.observability.admin_token,
        health=health,
        upstreams=lambda: upstream_health(services),
        bundlers=bundlers,
        keys_refresh=keys_refresh,
        redis_url=settings.auth.redis_url,
    )
    install(app, dash)
    return DashboardTasks(LatencySampler(rows, route_latency, time.time), dash.shared_throttle)

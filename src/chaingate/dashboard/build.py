"""The dashboard put together from a gateway's parts (the gateway calls ``install_dashboard``
once; nothing here runs per request)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from quart_trio import QuartTrio

from chaingate.dashboard import install
from chaingate.dashboard.latency import LatencySampler
from chaingate.dashboard.restcalls import RestCalls
from chaingate.dashboard.store import DashboardRows
from chaingate.dashboard.web import Dashboard

if TYPE_CHECKING:
    from chaingate.gateway import Gateway


def upstream_health(gateway: Gateway) -> list[dict[str, Any]]:
    found = []
    for key, service in gateway.services.items():
        max_lag = service.settings.max_head_lag
        for upstream in service.pool.upstreams:
            health = upstream.health
            state = "down" if health.state_down else "lagging" if health.lag > max_lag else "up"
            found.append(
                {
                    "network": key,
                    "name": upstream.name,
                    "state": state,
                    "latency_ms": round(health.latency * 1000, 2),
                    "head": health.head,
                }
            )
    return found


def install_dashboard(gateway: Gateway, app: QuartTrio) -> LatencySampler | None:
    """Adds the dashboard to the REST app when API keys are on (accounts sign in); its latency
    sampler, for the gateway's nursery."""
    settings = gateway.settings
    store = gateway.store
    if not settings.dashboard.enabled or not settings.auth.enabled or store is None:
        return None
    rows = DashboardRows(store)
    dash = Dashboard(
        rows=rows,
        store=store,
        rest=RestCalls(gateway.rest),
        api=gateway.api_deps,
        settings=settings.dashboard,
        pepper=settings.auth.pepper.encode(),
        admin_token=settings.observability.admin_token,
        health=gateway.health,
        upstreams=lambda: upstream_health(gateway),
        bundlers=gateway.bundlers,
        keys_refresh=gateway.keys.refresh if gateway.keys is not None else None,
    )
    install(app, dash)
    return LatencySampler(rows, gateway.routes.route_latency, time.time)

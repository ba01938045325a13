"""The chain subsystem as the gateway runs it: every configured network's JSON-RPC proxy
(``RpcService`` and its upstream pool), chaingate's own client of it, and, for a followed EVM
network, its follower.

``run`` starts the proxies (what serves requests); ``run_writers`` the followers, the single
writers of each network's chain rows, which the gateway starts once every consumer of their
events is up.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from chaingate import __version__
from chaingate.chain.client import ChainClient
from chaingate.chain.follower import Follower
from chaingate.chain.store import ChainRows
from chaingate.config import NetworkSettings, Settings
from chaingate.config.network import Network
from chaingate.rpc.methods import MethodTable
from chaingate.rpc.service import Gate as ProxyGate
from chaingate.rpc.service import RpcService
from chaingate.store import Store
from chaingate.twins import Impl

log = logging.getLogger("chaingate")


class ChainService:
    def __init__(
        self,
        settings: Settings,
        methods: MethodTable,
        impl: Impl,
        gate: ProxyGate,
        store: Store | None,
        *,
        logs_range_of: Callable[[Any], int] | None,
    ) -> None:
        """Keyed by ``Network``.  Without a store nothing is followed."""
        self.services: dict[Network, RpcService] = {
            key: RpcService(
                key, net, settings.rpc, methods, impl, gate, logs_range_of=logs_range_of
            )
            for key, net in settings.networks().items()
        }
        self.clients: dict[Network, ChainClient] = {}
        self.followers: dict[Network, Follower] = {}
        rows = ChainRows(store) if store is not None else None
        for key, service in self.services.items():
            net = service.settings
            if net.family != "evm":
                continue
            client = ChainClient(
                service.pool,
                timeout=settings.rpc.request_timeout,
                max_batch=min(u.max_batch for u in net.upstreams),
            )
            self.clients[key] = client
            if net.follower.enabled and rows is not None:
                self.followers[key] = Follower(
                    service.chain,
                    service.network,
                    client,
                    rows,
                    net.follower,
                    finality_depth=net.finality_depth,
                    block_time=net.block_time,
                    ws_urls=[u.ws_url for u in net.upstreams if u.ws_url],
                )

    @property
    def networks(self) -> dict[Network, NetworkSettings]:
        return {key: service.settings for key, service in self.services.items()}

    def witness_heads(self) -> None:
        """Each follower witnesses its pool's heads (rpc/heads.py)."""
        for key, follower in self.followers.items():
            self.services[key].pool.witness = follower

    async def run(self, nursery: trio.Nursery) -> None:
        """What serves requests: each network's proxy (its upstream pool)."""
        for service in self.services.values():
            await nursery.start(service.run)

    async def run_writers(self, nursery: trio.Nursery) -> None:
        """Each followed network's follower: the single writer of its chain rows."""
        for follower in self.followers.values():
            await nursery.start(follower.run)

    def shutdown(self) -> None:
        """Nothing to drain: a follower's save is one transaction, never left half-done."""

    def health(self) -> dict[str, Any]:
        # Never raises, whatever a component holds: one odd value (say a head of 5,000 hex
        # digits) must not turn the health of every network into a 500.
        def number(value: object) -> int | None:
            return value if type(value) is int and -(1 << 63) <= value < 1 << 64 else None

        networks = []
        healthy = True
        for key, service in self.services.items():
            entry: dict[str, Any] = {"chain": service.chain, "network": service.network}
            try:
                up = service.pool.upstreams_up
                entry["upstreams"] = len(service.pool.upstreams)
                entry["upstreams_up"] = up
                entry["head"] = number(service.pool.head)
                follower = self.followers.get(key)
                if follower is not None:
                    block, finalized = follower.progress
                    entry["follower"] = {
                        "block": number(block),
                        "finalized": number(finalized),
                        "live": bool(follower.live),
                    }
            except Exception:
                log.exception(
                    "health: network state unreadable", extra={"fields": {"network": str(key)}}
                )
                entry["error"] = "state unreadable"
                up = 0
            healthy = healthy and up > 0
            networks.append(entry)
        return {
            "status": "ok" if healthy else "degraded",
            "version": __version__,
            "networks": networks,
        }

"""The whole chaingate process: the composition root.

``Gateway`` opens the store, builds each subsystem's service object and the front door, and
``run`` starts them.  Each service object has ``run(nursery)`` — what serves requests — and
``run_writers(nursery)`` — the single writers of a network's rows (followers, indexers,
trackers, mempools, matchers...), which one process per network runs — and ``shutdown()``.
The order: every service's ``run`` (auth, the chains' proxies, gas, data, wallets, bundler,
webhooks, simulation), then their writers, the followers last (every consumer of their events
is up by then), then the front door; ``run`` reports the bound port and waits for ``shutdown()``.
Shutdown is graceful: the front door drains first (in-flight requests finish, up to
``server.shutdown_grace``), then the rest is cancelled.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
from pathlib import Path
from typing import IO, Any, Protocol

import trio

from chaingate.api.deps import ApiDeps
from chaingate.auth.gate import Gate, OpenGate
from chaingate.auth.keygate import KeyRegistry
from chaingate.auth.service import AuthService
from chaingate.auth.shared import SharedLimits
from chaingate.auth.usage import UsageWriter
from chaingate.bundler.service import BundlerService
from chaingate.chain.service import ChainService
from chaingate.cluster.wiring import lead_writers
from chaingate.config import Settings, follows_any, methods_path
from chaingate.data.service import DataPlane
from chaingate.frontdoor import FrontDoor
from chaingate.gas.service import GasService
from chaingate.gateway_metrics import register_edge_families, register_service_families
from chaingate.obs.metrics import Registry
from chaingate.outbound import Fetcher, OutboundPolicy
from chaingate.rpc.methods import MethodTable
from chaingate.simulation.service import SimulationService
from chaingate.store import Store, open_store
from chaingate.twins import Impl, select
from chaingate.wallets.service import WalletService
from chaingate.wallets.signer import paymaster_signer
from chaingate.webhooks.service import WebhookService, webhook_delivery_fetcher

log = logging.getLogger("chaingate")
# Allocations between young collections once serving (the interpreter's default: 700).
YOUNG_COLLECTION = 20_000


class Service(Protocol):
    """A subsystem as the root runs it: ``run`` and ``run_writers`` start tasks in the root's
    nursery and return once they are ready; ``shutdown`` is called before they are cancelled."""

    async def run(self, nursery: trio.Nursery) -> None: ...

    async def run_writers(self, nursery: trio.Nursery) -> None: ...

    def shutdown(self) -> None: ...


class Gateway:
    def __init__(
        self,
        settings: Settings,
        *,
        impl: Impl | None = None,
        gate: Gate | None = None,
        access_stream: IO[bytes] | None = None,
        outbound_policy: OutboundPolicy | None = None,
        webhook_fetcher: Fetcher | None = None,
        fetcher: Fetcher | None = None,
    ) -> None:
        """``outbound_policy``: where chaingate's own HTTP fetches may go; None builds it from
        ``settings.outbound`` (public addresses only unless configured).  ``chaingate dev``
        passes ``OutboundPolicy.dev()``, which adds loopback.  ``webhook_fetcher``: what
        delivers webhooks (tests inject its resolver and connector); None builds one under the
        same policy, with keep-alive connections.  ``fetcher``: what fetches metadata
        documents and token lists (``chaingate dev`` passes one that finds its devnet's own
        https host on loopback); None builds one under ``outbound_policy``."""
        self.settings = settings
        self.impl = impl or select()
        self.store = _open_store(settings)
        # API keys, plans and usage (chaingate.auth), unless a gate is given.
        self.auth: AuthService | None = None
        if gate is None and settings.auth.enabled:
            assert self.store is not None
            self.auth = AuthService(settings, self.store, self.impl)
        self.gate: Gate = gate or (self.auth.gate if self.auth is not None else OpenGate())
        # Each network's proxy, chaingate's own client of it, and its follower.
        self.chain = ChainService(
            settings,
            MethodTable.load(methods_path(settings)),
            self.impl,
            self.gate,
            self.store,
            logs_range_of=self.auth.logs_range_of if self.auth is not None else None,
        )
        # Gas prices, recomputed by each followed network's oracle on every new head.
        self.gas = GasService(self.chain.followers, self.chain.clients, self.chain.networks)
        # Token/NFT data (chaingate.data), fetched through the SSRF-safe outbound fetcher;
        # wallets and sponsorship; the ERC-4337 bundler; signed webhooks.
        self.fetcher = fetcher or Fetcher(outbound_policy or _outbound_policy(settings))
        self.data, self.wallets = self._data_and_wallets()
        self.bundler = self._bundler()
        self.simulation = self._simulation()
        self.webhooks = self._webhooks(webhook_fetcher)
        self.registry = Registry()
        self.front = self._front_door(access_stream)
        self._register_metrics()
        self.chain.witness_heads()
        # Who runs which single writer when several processes share the store.
        writers = (self.data, self.webhooks, self.bundler, self.wallets)
        self.leadership = lead_writers(
            self.store, settings, self.registry, self.chain.followers, writers
        )
        self._shutdown = trio.Event()

    def _data_and_wallets(self) -> tuple[DataPlane | None, WalletService | None]:
        """Token/NFT data and wallets, on every network, when there is a store."""
        if self.store is None:
            return None, None
        chain = self.chain
        data = DataPlane(self.store, chain.followers, chain.clients, chain.networks, self.fetcher)
        wallets = WalletService(
            self.store,
            chain.followers,
            chain.clients,
            chain.networks,
            paymaster_signer(self.settings),
        )
        return data, wallets

    def _bundler(self) -> BundlerService | None:
        if self.store is None or not self.settings.bundler.enabled:
            return None
        chain = self.chain
        return BundlerService(
            self.store, self.settings.bundler, chain.followers, chain.clients, chain.networks
        )

    def _simulation(self) -> SimulationService | None:
        """Transaction simulation: its methods answered on the proxy's own endpoints."""
        if not self.settings.simulation.enabled:
            return None
        simulation = SimulationService(
            self.settings.simulation,
            self.chain.networks,
            {key: client.pool for key, client in self.chain.clients.items()},
            self.data.metadata if self.data is not None else {},
        )
        simulation.register_proxy(self.chain.services)
        return simulation

    def _webhooks(self, webhook_fetcher: Fetcher | None) -> WebhookService | None:
        settings = self.settings
        if self.store is None or not settings.webhooks.enabled:
            return None
        chain = self.chain
        return WebhookService(
            self.store,
            settings.webhooks,
            chain.followers,
            chain.clients,
            chain.networks,
            webhook_fetcher or webhook_delivery_fetcher(self.fetcher.policy, settings.webhooks),
            limits=self.keys.account_limits if self.keys is not None else lambda _a: None,
            metadata=self.data.metadata if self.data is not None else None,
        )

    def _front_door(self, access_stream: IO[bytes] | None) -> FrontDoor:
        keys = self.keys
        return FrontDoor(
            self.settings,
            self.impl,
            self.chain,
            self.gate,
            self.registry,
            self._api_deps(),
            [s for s in (self.wallets, self.bundler, self.simulation) if s is not None],
            limits_of=keys.limits_of if keys is not None else None,
            rest_version=self.data.version if self.data is not None else None,
            access_stream=access_stream,
            health=self.health,
            keys_refresh=keys.refresh if keys is not None else None,
        )

    def _register_metrics(self) -> None:
        register_service_families(self)
        register_edge_families(self)
        parts = (
            self.front.ws,
            self.data,
            self.wallets,
            self.bundler,
            self.webhooks,
            self.simulation,
        )
        for part in parts:
            if part is not None:
                part.register_metrics(self.registry)

    @property
    def keys(self) -> KeyRegistry | None:
        """The key registry (None without API keys, or with a given gate)."""
        return self.auth.keys if self.auth is not None else None

    @property
    def usage_writer(self) -> UsageWriter | None:
        return self.auth.usage_writer if self.auth is not None else None

    @property
    def shared(self) -> SharedLimits | None:
        return self.auth.shared if self.auth is not None else None

    @property
    def port(self) -> int:
        return self.front.edge.port

    def health(self) -> dict[str, Any]:
        # Which process answered (one of `serve --workers N`, or of several machines) and
        # the roles it leads.
        return {**self.chain.health(), "worker": os.getpid(), "leads": self.leadership.leads()}

    def _api_deps(self) -> ApiDeps:
        return ApiDeps(
            health=self.health,
            store=self.store,
            evm_networks={k: n for k, n in self.chain.networks.items() if n.family == "evm"},
            gas_oracles=self.gas.oracles,
            indexes=self.data.readers if self.data is not None else {},
            metadata=self.data.metadata if self.data is not None else {},
            wallets=self.wallets,
            webhooks=self.webhooks,
            simulation=self.simulation,
        )

    def shutdown(self) -> None:
        """Begin a graceful shutdown (idempotent)."""
        self._shutdown.set()

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with contextlib.AsyncExitStack() as stack:
                if self.store is not None:
                    await stack.enter_async_context(self.store)
                    applied = await self.store.migrate()
                    if applied:
                        log.info("store migrated", extra={"fields": {"applied": applied}})
                await self._run(task_status)
        finally:
            self.front.close()

    async def _run(self, task_status: trio.TaskStatus[int]) -> None:
        parts: list[Service | None] = [self.auth, self.chain, self.gas, self.data]
        parts += [self.wallets, self.bundler, self.webhooks, self.simulation]
        services = [part for part in parts if part is not None]
        async with trio.open_nursery() as nursery:
            await nursery.start(self.leadership.run)
            for service in services:  # what serves requests
                await service.run(nursery)
            for service in [s for s in services if s is not self.chain] + [self.chain]:
                await service.run_writers(nursery)  # the followers last: their consumers are up
            port = await self.front.run(nursery)
            fields = {"host": self.settings.server.host, "port": port, "impl": self.impl.name}
            log.info("chaingate listening", extra={"fields": fields})
            # Everything built at start-up lives as long as the process: out of the collector's
            # way, so that a full collection walks only what requests leave behind (it took
            # ~20 ms, a stall for every connection, before).
            # Garbage is collected first: frozen, it would never be.
            gc.collect()
            gc.freeze()
            # Requests in flight are thousands of young containers (calls, flights, their
            # answers), walked by every young collection: one per 700 allocations was ~5% of
            # a distinct batch's CPU (issue 38).  Every 20,000 walks the same live set
            # ~30 times less often; garbage cycles wait at most that many allocations.
            thresholds = gc.get_threshold()
            gc.set_threshold(YOUNG_COLLECTION, *thresholds[1:])
            task_status.started(port)
            try:
                await self._shutdown.wait()
            finally:
                # The collector as it was: a process that goes on (tests, an embedding
                # program) gets back what this gateway held, its store's connections too.
                gc.set_threshold(*thresholds)
                gc.unfreeze()
            log.info("shutting down: draining connections")
            await self.front.shutdown()
            for service in reversed(services):
                service.shutdown()
            nursery.cancel_scope.cancel()


def _open_store(settings: Settings) -> Store | None:
    """The store, when keys or a follower need one."""
    if not (settings.auth.enabled or follows_any(settings)):
        return None
    return open_store(
        settings.store.url,
        Path(settings.data_dir).expanduser(),
        pool_size=settings.store.pool_size,
    )


def _outbound_policy(settings: Settings) -> OutboundPolicy:
    outbound = settings.outbound
    return OutboundPolicy.production(
        allow_private=outbound.allow_private,
        allow_cidrs=outbound.allow_cidrs,
        allowed_ports=outbound.allowed_ports,
    )

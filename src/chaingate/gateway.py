"""The whole chaingate process: one nursery owning every service, one port for every client.

``Gateway.run`` starts, in order: each chain/network's RPC service (its upstream pool), the
REST app's lifespan, the access-log flusher, and the edge listener; it then reports the bound
port and waits for ``shutdown()``.  Shutdown is graceful: the edge stops accepting and drains
(in-flight requests finish, up to ``server.shutdown_grace``), the REST app runs its shutdown
hooks, and only then is everything else cancelled.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
from pathlib import Path
from typing import IO, Any

import trio

from chaingate import __version__
from chaingate.api.app import create_app
from chaingate.api.build import build_api, load_costs
from chaingate.api.deps import ApiDeps
from chaingate.auth.gate import Gate, OpenGate
from chaingate.auth.keygate import KeyGate, KeyRegistry
from chaingate.auth.plans import Plans
from chaingate.auth.shared import SharedLimits
from chaingate.auth.usage import UsageWriter
from chaingate.bundler.service import BundlerService
from chaingate.chain.client import ChainClient
from chaingate.chain.events import ChainEvent
from chaingate.chain.follower import Follower
from chaingate.cluster.leases import Leadership, leadership_for
from chaingate.cluster.metrics import register_leader_metrics
from chaingate.cluster.roles import RoleKey
from chaingate.config import ConfigError, Settings, config_file, methods_path
from chaingate.data.service import DataPlane
from chaingate.edge.asgi import AsgiBridge
from chaingate.edge.lane import build_lane
from chaingate.edge.routes import Routes
from chaingate.edge.server import EdgeServer
from chaingate.gas.oracle import GasOracle
from chaingate.impl import Impl, select
from chaingate.obs.gateway_families import register_edge_families, register_service_families
from chaingate.obs.logs import AccessLog
from chaingate.obs.metrics import Registry
from chaingate.obs.sink import LogSink, stderr_sink
from chaingate.outbound import Fetcher, OutboundPolicy
from chaingate.rpc.local import LocalRpc
from chaingate.rpc.local import load_costs as load_rpc_costs
from chaingate.rpc.methods import MethodTable
from chaingate.rpc.service import RpcService
from chaingate.store import Store, open_store
from chaingate.wallets.service import WalletService
from chaingate.wallets.signer import paymaster_signer
from chaingate.webhooks.service import WebhookService, webhook_delivery_fetcher
from chaingate.ws.endpoint import WsEndpoint

log = logging.getLogger("chaingate")


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
    ) -> None:
        """``outbound_policy``: where chaingate's own HTTP fetches may go; None builds it from
        ``settings.outbound`` (public addresses only unless configured).  ``chaingate dev``
        passes ``OutboundPolicy.dev()``, which adds loopback.  ``webhook_fetcher``: what
        delivers webhooks (tests inject its resolver and connector); None builds one under the
        same policy, with keep-alive connections."""
        self.settings = settings
        self.impl = impl or select()
        self.store: Store | None = None
        self.keys: KeyRegistry | None = None
        self.usage_writer: UsageWriter | None = None
        self.shared: SharedLimits | None = None
        if settings.auth.enabled or _follows_any(settings):
            self.store = open_store(
                settings.store.url,
                Path(settings.data_dir).expanduser(),
                pool_size=settings.store.pool_size,
            )
        if gate is None and settings.auth.enabled:
            gate = self._key_gate(settings)
        self.gate: Gate = gate or OpenGate()
        methods = MethodTable.load(methods_path(settings))
        self.services: dict[str, RpcService] = {}
        for chain, networks in settings.chains.items():
            for network, net in networks.items():
                self.services[f"{chain}/{network}"] = RpcService(
                    chain,
                    network,
                    net,
                    settings.rpc,
                    methods,
                    self.impl,
                    self.gate,
                    logs_range_of=self._logs_range_of if self.keys is not None else None,
                )
        # Chaingate's own calls to each EVM network, and its chain follower.
        self.clients: dict[str, ChainClient] = {}
        self.followers: dict[str, Follower] = {}
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
            if net.follower.enabled and self.store is not None:
                self.followers[key] = Follower(
                    service.chain,
                    service.network,
                    client,
                    self.store,
                    net.follower,
                    finality_depth=net.finality_depth,
                    block_time=net.block_time,
                    ws_urls=[u.ws_url for u in net.upstreams if u.ws_url],
                )
        # Gas prices, recomputed by each followed network's oracle on every new head.
        self.gas_oracles: dict[str, GasOracle] = {}
        self._gas_streams: dict[str, trio.MemoryReceiveChannel[ChainEvent]] = {}
        for key, follower in self.followers.items():
            service = self.services[key]
            self.gas_oracles[key] = GasOracle(
                service.chain, service.network, service.settings, self.clients[key]
            )
            self._gas_streams[key] = follower.subscribe("gas")
        # Token/NFT data of each followed network (chaingate.data): its index, fed by its
        # follower, and its metadata, fetched through the SSRF-safe outbound fetcher.
        self.fetcher = Fetcher(outbound_policy or _outbound_policy(settings))
        self.data: DataPlane | None = None
        if self.store is not None:
            self.data = DataPlane(
                self.store,
                self.followers,
                self.clients,
                {key: service.settings for key, service in self.services.items()},
                self.fetcher,
            )
        # Smart wallets, gas policies and sponsorship (chaingate.wallets).
        self.wallets: WalletService | None = None
        if self.store is not None:
            self.wallets = WalletService(
                self.store,
                self.followers,
                self.clients,
                {key: service.settings for key, service in self.services.items()},
                paymaster_signer(settings),
            )
        # The ERC-4337 bundler (chaingate.bundler): its mempool in the store, its loops in a
        # nursery of its own.
        self.bundler: BundlerService | None = None
        if self.store is not None and settings.bundler.enabled:
            self.bundler = BundlerService(
                self.store,
                settings.bundler,
                self.followers,
                self.clients,
                {key: service.settings for key, service in self.services.items()},
            )
        # Signed webhooks (chaingate.webhooks): matched on the followers, delivered from the
        # outbox through a fetcher of their own (keep-alive connections per receiver).
        self.webhooks: WebhookService | None = None
        if self.store is not None and settings.webhooks.enabled:
            self.webhooks = WebhookService(
                self.store,
                settings.webhooks,
                self.followers,
                self.clients,
                {key: service.settings for key, service in self.services.items()},
                webhook_fetcher or webhook_delivery_fetcher(self.fetcher.policy, settings.webhooks),
                limits=self.keys.account_limits if self.keys is not None else lambda _a: None,
                metadata=self.data.metadata if self.data is not None else None,
            )
        self.registry = Registry()
        self.access_log = AccessLog(
            enabled=settings.observability.access_log,
            sink=_log_sink(access_stream, settings.observability.log_buffer_bytes),
        )
        # A sink of this gateway's own (a given stream) ends with it: its writer thread too.
        self._own_sink = self.access_log.sink if access_stream is not None else None
        # The REST plane: routes priced from config/rest.toml, served by the ASGI app.
        self.rest = build_api(self._api_deps(), load_costs(config_file(settings, "rest.toml")))
        self.asgi = AsgiBridge(create_app(self.rest), (settings.server.host, settings.server.port))
        self.bundlers = self._bundler_endpoints(settings)
        self.routes = Routes(
            self.services,
            self.asgi,
            self.rest,
            self.gate,
            self.registry,
            self.access_log,
            settings.observability.admin_token,
            self.impl.fastlane.RequestIds(os.urandom(4).hex().encode()),
            self.impl.jsonrpc,
            self.bundlers,
        )
        # Cached REST answers die with the data under them: when any index moves.
        if self.data is not None:
            self.routes.rest_cache.version = self.data.version
        # WebSocket subscriptions: upgraded by the edge, fed by each network's follower.
        self.ws = WsEndpoint(
            self.services,
            self.gate,
            self.access_log,
            settings.ws,
            self.keys.limits_of if self.keys is not None else None,
        )
        self.ws.attach(self.followers, self.clients)
        # One budget of answer bytes for every RPC service (rpc/answers.py): batches being
        # assembled that hold all of it make the edge shed new work at the door.
        self.answers = RpcService.share_answers(
            self.services.values(),
            self.impl.fastlane.AnswerBudget(settings.rpc.max_assembling_bytes),
        )
        self.lane = build_lane(self.impl, self.services, self.gate, self.routes, self.access_log)
        self.edge = EdgeServer(
            settings.server,
            self.impl,
            self.routes,
            self.lane,
            self.answers,
            self.ws,
            _reserved_fds(settings),
        )
        # Who writes what when several processes share the store (chaingate.cluster).
        self.leadership: Leadership = leadership_for(
            self.store.backend if self.store is not None else "",
            settings.store.url,
            self._role_keys(),
        )
        register_leader_metrics(self.registry, self.leadership)
        self._shutdown = trio.Event()
        register_service_families(self)
        register_edge_families(self)
        self.ws.register_metrics(self.registry)
        if self.data is not None:
            self.data.register_metrics(self.registry)
        if self.wallets is not None:
            self.wallets.register_metrics(self.registry)
        if self.bundler is not None:
            self.bundler.register_metrics(self.registry)
        if self.webhooks is not None:
            self.webhooks.register_metrics(self.registry)
        # Each follower witnesses its pool's heads (rpc/heads.py).
        for key, follower in self.followers.items():
            self.services[key].pool.witness = follower

    def _role_keys(self) -> list[RoleKey]:
        """The single-writer roles this process runs, per followed chain/network."""
        keys = []
        for key in self.followers:
            chain, network = key.split("/", 1)
            keys.append(RoleKey("follower", chain, network))
            writers = {
                "indexer": self.data is not None and key in self.data.indexers,
                "webhooks": self.webhooks is not None and key in self.webhooks.matchers,
                "bundler": self.bundler is not None and key in self.bundler.networks,
                "wallets": self.wallets is not None and key in self.wallets.trackers,
            }
            keys.extend(RoleKey(role, chain, network) for role, runs in writers.items() if runs)
        return keys

    def _bundler_endpoints(self, settings: Settings) -> dict[str, LocalRpc]:
        """``/v1/bundler/{chain}/{network}`` of each EVM network: JSON-RPC answered in
        process, by the methods each subsystem registers (ERC-7677 from the wallets)."""
        endpoints = {key: LocalRpc(key) for key in self.clients}
        costs = load_rpc_costs(config_file(settings, "bundler.toml"))
        try:
            if self.wallets is not None:
                self.wallets.register_rpc(endpoints, costs)
            if self.bundler is not None:
                self.bundler.register_rpc(endpoints, costs)
        except KeyError as exc:
            raise ConfigError(f"config/bundler.toml does not price {exc.args[0]}") from None
        return endpoints

    def _api_deps(self) -> ApiDeps:
        return ApiDeps(
            health=self.health,
            store=self.store,
            evm_networks={
                key: service.settings
                for key, service in self.services.items()
                if service.settings.family == "evm"
            },
            gas_oracles=self.gas_oracles,
            indexes=self.data.readers if self.data is not None else {},
            metadata=self.data.metadata if self.data is not None else {},
            wallets=self.wallets,
            webhooks=self.webhooks,
        )

    def _logs_range_of(self, principal: Any) -> int:
        """The widest eth_getLogs range a caller's plan allows (0: the network's limit)."""
        assert self.keys is not None
        limits = self.keys.limits_of(principal)
        return limits.logs_max_block_range if limits is not None else 0

    def _key_gate(self, settings: Settings) -> KeyGate:
        if not settings.auth.pepper:
            raise ConfigError(
                "auth.pepper is required when API keys are enabled: set CHAINGATE_AUTH__PEPPER "
                "to a long random secret (it must stay the same, or every key stops working)"
            )
        assert self.store is not None
        plans = Plans.load(config_file(settings, settings.auth.plans_file))
        self.keys = KeyRegistry(self.store, plans, settings.auth.pepper.encode(), self.impl.limiter)
        key_gate = KeyGate(self.keys, self.impl.limiter, self.impl.fastlane)
        self.usage_writer = UsageWriter(self.store, key_gate.meter, self.keys)
        if settings.auth.redis_url:
            self.shared = key_gate.shared = SharedLimits(
                settings.auth.redis_url, self.keys.account_quota
            )
        return key_gate

    @property
    def port(self) -> int:
        return self.edge.port

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
            if self._own_sink is not None:
                self._own_sink.close()

    async def _run(self, task_status: trio.TaskStatus[int]) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.leadership.run)
            if self.keys is not None and self.usage_writer is not None:
                auth = self.settings.auth
                await nursery.start(self.keys.run, auth.refresh_interval)
                nursery.start_soon(self.usage_writer.run, auth.usage_flush_interval)
            if self.shared is not None:
                nursery.start_soon(self.shared.run)
            for service in self.services.values():
                await nursery.start(service.run)
            for key, oracle in self.gas_oracles.items():
                await nursery.start(oracle.run, self._gas_streams[key])
            if self.data is not None:
                await nursery.start(self.data.run)
            if self.wallets is not None:
                await nursery.start(self.wallets.run)
            if self.bundler is not None:
                await nursery.start(self.bundler.run)
            if self.webhooks is not None:
                await nursery.start(self.webhooks.run)
            for follower in self.followers.values():
                await nursery.start(follower.run)
            await nursery.start(self.ws.run)
            await nursery.start(self.asgi.lifespan)
            nursery.start_soon(self.access_log.run)
            edge_done = trio.Event()

            async def serve_edge(task_status: trio.TaskStatus[int]) -> None:
                try:
                    await self.edge.serve(task_status=task_status)
                finally:
                    edge_done.set()

            port = await nursery.start(serve_edge)
            self.asgi.server = (self.settings.server.host, port)
            log.info(
                "chaingate listening",
                extra={
                    "fields": {
                        "host": self.settings.server.host,
                        "port": port,
                        "impl": self.impl.name,
                    }
                },
            )
            # Everything built at start-up lives as long as the process: out of the collector's
            # way, so that a full collection walks only what requests leave behind (it took
            # ~20 ms, a stall for every connection, before).
            gc.freeze()
            task_status.started(port)
            await self._shutdown.wait()
            log.info("shutting down: draining connections")
            self.edge.begin_shutdown()
            with trio.move_on_after(self.settings.server.shutdown_grace):
                await edge_done.wait()
            self.asgi.request_shutdown()
            nursery.cancel_scope.cancel()

    def health(self) -> dict[str, Any]:
        # Never raises, whatever a component holds: one odd value (say a head of 5,000 hex
        # digits) must not turn the health of every network into a 500.
        def number(value: Any) -> int | None:
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
                    "health: network state unreadable", extra={"fields": {"network": key}}
                )
                entry["error"] = "state unreadable"
                up = 0
            healthy = healthy and up > 0
            networks.append(entry)
        return {
            "status": "ok" if healthy else "degraded",
            "version": __version__,
            "networks": networks,
            "worker": os.getpid(),
            "leads": self.leadership.leads(),
        }


def _outbound_policy(settings: Settings) -> OutboundPolicy:
    outbound = settings.outbound
    return OutboundPolicy.production(
        allow_private=outbound.allow_private,
        allow_cidrs=outbound.allow_cidrs,
        allowed_ports=outbound.allowed_ports,
    )


def _log_sink(stream: IO[bytes] | None, max_bytes: int) -> LogSink:
    """The access log's sink: its own on a given stream, else the process's stderr sink."""
    if stream is not None:
        return LogSink(stream, max_bytes)
    sink = stderr_sink()
    sink.max_bytes = max_bytes
    return sink


def _reserved_fds(settings: Settings) -> int:
    """Descriptors the edge must leave for chaingate's own connections."""
    upstream = sum(
        u.max_connections + (1 if u.ws_url else 0)
        for networks in settings.chains.values()
        for net in networks.values()
        for u in net.upstreams
    )
    return upstream + settings.store.pool_size + 8  # + Redis and the store's files


def _follows_any(settings: Settings) -> bool:
    return any(
        net.family == "evm" and net.follower.enabled
        for networks in settings.chains.values()
        for net in networks.values()
    )

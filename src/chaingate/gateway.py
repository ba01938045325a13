"""The whole chaingate process: one nursery owning every service, one port for every client.

``Gateway.run`` starts, in order: each chain/network's RPC service (its upstream pool), the
REST app's lifespan, the access-log flusher, and the edge listener; it then reports the bound
port and waits for ``shutdown()``.  Shutdown is graceful: the edge stops accepting and drains
(in-flight requests finish, up to ``server.shutdown_grace``), the REST app runs its shutdown
hooks, and only then is everything else cancelled.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
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
from chaingate.chain.client import ChainClient
from chaingate.chain.events import ChainEvent
from chaingate.chain.follower import Follower
from chaingate.config import ConfigError, Settings, config_file, methods_path
from chaingate.edge.asgi import AsgiBridge
from chaingate.edge.routes import Routes
from chaingate.edge.server import EdgeServer
from chaingate.gas.oracle import GasOracle
from chaingate.impl import Impl, select
from chaingate.obs.logs import AccessLog
from chaingate.obs.metrics import Registry, Sample
from chaingate.obs.sink import LogSink, stderr_sink
from chaingate.rpc.methods import MethodTable
from chaingate.rpc.service import RpcService
from chaingate.store import Store, open_store
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
    ) -> None:
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
                    chain, network, net, settings.rpc, methods, self.impl, self.gate
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
        self.registry = Registry()
        self.access_log = AccessLog(
            enabled=settings.observability.access_log,
            sink=_log_sink(access_stream, settings.observability.log_buffer_bytes),
        )
        # The REST plane: routes priced from config/rest.toml, served by the ASGI app.
        self.rest = build_api(self._api_deps(), load_costs(config_file(settings, "rest.toml")))
        self.asgi = AsgiBridge(create_app(self.rest), (settings.server.host, settings.server.port))
        self.routes = Routes(
            self.services,
            self.asgi,
            self.rest,
            self.gate,
            self.registry,
            self.access_log,
            settings.observability.admin_token,
        )
        # WebSocket subscriptions: upgraded by the edge, fed by each network's follower.
        self.ws = WsEndpoint(
            self.services,
            self.gate,
            self.access_log,
            settings.ws,
            self.keys.limits_of if self.keys is not None else None,
        )
        self.ws.attach(self.followers, self.clients)
        self.edge = EdgeServer(
            settings.server,
            self.impl,
            self.routes,
            self.ws,
            _reserved_fds(settings),
            # Batches being assembled hold their whole budget: shed new work at the door.
            overloaded=lambda: self.answers.exhausted,
        )
        self._shutdown = trio.Event()
        self._register_metrics()
        self._register_edge_metrics()
        self.ws.register_metrics(self.registry)
        # One budget of answer bytes for every RPC service; each follower witnesses its pool's
        # heads (rpc/answers.py, rpc/heads.py).
        self.answers = RpcService.share_answers(
            self.services.values(), settings.rpc.max_assembling_bytes
        )
        for key, follower in self.followers.items():
            self.services[key].pool.witness = follower

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
        )

    def _key_gate(self, settings: Settings) -> KeyGate:
        if not settings.auth.pepper:
            raise ConfigError(
                "auth.pepper is required when API keys are enabled: set CHAINGATE_AUTH__PEPPER "
                "to a long random secret (it must stay the same, or every key stops working)"
            )
        assert self.store is not None
        plans = Plans.load(config_file(settings, settings.auth.plans_file))
        self.keys = KeyRegistry(self.store, plans, settings.auth.pepper.encode(), self.impl.limiter)
        key_gate = KeyGate(self.keys, self.impl.limiter)
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
        async with contextlib.AsyncExitStack() as stack:
            if self.store is not None:
                await stack.enter_async_context(self.store)
                applied = await self.store.migrate()
                if applied:
                    log.info("store migrated", extra={"fields": {"applied": applied}})
            await self._run(task_status)

    async def _run(self, task_status: trio.TaskStatus[int]) -> None:
        async with trio.open_nursery() as nursery:
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
                    head = follower.head
                    entry["follower"] = {
                        "block": number(head.number) if head is not None else None,
                        "finalized": number(follower.finalized),
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
        }

    def _register_edge_metrics(self) -> None:
        registry = self.registry
        edge = self.edge
        sink = self.access_log.sink
        registry.family(
            "chaingate_connections_max",
            "gauge",
            "Client connections allowed (derived from the file-descriptor limit), in all and "
            "per client address.",
            lambda: [
                ({"scope": "total"}, edge.limits.max_connections),
                ({"scope": "per_ip"}, edge.limits.max_per_ip),
            ],
        )
        registry.family(
            "chaingate_connections_refused_total",
            "counter",
            "New connections refused with 503 at a connection cap, by cap.",
            lambda: (({"cap": cap}, n) for cap, n in sorted(edge.refused.items())),
        )
        registry.family(
            "chaingate_connections_evicted_total",
            "counter",
            "Idle connections closed to make room for a new one at a cap.",
            lambda: [({}, edge.evicted)],
        )
        registry.family(
            "chaingate_accept_errors_total",
            "counter",
            "Failed accept() calls (out of file descriptors, ...).",
            lambda: [({}, edge.accept_errors)],
        )
        registry.family(
            "chaingate_unsent_bytes",
            "gauge",
            "Answer bytes waiting for slow clients to read them, all connections together.",
            lambda: [({}, edge.unsent_bytes)],
        )
        registry.family(
            "chaingate_overload_refusals_total",
            "counter",
            "Requests answered 503 because too many answer bytes were waiting for clients.",
            lambda: [({}, edge.overloaded)],
        )

        def log_sinks() -> list[LogSink]:
            sinks = [sink]
            if stderr_sink() is not sink:
                sinks.append(stderr_sink())
            return sinks

        registry.family(
            "chaingate_log_dropped_lines_total",
            "counter",
            "Log lines dropped because the log stream did not keep up (its buffer was full).",
            lambda: [({}, sum(s.dropped_lines for s in log_sinks()))],
        )
        registry.family(
            "chaingate_log_buffered_bytes",
            "gauge",
            "Log bytes waiting to be written.",
            lambda: [({}, sum(s.held for s in log_sinks()))],
        )

    def _register_metrics(self) -> None:
        registry = self.registry
        services = self.services
        routes = self.routes
        edge = self.edge

        def per_service(
            read: Any,
        ) -> Any:
            def collect() -> Iterable[Sample]:
                for service in services.values():
                    base = {"chain": service.chain, "network": service.network}
                    yield from read(service, base)

            return collect

        registry.family(
            "chaingate_http_requests_total",
            "counter",
            "HTTP requests answered, by route and status.",
            lambda: (
                ({"route": r, "status": str(s)}, n) for (r, s), n in sorted(routes.requests.items())
            ),
        )
        registry.family(
            "chaingate_http_framing_errors_total",
            "counter",
            "Requests refused by the HTTP parser, by status.",
            lambda: (({"status": str(s)}, n) for s, n in sorted(edge.framing_errors.items())),
        )
        registry.family(
            "chaingate_connections_open",
            "gauge",
            "Client connections currently open.",
            lambda: [({}, edge.open_connections)],
        )
        registry.family(
            "chaingate_rpc_calls_total",
            "counter",
            "JSON-RPC calls (batch items count one each), by method and outcome.",
            per_service(
                lambda s, base: (
                    ({**base, "method": m, "outcome": o}, n)
                    for (m, o), n in sorted(s.calls.items())
                )
            ),
        )
        registry.family(
            "chaingate_rpc_cache_hits_total",
            "counter",
            "Calls answered from the response cache, by method.",
            per_service(
                lambda s, base: (
                    ({**base, "method": m}, n) for m, n in sorted(s.cache_hits.items())
                )
            ),
        )
        registry.family(
            "chaingate_rpc_cache_lookups_total",
            "counter",
            "Cache lookups of cacheable calls, by result.",
            per_service(
                lambda s, base: [
                    ({**base, "result": "hit"}, s.cache.hits),
                    ({**base, "result": "miss"}, s.cache.misses),
                ]
            ),
        )
        registry.family(
            "chaingate_rpc_cache_entries",
            "gauge",
            "Entries in the response cache.",
            per_service(lambda s, base: [(base, len(s.cache))]),
        )
        registry.family(
            "chaingate_rpc_cache_bytes",
            "gauge",
            "Approximate bytes held by the response cache.",
            per_service(lambda s, base: [(base, s.cache.bytes)]),
        )
        registry.family(
            "chaingate_rpc_coalesced_total",
            "counter",
            "Calls answered by joining an identical call already in flight.",
            per_service(lambda s, base: [(base, s.coalesced)]),
        )

        def upstreams(read: Any) -> Any:
            def collect(service: RpcService, base: dict[str, str]) -> Iterable[Sample]:
                for upstream in service.pool.upstreams:
                    yield from read(upstream, {**base, "upstream": upstream.name})

            return per_service(collect)

        registry.family(
            "chaingate_upstream_up",
            "gauge",
            "1 when the upstream is in rotation, 0 when it is out.",
            upstreams(lambda u, labels: [(labels, 0 if u.health.state_down else 1)]),
        )
        registry.family(
            "chaingate_upstream_latency_seconds",
            "gauge",
            "Moving average of the upstream's answer latency.",
            upstreams(lambda u, labels: [(labels, round(u.health.latency, 6))]),
        )
        registry.family(
            "chaingate_upstream_head_lag_blocks",
            "gauge",
            "How far the upstream's head is behind the agreed head (outliers excluded).",
            upstreams(lambda u, labels: [(labels, u.health.lag)]),
        )
        registry.family(
            "chaingate_upstream_requests_total",
            "counter",
            "Requests sent to the upstream (a batch counts once).",
            upstreams(lambda u, labels: [(labels, u.health.requests)]),
        )
        registry.family(
            "chaingate_upstream_errors_total",
            "counter",
            "Failed upstream requests, by kind.",
            upstreams(
                lambda u, labels: (
                    ({**labels, "kind": k}, n) for k, n in sorted(u.health.errors.items())
                )
            ),
        )
        registry.family(
            "chaingate_upstream_connections",
            "gauge",
            "Open connections to the upstream.",
            upstreams(lambda u, labels: [(labels, len(u.connections))]),
        )
        registry.family(
            "chaingate_upstream_head_block",
            "gauge",
            "The head the upstream last reported to a probe (even when judged an outlier).",
            upstreams(lambda u, labels: [] if u.health.head is None else [(labels, u.health.head)]),
        )
        registry.family(
            "chaingate_rpc_head_block",
            "gauge",
            "The agreed head of the network (reached by two sources, or plausible in time); "
            "finality is decided from it.",
            per_service(lambda s, base: [] if s.pool.head is None else [(base, s.pool.head)]),
        )
        registry.family(
            "chaingate_rpc_answer_refusals_total",
            "counter",
            "Calls answered -32005 by an answer limit: answer_too_large (rpc.max_answer_bytes) "
            "or overloaded (rpc.max_assembling_bytes).",
            per_service(
                lambda s, base: (
                    ({**base, "reason": reason}, n) for reason, n in sorted(s.refused.items())
                )
            ),
        )
        registry.family(
            "chaingate_rpc_assembling_bytes",
            "gauge",
            "Reply bytes of batch answers being assembled, all networks together.",
            lambda: [({}, self.answers.held)],
        )
        followers = self.followers

        def per_follower(read: Any) -> Any:
            def collect() -> Iterable[Sample]:
                for follower in followers.values():
                    base = {"chain": follower.chain, "network": follower.network}
                    yield from read(follower, base)

            return collect

        registry.family(
            "chaingate_follower_block",
            "gauge",
            "Number of the newest block the chain follower has applied.",
            per_follower(lambda f, base: [(base, f.head.number if f.head else -1)]),
        )
        registry.family(
            "chaingate_follower_finalized_block",
            "gauge",
            "Newest block the chain follower has announced as finalized.",
            per_follower(lambda f, base: [(base, f.finalized)]),
        )
        registry.family(
            "chaingate_follower_events_total",
            "counter",
            "Chain follower activity: blocks applied/reverted, logs, reorgs, errors, range splits.",
            per_follower(
                lambda f, base: (({**base, "kind": kind}, n) for kind, n in sorted(f.stats.items()))
            ),
        )
        oracles = self.gas_oracles
        registry.family(
            "chaingate_gas_updates_total",
            "counter",
            "Gas price estimates recomputed (one per new head at most).",
            lambda: (
                ({"chain": o.chain, "network": o.network}, o.updates) for o in oracles.values()
            ),
        )
        registry.family(
            "chaingate_gas_failures_total",
            "counter",
            "Gas price refreshes that failed (the previous estimate stays served), by reason.",
            lambda: (
                ({"chain": o.chain, "network": o.network, "reason": reason}, n)
                for o in oracles.values()
                for reason, n in sorted(o.failures.items())
            ),
        )
        gate = self.gate
        if isinstance(gate, KeyGate):
            registry.family(
                "chaingate_auth_refusals_total",
                "counter",
                "Requests refused by the gate, by status and reason.",
                lambda: (
                    ({"status": str(status), "reason": reason}, n)
                    for (status, reason), n in sorted(gate.refusals.items())
                ),
            )
        shared = self.shared
        if shared is not None:
            registry.family(
                "chaingate_shared_limits_up",
                "gauge",
                "1 while rate limits are shared through Redis; 0: each process alone (fail-open).",
                lambda: [({}, 1 if shared.up else 0)],
            )
            registry.family(
                "chaingate_shared_limits_sync_failures_total",
                "counter",
                "Failed synchronisations with Redis.",
                lambda: [({}, shared.failures)],
            )
        registry.histogram(
            "chaingate_request_duration_seconds",
            "Time from a complete request to its response, by route.",
            routes.latency,
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

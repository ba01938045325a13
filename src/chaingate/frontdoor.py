"""The front door: the one port every client comes through, and what answers it.

``FrontDoor`` builds the REST plane (priced from config/rest.toml, served by the ASGI app),
the in-process JSON-RPC endpoints of ``/v1/bundler/...``, the routes, the WebSocket endpoint,
the hot lane and the edge listener, with the access log they all write.  ``run`` starts them
and returns the bound port; ``shutdown`` drains: the edge stops accepting, requests in flight
finish (up to ``server.shutdown_grace``), and the REST app runs its shutdown hooks.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import IO, Any, Protocol

import trio

from chaingate.api.app import create_app
from chaingate.api.build import build_api, load_costs
from chaingate.api.deps import ApiDeps
from chaingate.auth.gate import Gate
from chaingate.chain.service import ChainService
from chaingate.config import ConfigError, Settings, config_file
from chaingate.config.network import Network
from chaingate.dashboard.build import install_dashboard
from chaingate.edge.asgi import AsgiBridge
from chaingate.edge.lane import build_lane
from chaingate.edge.routes import Routes
from chaingate.edge.server import EdgeServer
from chaingate.obs.logs import AccessLog
from chaingate.obs.metrics import Registry
from chaingate.obs.sink import LogSink, stderr_sink
from chaingate.rpc.local import LocalRpc
from chaingate.rpc.local import load_costs as load_rpc_costs
from chaingate.rpc.service import RpcService
from chaingate.twins import Impl
from chaingate.ws.endpoint import WsEndpoint


class RpcMethods(Protocol):
    """A subsystem answering JSON-RPC methods on ``/v1/bundler/{chain}/{network}``."""

    def register_rpc(
        self, endpoints: Mapping[Network, LocalRpc], costs: dict[str, int]
    ) -> None: ...


class FrontDoor:
    def __init__(
        self,
        settings: Settings,
        impl: Impl,
        chain: ChainService,
        gate: Gate,
        registry: Registry,
        api: ApiDeps,
        rpc_methods: Sequence[RpcMethods],
        *,
        limits_of: Callable[[Any], Any] | None,
        rest_version: Callable[[], tuple[int, ...]] | None,
        access_stream: IO[bytes] | None,
        health: Callable[[], dict[str, Any]],
        keys_refresh: Callable[[], Awaitable[None]] | None,
    ) -> None:
        self.settings = settings
        self.access_log = AccessLog(
            enabled=settings.observability.access_log,
            sink=_log_sink(access_stream, settings.observability.log_buffer_bytes),
        )
        # A sink of this gateway's own (a given stream) ends with it: its writer thread too.
        self._own_sink = self.access_log.sink if access_stream is not None else None
        self.rest = build_api(api, load_costs(config_file(settings, "rest.toml")))
        app = create_app(self.rest)
        self.asgi = AsgiBridge(app, (settings.server.host, settings.server.port))
        self.bundlers = _rpc_endpoints(settings, chain, rpc_methods)
        self.routes = Routes(
            chain.services,
            self.asgi,
            self.rest,
            gate,
            registry,
            self.access_log,
            settings.observability.admin_token,
            impl.fastlane.RequestIds(os.urandom(4).hex().encode()),
            impl.jsonrpc,
            impl.fastlane,
            self.bundlers,
        )
        # The dashboard (/dashboard/) on the same app; its tasks (latency sampler, shared
        # sign-in throttle) run with the rest.
        self.dashboard_tasks = install_dashboard(
            app,
            settings,
            store=api.store,
            rest=self.rest,
            api=api,
            health=health,
            services=chain.services,
            bundlers=self.bundlers,
            keys_refresh=keys_refresh,
            route_latency=self.routes.route_latency,
        )
        # Cached REST answers die with the data under them: when any index moves.
        if rest_version is not None:
            self.routes.rest_cache.version = rest_version
        # WebSocket subscriptions: upgraded by the edge, fed by each network's follower.
        self.ws = WsEndpoint(chain.services, gate, self.access_log, settings.ws, limits_of)
        self.ws.attach(chain.followers, chain.clients)
        # One budget of answer bytes for every RPC service (rpc/answers.py): batches being
        # assembled that hold all of it make the edge shed new work at the door.
        self.answers = RpcService.share_answers(
            chain.services.values(),
            impl.fastlane.AnswerBudget(settings.rpc.max_assembling_bytes),
        )
        self.lane = build_lane(impl, chain.services, gate, self.routes)
        self.edge = EdgeServer(
            settings.server,
            impl,
            self.routes,
            self.lane,
            self.answers,
            self.ws,
            _reserved_fds(settings),
        )
        self._edge_done = trio.Event()

    async def run(self, nursery: trio.Nursery) -> int:
        """Start the WebSocket endpoint, the REST app, the access log and the listener;
        return the bound port."""
        await nursery.start(self.ws.run)
        await nursery.start(self.asgi.lifespan)
        nursery.start_soon(self.access_log.run)
        if self.dashboard_tasks is not None:
            interval = self.settings.dashboard.latency_sample_seconds
            nursery.start_soon(self.dashboard_tasks.run, interval)
        port: int = await nursery.start(self._serve_edge)
        self.asgi.server = (self.settings.server.host, port)
        return port

    async def _serve_edge(self, task_status: trio.TaskStatus[int]) -> None:
        try:
            await self.edge.serve(task_status=task_status)
        finally:
            self._edge_done.set()

    async def shutdown(self) -> None:
        """Drain: stop accepting, let requests in flight finish, then stop the REST app."""
        self.edge.begin_shutdown()
        with trio.move_on_after(self.settings.server.shutdown_grace):
            await self._edge_done.wait()
        self.asgi.request_shutdown()

    def close(self) -> None:
        """Close what outlives ``run``: a sink of the gateway's own."""
        if self._own_sink is not None:
            self._own_sink.close()


def _rpc_endpoints(
    settings: Settings, chain: ChainService, subsystems: Sequence[RpcMethods]
) -> dict[Network, LocalRpc]:
    """``/v1/bundler/{chain}/{network}`` of each EVM network: JSON-RPC answered in
    process, by the methods each subsystem registers (ERC-7677 from the wallets)."""
    endpoints = {key: LocalRpc(str(key)) for key in chain.clients}
    costs = load_rpc_costs(config_file(settings, "bundler.toml"))
    try:
        for subsystem in subsystems:
            subsystem.register_rpc(endpoints, costs)
    except KeyError as exc:
        raise ConfigError(f"config/bundler.toml does not price {exc.args[0]}") from None
    return endpoints


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

"""The gateway's own families in ``/metrics``: what its edge, RPC services, followers, gas
oracles and key gate count in plain attributes, read when ``/metrics`` is rendered.  (Each
subsystem with families of its own registers them itself: ``WsEndpoint.register_metrics``,
``DataPlane.register_metrics``.)"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from chaingate.auth.gate import Gate
from chaingate.auth.keygate import KeyGate
from chaingate.auth.shared import SharedLimits
from chaingate.chain.follower import Follower
from chaingate.config.network import Network
from chaingate.edge.routes import Routes
from chaingate.edge.server import EdgeServer
from chaingate.gas.oracle import GasOracle
from chaingate.obs.logs import AccessLog
from chaingate.obs.metrics import Registry, Sample
from chaingate.obs.sink import LogSink, stderr_sink
from chaingate.rpc.pool import Upstream
from chaingate.rpc.service import RpcService
from chaingate.twintypes.fastlane import AnswerBudget


class Front(Protocol):
    """The parts of the front door these families read (``chaingate.frontdoor.FrontDoor``)."""

    @property
    def edge(self) -> EdgeServer: ...
    @property
    def access_log(self) -> AccessLog: ...
    @property
    def routes(self) -> Routes: ...
    @property
    def answers(self) -> AnswerBudget: ...


class Chain(Protocol):
    """The chain's parts these families read (``chaingate.chain.service.ChainService``)."""

    @property
    def services(self) -> Mapping[Network, RpcService]: ...
    @property
    def followers(self) -> Mapping[Network, Follower]: ...


class Gas(Protocol):
    """The gas oracles (``chaingate.gas.service.GasService``)."""

    @property
    def oracles(self) -> Mapping[Network, GasOracle]: ...


class Gateway(Protocol):
    """The parts of the gateway these families read (``chaingate.gateway.Gateway``)."""

    @property
    def registry(self) -> Registry: ...
    @property
    def front(self) -> Front: ...
    @property
    def chain(self) -> Chain: ...
    @property
    def gas(self) -> Gas: ...
    @property
    def gate(self) -> Gate: ...
    @property
    def shared(self) -> SharedLimits | None: ...


def register_edge_families(gateway: Gateway) -> None:
    """Connections, overload, the REST cache and the log sinks."""
    registry = gateway.registry
    edge = gateway.front.edge
    sink = gateway.front.access_log.sink
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

    cache = gateway.front.routes.rest_cache
    registry.family(
        "chaingate_rest_cache_lookups_total",
        "counter",
        "Lookups of cacheable REST answers (served again for up to a second), by result.",
        lambda: [({"result": "hit"}, cache.hits), ({"result": "miss"}, cache.misses)],
    )
    registry.family(
        "chaingate_rest_cache_bytes",
        "gauge",
        "Bytes held by the REST answer cache.",
        lambda: [({}, cache.size)],
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


def register_service_families(gateway: Gateway) -> None:
    """Requests, upstreams, followers, gas oracles, the key gate and shared limits."""
    registry, services = gateway.registry, gateway.chain.services
    front = gateway.front
    _register_http_families(registry, front.routes, front.edge)
    _register_rpc_families(registry, services)
    _register_rpc_routing_families(registry, services)
    _register_upstream_families(registry, services)
    _register_answer_families(registry, services, front.answers)
    _register_follower_families(registry, gateway.chain.followers)
    _register_gas_families(registry, gateway.gas.oracles)
    _register_gate_families(registry, gateway.gate, gateway.shared)
    registry.histogram(
        "chaingate_request_duration_seconds",
        "Time from a complete request to its response, by route.",
        front.routes.latency,
    )


def _per_service(
    services: Mapping[Network, RpcService],
    read: Callable[[RpcService, dict[str, str]], Iterable[Sample]],
) -> Callable[[], Iterable[Sample]]:
    """A family's collector over every network's proxy, labelled by chain and network."""

    def collect() -> Iterable[Sample]:
        for service in services.values():
            base = {"chain": service.chain, "network": service.network}
            yield from read(service, base)

    return collect


def _per_upstream(
    services: Mapping[Network, RpcService],
    read: Callable[[Upstream, dict[str, str]], Iterable[Sample]],
) -> Callable[[], Iterable[Sample]]:
    """A family's collector over every upstream of every network, labelled by its name too."""

    def collect(service: RpcService, base: dict[str, str]) -> Iterable[Sample]:
        for upstream in service.pool.upstreams:
            yield from read(upstream, {**base, "upstream": upstream.name})

    return _per_service(services, collect)


def _per_follower(
    followers: Mapping[Network, Follower],
    read: Callable[[Follower, dict[str, str]], Iterable[Sample]],
) -> Callable[[], Iterable[Sample]]:
    """A family's collector over every network's chain follower."""

    def collect() -> Iterable[Sample]:
        for follower in followers.values():
            base = {"chain": follower.chain, "network": follower.network}
            yield from read(follower, base)

    return collect


def _register_http_families(registry: Registry, routes: Routes, edge: EdgeServer) -> None:
    """Requests by route and status, framing refusals, open connections."""
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


def _register_rpc_families(registry: Registry, services: Mapping[Network, RpcService]) -> None:
    """The proxies' calls, response cache and coalescing."""
    registry.family(
        "chaingate_rpc_calls_total",
        "counter",
        "JSON-RPC calls (batch items count one each), by method and outcome.",
        _per_service(
            services,
            lambda s, base: (
                ({**base, "method": m, "outcome": o}, n) for (m, o), n in sorted(s.calls.items())
            ),
        ),
    )
    registry.family(
        "chaingate_rpc_cache_hits_total",
        "counter",
        "Calls answered from the response cache, by method.",
        _per_service(
            services,
            lambda s, base: (({**base, "method": m}, n) for m, n in sorted(s.cache_hits.items())),
        ),
    )
    registry.family(
        "chaingate_rpc_cache_lookups_total",
        "counter",
        "Cache lookups of cacheable calls, by result.",
        _per_service(
            services,
            lambda s, base: [
                ({**base, "result": "hit"}, s.cache.hits),
                ({**base, "result": "miss"}, s.cache.misses),
            ],
        ),
    )
    registry.family(
        "chaingate_rpc_cache_entries",
        "gauge",
        "Entries in the response cache.",
        _per_service(services, lambda s, base: [(base, len(s.cache))]),
    )
    registry.family(
        "chaingate_rpc_cache_bytes",
        "gauge",
        "Approximate bytes held by the response cache.",
        _per_service(services, lambda s, base: [(base, s.cache.bytes)]),
    )
    registry.family(
        "chaingate_rpc_coalesced_total",
        "counter",
        "Calls answered by joining an identical call already in flight.",
        _per_service(services, lambda s, base: [(base, s.coalesced)]),
    )


def _register_rpc_routing_families(
    registry: Registry, services: Mapping[Network, RpcService]
) -> None:
    """Hedged reads, eth_getLogs ranges and read-your-writes (rpc/hedging.py, logranges.py,
    stickiness.py)."""
    registry.family(
        "chaingate_rpc_hedges_sent_total",
        "counter",
        "Hedged requests: a second upstream asked because the first had not answered within "
        "its recent p95 (networks with hedging on).",
        _per_service(
            services, lambda s, base: [] if s.pool.hedger is None else [(base, s.pool.hedger.sent)]
        ),
    )
    registry.family(
        "chaingate_rpc_hedges_won_total",
        "counter",
        "Hedged requests whose second upstream answered first.",
        _per_service(
            services, lambda s, base: [] if s.pool.hedger is None else [(base, s.pool.hedger.won)]
        ),
    )
    registry.family(
        "chaingate_rpc_hedgeable_total",
        "counter",
        "Retry-safe requests that could be hedged (the budget is a share of these).",
        _per_service(
            services, lambda s, base: [] if s.pool.hedger is None else [(base, s.pool.hedger.calls)]
        ),
    )
    registry.family(
        "chaingate_rpc_getlogs_split_total",
        "counter",
        "eth_getLogs calls wider than logs.upstream_block_range, answered by splitting.",
        _per_service(
            services, lambda s, base: [] if s.logs is None else [(base, s.logs.split_requests)]
        ),
    )
    registry.family(
        "chaingate_rpc_getlogs_range_refusals_total",
        "counter",
        "eth_getLogs calls refused for a block range over the network's or plan's limit.",
        _per_service(services, lambda s, base: [] if s.logs is None else [(base, s.logs.refused)]),
    )
    registry.family(
        "chaingate_rpc_read_your_writes_routed_total",
        "counter",
        "Reads sent first to the upstream that took their sender's or transaction's write.",
        _per_service(
            services, lambda s, base: [] if s.sticky is None else [(base, s.sticky.routed)]
        ),
    )


def _register_upstream_families(registry: Registry, services: Mapping[Network, RpcService]) -> None:
    """Each upstream's health, latency, head, requests, errors and connections."""
    registry.family(
        "chaingate_upstream_up",
        "gauge",
        "1 when the upstream is in rotation, 0 when it is out.",
        _per_upstream(services, lambda u, labels: [(labels, 0 if u.health.state_down else 1)]),
    )
    registry.family(
        "chaingate_upstream_latency_seconds",
        "gauge",
        "Moving average of the upstream's answer latency.",
        _per_upstream(services, lambda u, labels: [(labels, round(u.health.latency, 6))]),
    )
    registry.family(
        "chaingate_upstream_head_lag_blocks",
        "gauge",
        "How far the upstream's head is behind the agreed head (outliers excluded).",
        _per_upstream(services, lambda u, labels: [(labels, u.health.lag)]),
    )
    registry.family(
        "chaingate_upstream_requests_total",
        "counter",
        "Requests sent to the upstream (a batch counts once).",
        _per_upstream(services, lambda u, labels: [(labels, u.health.requests)]),
    )
    registry.family(
        "chaingate_upstream_errors_total",
        "counter",
        "Failed upstream requests, by kind.",
        _per_upstream(
            services,
            lambda u, labels: (
                ({**labels, "kind": k}, n) for k, n in sorted(u.health.errors.items())
            ),
        ),
    )
    registry.family(
        "chaingate_upstream_connections",
        "gauge",
        "Open connections to the upstream.",
        _per_upstream(services, lambda u, labels: [(labels, len(u.connections))]),
    )
    registry.family(
        "chaingate_upstream_http2_connections",
        "gauge",
        "Open connections to the upstream that speak HTTP/2 (chosen by ALPN).",
        _per_upstream(
            services, lambda u, labels: [(labels, sum(1 for c in u.connections if c.multiplexed))]
        ),
    )
    registry.family(
        "chaingate_upstream_head_block",
        "gauge",
        "The head the upstream last reported to a probe (even when judged an outlier).",
        _per_upstream(
            services, lambda u, labels: [] if u.health.head is None else [(labels, u.health.head)]
        ),
    )


def _register_answer_families(
    registry: Registry, services: Mapping[Network, RpcService], answers: AnswerBudget
) -> None:
    """The agreed head of each network, and the answer limits' refusals and held bytes."""
    registry.family(
        "chaingate_rpc_head_block",
        "gauge",
        "The agreed head of the network (reached by two sources, or plausible in time); "
        "finality is decided from it.",
        _per_service(
            services, lambda s, base: [] if s.pool.head is None else [(base, s.pool.head)]
        ),
    )
    registry.family(
        "chaingate_rpc_answer_refusals_total",
        "counter",
        "Calls answered -32005 by an answer limit: answer_too_large (rpc.max_answer_bytes) "
        "or overloaded (rpc.max_assembling_bytes).",
        _per_service(
            services,
            lambda s, base: (
                ({**base, "reason": reason}, n) for reason, n in sorted(s.refused.items())
            ),
        ),
    )
    registry.family(
        "chaingate_rpc_assembling_bytes",
        "gauge",
        "Reply bytes of batch answers being assembled, all networks together.",
        lambda: [({}, answers.held)],
    )


def _register_follower_families(registry: Registry, followers: Mapping[Network, Follower]) -> None:
    """Each chain follower's head, finalized block and activity."""
    registry.family(
        "chaingate_follower_block",
        "gauge",
        "Number of the newest block the chain follower has applied.",
        _per_follower(followers, lambda f, base: [(base, f.head.number if f.head else -1)]),
    )
    registry.family(
        "chaingate_follower_finalized_block",
        "gauge",
        "Newest block the chain follower has announced as finalized.",
        _per_follower(followers, lambda f, base: [(base, f.finalized)]),
    )
    registry.family(
        "chaingate_follower_events_total",
        "counter",
        "Chain follower activity: blocks applied/reverted, logs, reorgs, errors, range splits.",
        _per_follower(
            followers,
            lambda f, base: (({**base, "kind": kind}, n) for kind, n in sorted(f.stats.items())),
        ),
    )


def _register_gas_families(registry: Registry, oracles: Mapping[Network, GasOracle]) -> None:
    """Each gas oracle's updates and failed refreshes."""
    registry.family(
        "chaingate_gas_updates_total",
        "counter",
        "Gas price estimates recomputed (one per new head at most).",
        lambda: (({"chain": o.chain, "network": o.network}, o.updates) for o in oracles.values()),
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


def _register_gate_families(registry: Registry, gate: Gate, shared: SharedLimits | None) -> None:
    """The key gate's refusals, and whether rate limits are shared through Redis."""
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

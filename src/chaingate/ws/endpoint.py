"""``GET /v1/ws/{chain}/{network}?apiKey=…``: the upgrade, the sessions, the hubs, the sweeper.

The edge hands every request carrying ``Upgrade:`` to ``handshake``; for a WebSocket path it
answers with a refusal (the spec's error envelope: 401 bad or missing key, 403 test key on a
mainnet or no ``rpc:read`` scope, 429 too many connections for the key's plan, 404/405/400/
426 for the HTTP-level problems) or with the ``101`` and a ticket, and the edge then runs
``serve`` on the socket, outside its HTTP timeouts.

One sweeper task looks at every session a few times a second: a revoked key's socket is
closed (1008), silent clients are pinged and dropped when no pong comes, stuck writers and
closing handshakes that overstay are aborted, and pushed compute units are charged.
``begin_shutdown`` closes every session with 1001.
"""

from __future__ import annotations

import logging
import os
import socket
from collections import Counter
from collections.abc import Callable, Iterable
from time import monotonic, perf_counter, time
from typing import Any

import trio

from chaingate.auth.gate import Credentials, Gate, Principal, Rejection
from chaingate.auth.plans import Limits
from chaingate.chain.client import ChainClient
from chaingate.chain.events import ChainEvent
from chaingate.config import WebSocketSettings
from chaingate.config.network import Network
from chaingate.edge.responses import JSON
from chaingate.envelope import error_body
from chaingate.obs.logs import AccessEntry, AccessLog
from chaingate.obs.metrics import Registry, Sample
from chaingate.rpc.service import RpcService
from chaingate.twintypes.http1 import Request
from chaingate.ws.caps import KeyBudgets, WsCaps, caps_for
from chaingate.ws.deflate import Negotiated
from chaingate.ws.deflate import negotiate as negotiate_deflate
from chaingate.ws.handshake import (
    HandshakeError,
    query_api_key,
    query_value,
    switching_protocols,
    websocket_key,
)
from chaingate.ws.hub import Hub
from chaingate.ws.registry import KINDS
from chaingate.ws.session import Session
from chaingate.ws.solana_hub import PubSubUrl, SolanaHub

log = logging.getLogger("chaingate.ws")

WS_PREFIX = b"/v1/ws/"
SWEEP_INTERVAL = 0.25
# Sessions swept between two checkpoints: a sweep of many thousands (billing each one's
# pushes) must not hold the loop, and a fan-out waiting on it, for its whole length.
SWEEP_SLICE = 256
# The scope a WebSocket needs: subscriptions are reads (writes over it still need rpc:write).
WS_SCOPE = "rpc:read"


class Ticket:
    """An accepted upgrade: the 101 to write, and what the session needs."""

    __slots__ = (
        "caps",
        "deflate",
        "gap_notices",
        "hub",
        "principal",
        "request_id",
        "response",
        "service",
    )

    def __init__(
        self,
        response: bytes,
        request_id: str,
        principal: Principal,
        hub: Hub | SolanaHub,
        service: RpcService,
        caps: WsCaps,
        deflate: Negotiated | None = None,
        gap_notices: bool = False,
    ) -> None:
        self.response = response
        self.request_id = request_id
        self.principal = principal
        self.hub = hub
        self.service = service
        self.caps = caps
        self.deflate = deflate  # permessage-deflate, when negotiated
        # Solana: told of an upstream loss by a subscriptionGap notification (?gaps=notify)
        # rather than by the connection's close.
        self.gap_notices = gap_notices


class WsNetwork:
    """What an upgrade's path (``/v1/ws/`` + ``net.path``) finds: the network (its
    ``testnet`` for the gate), its RPC service, and its hub (None: a family without
    subscriptions)."""

    __slots__ = ("hub", "net", "service")

    def __init__(self, net: Network, service: RpcService, hub: Hub | SolanaHub | None) -> None:
        self.net = net
        self.service = service
        self.hub = hub


class WsEndpoint:
    def __init__(
        self,
        services: dict[Network, RpcService],
        gate: Gate,
        access_log: AccessLog,
        settings: WebSocketSettings,
        limits_of: Callable[[Principal], Limits | None] | None = None,
    ) -> None:
        self.settings = settings
        self.gate = gate
        self._access_log = access_log
        # The key's plan (WebSocket caps); None without API keys: only [ws]'s ceilings.
        self._limits_of = limits_of or (lambda principal: None)
        self.hubs: dict[Network, Hub] = {
            key: Hub(
                str(key),
                service.pool,
                settings.pending_poll_interval,
                settings.syncing_poll_interval,
            )
            for key, service in services.items()
            if service.settings.family == "evm"
        }
        # Solana's PubSub: one upstream connection per network, shared by its clients.
        self.solana_hubs: dict[Network, SolanaHub] = {
            key: SolanaHub(
                str(key),
                [
                    PubSubUrl(
                        upstream.display_name(), upstream.ws_url, tuple(upstream.headers.items())
                    )
                    for upstream in service.settings.upstreams
                    if upstream.ws_url
                ],
                max(upstream.timeout for upstream in service.settings.upstreams),
            )
            for key, service in services.items()
            if service.settings.family == "solana"
        }
        # By the URL's chain/network bytes: one dict lookup per upgrade, no parsing.
        hubs: dict[Network, Hub | SolanaHub] = {**self.hubs, **self.solana_hubs}
        self._endpoints = {
            key.path: WsNetwork(key, service, hubs.get(key)) for key, service in services.items()
        }
        self.sessions: set[Session] = set()
        self._per_key: Counter[str] = Counter()
        self.filter_budgets = KeyBudgets()  # logs filter bytes held per key
        self._closing = False
        self._id_prefix = "ws-" + os.urandom(4).hex()
        self._id_counter = 0
        # Observability.
        self.upgrades: Counter[int] = Counter()
        self.disconnects: Counter[str] = Counter()

    # --- wiring ----------------------------------------------------------------------------

    def attach(self, followers: dict[Network, Any], clients: dict[Network, ChainClient]) -> None:
        """Give each hub its follower's stream (when the network has a follower: else no
        newHeads/logs there) and its network's client.  Call once, before ``run``."""
        for key, hub in self.hubs.items():
            follower = followers.get(key)
            events: trio.MemoryReceiveChannel[ChainEvent] | None = None
            if follower is not None:
                events = follower.subscribe("ws")
            hub.attach(events, clients.get(key) or ChainClient(hub.pool))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The hubs and the sweeper, until cancelled."""
        async with trio.open_nursery() as nursery:
            for hub in self.hubs.values():
                await nursery.start(hub.run)
            for solana in self.solana_hubs.values():
                await nursery.start(solana.run)
            nursery.start_soon(self._sweeper)
            task_status.started()

    def begin_shutdown(self) -> None:
        self._closing = True
        for session in list(self.sessions):
            session.close(1001, "server shutting down")

    # --- the upgrade ---------------------------------------------------------------------

    def _request_id(self) -> str:
        self._id_counter += 1
        return f"{self._id_prefix}-{self._id_counter:x}"

    def handshake(self, request: Request, peer: str) -> tuple[int, bytes, bytes] | Ticket | None:
        """None when the path is not ours (the request is then answered as usual)."""
        path = request.path
        if not path.startswith(WS_PREFIX):
            return None
        started = perf_counter()
        request_id = self._request_id()
        outcome = self._accept(request, peer, path[len(WS_PREFIX) :], request_id)
        status = 101 if isinstance(outcome, Ticket) else outcome[0]
        self.upgrades[status] += 1
        access_log = self._access_log
        if access_log.enabled:
            # The path only: the query string carries the API key and is never logged.
            access_log.write(
                AccessEntry(
                    access_log.timestamp(time()),
                    "info",
                    "websocket upgrade",
                    request_id,
                    peer,
                    request.method.decode("latin-1"),
                    path[:256].decode("latin-1"),
                    status,
                    int((perf_counter() - started) * 1_000_000),
                    0 if isinstance(outcome, Ticket) else len(outcome[2]),
                )
            )
        if isinstance(outcome, Ticket):
            return outcome
        status, headers, body = outcome
        return status, b"X-Request-Id: " + request_id.encode() + b"\r\n" + headers, body

    def _accept(
        self, request: Request, peer: str, tail: bytes, request_id: str
    ) -> tuple[int, bytes, bytes] | Ticket:
        endpoint = self._endpoints.get(tail)
        if endpoint is None:
            return 404, JSON, error_body(404, "unknown chain or network")
        hub = endpoint.hub
        if hub is None:
            message = "WebSocket subscriptions are offered on EVM and Solana networks"
            return 404, JSON, error_body(404, message)
        if request.method != b"GET":
            return 405, JSON + b"Allow: GET\r\n", error_body(405, "a WebSocket upgrade is a GET")
        if self._closing:
            return 503, JSON, error_body(503, "shutting down")
        gate = self.gate
        # Browsers send Origin on a WebSocket handshake but CORS does not apply to it: the
        # key's origin allowlist, checked by the gate, is the only guard.
        credentials = Credentials(
            query_api_key(request.query) or request.api_key, request.authorization, request.origin
        )
        principal = gate.authenticate(credentials, peer, endpoint.net, WS_SCOPE)
        if isinstance(principal, Rejection):
            return _refused(principal)
        rate_headers = gate.response_headers(principal)
        try:
            key = websocket_key(request)
        except HandshakeError as exc:
            headers = JSON + exc.headers + rate_headers
            return exc.status, headers, error_body(exc.status, exc.message)
        limits = self._limits_of(principal)
        allowed = limits.ws_connections if limits is not None else 0
        if allowed and self._per_key[principal.key_id] >= allowed:
            message = f"too many WebSocket connections for this API key (the plan allows {allowed})"
            return 429, JSON + b"Retry-After: 1\r\n" + rate_headers, error_body(429, message)
        extra = b"X-Request-Id: " + request_id.encode() + b"\r\n" + rate_headers
        deflate = negotiate_deflate(request, self.settings.compress_min_bytes)
        if deflate is not None:
            extra += deflate.header
        gaps = query_value(request.query, "gaps") if isinstance(hub, SolanaHub) else None
        if gaps not in (None, b"close", b"notify"):
            message = "gaps must be close (the default) or notify"
            return 400, JSON + rate_headers, error_body(400, message)
        # Counted now, not when the session starts: the cap holds between 101 and serve.
        self._per_key[principal.key_id] += 1
        return Ticket(
            switching_protocols(key, extra),
            request_id,
            principal,
            hub,
            endpoint.service,
            caps_for(limits, self.settings),
            deflate,
            gaps == b"notify",
        )

    async def serve(self, sock: socket.socket, peer: str, leftover: bytes, ticket: Ticket) -> None:
        """Run one upgraded connection to its end (the edge closes the socket after)."""
        session = Session(
            self,
            sock,
            peer,
            ticket.request_id,
            ticket.principal,
            ticket.hub,
            ticket.service,
            ticket.caps,
            ticket.deflate,
        )
        session.gap_notices = ticket.gap_notices
        self.sessions.add(session)
        if self.settings.socket_send_buffer:
            try:
                sock.setsockopt(
                    socket.SOL_SOCKET, socket.SO_SNDBUF, self.settings.socket_send_buffer
                )
            except OSError:
                pass  # not a TCP socket (tests with socketpairs): nothing to bound
        try:
            if self._closing:
                session.close(1001, "server shutting down")
            await session.run(leftover)
        finally:
            self.sessions.discard(session)
            self._release(ticket.principal)
            session.end_all()
            self._charge(session)
            reason = "slow_consumer" if session.dropped else _reason_label(session)
            self.disconnects[reason] += 1
            log.info(
                "websocket closed",
                extra={
                    "fields": {
                        "request_id": session.request_id,
                        "key_id": session.principal.key_id,
                        "code": session.close_code,
                        "reason": session.close_reason,
                        "seconds": round(monotonic() - session.opened, 3),
                        "pushes": session.pushes,
                    }
                },
            )

    def release_unused(self, ticket: Ticket) -> None:
        """The 101 could not be written: give the connection slot back."""
        self._release(ticket.principal)

    def _release(self, principal: Principal) -> None:
        self._per_key[principal.key_id] -= 1
        if self._per_key[principal.key_id] <= 0:
            del self._per_key[principal.key_id]

    # --- the sweeper -----------------------------------------------------------------------

    async def _sweeper(self) -> None:
        settings = self.settings
        while True:
            await trio.sleep(SWEEP_INTERVAL)
            now = monotonic()
            for n, session in enumerate(list(self.sessions), 1):
                if n % SWEEP_SLICE == 0:
                    await trio.lowlevel.checkpoint()  # (a session that ended meanwhile: no-op)
                self._charge(session)
                if session.closing:
                    if now > session.close_deadline:
                        session.abort(session.close_reason or "close timeout")
                    continue
                if session.principal.revoked:
                    session.close(1008, "API key revoked")
                elif session.stalled_since and now - session.stalled_since > (
                    settings.write_timeout
                ):
                    session.abort("write timeout")
                elif session.ping_sent is not None:
                    if now - session.ping_sent > settings.pong_timeout:
                        session.abort("keepalive timeout")
                elif now - session.last_seen > settings.ping_interval:
                    session.ping()

    def _charge(self, session: Session) -> None:
        """Bill pushed compute units: usage meter, and the key's CU/s bucket (never refused:
        the bucket may go into debt, which then slows the key's own calls)."""
        cu = session.pending_cu
        if not cu:
            return
        session.pending_cu = 0
        principal = session.principal
        session.bill(session.hub.push_method, 0, cu)
        limiter = principal.limiter
        if limiter is not None:
            limiter.absorb(monotonic(), 0, cu)
            shared = getattr(self.gate, "shared", None)
            if shared is not None:
                principal.pending_units += cu
                shared.note(principal)

    # --- metrics ---------------------------------------------------------------------------

    def register_metrics(self, registry: Registry) -> None:
        registry.family(
            "chaingate_ws_connections_open",
            "gauge",
            "Open WebSocket connections.",
            lambda: [({}, len(self.sessions))],
        )
        registry.family(
            "chaingate_ws_upgrades_total",
            "counter",
            "WebSocket upgrade requests, by HTTP status answered (101: accepted).",
            lambda: (({"status": str(s)}, n) for s, n in sorted(self.upgrades.items())),
        )
        registry.family(
            "chaingate_ws_disconnects_total",
            "counter",
            "Closed WebSocket connections, by reason.",
            lambda: (({"reason": r}, n) for r, n in sorted(self.disconnects.items())),
        )
        self._register_hub_metrics(registry)
        self._register_solana_metrics(registry)
        registry.family(
            "chaingate_ws_fanout_total",
            "counter",
            "Blocks fanned out.",
            _per_hub(self.hubs, lambda hub, base: [(base, sum(hub.fanout.counts))]),
        )

    def _register_hub_metrics(self, registry: Registry) -> None:
        """The EVM hubs' families (subscriptions, pushes, heads, fan-out time), per network."""
        hubs = self.hubs
        registry.family(
            "chaingate_ws_subscriptions",
            "gauge",
            "Live subscriptions, by kind.",
            _per_hub(
                hubs,
                lambda hub, base: (
                    ({**base, "kind": kind}, hub.registry.count(kind)) for kind in KINDS
                ),
            ),
        )
        registry.family(
            "chaingate_ws_pushes_total",
            "counter",
            "Subscription messages pushed, by kind.",
            _per_hub(
                hubs,
                lambda hub, base: (
                    ({**base, "kind": kind}, n) for kind, n in sorted(hub.pushes.items())
                ),
            ),
        )
        registry.family(
            "chaingate_ws_head_arrival_seconds",
            "gauge",
            "Wall-clock time the newest head reached the WebSocket hub (bench: delivery delay).",
            _per_hub(hubs, lambda hub, base: [(base, round(hub.head_arrival, 6))]),
        )
        registry.family(
            "chaingate_ws_head_number",
            "gauge",
            "Number of the newest head the WebSocket hub pushed.",
            _per_hub(hubs, lambda hub, base: [(base, hub.head_number)]),
        )
        registry.family(
            "chaingate_ws_fanout_seconds_sum",
            "counter",
            "Time spent handing heads and their logs to every subscriber's connection.",
            _per_hub(hubs, lambda hub, base: [(base, round(hub.fanout.sum, 6))]),
        )

    def _register_solana_metrics(self, registry: Registry) -> None:
        """The Solana hubs' families (upstream and client subscriptions, pushes, gaps,
        failovers, fan-out), per network."""
        solana = self.solana_hubs

        def per_solana(
            read: Callable[[SolanaHub], float],
        ) -> Callable[[], Iterable[Sample]]:
            def collect() -> Iterable[Sample]:
                for key, hub in solana.items():
                    yield {"chain": key.chain, "network": key.network}, read(hub)

            return collect

        registry.family(
            "chaingate_ws_solana_upstream_subscriptions",
            "gauge",
            "Solana subscriptions held upstream: one per distinct (method, params).",
            per_solana(lambda hub: len(hub.router.channels)),
        )
        registry.family(
            "chaingate_ws_solana_subscriptions",
            "gauge",
            "Solana subscriptions held by clients (sharing the upstream ones).",
            per_solana(lambda hub: hub.router.members),
        )
        registry.family(
            "chaingate_ws_solana_pushes_total",
            "counter",
            "Solana notifications pushed to clients.",
            per_solana(lambda hub: hub.pushes),
        )
        registry.family(
            "chaingate_ws_solana_gaps_total",
            "counter",
            "subscriptionGap notices sent (an upstream PubSub connection was lost).",
            per_solana(lambda hub: hub.gaps),
        )
        registry.family(
            "chaingate_ws_solana_upstream_connects_total",
            "counter",
            "Upstream PubSub connections opened (more than one: failovers).",
            per_solana(lambda hub: hub.connects),
        )
        registry.family(
            "chaingate_ws_solana_fanout_seconds_sum",
            "counter",
            "Time spent handing Solana notifications to every client subscribed to them.",
            per_solana(lambda hub: round(hub.fanout_seconds, 6)),
        )
        registry.family(
            "chaingate_ws_solana_fanout_total",
            "counter",
            "Solana notifications fanned out.",
            per_solana(lambda hub: hub.fanouts),
        )
        registry.family(
            "chaingate_ws_solana_notification_arrival_seconds",
            "gauge",
            "Wall-clock time the newest Solana notification reached the hub (bench).",
            per_solana(lambda hub: round(hub.arrival, 6)),
        )


def _per_hub(
    hubs: dict[Network, Hub], read: Callable[[Hub, dict[str, str]], Iterable[Sample]]
) -> Callable[[], Iterable[Sample]]:
    """A family's collector: ``read``'s samples of every EVM hub, labelled by its network."""

    def collect() -> Iterable[Sample]:
        for key, hub in hubs.items():
            yield from read(hub, {"chain": key.chain, "network": key.network})

    return collect


def _refused(rejection: Rejection) -> tuple[int, bytes, bytes]:
    body = error_body(rejection.status, rejection.message, rejection.code)
    return rejection.status, JSON + rejection.headers, body


def _reason_label(session: Session) -> str:
    reason = session.close_reason
    if reason in ("client closed", "protocol error", "send failed", "write timeout"):
        return reason.replace(" ", "_")
    if reason == "keepalive timeout":
        return "keepalive_timeout"
    if reason == "API key revoked":
        return "revoked"
    if session.close_code == 1001:
        return "shutdown"
    if session.close_code == 1009:
        return "message_too_big"
    if session.close_code == 1012:
        return "upstream_lost"
    return "closed" if session.close_code != 1006 else "abnormal"

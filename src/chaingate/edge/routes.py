"""What the edge does with each request: route, authenticate, answer, measure, log.

* ``POST /v1/rpc/{chain}/{network}`` — the JSON-RPC proxy, entirely native (no ASGI);
* ``GET /metrics`` — Prometheus text, admin token required;
* ``GET /v1/ws/{chain}/{network}`` — WebSocket: the upgrade itself is taken by the edge before
  this handler (``chaingate.ws.endpoint``); a request without ``Upgrade`` gets 426 here;
* any other ``/v1/...`` path — the quart-trio REST app, in process;
* anything else — 404 in the spec's error envelope.

Every response carries ``X-Request-Id`` (the client's own, when it sent a sane one) and the
gate's rate-limit headers; every request produces one access-log line and one latency sample.

The path is normalised once (``chaingate.edge.paths``) and that one path is authorised,
routed, handed to the REST app and logged.
"""

from __future__ import annotations

import hmac
import os
import re
from collections import defaultdict
from time import perf_counter, time
from typing import Any

from chaingate.api.routing import RestApi
from chaingate.auth.gate import Gate, NetworkInfo, Rejection
from chaingate.edge.asgi import AsgiBridge
from chaingate.edge.paths import PathError, loggable_path, normalize_path
from chaingate.edge.responses import JSON, error_body
from chaingate.obs.logs import AccessEntry, AccessLog
from chaingate.obs.metrics import LatencyHistogram, Registry
from chaingate.rpc.service import RpcService

_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:\-]{1,128}")
_RPC_PREFIX = b"/v1/rpc/"  # 8 bytes; the chain/network tail follows
_ALLOW_POST = b"Allow: POST\r\n"
_ALLOW_GET = b"Allow: GET\r\n"


_ROUTES = ("rpc", "rest", "metrics", "ws", "other")
_WS_PREFIX = b"/v1/ws/"

# The scope each REST area needs (docs/decisions.md), for paths no route matches (so a key
# without the area's scope learns nothing about what exists there); a matched route carries
# its own scope.  None: any valid key.
_REST_SCOPES = (
    (b"/v1/tokens/", "data:read"),
    (b"/v1/nfts/", "data:read"),
    (b"/v1/gas/policies", "gas:manage"),
    (b"/v1/gas/sponsor", "gas:manage"),
    (b"/v1/gas/", "data:read"),
    (b"/v1/wallets", "wallets:manage"),
    (b"/v1/webhooks", "webhooks:manage"),
    (b"/v1/bundler/", "bundler:send"),
)


def rest_scope(path: bytes) -> str | None:
    for prefix, scope in _REST_SCOPES:
        if path.startswith(prefix):
            return scope
    return None


# Compute units of a REST request no route matches (it is answered 404 or 405).
UNMATCHED_CU = 1

# Response header blocks of the RPC route, built once.
_RPC_HEADERS = {
    cache: JSON + b"X-Cache: " + cache + b"\r\n" for cache in (b"HIT", b"MISS", b"PARTIAL")
}


class Routes:
    def __init__(
        self,
        services: dict[str, RpcService],
        asgi: AsgiBridge,
        rest: RestApi,
        gate: Gate,
        registry: Registry,
        access_log: AccessLog,
        admin_token: str,
    ) -> None:
        self._services = {key.encode(): service for key, service in services.items()}
        self._networks = {
            key.encode(): NetworkInfo(service.chain, service.network, service.settings.testnet)
            for key, service in services.items()
        }
        self._asgi = asgi
        self._rest_api = rest
        self._gate = gate
        self._registry = registry
        self._access_log = access_log
        self._admin_token = admin_token.encode()
        self._id_prefix = os.urandom(4).hex().encode()
        self._id_counter = 0
        self.latency = LatencyHistogram()
        self._route_latency = {route: self.latency.series(route) for route in _ROUTES}
        # Answered requests by route, then by status.
        self.statuses: dict[str, defaultdict[int, int]] = {
            route: defaultdict(int) for route in _ROUTES
        }

    @property
    def requests(self) -> dict[tuple[str, int], int]:
        return {
            (route, status): n
            for route, counts in self.statuses.items()
            for status, n in counts.items()
        }

    def _request_id(self, request: Any) -> bytes:
        supplied = request.request_id
        if supplied is not None and _REQUEST_ID.fullmatch(supplied):
            return supplied  # type: ignore[no-any-return]
        self._id_counter += 1
        return b"%s-%x" % (self._id_prefix, self._id_counter)

    async def __call__(self, request: Any, peer: str) -> tuple[int, bytes, bytes]:
        started = perf_counter()
        request_id = self._request_id(request)
        label = ""
        cache = b""
        try:
            path = normalize_path(request.path)
        except PathError as exc:
            path = request.path
            route = "other"
            status, headers, body = 400, JSON, error_body(400, str(exc))
        else:
            route, status, headers, body, label, cache = await self._route(request, path, peer)
        elapsed = perf_counter() - started
        self._route_latency[route].observe(elapsed)
        self.statuses[route][status] += 1
        access_log = self._access_log
        if access_log.enabled:
            access_log.write(
                AccessEntry(
                    access_log.timestamp(time()),
                    "info",
                    "request",
                    request_id.decode(),
                    peer,
                    request.method.decode("latin-1"),
                    loggable_path(path),
                    status,
                    int(elapsed * 1_000_000),
                    len(body),
                    label,
                    cache.decode(),
                )
            )
        return status, b"X-Request-Id: " + request_id + b"\r\n" + headers, body

    async def _route(
        self, request: Any, path: bytes, peer: str
    ) -> tuple[str, int, bytes, bytes, str, bytes]:
        """Route, status, header lines, body, RPC label and cache status of one request."""
        label = ""
        cache = b""
        if path.startswith(_RPC_PREFIX):
            route = "rpc"
            # The JSON-RPC route, inline: it is the hot path.
            tail = path[8:]
            service = self._services.get(tail)
            if service is None:
                status, headers, body = 404, JSON, error_body(404, "unknown chain or network")
            elif request.method != b"POST":
                status, headers, body = (
                    405,
                    JSON + _ALLOW_POST,
                    error_body(405, "JSON-RPC requests must be POST"),
                )
            else:
                gate = self._gate
                principal = gate.authenticate(request, peer, self._networks[tail], None)
                if isinstance(principal, Rejection):
                    status, headers, body = _rejected(principal, b"", request)
                else:
                    reply = await service.handle(request.body, principal)
                    label = reply.label
                    rate_headers = gate.response_headers(principal)
                    if reply.rejection is not None:
                        status, headers, body = _rejected(
                            reply.rejection, rate_headers, request, reply.body
                        )
                    else:
                        cache = reply.cache
                        headers = (
                            _RPC_HEADERS[cache] + rate_headers
                            if rate_headers
                            else _RPC_HEADERS[cache]
                        )
                        body = reply.body if reply.body is not None else b""
                        status = 200 if reply.body is not None else 204
        elif path == b"/metrics":
            route = "metrics"
            status, headers, body = self._metrics(request)
        elif path.startswith(_WS_PREFIX):
            route = "ws"
            status, headers, body = (
                426,
                JSON + b"Upgrade: websocket\r\nConnection: Upgrade\r\n",
                error_body(426, "this endpoint speaks WebSocket: send an Upgrade request"),
            )
        elif path.startswith(b"/v1/") or path == b"/v1":
            route = "rest"
            status, headers, body = await self._rest(request, path, peer)
        else:
            route = "other"
            status, headers, body = 404, JSON, error_body(404, "no such endpoint")
        return route, status, headers, body, label, cache

    def _metrics(self, request: Any) -> tuple[int, bytes, bytes]:
        if request.method not in (b"GET", b"HEAD"):
            return 405, JSON + _ALLOW_GET, error_body(405, "use GET")
        if not self._admin_token:
            return 403, JSON, error_body(403, "metrics are disabled: set observability.admin_token")
        supplied = request.authorization or b""
        if not (
            supplied.startswith(b"Bearer ") and hmac.compare_digest(supplied[7:], self._admin_token)
        ):
            return (
                401,
                JSON,
                error_body(401, "admin token required (Authorization: Bearer <token>)"),
            )
        return 200, b"Content-Type: text/plain; version=0.0.4\r\n", self._registry.render()

    async def _rest(self, request: Any, path: bytes, peer: str) -> tuple[int, bytes, bytes]:
        """A REST request: its route's scope, then admission like a JSON-RPC call (request and
        compute-unit buckets, day quota, usage), then the app."""
        match = self._rest_api.match(request.method, path)
        route = match.route if match is not None else None
        if route is not None and route.public:
            return await self._asgi.handle(request, path, peer)
        gate = self._gate
        scope = route.scope if route is not None else rest_scope(path)
        principal = gate.authenticate(request, peer, None, scope)
        if isinstance(principal, Rejection):
            return _rejected(principal, b"", request)
        units = route.cu if route is not None else UNMATCHED_CU
        name = route.key if route is not None else "rest:unmatched"
        rejection = gate.admit(principal, False, False, 1, units, units)
        if rejection is not None:
            return _rejected(rejection, gate.response_headers(principal), request)
        status, headers, body = await self._asgi.handle(
            request, path, peer, gate.response_headers(principal), principal
        )
        gate.record(principal, name, 1, units, 1 if status >= 400 else 0)
        return status, headers, body


def _rejected(
    rejection: Rejection, rate_headers: bytes, request: Any = None, body: bytes | None = None
) -> tuple[int, bytes, bytes]:
    """A refusal: the spec's error envelope, unless a body is given (JSON-RPC, over a limit).
    A rejection that asks for it closes the connection after the answer."""
    if rejection.close and request is not None:
        request.keep_alive = False
    headers = JSON + rejection.headers + rate_headers
    if body is None:
        body = error_body(rejection.status, rejection.message, rejection.code)
    return rejection.status, headers, body

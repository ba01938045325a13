"""What the edge does with each request: route, authenticate, answer, measure, log.

* ``POST /v1/rpc/{chain}/{network}`` — the JSON-RPC proxy, entirely native (no ASGI);
* ``POST /v1/bundler/{chain}/{network}`` — JSON-RPC answered in process (``chaingate.rpc.local``:
  the ERC-7677 paymaster methods, the bundler's), native too;
* ``GET /metrics`` — Prometheus text, admin token required;
* ``GET /v1/ws/{chain}/{network}`` — WebSocket: the upgrade itself is taken by the edge before
  this handler (``chaingate.ws.endpoint``); a request without ``Upgrade`` gets 426 here;
* any other ``/v1/...`` path — the quart-trio REST app, in process;
* anything else — 404 in the spec's error envelope.

``OPTIONS`` on the RPC, bundler and REST paths is a browser's preflight, answered without a
key (``chaingate.edge.cors``); answers to a request with ``Origin`` carry the CORS headers.

Every response carries ``X-Request-Id`` (the client's own, when it sent a sane one) and the
gate's rate-limit headers; every request produces one access-log line and one latency sample.

The path is normalised once (``chaingate.edge.paths``) and that one path is authorised,
routed, handed to the REST app and logged.
"""

from __future__ import annotations

import hmac
import logging
from collections import defaultdict
from collections.abc import Mapping
from time import monotonic, perf_counter

from chaingate.api.routing import RestApi
from chaingate.auth.apikeys import environment_of
from chaingate.auth.gate import Gate, Principal, Rejection, book
from chaingate.config.network import Network
from chaingate.edge import cors
from chaingate.edge.asgi import AsgiBridge
from chaingate.edge.paths import PathError, normalize_path
from chaingate.edge.responses import JSON, PAGE_REFUSAL
from chaingate.edge.restcache import CacheKey, RestCache
from chaingate.envelope import error_body
from chaingate.obs.logs import AccessLog
from chaingate.obs.metrics import LatencyHistogram, Registry
from chaingate.redaction import loggable_path
from chaingate.refusals import refusal_error
from chaingate.rpc import local as local_rpc
from chaingate.rpc.future import Future
from chaingate.rpc.local import LocalRpc
from chaingate.rpc.reply import Usage
from chaingate.rpc.service import RpcService
from chaingate.twintypes.fastlane import FastlaneModule, RequestIds
from chaingate.twintypes.http1 import Request
from chaingate.twintypes.jsonrpc import JsonRpcModule

log = logging.getLogger("chaingate.edge")

_RPC_PREFIX = b"/v1/rpc/"  # 8 bytes; the chain/network tail follows
_ALLOW_POST = b"Allow: POST\r\n"
_ALLOW_GET = b"Allow: GET\r\n"


_ROUTES = ("rpc", "bundler", "rest", "metrics", "ws", "dashboard", "other")
_DASHBOARD = b"/dashboard"
_WS_PREFIX = b"/v1/ws/"
_BUNDLER_PREFIX = b"/v1/bundler/"
_BUNDLER_SCOPE = "bundler:send"
# REST calls are metered under no network: a route may read several (or none).
REST_NETWORK = ""

# The scope each REST area needs (docs/decisions/api.md), for paths no route matches (so a key
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
_HIT = b"X-Cache: HIT\r\n"
_MISS = b"X-Cache: MISS\r\n"

# Response header blocks of the RPC route, built once.
_RPC_HEADERS = {
    cache: JSON + b"X-Cache: " + cache + b"\r\n" for cache in (b"HIT", b"MISS", b"PARTIAL")
}


class Routes:
    def __init__(
        self,
        services: dict[Network, RpcService],
        asgi: AsgiBridge,
        rest: RestApi,
        gate: Gate,
        registry: Registry,
        access_log: AccessLog,
        admin_token: str,
        ids: RequestIds,
        jsonrpc: JsonRpcModule,
        fastlane: FastlaneModule,
        bundlers: Mapping[Network, LocalRpc] | None = None,
    ) -> None:
        """``ids``: the process's ``X-Request-Id`` source (``fastlane.RequestIds``), shared
        with the fast lane; ``jsonrpc``: the framing twin, for refusals on JSON-RPC paths;
        ``fastlane``: the lane's twin, whose rules the handler's requests follow too."""
        # By the URL's chain/network bytes: one dict lookup per request, no parsing.
        bundlers = bundlers or {}
        self._endpoints = {
            key.path: Endpoint(key, service, bundlers.get(key)) for key, service in services.items()
        }
        self._asgi = asgi
        self._rest_api = rest
        self.rest_cache = RestCache()
        # key -> (the data's version when it began, the answer to come)
        self._rest_inflight: dict[CacheKey, tuple[object, Future[tuple[int, bytes, bytes]]]] = {}
        self._gate = gate
        self._registry = registry
        self._admin_token = admin_token.encode()
        self.ids = ids
        self._split_path_key = fastlane.split_path_key
        self._jsonrpc = jsonrpc
        self.latency = LatencyHistogram()
        self.route_latency = {route: self.latency.series(route) for route in _ROUTES}
        # Answered requests by route, then by status.
        self.statuses: dict[str, defaultdict[int, int]] = {
            route: defaultdict(int) for route in _ROUTES
        }
        # What every answered request leaves behind (status count, latency, access-log line):
        # the fast lane's books, which it shares.
        self.ledger = fastlane.Ledger(self.statuses, self.route_latency, access_log)

    @property
    def requests(self) -> dict[tuple[str, int], int]:
        return {
            (route, status): n
            for route, counts in self.statuses.items()
            for status, n in counts.items()
        }

    async def __call__(self, request: Request, peer: str) -> tuple[int, bytes, bytes]:
        started = perf_counter()
        request_id: bytes = self.ids.take(request.request_id)
        label = ""
        cache = b""
        route = "other"
        sample = _Sample()
        try:
            path = normalize_path(request.path)
        except PathError as exc:
            path = request.path
            status, headers, body = 400, _refusal_headers(path), error_body(400, str(exc))
        else:
            try:
                if path.startswith(_RPC_PREFIX):
                    route = "rpc"
                    status, headers, body, label, cache = await self._rpc(
                        request, path, peer, sample
                    )
                else:
                    route, status, headers, body = await self._other(request, path, peer, sample)
            except Exception:
                # A bug of ours costs this request a 500 (logged, and in the access log like
                # every answer), never the listener.
                log.exception("unhandled error while answering a request")
                status, headers = 500, _refusal_headers(path)
                body = error_body(500, "internal error; retry with exponential backoff")
                request.keep_alive = False
        elapsed = self.ledger.note(
            route, status, request_id, peer, request.method, loggable_path(path), started,
            len(body), label, cache,
        )  # fmt: skip
        if sample.principal is not None:
            sample.book(self._gate, elapsed)
        if request.origin is not None and route != "metrics":
            headers += cors.answer_headers(request.origin)
        return status, b"X-Request-Id: " + request_id + b"\r\n" + headers, body

    async def _rpc(
        self, request: Request, path: bytes, peer: str, sample: _Sample
    ) -> tuple[int, bytes, bytes, str, bytes]:
        """A JSON-RPC request the fast lane left to Python: status, headers, body, the
        access log's label and X-Cache value."""
        endpoint, path_key = self._endpoint(path[8:])
        if request.method == b"OPTIONS":  # a browser's preflight: no key to check
            return (*cors.preflight(request.origin, cors.RPC_METHODS), "", b"")
        if endpoint is None:
            return 404, JSON, error_body(404, "unknown chain or network"), "", b""
        if request.method != b"POST":
            body = error_body(405, "JSON-RPC requests must be POST")
            return 405, JSON + _ALLOW_POST, body, "", b""
        service = endpoint.service
        gate = self._gate
        principal = gate.authenticate(request, peer, endpoint.net, None, path_key)
        if isinstance(principal, Rejection):
            return (*self._refused_rpc(request, principal, b"", service.max_batch), "", b"")
        reply = await service.handle(request.body, principal)
        sample.principal, sample.network, sample.method = principal, service.label, reply.label
        sample.usage, sample.timed = reply.usage, reply.admitted
        rate_headers = gate.response_headers(principal)
        if reply.rejection is not None:
            status, headers, body = _rejected(reply.rejection, rate_headers, request, reply.body)
            return status, headers, body, reply.label, b""
        cache = reply.cache
        headers = _RPC_HEADERS[cache] + rate_headers if rate_headers else _RPC_HEADERS[cache]
        if reply.body is None:
            return 204, headers, b"", reply.label, cache
        return 200, headers, reply.body, reply.label, cache

    async def _other(
        self, request: Request, path: bytes, peer: str, sample: _Sample
    ) -> tuple[str, int, bytes, bytes]:
        """Route, status, header lines and body of a request that is not JSON-RPC."""
        if path == b"/metrics":
            route = "metrics"
            status, headers, body = self._metrics(request)
        elif path.startswith(_BUNDLER_PREFIX):
            route = "bundler"
            if request.method == b"OPTIONS":
                status, headers, body = cors.preflight(request.origin, cors.RPC_METHODS)
            else:
                tail = path[len(_BUNDLER_PREFIX) :]
                status, headers, body = await self._bundler(request, tail, peer, sample)
        elif path.startswith(_WS_PREFIX):
            route = "ws"
            status, headers, body = (
                426,
                JSON + b"Upgrade: websocket\r\nConnection: Upgrade\r\n",
                error_body(426, "this endpoint speaks WebSocket: send an Upgrade request"),
            )
        elif path.startswith(b"/v1/") or path == b"/v1":
            route = "rest"
            # A browser's preflight carries Origin; a plain OPTIONS goes to the REST app,
            # which answers with the resource's own methods (what its OpenAPI lists).
            if request.method == b"OPTIONS" and request.origin is not None:
                status, headers, body = cors.preflight(request.origin, cors.REST_METHODS)
            else:
                status, headers, body = await self._rest(request, path, peer, sample)
        elif path == _DASHBOARD or path.startswith(_DASHBOARD + b"/"):
            route = "dashboard"  # pages with sessions of their own: no API key, no CORS
            request.origin = None
            status, headers, body = await self._asgi.handle(request, path, peer)
        else:
            route = "other"
            status, headers, body = 404, JSON, error_body(404, "no such endpoint")
        return route, status, headers, body

    async def _bundler(
        self, request: Request, tail: bytes, peer: str, sample: _Sample
    ) -> tuple[int, bytes, bytes]:
        """JSON-RPC answered in process: scope ``bundler:send``, then every call admitted at
        its compute units like a proxied batch, run, and recorded under its method."""
        endpoint, path_key = self._endpoint(tail)
        # The scope first: a key without it learns nothing about what exists here.
        gate = self._gate
        net = endpoint.net if endpoint is not None else None
        principal = gate.authenticate(request, peer, net, _BUNDLER_SCOPE, path_key)
        if isinstance(principal, Rejection):
            return self._refused_rpc(request, principal, b"", local_rpc.MAX_BATCH)
        rpc = endpoint.bundler if endpoint is not None else None
        rate_headers = gate.response_headers(principal)
        if rpc is None:
            return 404, JSON + rate_headers, error_body(404, "unknown chain or network")
        network = rpc.label  # metered under its chain/network, like the proxied calls
        if request.method != b"POST":
            headers = JSON + _ALLOW_POST + rate_headers
            return 405, headers, error_body(405, "JSON-RPC requests must be POST")
        parsed = local_rpc.parse(request.body)
        calls = parsed.calls if not isinstance(parsed, bytes) else []
        units = rpc.cost(calls) if calls else 1
        decided = monotonic()
        rejection = gate.admit(principal, False, False, max(1, len(calls)), units, units)
        if rejection is not None:
            rate_headers = gate.response_headers(principal, decided)
            return self._refused_rpc(request, rejection, rate_headers, local_rpc.MAX_BATCH)
        if isinstance(parsed, bytes):
            sample.priced(principal, network, "bundler:invalid", units, failed=True)
            return 200, JSON + gate.response_headers(principal), parsed
        replies, _ = await rpc.run(parsed, principal)
        usage = sample.usage
        for call, reply in zip(calls, replies, strict=True):
            method = call.method if call.method in rpc.methods else "bundler:unknown"
            failed = call.error is not None or (reply is not None and "error" in reply)
            usage.append((method, 1, rpc.cost([call]), 1 if failed else 0))
        label = "batch" if parsed.batch else method  # a single call's method
        sample.principal, sample.network, sample.method = principal, network, label
        body = local_rpc.encode(parsed, replies)
        if body is None:  # notifications only
            return 204, gate.response_headers(principal), b""
        return 200, JSON + gate.response_headers(principal), body

    def _refused_rpc(
        self, request: Request, rejection: Rejection, rate_headers: bytes, max_batch: int
    ) -> tuple[int, bytes, bytes]:
        """A refusal on a JSON-RPC path: its HTTP status, and a JSON-RPC body with the
        request's ids that JSON-RPC clients read (chaingate.refusals)."""
        jsonrpc = self._jsonrpc
        error = refusal_error(rejection.status, rejection.code, rejection.message)
        parsed = jsonrpc.parse_request(request.body, max_batch)
        ids = [] if parsed.error else [call.id for call in parsed.calls if call.id is not None]
        if parsed.batch and ids:
            body = jsonrpc.join_batch([jsonrpc.raw_error_reply(i, error) for i in ids])
        else:
            body = jsonrpc.raw_error_reply(ids[0] if ids else b"null", error)
        return _rejected(rejection, rate_headers, request, body)

    def _endpoint(self, tail: bytes) -> tuple[Endpoint | None, bytes | None]:
        """The endpoint a JSON-RPC path names (``{chain}/{network}``, a trailing slash allowed)
        and the key in the path, for ``{chain}/{network}/{key}`` (the lane's rule,
        ``split_path_key``; the gate checks it against a header's, ``presented_key``)."""
        endpoints = self._endpoints
        endpoint = endpoints.get(tail)
        if endpoint is not None:
            return endpoint, None
        if tail.endswith(b"/"):
            endpoint = endpoints.get(tail[:-1])  # a trailing slash names the same endpoint
            if endpoint is not None:
                return endpoint, None
        head, key = self._split_path_key(tail)
        if key is None or environment_of(key) is None:
            return None, None  # no such endpoint: 404
        endpoint = endpoints.get(head)
        if endpoint is None:
            return None, None
        return endpoint, key

    def _metrics(self, request: Request) -> tuple[int, bytes, bytes]:
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

    async def _compute_shared(
        self,
        request: Request,
        path: bytes,
        peer: str,
        principal: object,
        key: CacheKey,
        seconds: float,
    ) -> tuple[int, bytes, bytes]:
        """Compute a cacheable answer once for everyone asking for ``key`` meanwhile."""
        future: Future[tuple[int, bytes, bytes]] = Future()
        version = self.rest_cache.version()  # before reading: see RestCache
        mine = self._rest_inflight[key] = (version, future)
        try:
            answer = await self._asgi.handle(request, path, peer, b"", principal)
        except BaseException:
            future.set_exception(_LeaderGone())
            raise
        finally:
            if self._rest_inflight.get(key) is mine:  # a later version's may have replaced it
                del self._rest_inflight[key]
        if answer[0] == 200:
            self.rest_cache.put(key, seconds, answer[1], answer[2], version)
        future.set_result(answer)
        return answer

    async def _rest(
        self, request: Request, path: bytes, peer: str, sample: _Sample
    ) -> tuple[int, bytes, bytes]:
        """A REST request: its route's scope, then admission like a JSON-RPC call (request and
        compute-unit buckets, day quota, usage), then the app."""
        match = self._rest_api.match(request.method, path)
        route = match.route if match is not None else None
        if route.public if route is not None else self._rest_api.only_public_at(path):
            return await self._asgi.handle(request, path, peer)  # (another method: its 405)
        gate = self._gate
        scope = route.scope if route is not None else rest_scope(path)
        principal = gate.authenticate(request, peer, None, scope)
        if isinstance(principal, Rejection):
            return _rejected(principal, b"", request)
        units = route.cu if route is not None else UNMATCHED_CU
        name = route.key if route is not None else "rest:unmatched"
        decided = monotonic()
        rejection = gate.admit(principal, False, False, 1, units, units)
        if rejection is not None:
            return _rejected(rejection, gate.response_headers(principal, decided), request)
        seconds = route.cache_seconds if route is not None else 0.0
        if not seconds or request.method != b"GET":  # a HEAD answer has no body to share
            status, headers, body = await self._asgi.handle(request, path, peer, b"", principal)
            sample.priced(principal, REST_NETWORK, name, units, status >= 400)
            return status, headers + gate.response_headers(principal), body
        key = (principal.environment, b"GET", path, request.query)
        hit = self.rest_cache.get(key)
        if hit is not None:
            sample.priced(principal, REST_NETWORK, name, units, False)
            return 200, hit[0] + _HIT + gate.response_headers(principal), hit[1]
        # One computation per key at a time: requests arriving while it runs share its answer
        # (else a popular page that expires is computed by every client waiting for it).
        # Only a computation begun at the data's current version: one begun before a commit
        # could answer with what that commit replaced.
        shared = self._rest_inflight.get(key)
        answer = None
        if shared is not None and shared[0] == self.rest_cache.version():
            try:
                answer = await shared[1].wait()
            except _LeaderGone:
                pass  # the request computing it was cancelled: compute it here
        if answer is None:
            answer = await self._compute_shared(request, path, peer, principal, key, seconds)
        status, headers, body = answer
        sample.priced(principal, REST_NETWORK, name, units, status >= 400)
        return status, headers + _MISS + gate.response_headers(principal), body


class Endpoint:
    """One network's JSON-RPC endpoints (``/v1/rpc/`` and ``/v1/bundler/`` + its
    ``net.path``): the network (its ``testnet`` for the gate), its proxy, and the bundler's
    in-process JSON-RPC when the network has one — the one record a request's path finds."""

    __slots__ = ("bundler", "net", "service")

    def __init__(self, net: Network, service: RpcService, bundler: LocalRpc | None) -> None:
        self.net = net
        self.service = service
        self.bundler = bundler


class _Sample:
    """What one request answered in Python leaves in its caller's books, filled in while it
    is answered and booked once, when the answer leaves (``__call__``): the usage of its
    calls, each (method, requests, billed units, errors), under its network; and its latency
    under its method ("batch" for a batch), once admitted."""

    __slots__ = ("method", "network", "principal", "timed", "usage")

    def __init__(self) -> None:
        self.principal: Principal | None = None  # None: nothing to book
        self.network = ""
        self.method = ""
        self.usage: Usage = []
        self.timed = True

    def priced(
        self, principal: Principal, network: str, method: str, units: int, failed: bool
    ) -> None:
        """One request priced as a whole (a REST call, a bundler body that is not
        JSON-RPC), answered."""
        self.principal, self.network, self.method = principal, network, method
        self.usage.append((method, 1, units, 1 if failed else 0))

    def book(self, gate: Gate, seconds: float) -> None:
        assert self.principal is not None
        timed = seconds if self.timed else None
        book(gate, self.principal, self.network, self.usage, self.method, timed)


def _refusal_headers(path: bytes) -> bytes:
    """The headers of a refusal the edge writes itself: a page's under /dashboard."""
    return PAGE_REFUSAL if path == _DASHBOARD or path.startswith(_DASHBOARD + b"/") else JSON


class _LeaderGone(Exception):
    """The request computing a shared REST answer was cancelled before it had one."""


def _rejected(
    rejection: Rejection,
    rate_headers: bytes,
    request: Request | None = None,
    body: bytes | None = None,
) -> tuple[int, bytes, bytes]:
    """A refusal: the spec's error envelope, unless a body is given (JSON-RPC, over a limit).
    A rejection that asks for it closes the connection after the answer."""
    if rejection.close and request is not None:
        request.keep_alive = False
    if not rejection.cors and request is not None:
        request.origin = None  # an origin the key refuses: no CORS headers on its answer
    headers = JSON + rejection.headers + rate_headers
    if body is None:
        body = error_body(rejection.status, rejection.message, rejection.code)
    return rejection.status, headers, body

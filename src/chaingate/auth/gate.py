"""The seam where every request is authenticated and metered before it is dispatched.

The edge calls ``authenticate`` once per request (before reading meaning into the body); the
RPC service calls ``admit`` with the request's calls and compute units once it has classified
them, before anything reaches a node; whoever answers the request (the edge, the WebSocket
session) books its samples once, as the answer leaves (``book``: one ``record`` per sample,
usage and latency together; ``chaingate.twintypes.metering``).  Every response carries
``response_headers``.  A refused request costs nothing.

``OpenGate`` admits everything (auth disabled); ``chaingate.auth.keygate.KeyGate`` is the real
one: API keys, scopes, plans and rate limits.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from chaingate.auth.allowlists import Policy
from chaingate.config.network import Network
from chaingate.refusals import Rejection
from chaingate.twintypes.http1 import Request
from chaingate.twintypes.metering import MeterSink, Sample

__all__ = [
    "ANONYMOUS",
    "SCOPES",
    "Credentials",
    "Gate",
    "OpenGate",
    "Principal",
    "Rejection",
]

SCOPES = (
    "rpc:read",
    "rpc:write",
    "data:read",
    "wallets:manage",
    "webhooks:manage",
    "gas:manage",
    "bundler:send",
)


class Principal:
    """Who is calling: one API key, kept in memory and shared by all its requests.

    Mutable on purpose: the key registry flips ``revoked`` or swaps limits in place, and every
    request holding this object sees it at once.
    """

    __slots__ = (
        "account_id",
        "allow",
        "environment",
        "key_id",
        "limiter",
        "limits_rps",
        "logs_range",
        "pending_requests",
        "pending_units",
        "prefix",
        "quota",
        "revoked",
        "scopes",
    )

    def __init__(
        self,
        key_id: str = "",
        account_id: str = "",
        prefix: str = "",
        environment: str = "live",
        scopes: frozenset[str] = frozenset(SCOPES),
        limiter: Any = None,
        quota: Any = None,
        limits_rps: int = 0,
        logs_range: int = 0,
    ) -> None:
        self.key_id = key_id
        self.account_id = account_id
        self.prefix = prefix
        self.environment = environment
        self.scopes = scopes
        self.limiter = limiter
        self.quota = quota
        self.limits_rps = limits_rps
        # The plan's widest eth_getLogs range (0: the network's), where the lane reads it.
        self.logs_range = logs_range
        self.revoked = False
        # The key's allowlists (chaingate.auth.allowlists.Policy); None: no lists (most keys),
        # which is all the hot path looks at.
        self.allow: Policy | None = None
        # Consumption not yet reported to the other processes (shared limits).
        self.pending_requests = 0
        self.pending_units = 0


class Credentials:
    """What the gate reads from a request, with a key from elsewhere (a WebSocket query, a
    JSON-RPC path) in the header's place."""

    __slots__ = ("api_key", "authorization", "origin")

    def __init__(
        self, api_key: bytes | None, authorization: bytes | None, origin: bytes | None = None
    ) -> None:
        self.api_key = api_key
        self.authorization = authorization
        self.origin = origin  # the request's Origin: checked against the key's allowlist


class Gate(MeterSink[Principal], Protocol):
    """The key check every path asks (``KeyGate``, or ``OpenGate`` with keys off), and the
    meters' one sink, ``record`` (``twintypes.metering``): a sample's ``network`` is the
    endpoint's ``chain/network``, '' for REST calls (no one network)."""

    def authenticate(
        self,
        request: Request | Credentials,
        peer: str,
        network: Network | None,
        scope: str | None,
        path_key: bytes | None = None,
    ) -> Principal | Rejection:
        """The caller's principal, or why not.  ``network``: the endpoint's (its ``testnet``
        says whether a test key may use it), None for REST calls; ``scope`` is the REST
        endpoint's scope (RPC scopes depend on the methods and are checked by ``admit``);
        ``path_key`` a key in the request's path (``…/{chain}/{network}/{key}``), which a
        header's must equal."""
        ...

    def admit(
        self, principal: Principal, reads: bool, writes: bool, requests: int, cu: int, tcu: int
    ) -> Rejection | None:
        """Check RPC scopes and limits for ``requests`` calls costing ``cu``/``tcu`` units."""
        ...

    def response_headers(self, principal: Principal, at: float | None = None) -> bytes:
        """The X-RateLimit-* lines: as the buckets stand now, or ``at`` (a ``time.monotonic()``
        read just before a refusing ``admit``: as they stood when the request was refused)."""
        ...


ANONYMOUS = Principal()


def book(
    gate: Gate,
    principal: Principal,
    network: str,
    usage: Iterable[tuple[str, int, int, int]],
    method: str = "",
    seconds: float | None = None,
) -> None:
    """A request's books, kept once, as its answer leaves (the edge's handler, the WebSocket
    session; the fast lane keeps its own, in the same meters): its samples, one ``record``
    each."""
    for sample in samples(principal, network, usage, method, seconds):
        gate.record(*sample)


def samples(
    principal: Principal,
    network: str,
    usage: Iterable[tuple[str, int, int, int]],
    method: str = "",
    seconds: float | None = None,
) -> list[Sample[Principal]]:
    """A request's samples: each row of its ``usage`` (method, requests, compute units,
    errors) under ``network``, and its latency under ``method`` when it was admitted
    (``seconds``) — carried by its one row when that row is ``method``'s (a single call, as
    the lane books it), else by a sample of its own (a batch: "batch")."""
    rows = [Sample(principal, network, *row) for row in usage]
    if seconds is None:
        return rows
    if len(rows) == 1 and rows[0].method == method:
        return [rows[0]._replace(seconds=seconds)]
    rows.append(Sample(principal, network, method, seconds=seconds))
    return rows


# A key in the path and another in a header: which would be the caller's?
TWO_KEYS = Rejection(
    400, "invalid_request", "two different API keys: one in the path, another in a header"
)


class OpenGate:
    """No keys, no limits: what runs when ``[auth] enabled = false``."""

    def authenticate(
        self,
        request: Request | Credentials,
        peer: str,
        network: Network | None,
        scope: str | None,
        path_key: bytes | None = None,
    ) -> Principal | Rejection:
        return ANONYMOUS

    def admit(
        self, principal: Principal, reads: bool, writes: bool, requests: int, cu: int, tcu: int
    ) -> Rejection | None:
        return None

    def record(
        self,
        principal: Principal,
        network: str,
        method: str,
        requests: int,
        cu: int,
        errors: int,
        seconds: float,
    ) -> None:
        return None

    def response_headers(self, principal: Principal, at: float | None = None) -> bytes:
        return b""

"""What the fast-lane twins (``native/fastlane.pyx``, ``_pure/fastlane.py``) offer, and what
the lane asks of the code around it.

The lane calls back into the key gate (``KeyAdmission`` → ``rejection``, its meters) and reads
principals, method specs and the access log: each is an interface declared here
(``AdmissionGate``, ``Principal``, ``MethodSpec``, ``AccessLogSink``), so the lane never
names ``chaingate.auth`` or ``chaingate.rpc`` — they satisfy these Protocols structurally, as
``rpc/`` does with its ``Gate``.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any, Protocol, TypeAlias, TypeVar

from chaingate.refusals import Rejection
from chaingate.twintypes.http1 import Request
from chaingate.twintypes.jsonrpc import Call, JsonRpcModule, Reply
from chaingate.twintypes.limiter import DayQuota, KeyLimiter, UsageMeter
from chaingate.twintypes.metering import MeterSink

# The edge loop's connection: opaque to the lane, which only hands it back to its sink.
ConnHandle = Any
# (result, error): exactly one is raw JSON bytes.
Outcome = tuple[bytes | None, bytes | None]
# A call as the cache and the flights in the air know it: (method, raw params).
CacheKey = tuple[str, bytes]
# What ``Lane.serve`` answers now: (status, headers, body); else HANDOFF or DEFER.
Answer = tuple[int, bytes, bytes]


# --- what the lane asks of the code around it -----------------------------------------------


class AllowPolicy(Protocol):
    """A key's allowlists (``chaingate.auth.allowlists.Policy``), as the lane asks them."""

    def admits(self, origin: bytes | None, peer: str) -> bool:
        """May a request from this origin and client address use the key at all?"""
        ...

    def call_refusal(self, method: str | None, params: bytes | None) -> tuple[int, str] | None:
        """(JSON-RPC code, message) of a call the lists forbid, else None."""
        ...


class Principal(Protocol):
    """Who is calling, as the lane reads it (``chaingate.auth.gate.Principal``)."""

    key_id: str
    account_id: str
    environment: str
    scopes: frozenset[str]
    revoked: bool
    limits_rps: int
    # The widest eth_getLogs range the key's plan allows (0: the network's limit): as
    # ``AuthService.logs_range_of`` says, kept with the key's limits by the registry.
    logs_range: int
    # Consumption not yet reported to the other processes (shared limits).
    pending_requests: int
    pending_units: int

    @property
    def allow(self) -> AllowPolicy | None: ...
    @property
    def limiter(self) -> KeyLimiter: ...
    @property
    def quota(self) -> DayQuota: ...


# The principal type of one admission: the lane hands back the principals it was given.
P = TypeVar("P", bound=Principal)
P_contra = TypeVar("P_contra", bound=Principal, contravariant=True)


class SharedLimits(Protocol[P_contra]):
    """Limits shared between processes (``chaingate.auth.shared``): told of every admission."""

    def note(self, principal: P_contra) -> None: ...


class LatencyMeter(Protocol):
    """Answered requests' latencies per (account, network, method, minute)."""

    def observe(
        self, account_id: str, network: str, method: str, minute: int, seconds: float
    ) -> None: ...

    def add(
        self, account_id: str, network: str, method: str, minute: int, counts: Sequence[int]
    ) -> None: ...

    def drain(self) -> list[tuple[str, str, str, int, tuple[int, ...]]]: ...


class AdmissionGate(Protocol):
    """What ``KeyAdmission`` calls back in the key gate (``chaingate.auth.keygate.KeyGate``):
    the wording and counting of a refusal, and the meters it records into."""

    @property
    def meter(self) -> UsageMeter: ...
    @property
    def latency(self) -> LatencyMeter: ...
    def rejection(self, why: int, wait: float, epoch: float) -> Rejection: ...


class FailureBucket(Protocol):
    """A client address's failed-authentication bucket (a ``KeyLimiter``)."""

    def remaining(self, now: float) -> int: ...


class MethodSpec(Protocol):
    """One row of the method table (``chaingate.rpc.methods.MethodSpec``)."""

    @property
    def name(self) -> str: ...
    @property
    def scope(self) -> str: ...
    @property
    def cu(self) -> int: ...
    @property
    def tcu(self) -> int: ...
    @property
    def cu_historical(self) -> int | None: ...
    @property
    def block_param(self) -> int | None: ...
    @property
    def cache(self) -> str: ...
    @property
    def retry(self) -> bool: ...
    @property
    def local(self) -> bool: ...
    @property
    def testnet_only(self) -> bool: ...
    @property
    def broadcast(self) -> bool: ...
    @property
    def cu_per_kib(self) -> int | None: ...
    @property
    def max_bytes(self) -> int | None: ...
    @property
    def special(self) -> bool: ...


class Presenter(Protocol):
    """What presents an API key: a request, or ``Credentials`` (a key from elsewhere)."""

    @property
    def api_key(self) -> bytes | None: ...
    @property
    def authorization(self) -> bytes | None: ...


class Sticky(Protocol):
    """The writes read-your-writes remembers (``Stickiness.routes``, a dict: its length is
    asked without a Python call)."""

    def __len__(self) -> int: ...


class LatencySample(Protocol):
    def observe(self, seconds: float) -> None: ...


class AccessLogSink(Protocol):
    """The access log (``chaingate.obs.logs.AccessLog``): the compiled lane writes its lines
    into ``buffer`` itself, and calls ``flush`` once it holds ``FLUSH_BYTES``."""

    enabled: bool
    FLUSH_BYTES: int

    @property
    def buffer(self) -> bytearray: ...
    def flush(self) -> None: ...

    def write_request(
        self,
        request_id: str,
        peer: str,
        method: str,
        path: str,
        status: int,
        duration_us: int,
        size: int,
        rpc: str = ...,
        cache: str = ...,
    ) -> None: ...


class ErrorBody(Protocol):
    """The spec's error envelope (``chaingate.envelope.error_body``)."""

    def __call__(self, status: int, message: str, code: str | None = ...) -> bytes: ...


class Sink(Protocol):
    """Where a deferred answer goes when its flights land (the edge loop)."""

    def deliver(
        self, conn: ConnHandle, request: Request, status: int, headers: bytes, body: bytes
    ) -> None: ...


class FlightWaiter(Protocol):
    """Python tasks waiting for a flight too (``chaingate.rpc.future.Future``): the lane
    resolves it when the flight lands, the tasks wait for it."""

    def set_result(self, outcome: Outcome) -> None: ...
    async def wait(self) -> Outcome: ...


# --- what the lane offers -------------------------------------------------------------------


class MethodStats(Protocol):
    ok: int
    error: int
    cache_hits: int


class AnswerBudget(Protocol):
    """Reply bytes held by batches being assembled, all requests of the process together."""

    limit: int
    held: int
    refused: int

    @property
    def exhausted(self) -> bool: ...
    def take(self, size: int) -> bool: ...
    def give_back(self, size: int) -> None: ...


class ResponseCache(Protocol):
    """Answers of cacheable calls, bounded in entries and bytes; its counters for /metrics."""

    bytes: int
    hits: int
    misses: int
    evictions: int

    def __len__(self) -> int: ...
    # builtins.bytes: the ``bytes`` counter above shadows the type in this class's body.
    def get(self, key: CacheKey) -> builtins.bytes | None: ...
    def put(self, key: CacheKey, value: builtins.bytes) -> None: ...


class RequestIds(Protocol):
    """``X-Request-Id`` values: the client's own when sane, else a process-unique one."""

    def take(self, supplied: bytes | None) -> bytes: ...


class Method(Protocol):
    """A method-table row as the lane reads it."""

    @property
    def spec(self) -> MethodSpec: ...
    @property
    def name(self) -> str: ...
    @property
    def write(self) -> bool: ...
    @property
    def retry(self) -> bool: ...
    @property
    def coalescible(self) -> bool: ...
    @property
    def stats(self) -> MethodStats: ...
    @property
    def special(self) -> bool: ...

    def price(self, tag: bytes | None) -> tuple[int, int]:
        """(billed, throughput) units of a call with this block tag."""
        ...

    def may_be_cached(self, tag: bytes | None, params: bytes | None = None) -> bool:
        """Could the cache hold the answer of a call with this block tag (and these params:
        a Solana call at a commitment short of finalized never)?"""
        ...


class Flight(Protocol):
    """One upstream call in flight."""

    key: CacheKey
    method: str
    params: bytes | None
    tag: bytes | None
    done: bool
    result: bytes | None
    error: bytes | None
    future: FlightWaiter | None

    @property
    def spec(self) -> Method: ...


class Route(Protocol):
    """One JSON-RPC endpoint: its method table, cache, flights and counters."""

    label: str
    family: str
    testnet: bool
    cache: ResponseCache
    coalesced: int
    refused: dict[str, int]
    budget: AnswerBudget
    # Set by the RPC service: sends a group of new flights upstream.
    dispatch: Callable[[list[Flight]], None] | None
    # Set by the RPC service when eth_getLogs ranges are looked at: the agreed head (for a
    # range's tags).  A caller's plan's own range limit is its principal's ``logs_range``.
    logs_head: Callable[[], int | None]
    # Set by the RPC service: the highest block known final (-1: none yet; the agreed head
    # less the finality depth), and the family's reader of the block an upstream reply's
    # result belongs to.  A cacheable result about a later block is not shown to the service
    # (``look``).
    finalized: int
    reply_block: Callable[[Reply], int | None] | None

    @property
    def stats(self) -> Mapping[str, MethodStats]: ...
    @property
    def invalid(self) -> MethodStats: ...
    @property
    def unknown(self) -> MethodStats: ...
    @property
    def methods(self) -> Mapping[str, Method]: ...
    @property
    def passthrough(self) -> Method | None: ...
    @property
    def flights(self) -> Mapping[CacheKey, Flight]: ...

    def open_flight(
        self, key: CacheKey, params: bytes | None, spec: Method, tag: bytes | None
    ) -> Flight: ...

    def land(self, flight: Flight, result: bytes | None, error: bytes | None) -> None: ...
    def land_replies(
        self,
        flights: list[Flight],
        first_id: int,
        replies: Sequence[Reply],
        look: Callable[[Flight, bytes], None],
        bad: Callable[[], bytes],
        missing: bytes,
    ) -> None:
        """Land a group's upstream answer, each reply on the flight its upstream id names."""
        ...

    def wants(self, flights: list[Flight], length: int) -> bool: ...
    def refuse(self, reason: str, executed: bool, calls: int = ...) -> bytes: ...

    def classify(self, call: Call) -> tuple[Method | None, bytes | None, bool]:
        """(method row, raw block tag, tag valid) of a well-formed call."""
        ...

    def not_found(self, call: Call) -> bytes | None:
        """The reply to a call of a method this network does not serve (None: a
        notification)."""
        ...

    def bad_tag(self, call: Call) -> bytes | None:
        """The reply to a call with a block tag no node understands."""
        ...

    def logs_fit(self, params: bytes | None, principal: Any) -> bool:
        """Does this eth_getLogs go upstream as it is (a range within the caller's limit and
        one upstream call)?  False: the handler refuses, splits or forwards it."""
        ...


class Admission(MeterSink[P], Protocol[P]):
    """Who may call and what it costs, on the lane: ``OpenAdmission`` or ``KeyAdmission``
    (``P``: the principals it was given, which it hands back); the meters' one sink,
    ``record`` (``twintypes.metering``)."""

    # Set by the key gate when processes share limits (Redis); None otherwise.
    shared: SharedLimits[P] | None

    def principal(
        self, request: Request, group: str, testnet: bool, key: bytes | None = ...
    ) -> P | None: ...

    def admit(
        self, principal: P, reads: bool, writes: bool, requests: int, cu: int, tcu: int
    ) -> Rejection | None: ...

    def headers(self, principal: P) -> bytes: ...


class Ledger(Protocol):
    """What every answered request leaves behind: status count, latency, access-log line."""

    def note(
        self,
        route: str,
        status: int,
        request_id: bytes,
        peer: str,
        method: bytes,
        path: str,
        started: float,
        size: int,
        label: str,
        cache: bytes,
    ) -> float: ...


class Lane(Protocol):
    """Every JSON-RPC endpoint's fast path."""

    sink: Sink | None
    served: int

    # What the edge loop shares with the lane to note its own answers like the lane's.
    @property
    def ids(self) -> RequestIds: ...
    @property
    def ledger(self) -> Ledger: ...
    @property
    def log_path(self) -> Callable[[bytes], str]: ...

    def serve(self, conn: ConnHandle, request: Request, peer: str, group: str) -> Answer | str: ...

    def hold(self) -> None:
        """Until ``release``, new retry-safe flights (single calls' and batches') wait (to go
        upstream together): the edge loop holds them while it serves one readiness."""
        ...

    def release(self) -> None: ...


# The module Protocol's members shadow the class names inside its body.
_MethodStats: TypeAlias = MethodStats
_AnswerBudget: TypeAlias = AnswerBudget
_ResponseCache: TypeAlias = ResponseCache
_RequestIds: TypeAlias = RequestIds
_LatencyMeter: TypeAlias = LatencyMeter
_Route: TypeAlias = Route
_Admission: TypeAlias = Admission
_Ledger: TypeAlias = Ledger
_Lane: TypeAlias = Lane


class FastlaneModule(Protocol):
    """The module: its classes' constructors and the markers ``serve`` answers."""

    @property
    def IMPLEMENTATION(self) -> str: ...
    @property
    def HANDOFF(self) -> str: ...
    @property
    def DEFER(self) -> str: ...

    def MethodStats(self) -> _MethodStats: ...
    def presented_key(self, request: Presenter, path_key: bytes | None = ...) -> bytes | None: ...
    def split_path_key(self, path: bytes) -> tuple[bytes, bytes | None]: ...
    def logs_limit(self, network_blocks: int, plan_blocks: int) -> int: ...
    def log_filter_ends(self, params: bytes) -> tuple[bytes, bytes, bytes] | None: ...
    def logs_verdict(self, low: int, high: int, limit_blocks: int, upstream_blocks: int) -> int: ...
    @property
    def LOGS_FORWARD(self) -> int: ...
    @property
    def LOGS_REFUSE(self) -> int: ...
    @property
    def LOGS_SPLIT(self) -> int: ...
    def AnswerBudget(self, limit: int) -> _AnswerBudget: ...
    def ResponseCache(self, max_entries: int, max_bytes: int) -> _ResponseCache: ...
    def RequestIds(self, prefix: bytes) -> _RequestIds: ...
    def LatencyMeter(self, bounds: tuple[float, ...]) -> _LatencyMeter: ...

    def Route(
        self,
        label: str,
        family: str,
        testnet: bool,
        methods: Mapping[str, MethodSpec],
        passthrough: MethodSpec | None,
        cache: _ResponseCache,
        jsonrpc: JsonRpcModule,
        *,
        max_batch: int,
        max_answer: int,
        coalesce: bool,
        upstream_batch: int,
        refusals: dict[str, bytes],
        python_methods: frozenset[str] = ...,
        sticky: Sticky | None = ...,
        sticky_methods: frozenset[str] = ...,
        logs: tuple[int, int] | None = ...,
        watched: frozenset[str] = ...,
    ) -> _Route: ...

    def OpenAdmission(self, anonymous: P) -> _Admission[P]: ...

    def KeyAdmission(
        self,
        gate: AdmissionGate,
        recent: Mapping[bytes, P],
        failures: Mapping[str, FailureBucket],
        used: set[str],
    ) -> _Admission[P]: ...

    def Ledger(
        self,
        statuses: Mapping[str, MutableMapping[int, int]],
        latency: Mapping[str, LatencySample],
        access_log: AccessLogSink,
    ) -> _Ledger: ...

    def Lane(
        self,
        routes: Mapping[bytes, _Route],
        admission: _Admission[Any],
        ledger: _Ledger,
        ids: _RequestIds,
        cors: Callable[[bytes | None], bytes],
        error_body: ErrorBody,
        log_path: Callable[[bytes], str],
    ) -> _Lane: ...

"""The upstream pool of one chain/network: health, ranking, failover, probing, deadlines.

Selection: upstreams are ranked by health class (up and current, then up but lagging or
throttled, then down) and, within a class, by latency (EWMA).  A call goes to the first; if it
fails in a way that allows another try it moves down the list, within the call's deadline.

Retry rules (see docs/decisions/rpc.md, "Upstreams"):

* a call that provably never left (connect failure, or its bytes were still queued when the
  connection broke) may always go to the next upstream — reads and writes alike;
* a call an HTTP/2 node provably did not process (its stream refused with REFUSED_STREAM, or
  above a GOAWAY's last-stream-id) is sent again to the same node on another stream, at most
  ``MAX_REFUSALS`` times (``Upstream.send``), then to the next — reads and writes alike;
* a node's 429 means it refused the call unexecuted, so it too may go elsewhere;
* anything else (timeout, connection lost after sending, 5xx) is retried only for calls the
  method table marks retry-safe.  A write gets an "outcome unknown" error instead.

Health: a connect failure or an implausible head takes an upstream out at once; other failures
(an answer that is not JSON-RPC among them) after ``failure_threshold`` in a row.  A probe task
asks every upstream for its head each ``probe_interval``; ``HeadJudge`` (heads.py) weighs the
heads against each other and the follower — that measures head lag, decides the head finality
is judged from, and is how a failed upstream is probed back in.  Every move in or out of
rotation is logged once, with the pool, the upstream's name and the reason.

Transport: an ``https://`` upstream offers HTTP/2 and HTTP/1.1 by ALPN (``http_version``
forces one).  HTTP/2 is one multiplexed connection (h2connection.py) — another only when its
streams are all in use, up to ``max_connections``; HTTP/1.1 is a few pipelined connections
(connection.py).  Both give the same guarantees about what was sent.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import re
import ssl
from collections.abc import Callable
from time import perf_counter
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import trio

from chaingate import netio
from chaingate.config import NetworkSettings, RpcSettings, UpstreamSettings
from chaingate.rpc.connection import (
    H2,
    HTTP1,
    Transport,
    UpstreamConnection,
    Wanted,
    open_transport,
)
from chaingate.rpc.errors import (
    ABANDONED,
    BAD_RESPONSE,
    CONNECT,
    HEAD_OUTLIER,
    HTTP_STATUS,
    REFUSED,
    THROTTLED,
    UNAVAILABLE,
    UpstreamError,
)
from chaingate.rpc.future import Future
from chaingate.rpc.h2connection import Http2Connection
from chaingate.rpc.heads import HeadJudge, Witness, witness_head
from chaingate.rpc.hedging import Hedger
from chaingate.twins import Impl
from chaingate.twintypes.http1 import Response
from chaingate.twintypes.jsonrpc import ParsedResponse

Connection = UpstreamConnection | Http2Connection

log = logging.getLogger("chaingate.upstream")

# HTTP statuses after which a retry-safe call goes to the next upstream.
FAILOVER_STATUSES = frozenset({401, 403, 404, 408, 500, 502, 503, 504})
MAX_THROTTLE_SECONDS = 30.0
IDLE_CONNECTION_SECONDS = 60.0
WATCHDOG_INTERVAL = 0.1
MAX_REFUSALS = 2  # sends again of a call an HTTP/2 node refused unprocessed (per upstream)
# ALPN offers by ``http_version``: HTTP/2 first where it may be chosen.
ALPN = {"auto": [H2, HTTP1], "h2": [H2], "http1": [HTTP1]}

UP, LAGGING, DOWN = 0, 1, 2

_JSON_START = re.compile(rb"[ \t\r\n]*[\[{]")

# Failures that take an upstream out at once rather than after ``failure_threshold``.
_IMMEDIATE = frozenset({CONNECT, HEAD_OUTLIER})


class Health:
    """Health bookkeeping of one upstream; pure state, no I/O."""

    __slots__ = (
        "consecutive_failures",
        "errors",
        "head",
        "lag",
        "latency",
        "requests",
        "state_down",
        "throttle_noted",
        "throttled_until",
    )

    def __init__(self) -> None:
        self.state_down = False
        self.consecutive_failures = 0
        self.latency = 0.0  # EWMA of successful call latency, seconds (0 = no sample yet)
        self.head: int | None = None
        self.lag = 0
        self.throttled_until = 0.0
        self.throttle_noted = False  # a throttle was logged and its end is not yet
        self.requests = 0
        self.errors: dict[str, int] = {}

    def record_success(self, latency: float) -> None:
        self.requests += 1
        self.consecutive_failures = 0
        self.latency = latency if self.latency == 0.0 else self.latency * 0.9 + latency * 0.1

    def note_latency(self, latency: float) -> None:
        """A latency seen without an answer (a hedged call abandoned after this long)."""
        self.latency = latency if self.latency == 0.0 else self.latency * 0.9 + latency * 0.1

    def record_failure(self, kind: str, threshold: int) -> bool:
        """Count a failure; True when this takes the upstream out of rotation."""
        self.requests += 1
        self.errors[kind] = self.errors.get(kind, 0) + 1
        self.consecutive_failures += 1
        if self.state_down:
            return False
        if kind in _IMMEDIATE or self.consecutive_failures >= threshold:
            self.state_down = True
            return True
        return False

    def bring_back(self) -> bool:
        """A good probe: True when this puts the upstream back in rotation."""
        if not self.state_down:
            return False
        self.state_down = False
        self.consecutive_failures = 0
        return True

    def rank(self, now: float, max_lag: int) -> tuple[int, float]:
        if self.state_down:
            return (DOWN, self.latency)
        if self.lag > max_lag or self.throttled_until > now:
            return (LAGGING, self.latency)
        return (UP, self.latency)


class Upstream:
    """One node: its connections and its health."""

    def __init__(
        self, settings: UpstreamSettings, impl: Impl, pipeline_nursery: trio.Nursery
    ) -> None:
        self.settings = settings
        self.name = settings.display_name()
        parts = urlsplit(settings.url)
        self.host = parts.hostname or ""
        self.tls = parts.scheme == "https"
        self.port = parts.port or (443 if self.tls else 80)
        path = parts.path or "/"
        self._path = (path + ("?" + parts.query if parts.query else "")).encode()
        default_port = 443 if self.tls else 80
        host_header = self.host if self.port == default_port else f"{self.host}:{self.port}"
        self._host_header = host_header.encode()
        self._headers = b"".join(
            f"{name}: {value}\r\n".encode() for name, value in settings.headers.items()
        )
        self._impl = impl
        self._frame = functools.partial(
            impl.http1.build_request, self._path, self._host_header, self._headers
        )
        self._nursery = pipeline_nursery
        self._tls_context: ssl.SSLContext | None = None
        if self.tls:
            self._tls_context = ssl.create_default_context(cafile=settings.ca_file)
            self._tls_context.set_alpn_protocols(ALPN[settings.http_version])
        self.connections: list[Connection] = []
        # Connections whose oldest request was abandoned to a hedge: nothing more is pipelined
        # behind that slow answer (HTTP/1.1 answers in order) until they drain.
        self.stalled: set[Connection] = set()
        self.closed = False
        self._opening: Future[Connection] | None = None
        self._growing = False  # a spare connection is being opened (ready(spread=True))
        self.health = Health()

    async def send(
        self,
        body: bytes,
        deadline: float,
        *,
        prefer_idle: bool = False,
        using: list[tuple[Upstream, Connection]] | None = None,
        wanted: Wanted | None = None,
    ) -> Any:
        """One JSON-RPC body to this node: its HTTP response, or UpstreamError.

        A call the node refused unprocessed (HTTP/2) goes again on another stream — of a new
        connection after a GOAWAY — at most MAX_REFUSALS times: not a failure of the node, and
        safe for a write.  ``using`` collects the connections tried (for the hedger)."""
        refusals = 0
        while True:
            conn = await self.acquire(prefer_idle=prefer_idle)
            if using is not None:
                using.append((self, conn))
            try:
                return await conn.submit(body, deadline, wanted).wait()
            except UpstreamError as exc:
                if exc.kind != REFUSED or refusals == MAX_REFUSALS:
                    raise
                refusals += 1
                self.health.errors[REFUSED] = self.health.errors.get(REFUSED, 0) + 1

    def ready(
        self, *, prefer_idle: bool = False, spread: bool = False
    ) -> UpstreamConnection | None:
        """An open HTTP/1.1 connection with room for one more request right now, as
        ``acquire`` would choose it; None when it would have to wait (open one, an HTTP/2
        connection's refusals to retry): then ``acquire``'s path is taken.

        ``spread`` (the fast lane's groups of reads, each already one upstream batch): an
        idle connection first, else the least loaded with room while another one opens
        (up to ``max_connections``).  A node answers one connection's pipeline in order, one
        call after the other, so its other cores serve only other connections' calls."""
        if self.closed:
            return None
        depth = self.settings.pipeline_depth
        least: UpstreamConnection | None = None
        for conn in self.connections:
            if conn.multiplexed or conn.closed:  # HTTP/2 (told without a call: hot path)
                return None
            if TYPE_CHECKING:  # what ``multiplexed`` says, for mypy
                assert isinstance(conn, UpstreamConnection)
            if self.stalled and conn in self.stalled:
                continue
            if not conn.pending:
                return conn
            in_flight = len(conn.pending)
            if not prefer_idle and not spread and in_flight < depth:
                return conn
            if spread and in_flight < depth and (least is None or in_flight < len(least.pending)):
                least = conn
        if least is not None:
            self._grow()
        return least

    def _grow(self) -> None:
        """Open one more connection in the background, when there is room for it."""
        if not self._growing and self._room():
            self._growing = True
            self._nursery.start_soon(self._open_spare)

    def _room(self) -> bool:
        return (
            self._opening is None
            and not self.closed
            and len(self.connections) - len(self.stalled) < self.settings.max_connections
        )

    async def _open_spare(self) -> None:
        try:
            if self._room():
                with contextlib.suppress(UpstreamError):  # unreachable: the calls will say so
                    await self._open()
        finally:
            self._growing = False

    async def acquire(self, *, prefer_idle: bool = False) -> Connection:
        """A connection for one more request: fill the first with room, else open another.

        Filling one connection before the next keeps pipelines deep, which is what makes
        the proxy cheap per request; ``prefer_idle`` (used for writes) looks for an HTTP/1.1
        connection with nothing in flight, so a write never waits behind — or dies with — a
        slow read.  (HTTP/2 streams wait on nobody: a write shares the connection.)
        """
        settings = self.settings
        if self.closed:
            raise UpstreamError(UNAVAILABLE, "pool shut down", sent=False, upstream=self.name)
        while True:
            least: Connection | None = None
            for conn in self.connections:
                in_flight = len(conn.pending)
                if isinstance(conn, Http2Connection):
                    if conn.draining:
                        continue
                    if in_flight < conn.capacity:
                        return conn
                else:
                    if self.stalled and conn in self.stalled:
                        if in_flight:
                            continue
                        self.stalled.discard(conn)
                    if in_flight == 0 or (not prefer_idle and in_flight < settings.pipeline_depth):
                        return conn
                if least is None or in_flight < len(least.pending):
                    least = conn
            if self._opening is not None:
                await self._opening.wait()
                continue
            if len(self.connections) - len(self.stalled) >= settings.max_connections and (
                least is not None
            ):
                return least
            return await self._open()

    async def _open(self) -> Connection:
        # Tasks that need a connection while this one opens wait on ``opening`` and share
        # its outcome, so a dead node costs one connect attempt, not one per waiting call.
        opening: Future[Connection] = Future()
        self._opening = opening
        try:
            try:
                with trio.fail_after(self.settings.connect_timeout):
                    transport = await open_transport(self.host, self.port, self._tls_context)
            except (OSError, trio.TooSlowError, trio.BrokenResourceError, ssl.SSLError) as exc:
                # BrokenResourceError: trio's wrapping of a failed TLS handshake.
                raise UpstreamError(
                    CONNECT,
                    f"cannot connect: {exc.__class__.__name__}",
                    sent=False,
                    upstream=self.name,
                ) from None
            conn = self._connection(transport)
            self.connections.append(conn)
            self._nursery.start_soon(conn.run, self._forget)
        except BaseException as exc:
            opening.set_exception(
                exc
                if isinstance(exc, UpstreamError)
                else UpstreamError(CONNECT, "connect cancelled", sent=False, upstream=self.name)
            )
            raise
        finally:
            self._opening = None
        opening.set_result(conn)
        return conn

    def _connection(self, transport: Transport) -> Connection:
        """The connection for what ALPN chose."""
        http1 = self._impl.http1
        if transport.protocol == H2:
            return Http2Connection(
                self.name,
                transport,
                authority=self._host_header,
                path=self._path,
                headers=[
                    (name.lower().encode(), value.encode())
                    for name, value in self.settings.headers.items()
                ],
                max_body=self.settings.max_response_bytes,
                response_type=http1.Response,
            )
        if self.settings.http_version == "h2":
            transport.close()
            raise UpstreamError(
                CONNECT, "the upstream did not agree to HTTP/2 (ALPN)", sent=False,
                upstream=self.name,
            )  # fmt: skip
        parser = http1.ResponseParser(max_body=self.settings.max_response_bytes)
        return UpstreamConnection(self.name, transport, parser, http1.HttpError, self._frame)

    def _forget(self, conn: Connection) -> None:
        """``conn`` closed (``run`` ended)."""
        if conn in self.connections:
            self.connections.remove(conn)
        self.stalled.discard(conn)

    def expire(self, now: float) -> None:
        """Fail requests past their deadline (each connection kind its way); close idle
        connections."""
        for conn in list(self.connections):
            conn.expire(now, IDLE_CONNECTION_SECONDS)

    def close(self) -> None:
        """The pool is shutting down: abort every connection and open no new one (its nursery
        is about to close; a caller in a shielded shutdown path gets an UpstreamError)."""
        self.closed = True
        for conn in list(self.connections):
            conn.abort(UNAVAILABLE, "pool shutting down")


class UpstreamPool:
    """All upstreams of one chain/network.  ``run()`` must be running while requests are made."""

    def __init__(
        self,
        label: str,
        network: NetworkSettings,
        rpc: RpcSettings,
        impl: Impl,
        probe_body: bytes,
        parse_head: Callable[[bytes], int | None],
    ) -> None:
        self.label = label
        self._network = network
        self._rpc = rpc
        self._impl = impl
        self._parse_response = impl.jsonrpc.parse_response
        self._probe_body = probe_body
        self._parse_head = parse_head
        self.upstreams: list[Upstream] = []
        self._ranked: list[Upstream] = []
        block_time = max(network.block_time, 0.001)
        slack = network.max_head_lag + math.ceil(max(rpc.max_head_lead, 0.0) / block_time)
        self.judge = HeadJudge(block_time, slack)
        # Told the agreed head each time it moves (only note_head and _judge_round move it):
        # the RPC service keeps the lane's bound of what is final with it.
        self.on_head: Callable[[int | None], None] = _ignore_head
        # A source of heads that does not come from probes (the chain follower), set by the
        # gateway once both exist; consulted on every probe round.
        self.witness: Witness | None = None
        self._nursery: trio.Nursery | None = None
        # The run's clock as an offset from perf_counter (netio.clock_offset), known once
        # running; None: ask trio.current_time() (another clock, or not running yet).
        self._clock: float | None = None
        self._by_name: dict[str, Upstream] = {}
        # Hedged reads (hedging.py): on per network, off by default.
        self.hedger = Hedger(network.hedging) if network.hedging.enabled else None

    @property
    def head(self) -> int | None:
        """The agreed head (see heads.py): the one finality is decided from."""
        return self.judge.head

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._clock = netio.clock_offset()
            self.upstreams = [Upstream(u, self._impl, nursery) for u in self._network.upstreams]
            self._ranked = list(self.upstreams)
            self._by_name = {upstream.name: upstream for upstream in self.upstreams}
            nursery.start_soon(self._watchdog)
            nursery.start_soon(self._prober)
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None  # nothing more can be started in it
                self._clock = None
                for upstream in self.upstreams:
                    upstream.close()

    def ranked(self) -> list[Upstream]:
        return self._ranked

    @property
    def upstreams_up(self) -> int:
        return sum(1 for upstream in self.upstreams if not upstream.health.state_down)

    def _rerank(self) -> None:
        now = trio.current_time()
        max_lag = self._network.max_head_lag
        self._ranked = sorted(self.upstreams, key=lambda u: u.health.rank(now, max_lag))

    async def request(
        self,
        body: bytes,
        *,
        retry_safe: bool,
        deadline: float,
        prefer: str | None = None,
        prefer_idle: bool = False,
    ) -> tuple[Upstream, Response]:
        """Send one JSON-RPC body; the answering upstream and its HTTP response.

        For chaingate's own callers, which decode the body themselves: an answer is only
        checked to be JSON at all (an HTML page fails over and counts against health).
        ``prefer``: an upstream to ask first, as ``request_parsed``'s; ``prefer_idle``: a
        connection with nothing in flight, as writes get (a slow call — a trace — then holds
        no pipeline of quick ones behind it)."""
        order = self._ranked if prefer is None else self._order(prefer)
        upstream, response, _ = await self._exchange(
            body, retry_safe, deadline, False, order, prefer_idle=prefer_idle
        )
        return upstream, response

    async def request_parsed(
        self,
        body: bytes,
        *,
        retry_safe: bool,
        deadline: float,
        prefer: str | None = None,
        wanted: Wanted | None = None,
    ) -> tuple[Upstream, Any, Any]:
        """Send one JSON-RPC body; the answering upstream, its response and the response's
        JSON-RPC framing (``parse_response``), which is checked here: an answer that is not
        JSON-RPC is a failure of the upstream, like a 5xx, not a success to pass on.

        ``prefer``: an upstream to ask first (read-your-writes, stickiness.py); after it,
        upstreams whose head is at least its head, then the rest.  Retry-safe calls may be
        hedged (hedging.py) when the network turns it on."""
        order = self._ranked if prefer is None else self._order(prefer)
        if self.hedger is None or not retry_safe or len(order) < 2:
            return await self._exchange(body, retry_safe, deadline, True, order, wanted=wanted)
        return await self._hedged(body, deadline, order, self.hedger)

    def submit(
        self,
        body: bytes,
        *,
        retry_safe: bool,
        timeout: float,
        done: Callable[[Any], None],
        wanted: Wanted | None = None,
    ) -> None:
        """``request_parsed`` for a caller that would rather be called back than wait, within
        ``timeout`` seconds from now: ``done`` gets ``(upstream, response, parsed)`` or the
        ``UpstreamError``, exactly once.

        When the first upstream has an HTTP/1.1 connection with room, the request goes on it
        at once and its answer is judged where it is read (the connection's reader, which
        settles a ``_FirstAttempt``): no task.  Anything that must wait — a connection to
        open, another upstream to try after a failure, a hedge — continues in a task, by
        ``request_parsed``'s own rules.

        ``wanted`` (a batch's group): asked when the answer's body starts; when nobody wants
        it any more the body is dropped unread and ``done`` gets an ``ABANDONED`` error."""
        clock = self._clock
        started = clock + perf_counter() if clock is not None else trio.current_time()
        deadline = started + timeout
        order = self._ranked
        if order and (self.hedger is None or not retry_safe or len(order) < 2):
            upstream = order[0]
            conn = upstream.ready(prefer_idle=not retry_safe, spread=retry_safe)
            if conn is not None and started < deadline:
                attempt = _FirstAttempt(
                    self, upstream, started, body, retry_safe, deadline, done, wanted
                )
                attempt_deadline = started + upstream.settings.timeout
                if deadline < attempt_deadline:  # min() without a call
                    attempt_deadline = deadline
                # At once, not by the connection's writer task: the lane sends one group per
                # readiness (Lane.hold), so there is nothing to gather, only a task to wake.
                conn.send(attempt, body, attempt_deadline, wanted, now=True)
                return
        self._continue(body, retry_safe, deadline, done, None, None, wanted)

    def _continue(
        self,
        body: bytes,
        retry_safe: bool,
        deadline: float,
        done: Callable[[Any], None],
        last: UpstreamError | None,
        order: list[Upstream] | None,
        wanted: Wanted | None,
    ) -> None:
        if self._nursery is None:
            done(last or UpstreamError(UNAVAILABLE, "the pool is not running", sent=False))
            return
        self._nursery.start_soon(
            self._finish, body, retry_safe, deadline, done, last, order, wanted
        )

    async def _finish(
        self,
        body: bytes,
        retry_safe: bool,
        deadline: float,
        done: Callable[[Any], None],
        last: UpstreamError | None,
        order: list[Upstream] | None,
        wanted: Wanted | None,
    ) -> None:
        # If this task is cancelled (shutdown), the call may have left: say so.
        outcome: Any = UpstreamError(UNAVAILABLE, "request cancelled", sent=True)
        try:
            if order is None:
                outcome = await self.request_parsed(
                    body, retry_safe=retry_safe, deadline=deadline, wanted=wanted
                )
            elif order:
                outcome = await self._exchange(
                    body, retry_safe, deadline, True, order, last=last, wanted=wanted
                )
            else:
                outcome = last
        except UpstreamError as exc:
            outcome = exc
        finally:
            done(outcome)

    async def broadcast(self, body: bytes, *, deadline: float) -> tuple[Upstream, Any, Any]:
        """A write every upstream in rotation takes at once (methods.toml ``broadcast``: a
        Solana transaction, idempotent by its signature, so a node that sees it twice
        executes it once).  The answer: the first reply with a result; else, once all have
        answered, the first node's error reply (a preflight failure is the node's to tell);
        else the first failure.  The attempts left when the answer is chosen run on in the
        pool's nursery (their replies dropped): every node still gets the transaction.

        A single upstream in rotation (or none): an ordinary write, by the ranking."""
        targets = [u for u in self._ranked if not u.health.state_down]
        nursery = self._nursery
        if len(targets) < 2 or nursery is None:
            return await self._exchange(body, False, deadline, True, self._ranked)
        answered = trio.Event()
        replies: list[tuple[Upstream, Any, Any]] = []
        failures: list[UpstreamError] = []
        winner: list[tuple[Upstream, Any, Any]] = []

        async def attempt(upstream: Upstream) -> None:
            try:
                got = await self._exchange(body, False, deadline, True, [upstream])
            except UpstreamError as exc:
                failures.append(exc)
            else:
                replies.append(got)
                if not winner and got[2].replies[0].result is not None:
                    winner.append(got)
            finally:
                if winner or len(replies) + len(failures) == len(targets):
                    answered.set()

        for upstream in targets:
            nursery.start_soon(attempt, upstream)
        await answered.wait()
        if winner:
            return winner[0]
        if replies:
            return replies[0]
        raise failures[0]

    def _order(self, prefer: str) -> list[Upstream]:
        first = self._by_name.get(prefer)
        if first is None:
            return self._ranked
        mark = first.health.head
        rest = [u for u in self._ranked if u is not first]
        if mark is None:
            return [first, *rest]
        caught_up = [u for u in rest if u.health.head is not None and u.health.head >= mark]
        behind = [u for u in rest if u.health.head is None or u.health.head < mark]
        return [first, *caught_up, *behind]

    async def _hedged(
        self, body: bytes, deadline: float, order: list[Upstream], hedger: Hedger
    ) -> tuple[Upstream, Any, Any]:
        """A retry-safe call sent to ``order``; if no answer within the first upstream's
        adaptive delay (and the budget allows), sent as well to the next ones.  The first
        answer wins; the other attempt is cancelled (its late answer is discarded)."""
        hedger.earn()
        first = order[0]
        started = trio.current_time()
        winner: tuple[Upstream, Any, Any] | None = None
        hedge_won = False
        failures: list[UpstreamError] = []
        primary_done = trio.Event()
        using: list[tuple[Upstream, Connection]] = []

        async def attempt(upstreams: list[Upstream], hedge: bool, scope: trio.CancelScope) -> None:
            nonlocal winner, hedge_won
            try:
                got = await self._exchange(
                    body, True, deadline, True, upstreams, None if hedge else using
                )
            except UpstreamError as exc:
                failures.append(exc)
                return
            finally:
                if not hedge:
                    primary_done.set()
            if winner is None:
                winner, hedge_won = got, hedge
                scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(attempt, order, False, nursery.cancel_scope)
            with trio.move_on_after(hedger.delay(first.name)):
                await primary_done.wait()
            if not primary_done.is_set() and winner is None and hedger.take():
                nursery.start_soon(attempt, order[1:], True, nursery.cancel_scope)
        if winner is None:
            raise (
                failures[0]
                if failures
                else UpstreamError(
                    UNAVAILABLE, "no upstream answered before the deadline", sent=False
                )
            )
        if hedge_won:
            hedger.won += 1
            # The primary was abandoned: at least this slow.  Counted in its p95 and its
            # latency, and the ranking redone: its pipeline is stuck behind the slow answer,
            # so the next calls had better start elsewhere.
            elapsed = trio.current_time() - started
            hedger.observe(first.name, elapsed)
            first.health.note_latency(elapsed)
            if using:
                upstream, conn = using[-1]
                if conn.pending and not conn.closed and not conn.multiplexed:
                    upstream.stalled.add(conn)
            self._rerank()
        return winner

    async def _exchange(
        self,
        body: bytes,
        retry_safe: bool,
        deadline: float,
        parse: bool,
        order: list[Upstream],
        using: list[tuple[Upstream, Connection]] | None = None,
        *,
        last: UpstreamError | None = None,
        prefer_idle: bool = False,
        wanted: Wanted | None = None,
    ) -> tuple[Upstream, Any, Any]:
        """``last``: the failure of an attempt made before (``submit``'s first), what the
        caller hears if no upstream of ``order`` does better.  Writes, and ``prefer_idle``
        callers, ask for a connection with nothing in flight."""
        for upstream in order:
            now = trio.current_time()
            if now >= deadline:
                break
            attempt_deadline = min(deadline, now + upstream.settings.timeout)
            try:
                response = await upstream.send(
                    body,
                    attempt_deadline,
                    prefer_idle=prefer_idle or not retry_safe,
                    using=using,
                    wanted=wanted,
                )
            except UpstreamError as exc:
                if exc.kind == ABANDONED:
                    raise
                self._failed(upstream, exc)
                last = exc
                if exc.sent and not retry_safe:
                    raise
                continue
            try:
                parsed = self._judge(upstream, response, body, parse, now)
            except UpstreamError as exc:
                last = exc
                if exc.sent and not retry_safe:
                    raise
                continue
            return upstream, response, parsed
        raise last or UpstreamError(
            UNAVAILABLE, "no upstream answered before the deadline", sent=False
        )

    def _judge(
        self,
        upstream: Upstream,
        response: Response,
        body: bytes,
        parse: bool,
        started: float,
    ) -> Any:
        """One attempt's HTTP answer judged: its JSON-RPC framing (``parse``) when it is an
        answer, counted a success; else an UpstreamError (throttled, a status to fail over
        on, not JSON-RPC), counted against the upstream."""
        status = response.status
        if status == 429:
            self._throttled(upstream, response.retry_after)
            raise UpstreamError(
                THROTTLED,
                "upstream rate limit (HTTP 429)",
                sent=False,
                upstream=upstream.name,
                status=429,
            )
        if status in FAILOVER_STATUSES:
            refused = UpstreamError(
                HTTP_STATUS,
                f"upstream answered HTTP {status}",
                sent=True,
                upstream=upstream.name,
                status=status,
            )
            self._failed(upstream, refused)
            raise refused
        parsed: Any = None
        if parse:
            parsed = self._parse_response(response.body)
            batch = body[0] == 0x5B  # "["
            # The usual case inline (the proxy's hot path); the rest in _is_answer.
            if parsed is not None and (
                parsed.batch if batch else not parsed.batch and parsed.replies[0].result
            ):
                answer = True
            else:
                answer = _is_answer(parsed, batch)
        else:
            answer = _looks_like_json(response.body)
        if not answer:
            bad = UpstreamError(
                BAD_RESPONSE,
                f"upstream {upstream.name} answered HTTP {status} with no valid JSON-RPC",
                sent=True,
                upstream=upstream.name,
                status=status,
            )
            self._failed(upstream, bad)
            raise bad
        clock = self._clock
        latency = (clock + perf_counter() if clock is not None else trio.current_time()) - started
        upstream.health.record_success(latency)
        if self.hedger is not None:
            self.hedger.observe(upstream.name, latency)
        return parsed

    def _failed(self, upstream: Upstream, exc: UpstreamError) -> None:
        self._failure(upstream, exc.kind)

    def _failure(self, upstream: Upstream, kind: str) -> None:
        if upstream.health.record_failure(kind, self._rpc.failure_threshold):
            self._log_rotation(upstream, "upstream out of rotation", kind)
            self._rerank()

    def _log_rotation(
        self, upstream: Upstream, message: str, reason: str, level: int = logging.WARNING
    ) -> None:
        # The upstream's configured name only: its URL may carry a provider key.
        log.log(
            level,
            message,
            extra={"fields": {"pool": self.label, "upstream": upstream.name, "reason": reason}},
        )

    def _throttled(self, upstream: Upstream, retry_after: bytes | None) -> None:
        seconds = 1.0
        if retry_after is not None and retry_after.isdigit() and len(retry_after) < 6:
            seconds = min(float(retry_after), MAX_THROTTLE_SECONDS)
        health = upstream.health
        if not health.throttle_noted:
            health.throttle_noted = True
            self._log_rotation(upstream, "upstream throttled", THROTTLED)
        health.throttled_until = trio.current_time() + seconds
        health.errors[THROTTLED] = health.errors.get(THROTTLED, 0) + 1
        self._rerank()

    def note_head(self, head: int) -> None:
        """A head seen in a client's answer (eth_blockNumber): believed as far as time allows."""
        judge = self.judge
        before = judge.head
        judge.note(head, trio.current_time())
        if judge.head != before:
            self.on_head(judge.head)

    async def _watchdog(self) -> None:
        while True:
            await trio.sleep(WATCHDOG_INTERVAL)
            now = trio.current_time()
            for upstream in self.upstreams:
                upstream.expire(now)

    async def _prober(self) -> None:
        while True:
            results: dict[str, tuple[int | None, str, float]] = {}
            async with trio.open_nursery() as nursery:
                for upstream in self.upstreams:
                    nursery.start_soon(self._probe, upstream, results)
            self._judge_round(results)
            await trio.sleep(self._rpc.probe_interval)

    async def _probe(
        self, upstream: Upstream, results: dict[str, tuple[int | None, str, float]]
    ) -> None:
        """Ask one upstream for its head: (head, "", latency) or (None, failure kind, 0)."""
        now = trio.current_time()
        deadline = now + min(upstream.settings.timeout, max(self._rpc.probe_interval * 2, 1.0))
        try:
            response = await upstream.send(self._probe_body, deadline)
        except UpstreamError as exc:
            results[upstream.name] = (None, exc.kind, 0.0)
            return
        if response.status == 429:
            self._throttled(upstream, response.retry_after)
            return
        if response.status != 200:
            results[upstream.name] = (None, HTTP_STATUS, 0.0)
            return
        head = self._parse_head(response.body)
        if head is None:
            # Not a head, or one of more than 64 bits: the answer is malformed.
            results[upstream.name] = (None, BAD_RESPONSE, 0.0)
            return
        results[upstream.name] = (head, "", trio.current_time() - now)

    def _judge_round(self, results: dict[str, tuple[int | None, str, float]]) -> None:
        now = trio.current_time()
        heads = {name: head for name, (head, _, _) in results.items() if head is not None}
        before = self.judge.head
        verdict = self.judge.judge(heads, witness_head(self.witness), now)
        if self.judge.head != before:
            self.on_head(self.judge.head)
        for upstream in self.upstreams:
            health = upstream.health
            if health.throttle_noted and health.throttled_until <= now:
                health.throttle_noted = False
                self._log_rotation(upstream, "upstream throttle over", THROTTLED, logging.INFO)
            result = results.get(upstream.name)
            if result is None:
                continue
            head, kind, latency = result
            if head is None:
                self._failure(upstream, kind)
                continue
            health.head = head
            if upstream.name in verdict.outliers:
                self._failure(upstream, HEAD_OUTLIER)
                continue
            health.lag = verdict.lags.get(upstream.name, 0)
            health.record_success(latency)
            if health.bring_back():
                self._log_rotation(upstream, "upstream back in rotation", "probe_ok", logging.INFO)
        self._rerank()


class _FirstAttempt:
    """The first attempt of a ``submit`` on a connection with room: the connection's reader
    settles it with the answer (``Settle``), judged right there, and ``done`` told; a failure
    that allows another try continues in a task (``UpstreamPool._continue``).  Nothing it
    does may raise into the reader: a bug of ours is logged, and ``done`` still told."""

    __slots__ = ("body", "deadline", "done", "pool", "retry_safe", "started", "upstream", "wanted")

    def __init__(
        self,
        pool: UpstreamPool,
        upstream: Upstream,
        started: float,
        body: bytes,
        retry_safe: bool,
        deadline: float,
        done: Callable[[Any], None],
        wanted: Wanted | None,
    ) -> None:
        self.pool = pool
        self.upstream = upstream
        self.started = started
        self.body = body
        self.retry_safe = retry_safe
        self.deadline = deadline
        self.done = done
        self.wanted = wanted

    def set_result(self, response: Response) -> None:
        """The node answered: an answer is done; anything else, another try perhaps."""
        try:
            try:
                parsed = self.pool._judge(self.upstream, response, self.body, True, self.started)
            except UpstreamError as exc:
                self._failed(exc)
                return
            except Exception as exc:
                self._bug(exc)
                return
            self.done((self.upstream, response, parsed))
        except Exception:
            log.exception("an upstream answer could not be delivered")

    def set_exception(self, error: BaseException) -> None:
        """No answer (the connection failed it): counted against the node unless abandoned."""
        try:
            if not isinstance(error, UpstreamError):
                self._bug(error)
            elif error.kind == ABANDONED:
                self.done(error)
            else:
                self.pool._failed(self.upstream, error)
                self._failed(error)
        except Exception:
            log.exception("an upstream answer could not be delivered")

    def _failed(self, failure: UpstreamError) -> None:
        """Told to ``done``, or tried on the other upstreams when the call allows it."""
        if failure.sent and not self.retry_safe:
            self.done(failure)
            return
        pool = self.pool
        rest = [other for other in pool._ranked if other is not self.upstream]
        pool._continue(
            self.body, self.retry_safe, self.deadline, self.done, failure, rest, self.wanted
        )

    def _bug(self, error: BaseException) -> None:
        """A bug of ours, not the node's: the call may have left, and ``done`` is owed."""
        log.error("upstream attempt failed unexpectedly", exc_info=error)
        self.done(
            UpstreamError(BAD_RESPONSE, "internal error", sent=True, upstream=self.upstream.name)
        )


def _ignore_head(head: int | None) -> None:
    """No one told of head moves (a pool without a service)."""


def _looks_like_json(body: bytes) -> bool:
    """A cheap check for callers that decode the body themselves: an object or an array."""
    return _JSON_START.match(body) is not None


def _is_answer(parsed: ParsedResponse | None, batch: bool) -> bool:
    """Is a parsed response a JSON-RPC answer to what was sent (one call, or a batch)?"""
    if parsed is None:
        return False
    if parsed.batch:
        return batch
    reply = parsed.replies[0]
    error = reply.error
    if error is not None and error[:1] == b"{":
        return True  # an error object; for a batch, the node refusing it as a whole
    return not batch and reply.result is not None

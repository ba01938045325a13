"""The upstream pool of one chain/network: health, ranking, failover, probing, deadlines.

Selection: upstreams are ranked by health class (up and current, then up but lagging or
throttled, then down) and, within a class, by latency (EWMA).  A call goes to the first; if it
fails in a way that allows another try it moves down the list, within the call's deadline.

Retry rules (see docs/decisions.md):

* a call that provably never left (connect failure, or its bytes were still queued when the
  connection broke) may always go to the next upstream — reads and writes alike;
* a node's 429 means it refused the call unexecuted, so it too may go elsewhere;
* anything else (timeout, connection lost after sending, 5xx) is retried only for calls the
  method table marks retry-safe.  A write gets an "outcome unknown" error instead.

Health: a connect failure takes an upstream out at once; other failures after
``failure_threshold`` in a row.  A probe task asks every upstream for its head each
``probe_interval`` — that measures head lag and is how a failed upstream is probed back in.
"""

from __future__ import annotations

import logging
import ssl
from typing import Any
from urllib.parse import urlsplit

import trio

from chaingate.config import NetworkSettings, RpcSettings, UpstreamSettings
from chaingate.impl import Impl
from chaingate.rpc.connection import UpstreamConnection, open_transport
from chaingate.rpc.errors import (
    CONNECT,
    HTTP_STATUS,
    THROTTLED,
    TIMEOUT,
    UNAVAILABLE,
    UpstreamError,
)
from chaingate.rpc.future import Future

log = logging.getLogger("chaingate.upstream")

# HTTP statuses after which a retry-safe call goes to the next upstream.
FAILOVER_STATUSES = frozenset({401, 403, 404, 408, 500, 502, 503, 504})
MAX_THROTTLE_SECONDS = 30.0
IDLE_CONNECTION_SECONDS = 60.0
WATCHDOG_INTERVAL = 0.1

UP, LAGGING, DOWN = 0, 1, 2


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
        "throttled_until",
    )

    def __init__(self) -> None:
        self.state_down = False
        self.consecutive_failures = 0
        self.latency = 0.0  # EWMA of successful call latency, seconds (0 = no sample yet)
        self.head: int | None = None
        self.lag = 0
        self.throttled_until = 0.0
        self.requests = 0
        self.errors: dict[str, int] = {}

    def record_success(self, latency: float) -> None:
        self.requests += 1
        self.consecutive_failures = 0
        self.latency = latency if self.latency == 0.0 else self.latency * 0.9 + latency * 0.1

    def record_failure(self, kind: str, threshold: int) -> bool:
        """Count a failure; True when this takes the upstream out of rotation."""
        self.requests += 1
        self.errors[kind] = self.errors.get(kind, 0) + 1
        self.consecutive_failures += 1
        if self.state_down:
            return False
        if kind == CONNECT or self.consecutive_failures >= threshold:
            self.state_down = True
            return True
        return False

    def rank(self, now: float, max_lag: int) -> tuple[int, float]:
        if self.state_down:
            return (DOWN, self.latency)
        if self.lag > max_lag or self.throttled_until > now:
            return (LAGGING, self.latency)
        return (UP, self.latency)


class Upstream:
    """One node: its connections and its health."""

    def __init__(self, settings: UpstreamSettings, impl: Impl, pipeline_nursery: Any) -> None:
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
        self._nursery = pipeline_nursery
        self._tls_context = (
            ssl.create_default_context(cafile=settings.ca_file) if self.tls else None
        )
        self.connections: list[UpstreamConnection] = []
        self._opening: Future[UpstreamConnection] | None = None
        self.health = Health()

    def frame(self, body: bytes) -> bytes:
        build: Any = self._impl.http1.build_request
        result: bytes = build(self._path, self._host_header, self._headers, body)
        return result

    async def acquire(self, *, prefer_idle: bool = False) -> UpstreamConnection:
        """A connection for one more request: fill the first with room, else open another.

        Filling one connection before the next keeps pipelines deep, which is what makes
        the proxy cheap per request; ``prefer_idle`` (used for writes) looks for a connection
        with nothing in flight, so a write never waits behind — or dies with — a slow read.
        """
        settings = self.settings
        while True:
            least: UpstreamConnection | None = None
            for conn in self.connections:
                in_flight = len(conn.pending)
                if in_flight == 0 or (not prefer_idle and in_flight < settings.pipeline_depth):
                    return conn
                if least is None or in_flight < len(least.pending):
                    least = conn
            if self._opening is not None:
                await self._opening.wait()
                continue
            if len(self.connections) >= settings.max_connections and least is not None:
                return least
            return await self._open()

    async def _open(self) -> UpstreamConnection:
        # Tasks that need a connection while this one opens wait on ``opening`` and share
        # its outcome, so a dead node costs one connect attempt, not one per waiting call.
        opening: Future[UpstreamConnection] = Future()
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
            http1: Any = self._impl.http1
            parser = http1.ResponseParser(max_body=self.settings.max_response_bytes)
            conn = UpstreamConnection(self.name, transport, parser, http1.HttpError)
            self.connections.append(conn)
            self._nursery.start_soon(self._run_connection, conn)
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

    async def _run_connection(self, conn: UpstreamConnection) -> None:
        try:
            await conn.run()
        finally:
            if conn in self.connections:
                self.connections.remove(conn)

    def expire(self, now: float) -> None:
        """Abort connections whose oldest request is past its deadline; close idle ones."""
        for conn in list(self.connections):
            if conn.pending:
                if conn.pending[0].deadline <= now:
                    # HTTP/1.1 answers in order: a stuck head blocks the whole pipeline, so
                    # the connection goes; retry-safe calls behind it move to another node.
                    conn.abort(TIMEOUT, "no answer before the deadline")
            elif now - conn.last_active > IDLE_CONNECTION_SECONDS:
                conn.abort(TIMEOUT, "idle connection closed")

    def close(self) -> None:
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
        parse_head: Any,
    ) -> None:
        self.label = label
        self._network = network
        self._rpc = rpc
        self._impl = impl
        self._probe_body = probe_body
        self._parse_head = parse_head
        self.upstreams: list[Upstream] = []
        self._ranked: list[Upstream] = []
        self.head: int | None = None
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.upstreams = [Upstream(u, self._impl, nursery) for u in self._network.upstreams]
            self._ranked = list(self.upstreams)
            nursery.start_soon(self._watchdog)
            nursery.start_soon(self._prober)
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
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
        self, body: bytes, *, retry_safe: bool, deadline: float
    ) -> tuple[Upstream, Any]:
        """Send one JSON-RPC body; the answering upstream and its HTTP response."""
        last: UpstreamError | None = None
        for upstream in self._ranked:
            now = trio.current_time()
            if now >= deadline:
                break
            attempt_deadline = min(deadline, now + upstream.settings.timeout)
            try:
                conn = await upstream.acquire(prefer_idle=not retry_safe)
                response = await conn.submit(upstream.frame(body), attempt_deadline).wait()
            except UpstreamError as exc:
                self._failed(upstream, exc)
                last = exc
                if exc.sent and not retry_safe:
                    raise
                continue
            status = response.status
            if status == 429:
                self._throttled(upstream, response.retry_after)
                last = UpstreamError(
                    THROTTLED,
                    "upstream rate limit (HTTP 429)",
                    sent=False,
                    upstream=upstream.name,
                    status=429,
                )
                continue
            if status in FAILOVER_STATUSES:
                refused = UpstreamError(
                    HTTP_STATUS,
                    f"upstream answered HTTP {status}",
                    sent=True,
                    upstream=upstream.name,
                    status=status,
                )
                self._failed(upstream, refused)
                last = refused
                if not retry_safe:
                    raise refused
                continue
            upstream.health.record_success(trio.current_time() - now)
            return upstream, response
        raise last or UpstreamError(
            UNAVAILABLE, "no upstream answered before the deadline", sent=False
        )

    def _failed(self, upstream: Upstream, exc: UpstreamError) -> None:
        if upstream.health.record_failure(exc.kind, self._rpc.failure_threshold):
            log.warning(
                "upstream out of rotation",
                extra={
                    "fields": {"pool": self.label, "upstream": upstream.name, "reason": exc.kind}
                },
            )
            self._rerank()

    def _throttled(self, upstream: Upstream, retry_after: bytes | None) -> None:
        seconds = 1.0
        if retry_after is not None and retry_after.isdigit():
            seconds = min(float(retry_after), MAX_THROTTLE_SECONDS)
        upstream.health.throttled_until = trio.current_time() + seconds
        upstream.health.errors[THROTTLED] = upstream.health.errors.get(THROTTLED, 0) + 1
        self._rerank()

    def note_head(self, head: int) -> None:
        """A head seen in a client's answer (eth_blockNumber) keeps finality checks current."""
        if self.head is None or head > self.head:
            self.head = head

    async def _watchdog(self) -> None:
        while True:
            await trio.sleep(WATCHDOG_INTERVAL)
            now = trio.current_time()
            for upstream in self.upstreams:
                upstream.expire(now)

    async def _prober(self) -> None:
        while True:
            async with trio.open_nursery() as nursery:
                for upstream in self.upstreams:
                    nursery.start_soon(self._probe, upstream)
            self._update_lag()
            self._rerank()
            await trio.sleep(self._rpc.probe_interval)

    async def _probe(self, upstream: Upstream) -> None:
        now = trio.current_time()
        deadline = now + min(upstream.settings.timeout, max(self._rpc.probe_interval * 2, 1.0))
        try:
            conn = await upstream.acquire()
            response = await conn.submit(upstream.frame(self._probe_body), deadline).wait()
        except UpstreamError as exc:
            upstream.health.record_failure(exc.kind, self._rpc.failure_threshold)
            return
        head = self._parse_head(response.body) if response.status == 200 else None
        if head is None:
            upstream.health.record_failure(HTTP_STATUS, self._rpc.failure_threshold)
            return
        upstream.health.head = head
        upstream.health.record_success(trio.current_time() - now)
        if upstream.health.state_down:
            upstream.health.state_down = False
            log.info(
                "upstream back in rotation",
                extra={"fields": {"pool": self.label, "upstream": upstream.name}},
            )

    def _update_lag(self) -> None:
        heads = [
            u.health.head
            for u in self.upstreams
            if u.health.head is not None and not u.health.state_down
        ]
        if not heads:
            return
        best = max(heads)
        # Probes are authoritative and may move the head back (a devnet revert); answers
        # seen between probes only move it forward (note_head).
        self.head = best
        for upstream in self.upstreams:
            head = upstream.health.head
            upstream.health.lag = 0 if head is None else max(0, best - head)

"""The edge: chaingate's one public listener, an HTTP/1.1 server written for trio.

Connections are accepted here and handed to the edge loop (compiled ``edgeloop``, see its
docstring): one epoll set holds them all and one task of this server serves it — on
readiness the loop reads, frames, answers JSON-RPC requests through the fast lane and writes,
without a trio task switch per request.  What the loop does not answer itself comes back
here as a hand-off, answered in a task of its own by the handler (``chaingate.edge.routes``):
REST, the bundler, metrics, WebSocket upgrades, compressed bodies, and the JSON-RPC requests
the lane leaves to Python (docs/decisions/edge.md says which).

Timeouts are not one cancel scope per read: a sweeper task looks at every connection a few
times a second and closes the ones that overstayed their state — idle keep-alive, a client
too slow to finish sending a request (answered 408), too slow to read a response, or
lingering after an error.

Shutdown: ``begin_shutdown`` closes the listener and every idle connection at once; a busy
connection finishes its request, answers with ``Connection: close`` and closes.

Upgrades: a request carrying ``Upgrade:`` is first offered to ``upgrades`` (the WebSocket
endpoint).  When it accepts, the loop gives the socket away with every byte already read
past the request; the edge writes the ``101`` and steps aside: the connection leaves the
loop (the sweeper's timeouts no longer apply; the upgraded protocol keeps its own) but stays
counted, so shutdown waits for it like for any other connection.

Bounds (docs/decisions/edge.md): connections at most what the file descriptors allow
(``edge.limits``), per client address too; at a cap the longest-idle connection makes room,
else the newcomer gets a 503 at once — never a hang in the backlog.  Idle connections are
closed sooner under pressure.  Answer bytes that slow clients have not taken are counted over
all connections; past ``max_unsent_bytes`` new requests get 503 until the backlog drains.  A
connection that fails authentication ``max_auth_failures`` times is closed.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from collections import defaultdict
from collections.abc import Iterable
from time import monotonic
from typing import Any, Protocol

import trio
from trio.lowlevel import wait_readable

from chaingate import netio
from chaingate.config import ServerSettings
from chaingate.edge import compression
from chaingate.edge.limits import ConnectionLimits, connection_limits, raise_fd_limit
from chaingate.edge.responses import JSON, DateHeader
from chaingate.envelope import error_body
from chaingate.framing_constants import BUSY, IDLE, LINGER, READING, WRITING
from chaingate.peers import peer_group
from chaingate.twins import Impl
from chaingate.twintypes.edgeloop import Conn
from chaingate.twintypes.fastlane import AnswerBudget, Lane
from chaingate.twintypes.http1 import Http1Module, Request

log = logging.getLogger("chaingate.edge")

# "accept failed" is logged at most this often (with the count since the last line).
ACCEPT_ERROR_LOG_SECONDS = 10.0
# Connections accepted back to back before the accepting task yields anyway.
FAIRNESS_BATCH = 64
# How long a connection closing after an error answer may linger, reading and discarding
# the client's remaining input (see edgeloop: closing on unread input resets the connection).
LINGER_SECONDS = 2.0
# How often an upgrade waiting for earlier answers to leave looks again.
UNSENT_POLL_SECONDS = 0.005


class Handler(Protocol):
    async def __call__(self, request: Request, peer: str) -> tuple[int, bytes, bytes]:
        """Answer one request: status, extra header lines, body."""
        ...


class Upgrades(Protocol):
    """Takes over connections that ask for another protocol (see ``chaingate.ws``)."""

    def handshake(self, request: Request, peer: str) -> tuple[int, bytes, bytes] | Any:
        """None: not ours, answer as usual; (status, headers, body): refuse; else a ticket
        whose ``response`` (the 101) is written before ``serve`` takes the socket."""
        ...

    async def serve(self, sock: socket.socket, peer: str, leftover: bytes, ticket: Any) -> None: ...

    def release_unused(self, ticket: Any) -> None:
        """The 101 of ``ticket`` could not be written."""
        ...

    def begin_shutdown(self) -> None: ...


class EdgeServer:
    def __init__(
        self,
        settings: ServerSettings,
        impl: Impl,
        handler: Handler,
        lane: Lane,
        budget: AnswerBudget,
        upgrades: Upgrades | None = None,
        reserved_fds: int = 0,
    ) -> None:
        """``lane``: the fast lane (``impl.fastlane.Lane``) JSON-RPC requests go to first;
        ``budget``: the answer bytes batches are assembling (exhausted: new work is shed
        with 503)."""
        self._settings = settings
        self._http1 = impl.http1
        self._handler = handler
        self._upgrades = upgrades
        self._reserved_fds = reserved_fds
        self._date = DateHeader()
        self._lane = lane
        self.loop = impl.edgeloop.Loop(
            impl.http1,
            lane,
            limits=(
                settings.max_request_line,
                settings.max_header_bytes,
                settings.max_headers,
                settings.max_body_bytes,
            ),
            max_unsent_bytes=settings.max_unsent_bytes,
            max_auth_failures=settings.max_auth_failures,
            compress_min=settings.compress_min_bytes,
            budget=budget,
            date=self._date,
            error_body=error_body,
            handoff=self._handoff,
            encode=self._encode_later,
            closed=self._forget,
        )
        self._nursery: trio.Nursery | None = None
        self._by_group: dict[str, set[Conn]] = {}
        self._upgraded = 0  # connections handed to the upgraded protocol, still open
        self._closing = False
        self._listener: socket.socket | None = None
        self._drained = trio.Event()
        self.port = 0
        self.limits: ConnectionLimits = connection_limits(settings, 0, reserved_fds)
        self.accepted = 0
        # Connections refused at a cap (by which cap), and idle ones closed to make room.
        self.refused: defaultdict[str, int] = defaultdict(int)
        self.evicted = 0
        self.accept_errors = 0
        self._accept_errors_logged = 0
        self._accept_error_logged_at = -ACCEPT_ERROR_LOG_SECONDS
        # Answers sent coded, by coding; their bytes before and after.
        self.coded: defaultdict[bytes, int] = defaultdict(int)
        self.coded_bytes_in = 0
        self.coded_bytes_out = 0

    @property
    def open_connections(self) -> int:
        return len(self.loop.conns) + self._upgraded

    @property
    def unsent_bytes(self) -> int:
        """Bytes of answers handed to the loop but not yet taken by their clients."""
        return self.loop.unsent_bytes

    @property
    def overloaded(self) -> int:
        """Requests answered 503 because of unsent_bytes or the answer budget."""
        return self.loop.overloaded

    @property
    def framing_errors(self) -> dict[int, int]:
        return self.loop.framing_errors

    def _bind(self) -> socket.socket:
        settings = self._settings
        infos = socket.getaddrinfo(
            settings.host, settings.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        family, type_, proto, _, address = infos[0]
        listener = socket.socket(family, type_, proto)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if settings.reuse_port:
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            listener.bind(address)
            listener.listen(settings.backlog)
            listener.setblocking(False)
        except BaseException:
            listener.close()
            raise
        return listener

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen until ``begin_shutdown``, then until the last connection has closed."""
        self.limits = connection_limits(self._settings, raise_fd_limit(), self._reserved_fds)
        if self.limits.lowered:
            log.warning(
                "server.max_connections lowered to fit the file-descriptor limit",
                extra={
                    "fields": {
                        "max_connections": self.limits.max_connections,
                        "fd_limit": self.limits.fd_limit,
                        "reserved": self.limits.reserved,
                    }
                },
            )
        listener = self._listener = self._bind()
        self.port = listener.getsockname()[1]
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._sweeper)
                nursery.start_soon(self._serve_loop)
                task_status.started(self.port)
                await self._accept_loop(listener)
                if self.open_connections:
                    await self._drained.wait()
                nursery.cancel_scope.cancel()
        finally:
            self.loop.close_loop()

    def begin_shutdown(self) -> None:
        """Stop accepting; close idle connections now and busy ones after their response."""
        if self._closing:
            return
        self._closing = True
        if self._listener is not None:
            netio.close_socket(self._listener)
        if self._upgrades is not None:
            self._upgrades.begin_shutdown()
        self.loop.begin_shutdown()
        self._check_drained()

    async def wait_closed(self) -> None:
        await self._drained.wait()

    def _check_drained(self) -> None:
        if self._closing and not self.open_connections:
            self._drained.set()

    async def _serve_loop(self) -> None:
        """The loop's one task: wait until some connection is ready, serve them all."""
        loop = self.loop
        lane = self._lane
        epoll_fd = loop.fileno()
        while True:
            # The distinct calls of one readiness go upstream together (Lane.hold).
            lane.hold()
            try:
                more = loop.poll()
            finally:
                lane.release()
            if more:
                await trio.lowlevel.checkpoint()  # more to do: let everyone else run first
            else:
                await wait_readable(epoll_fd)

    async def _accept_loop(self, listener: socket.socket) -> None:
        accepted = 0
        loop = self.loop
        while not self._closing:
            try:
                sock, address = listener.accept()
            except BlockingIOError:
                try:
                    await wait_readable(listener)
                except trio.ClosedResourceError:
                    return
                continue
            except OSError as exc:
                if self._closing or exc.errno == errno.EBADF:
                    return
                # Out of file descriptors or similar: back off instead of spinning.
                self._accept_failed(exc)
                await trio.sleep(0.1)
                continue
            sock.setblocking(False)
            peer = _peer(address)
            group = peer_group(peer)
            if not self._make_room(group):
                _refuse_connection(sock, self._http1, self._date)
                continue
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.accepted += 1
            conn = loop.register(sock, peer, group)
            self._by_group.setdefault(group, set()).add(conn)
            accepted += 1
            if accepted % FAIRNESS_BATCH == 0:
                await trio.lowlevel.checkpoint()

    def _forget(self, conn: Conn) -> None:
        """The loop closed ``conn``."""
        members = self._by_group.get(conn.group)
        if members is not None:
            members.discard(conn)
            if not members:
                del self._by_group[conn.group]
        self._check_drained()

    def _make_room(self, group: str) -> bool:
        """Whether a new connection from ``group`` may be served, closing the longest-idle
        connection (of that address, or of anyone at the global cap) to make room."""
        members = self._by_group.get(group)
        if (
            members is not None
            and len(members) >= self.limits.max_per_ip
            and not self._evict_idle(members)
        ):
            self.refused["per_ip"] += 1
            return False
        if self.open_connections >= self.limits.max_connections and not self._evict_idle(
            self.loop.conns.values()
        ):
            self.refused["total"] += 1
            return False
        return True

    def _evict_idle(self, conns: Iterable[Conn]) -> bool:
        oldest: Conn | None = None
        idle = self.loop.idle
        for conn in conns:
            if idle(conn) and (oldest is None or conn.since < oldest.since):
                oldest = conn
        if oldest is None:
            return False
        self.loop.close(oldest)
        self.evicted += 1
        return True

    def _accept_failed(self, exc: OSError) -> None:
        self.accept_errors += 1
        now = monotonic()
        if now - self._accept_error_logged_at >= ACCEPT_ERROR_LOG_SECONDS:
            log.warning(
                "accept failed",
                extra={
                    "fields": {
                        "error": exc.__class__.__name__,
                        "errno": exc.errno,
                        "since_last_line": self.accept_errors - self._accept_errors_logged,
                    }
                },
            )
            self._accept_error_logged_at = now
            self._accept_errors_logged = self.accept_errors

    # --- hand-offs: what the loop leaves to Python ----------------------------------------

    def _handoff(self, conn: Conn, request: Request) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(self._answer, conn, request)

    def _encode_later(self, conn: Conn, status: int, headers: bytes, body: bytes) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(self._encode_and_answer, conn, status, headers, body)

    async def _answer(self, conn: Conn, request: Request) -> None:
        """Answer one handed-off request (the loop waits for it before the connection's
        next one)."""
        peer = conn.peer
        ticket = None
        try:
            if (coding := request.content_encoding) is not None and (
                refusal := _decode_body(request, coding, self._settings.max_body_bytes)
            ):
                status, headers, body = refusal
            elif request.upgrade is not None and self._upgrades is not None:
                taken = self._upgrades.handshake(request, peer)
                if taken is None:
                    taken = await self._handler(request, peer)
                elif not isinstance(taken, tuple):
                    ticket = taken
                if ticket is None:
                    status, headers, body = taken
            else:
                status, headers, body = await self._handler(request, peer)
        except Exception:
            # A bug of ours must cost this request a 500, never the whole listener; the
            # access log has it like any other answer.
            log.exception("unhandled error while answering a request")
            status, headers = 500, JSON
            body = error_body(500, "internal error; retry with exponential backoff")
            request.keep_alive = False
        if ticket is not None:
            try:
                await self._upgrade(conn, ticket)
            except Exception:
                # A bug of ours must cost this connection, never the listener.
                log.exception("unhandled error while upgrading a connection")
                self.loop.close(conn)
            return
        accept = request.accept_encoding
        if accept is not None and _wants_coding(accept, body, self._settings.compress_min_bytes):
            headers, body = await self._encode(accept, status, headers, body)
        self.loop.answer(conn, status, headers, body)

    async def _encode_and_answer(
        self, conn: Conn, status: int, headers: bytes, body: bytes
    ) -> None:
        accept = conn.request.accept_encoding
        # The loop asks for a coding only for a request that accepts one (_wants_coding).
        assert accept is not None
        headers, body = await self._encode(accept, status, headers, body)
        self.loop.answer(conn, status, headers, body)

    async def _encode(
        self, accept: bytes, status: int, headers: bytes, body: bytes
    ) -> tuple[bytes, bytes]:
        """Headers and body of an answer coded as ``accept`` allows (see edge.compression)."""
        coding, vary = compression.plan(
            accept, status, headers, len(body), self._settings.compress_min_bytes
        )
        if coding is None:
            return (headers + compression.VARY if vary else headers), body
        if len(body) >= compression.THREAD_BYTES:
            # Off the event loop: the codecs release the GIL, and everyone else keeps moving.
            coded = await trio.to_thread.run_sync(compression.encode, coding, body)
        else:
            coded = compression.encode(coding, body)
        if len(coded) >= len(body) and compression.preferences(accept).identity_q > 0:
            return headers + compression.VARY, body  # incompressible: as it is
        self.coded[coding] += 1
        self.coded_bytes_in += len(body)
        self.coded_bytes_out += len(coded)
        return headers + compression.coded_headers(coding), coded

    async def _upgrade(self, conn: Conn, ticket: Any) -> None:
        upgrades = self._upgrades
        assert upgrades is not None
        # Answers to requests pipelined before the upgrade go first; the 101 follows them.
        # (Looked at, not waited on: the loop, not a task, owns the socket and its events;
        # and this is rare — a client pipelining requests before an upgrade.)
        with trio.move_on_after(self._settings.client_write_timeout):
            while conn.state == BUSY and conn.unsent:  # noqa: ASYNC110
                await trio.sleep(UNSENT_POLL_SECONDS)
        detached = self.loop.detach(conn)
        if detached is None:
            # Closed meanwhile (the client reset it), or its earlier answers never left.
            upgrades.release_unused(ticket)
            self.loop.close(conn)
            return
        fd, leftover = detached
        self._upgraded += 1  # counted before the loop forgets it: shutdown waits for it
        self._forget(conn)
        try:
            try:
                sock = socket.socket(fileno=fd)
            except OSError:
                os.close(fd)
                upgrades.release_unused(ticket)
                return
            try:
                try:
                    await netio.send_all(sock, ticket.response)
                except BaseException:
                    upgrades.release_unused(ticket)
                    raise
                try:
                    await upgrades.serve(sock, conn.peer, leftover, ticket)
                except Exception:
                    # A bug of ours must cost this connection, never the listener.
                    log.exception("unhandled error on an upgraded connection")
            except (OSError, trio.ClosedResourceError, trio.BrokenResourceError):
                pass  # the peer went away
            finally:
                netio.close_socket(sock)
        finally:
            self._upgraded -= 1
            self._check_drained()

    async def _sweeper(self) -> None:
        settings = self._settings
        interval = max(
            0.05,
            min(
                1.0,
                settings.idle_timeout,
                settings.client_read_timeout,
                settings.client_write_timeout,
            )
            / 4,
        )
        loop = self.loop
        while True:
            await trio.sleep(interval)
            now = monotonic()
            idle_timeout = settings.idle_timeout
            if len(loop.conns) * 4 > self.limits.max_connections * 3:
                idle_timeout = min(idle_timeout, settings.pressure_idle_timeout)
            for conn in list(loop.conns.values()):
                age = now - conn.since
                state = conn.state
                if state == IDLE:
                    if (age > idle_timeout or self._closing) and loop.idle(conn):
                        loop.close(conn)
                elif state == READING:
                    if age > settings.client_read_timeout:
                        # Best effort: tell a client that was too slow why it is cut off.
                        loop.timeout(conn, 408, "request not received in time")
                elif state == WRITING:
                    if age > settings.client_write_timeout:
                        loop.close(conn)
                elif state == LINGER and age > LINGER_SECONDS:
                    loop.close(conn)


def _wants_coding(accept: bytes, body: bytes, compress_min: int) -> bool:
    """Might the client's Accept-Encoding turn this answer into a coded one?  (The size test
    first: a small answer is coded only when the client refused identity, which needs a
    "=0" somewhere.)"""
    return compress_min > 0 and len(body) > 0 and (len(body) >= compress_min or b"=0" in accept)


def _refuse_connection(sock: socket.socket, http1: Http1Module, date: DateHeader) -> None:
    """Tell a connection over a cap why it is closed (best effort, never waiting)."""
    body = error_body(503, "too many connections: retry shortly")
    netio.try_send(
        sock, http1.build_response(503, date.line() + JSON + b"Retry-After: 1\r\n", body, False)
    )
    sock.close()


def _decode_body(request: Request, coding: bytes, cap: int) -> tuple[int, bytes, bytes] | None:
    """Undo the request body's content ``coding`` in place; the refusal when it cannot be."""
    try:
        body = compression.decode_body(coding, request.body, cap)
    except compression.BodyError as exc:
        headers = JSON + compression.ACCEPTED_REQUEST_CODINGS if exc.status == 415 else JSON
        return exc.status, headers, error_body(exc.status, exc.message)
    compression.replace_body(request, body)
    return None


def _peer(address: object) -> str:
    if isinstance(address, tuple) and address:
        return str(address[0])
    return "unix"

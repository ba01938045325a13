"""The edge: chaingate's one public listener, an HTTP/1.1 server written for trio.

Per connection one task reads, frames (compiled ``http1``), hands each request to the handler
and writes the response, in order — keep-alive and pipelining included.  The socket is used
directly (see ``chaingate.netio``): a request that arrives whole and is answered at once costs
one wait for readability and no other trip through the scheduler.

Timeouts are not one cancel scope per read: a sweeper task looks at every connection a few
times a second and cancels the ones that overstayed their state — idle keep-alive, a client
too slow to finish sending a request (answered 408), or too slow to read a response.

Shutdown: ``begin_shutdown`` closes the listener and every idle connection at once; a busy
connection finishes its request, answers with ``Connection: close`` and closes.

Upgrades: a request carrying ``Upgrade:`` is first offered to ``upgrades`` (the WebSocket
endpoint).  When it accepts, the edge writes its ``101``, hands it the socket and every byte
already read past the request, and steps aside: the connection leaves the HTTP states (the
sweeper's timeouts no longer apply; the upgraded protocol keeps its own) but stays counted,
so shutdown waits for it like for any other connection.

Bounds (docs/decisions.md, "Edge"): connections at most what the file descriptors allow
(``edge.limits``), per client address too; at a cap the longest-idle connection makes room,
else the newcomer gets a 503 at once — never a hang in the backlog.  Idle connections are
closed sooner under pressure.  Answer bytes that slow clients have not taken are counted over
all connections; past ``max_unsent_bytes`` new requests get 503 until the backlog drains.  A
connection that fails authentication ``max_auth_failures`` times is closed.
"""

from __future__ import annotations

import errno
import logging
import socket
from collections import defaultdict
from collections.abc import Callable
from time import monotonic
from typing import Any, Protocol

import trio
from trio.lowlevel import wait_readable

from chaingate import netio
from chaingate.config import ServerSettings
from chaingate.edge import compression
from chaingate.edge.limits import ConnectionLimits, connection_limits, raise_fd_limit
from chaingate.edge.responses import JSON, DateHeader, error_body
from chaingate.impl import Impl
from chaingate.peers import peer_group

log = logging.getLogger("chaingate.edge")

IDLE, READING, BUSY, WRITING, UPGRADED, EVICTED = 0, 1, 2, 3, 4, 5
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# A body at least this large is written after its header section as it is (one sendmsg),
# not copied into one message with it.
LARGE_BODY = 64 << 10
# "accept failed" is logged at most this often (with the count since the last line).
ACCEPT_ERROR_LOG_SECONDS = 10.0
# Requests answered back to back without the task ever parking before it yields anyway.
FAIRNESS_BATCH = 64
# After an error answer, how long and how much of the client's remaining input we read and
# discard before closing: closing with unread input makes the kernel send a reset, which can
# destroy the answer (a 413) before the client has read it.
LINGER_SECONDS = 2.0
LINGER_MAX_BYTES = 8 << 20


class Handler(Protocol):
    async def __call__(self, request: Any, peer: str) -> tuple[int, bytes, bytes]:
        """Answer one request: status, extra header lines, body."""
        ...


class Upgrades(Protocol):
    """Takes over connections that ask for another protocol (see ``chaingate.ws``)."""

    def handshake(self, request: Any, peer: str) -> tuple[int, bytes, bytes] | Any:
        """None: not ours, answer as usual; (status, headers, body): refuse; else a ticket
        whose ``response`` (the 101) is written before ``serve`` takes the socket."""
        ...

    async def serve(self, sock: socket.socket, peer: str, leftover: bytes, ticket: Any) -> None: ...

    def release_unused(self, ticket: Any) -> None:
        """The 101 of ``ticket`` could not be written."""
        ...

    def begin_shutdown(self) -> None: ...


class _Conn:
    __slots__ = ("group", "scope", "since", "sock", "state", "timed_out")

    def __init__(self, sock: socket.socket, group: str, now: float) -> None:
        self.sock = sock
        self.group = group  # the client address (an IPv6 /64) for per-address caps
        self.scope = trio.CancelScope()
        self.state = IDLE
        self.since = now
        self.timed_out = False


class EdgeServer:
    def __init__(
        self,
        settings: ServerSettings,
        impl: Impl,
        handler: Handler,
        upgrades: Upgrades | None = None,
        reserved_fds: int = 0,
        overloaded: Callable[[], bool] | None = None,
    ) -> None:
        self._settings = settings
        self._http1: Any = impl.http1
        self._handler = handler
        self._upgrades = upgrades
        self._reserved_fds = reserved_fds
        # Another reason to shed new work: memory held elsewhere (answers being assembled).
        self._overloaded = overloaded
        self._conns: set[_Conn] = set()
        self._by_group: dict[str, set[_Conn]] = {}
        self._closing = False
        self._listener: socket.socket | None = None
        self._drained = trio.Event()
        self._date = DateHeader()
        self.port = 0
        self.limits: ConnectionLimits = connection_limits(settings, 0, reserved_fds)
        self.accepted = 0
        # Connections refused at a cap (by which cap), and idle ones closed to make room.
        self.refused: defaultdict[str, int] = defaultdict(int)
        self.evicted = 0
        self.accept_errors = 0
        self._accept_errors_logged = 0
        self._accept_error_logged_at = -ACCEPT_ERROR_LOG_SECONDS
        # Bytes of answers handed to the kernel's care but not yet taken by their clients.
        self.unsent_bytes = 0
        self.overloaded = 0  # requests answered 503 because of unsent_bytes
        self.framing_errors: defaultdict[int, int] = defaultdict(int)
        # Answers sent coded, by coding; their bytes before and after.
        self.coded: defaultdict[bytes, int] = defaultdict(int)
        self.coded_bytes_in = 0
        self.coded_bytes_out = 0

    @property
    def open_connections(self) -> int:
        return len(self._conns)

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
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._sweeper)
            task_status.started(self.port)
            await self._accept_loop(listener, nursery)
            if self._conns:
                await self._drained.wait()
            nursery.cancel_scope.cancel()

    def begin_shutdown(self) -> None:
        """Stop accepting; close idle connections now and busy ones after their response."""
        if self._closing:
            return
        self._closing = True
        if self._listener is not None:
            netio.close_socket(self._listener)
        if self._upgrades is not None:
            self._upgrades.begin_shutdown()
        for conn in list(self._conns):
            if conn.state == IDLE:
                conn.scope.cancel()
        if not self._conns:
            self._drained.set()

    async def wait_closed(self) -> None:
        await self._drained.wait()

    async def _accept_loop(self, listener: socket.socket, nursery: trio.Nursery) -> None:
        accepted = 0
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
            conn = _Conn(sock, group, monotonic())
            self._conns.add(conn)
            self._by_group.setdefault(group, set()).add(conn)
            nursery.start_soon(self._connection, conn, peer)
            accepted += 1
            if accepted % FAIRNESS_BATCH == 0:
                await trio.lowlevel.checkpoint()

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
        if len(self._conns) >= self.limits.max_connections and not self._evict_idle(self._conns):
            self.refused["total"] += 1
            return False
        return True

    def _evict_idle(self, conns: set[_Conn]) -> bool:
        oldest: _Conn | None = None
        for conn in conns:
            if conn.state == IDLE and (oldest is None or conn.since < oldest.since):
                oldest = conn
        if oldest is None:
            return False
        oldest.state = EVICTED  # not idle any more: the next newcomer evicts another
        oldest.scope.cancel()
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

    async def _connection(self, conn: _Conn, peer: str) -> None:
        sock = conn.sock
        try:
            with conn.scope:
                await self._serve(conn, peer)
            if conn.timed_out:
                # Best effort: tell a client that was too slow why it is cut off.
                body = error_body(408, "request not received in time")
                netio.try_send(
                    sock, self._http1.build_response(408, self._date.line() + JSON, body, False)
                )
        except (OSError, trio.ClosedResourceError, trio.BrokenResourceError):
            pass  # the peer went away; nothing to answer
        finally:
            self._conns.discard(conn)
            members = self._by_group.get(conn.group)
            if members is not None:
                members.discard(conn)
                if not members:
                    del self._by_group[conn.group]
            netio.close_socket(sock)
            if self._closing and not self._conns:
                self._drained.set()

    async def _serve(self, conn: _Conn, peer: str) -> None:
        settings = self._settings
        http1 = self._http1
        parser = http1.RequestParser(
            settings.max_request_line,
            settings.max_header_bytes,
            settings.max_headers,
            settings.max_body_bytes,
        )
        http_error = http1.HttpError
        handler = self._handler
        sock = conn.sock
        answered = 0
        auth_failures = 0
        eof = False
        eager = False
        compress_min = settings.compress_min_bytes
        while True:
            request = parser.next_event()
            if request is None:
                if eof:
                    return  # the client closed between requests
                if parser.has_partial:
                    if parser.take_continue():
                        await netio.send_all(sock, CONTINUE)
                    if conn.state != READING:
                        conn.state = READING
                        conn.since = monotonic()
                else:
                    if self._closing:
                        return
                    if conn.state != IDLE:
                        conn.state = IDLE
                        conn.since = monotonic()
                data = await netio.recv_next(sock, eager)
                if data:
                    eager = len(data) == netio.RECV_SIZE
                    parser.feed(data)
                else:
                    eof = True
                    parser.feed_eof()
                continue
            if isinstance(request, http_error):
                self.framing_errors[request.status] += 1
                if eof:
                    return  # the client hung up mid-request: nobody left to answer
                body = error_body(request.status, request.message)
                response = http1.build_response(
                    request.status, self._date.line() + JSON, body, False
                )
                await self._write(conn, response)
                await self._linger(conn)
                return
            conn.state = BUSY
            ticket = None
            asked_keep_alive = request.keep_alive
            try:
                if self.unsent_bytes > settings.max_unsent_bytes or (
                    self._overloaded is not None and self._overloaded()
                ):
                    # Memory held for clients that do not read is at its bound: shed new work
                    # before it grows (the backlog drains or times out within seconds).
                    self.overloaded += 1
                    status, headers = 503, JSON + b"Retry-After: 1\r\n"
                    body = error_body(503, "server overloaded: retry shortly")
                elif request.content_encoding is not None and (
                    refusal := _decode_body(request, settings.max_body_bytes)
                ):
                    status, headers, body = refusal
                elif request.upgrade is not None and self._upgrades is not None:
                    taken = self._upgrades.handshake(request, peer)
                    if taken is None:
                        taken = await handler(request, peer)
                    elif not isinstance(taken, tuple):
                        ticket = taken
                    if ticket is None:
                        status, headers, body = taken
                else:
                    status, headers, body = await handler(request, peer)
            except Exception:
                # A bug of ours must cost this request a 500, never the whole listener.
                log.exception("unhandled error while answering a request")
                status, headers = 500, JSON
                body = error_body(500, "internal error; retry with exponential backoff")
                request.keep_alive = False
            if ticket is not None:
                await self._upgrade(conn, peer, parser, ticket)
                return
            accept = request.accept_encoding
            # The size test first: a small answer is coded only when the client refused
            # identity ("identity;q=0", "*;q=0"), which needs a "=0" somewhere.
            if (
                accept is not None
                and compress_min
                and body
                and (len(body) >= compress_min or b"=0" in accept)
            ):
                headers, body = await self._encode(accept, status, headers, body)
            if status == 401:
                auth_failures += 1
                if auth_failures >= settings.max_auth_failures:
                    request.keep_alive = False  # a key guesser gets a new handshake per try
            keep_alive = request.keep_alive and not self._closing
            http10 = request.version == 10
            has_content = body and status >= 200 and status not in (204, 304)
            if has_content and len(body) >= LARGE_BODY:
                head = http1.build_response_head(
                    status, self._date.line() + headers, len(body), keep_alive, http10
                )
                await self._write(conn, head, b"" if request.method == b"HEAD" else body)
            else:
                response = http1.build_response(
                    status, self._date.line() + headers, body, keep_alive, http10
                )
                if request.method == b"HEAD" and has_content:
                    # HEAD: the headers of the GET answer (Content-Length included), no content.
                    # (204/304 answers never carry a body, so there is nothing to cut.)
                    response = response[: len(response) - len(body)]
                # The whole answer in one send, as a rule: no coroutine unless the kernel
                # leaves some of it for later.
                sent = netio.try_send(conn.sock, response)
                if sent < len(response):
                    await self._write(conn, response[sent:])
            if not keep_alive:
                if asked_keep_alive and not self._closing:
                    # We close a connection the client meant to keep (its key guesses, a bug
                    # of ours): pipelined requests may be on their way, and closing on unread
                    # input resets the connection, which can destroy this answer.
                    await self._linger(conn)
                return
            answered += 1
            if answered % FAIRNESS_BATCH == 0:
                await trio.lowlevel.checkpoint()

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

    async def _upgrade(self, conn: _Conn, peer: str, parser: Any, ticket: Any) -> None:
        upgrades = self._upgrades
        assert upgrades is not None
        try:
            await self._write(conn, ticket.response)
        except BaseException:
            upgrades.release_unused(ticket)
            raise
        conn.state = UPGRADED
        try:
            await upgrades.serve(conn.sock, peer, parser.take_buffered(), ticket)
        except Exception:
            # A bug of ours must cost this connection, never the listener.
            log.exception("unhandled error on an upgraded connection")

    async def _write(self, conn: _Conn, data: bytes, tail: bytes = b"") -> None:
        """Write ``data`` then ``tail``; what the kernel does not take at once is waited for
        (bounded by the sweeper) and counted in ``unsent_bytes`` meanwhile."""
        sock = conn.sock
        sent = netio.try_send_parts(sock, data, tail) if tail else netio.try_send(sock, data)
        total = len(data) + len(tail)
        if sent == total:
            return
        conn.state = WRITING
        conn.since = monotonic()
        left = total - sent
        self.unsent_bytes += left
        try:
            if sent < len(data):
                await netio.send_all(sock, memoryview(data)[sent:])
                sent = len(data)
            if tail:
                await netio.send_all(sock, memoryview(tail)[sent - len(data) :])
        finally:
            self.unsent_bytes -= left

    async def _linger(self, conn: _Conn) -> None:
        conn.state = BUSY  # bounded here, not by the sweeper
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            return
        with trio.move_on_after(LINGER_SECONDS):
            drained = 0
            while drained < LINGER_MAX_BYTES:
                data = await netio.recv_some(conn.sock)
                if not data:
                    return
                drained += len(data)

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
        while True:
            await trio.sleep(interval)
            now = monotonic()
            idle_timeout = settings.idle_timeout
            if len(self._conns) * 4 > self.limits.max_connections * 3:
                idle_timeout = min(idle_timeout, settings.pressure_idle_timeout)
            for conn in list(self._conns):
                age = now - conn.since
                if conn.state == IDLE:
                    if age > idle_timeout or self._closing:
                        conn.scope.cancel()
                elif conn.state == READING:
                    if age > settings.client_read_timeout:
                        conn.timed_out = True
                        conn.scope.cancel()
                elif conn.state == WRITING and age > settings.client_write_timeout:
                    conn.scope.cancel()


def _refuse_connection(sock: socket.socket, http1: Any, date: DateHeader) -> None:
    """Tell a connection over a cap why it is closed (best effort, never waiting)."""
    body = error_body(503, "too many connections: retry shortly")
    netio.try_send(
        sock, http1.build_response(503, date.line() + JSON + b"Retry-After: 1\r\n", body, False)
    )
    sock.close()


def _decode_body(request: Any, cap: int) -> tuple[int, bytes, bytes] | None:
    """Undo the request body's content coding in place; the refusal when it cannot be."""
    try:
        body = compression.decode_body(request.content_encoding, request.body, cap)
    except compression.BodyError as exc:
        headers = JSON + compression.ACCEPTED_REQUEST_CODINGS if exc.status == 415 else JSON
        return exc.status, headers, error_body(exc.status, exc.message)
    compression.replace_body(request, body)
    return None


def _peer(address: Any) -> str:
    if isinstance(address, tuple) and address:
        return str(address[0])
    return "unix"

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
"""

from __future__ import annotations

import errno
import logging
import socket
from collections import defaultdict
from time import monotonic
from typing import Any, Protocol

import trio
from trio.lowlevel import wait_readable

from chaingate import netio
from chaingate.config import ServerSettings
from chaingate.edge.responses import JSON, DateHeader, error_body
from chaingate.impl import Impl

log = logging.getLogger("chaingate.edge")

IDLE, READING, BUSY, WRITING, UPGRADED = 0, 1, 2, 3, 4
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
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
    __slots__ = ("scope", "since", "sock", "state", "timed_out")

    def __init__(self, sock: socket.socket, now: float) -> None:
        self.sock = sock
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
    ) -> None:
        self._settings = settings
        self._http1: Any = impl.http1
        self._handler = handler
        self._upgrades = upgrades
        self._conns: set[_Conn] = set()
        self._closing = False
        self._listener: socket.socket | None = None
        self._drained = trio.Event()
        self._date = DateHeader()
        self.port = 0
        self.accepted = 0
        self.framing_errors: defaultdict[int, int] = defaultdict(int)

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
                log.warning("accept failed", extra={"fields": {"error": exc.__class__.__name__}})
                await trio.sleep(0.1)
                continue
            if len(self._conns) >= self._settings.max_connections:
                sock.close()
                continue
            sock.setblocking(False)
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.accepted += 1
            nursery.start_soon(self._connection, sock, _peer(address))
            accepted += 1
            if accepted % FAIRNESS_BATCH == 0:
                await trio.lowlevel.checkpoint()

    async def _connection(self, sock: socket.socket, peer: str) -> None:
        conn = _Conn(sock, monotonic())
        self._conns.add(conn)
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
        eof = False
        eager = False
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
            try:
                if request.upgrade is not None and self._upgrades is not None:
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
            keep_alive = request.keep_alive and not self._closing
            response = http1.build_response(
                status, self._date.line() + headers, body, keep_alive, request.version == 10
            )
            if request.method == b"HEAD" and body and status >= 200 and status not in (204, 304):
                # HEAD: the headers of the GET answer (Content-Length included), no content.
                # (204/304 answers never carry a body, so there is nothing to cut.)
                response = response[: len(response) - len(body)]
            await self._write(conn, response)
            if not keep_alive:
                return
            answered += 1
            if answered % FAIRNESS_BATCH == 0:
                await trio.lowlevel.checkpoint()

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

    async def _write(self, conn: _Conn, data: bytes) -> None:
        sent = netio.try_send(conn.sock, data)
        if sent < len(data):
            conn.state = WRITING
            conn.since = monotonic()
            await netio.send_all(conn.sock, memoryview(data)[sent:])

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
            for conn in list(self._conns):
                age = now - conn.since
                if conn.state == IDLE:
                    if age > settings.idle_timeout or self._closing:
                        conn.scope.cancel()
                elif conn.state == READING:
                    if age > settings.client_read_timeout:
                        conn.timed_out = True
                        conn.scope.cancel()
                elif conn.state == WRITING and age > settings.client_write_timeout:
                    conn.scope.cancel()


def _peer(address: Any) -> str:
    if isinstance(address, tuple) and address:
        return str(address[0])
    return "unix"

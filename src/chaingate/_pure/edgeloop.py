"""The edge's connection loop: the pure-Python twin of ``native/edgeloop.pyx``.

Every client connection of the edge lives in one epoll set (edge-triggered) owned here; the
edge's one trio task waits for that set to become readable and calls ``poll``, which, for each
ready connection, reads what the kernel holds, frames every complete request (``http1``),
answers JSON-RPC requests through the fast lane (``fastlane``) and writes all the answers of
that readiness in one send — no trio task switch, no Python object per header, no system call
per request beyond one read and one write.

What the lane does not answer is handed to Python: ``handoff(conn, request)`` (the edge runs
the handler in a task and calls ``answer``), ``encode(conn, status, headers, body)`` (an
answer the client wants compressed) and ``upgrade`` requests (``detach`` gives the socket
away).  A connection answers its requests strictly in order: while one request is being
answered elsewhere (``BUSY``) or its answer waits for the client to read (``WRITING``), the
rest of its input waits in the kernel or the parser.

Timeouts are the edge's sweeper's: it reads ``state``/``since`` and calls ``close`` or
``timeout``.  Sans trio: the caller owns waiting and tasks.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import socket
import time
from collections.abc import Callable
from typing import Any

from chaingate.framing_constants import (
    BUSY,
    CLOSED,
    IDLE,
    JSON_HEADERS,
    LINGER,
    READING,
    UPGRADED,
    WRITING,
)
from chaingate.twintypes.edgeloop import DateLine
from chaingate.twintypes.fastlane import AnswerBudget, ErrorBody, Lane
from chaingate.twintypes.http1 import Http1Module, Request, RequestParser

log = logging.getLogger("chaingate.edge")

__all__ = ["IMPLEMENTATION", "Conn", "Loop"]

IMPLEMENTATION = "pure"

RECV_SIZE = 65536
MAX_EVENTS = 256
# A readiness that held at least LOOK_AGAIN connections (a loaded loop) gets one more look
# before the loop goes back to trio: what arrived while it was served is served in the same
# turn for one epoll_wait, where a turn of trio's costs ~50 Python calls and 3 system calls.
# Below that (one request at a time) nothing changes.
LOOK_AGAIN = 2
# Pieces of answer handed to one sendmsg (the compiled twin's iovec array).
MAX_PARTS = 64
# Requests of one connection answered in one visit before the others get their turn.
FAIRNESS_BATCH = 64
# Answer bytes gathered for one send before they are written anyway.
FLUSH_BYTES = 256 << 10
# A body at least this large is sent after its header section as it is (one sendmsg),
# not copied into one message with it.
LARGE_BODY = 64 << 10
# After an error answer, how much of the client's remaining input we read and discard before
# closing: closing with unread input makes the kernel send a reset, which can destroy the
# answer (a 413) before the client has read it.  (The sweeper bounds the time.)
LINGER_MAX_BYTES = 8 << 20
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
INTERNAL_ERROR = "internal error; retry with exponential backoff"
JSON = JSON_HEADERS
_OVERLOADED_HEADERS = JSON + b"Retry-After: 1\r\n"
# What to do once an answer has been written.
KEEP, CLOSE, DRAIN = 0, 1, 2

# Writability is watched only once an answer did not fit in the kernel: on loopback every send
# is acknowledged at once, and an EPOLLOUT edge per answer would be a wake-up per answer.
_EPOLL_FLAGS = select.EPOLLIN | select.EPOLLRDHUP | select.EPOLLET
_EPOLL_WRITING = _EPOLL_FLAGS | select.EPOLLOUT
_HANGUP = select.EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR


def _quick_ack(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
    except OSError:
        pass  # not TCP


class Conn:
    """One client connection as the loop keeps it."""

    __slots__ = (
        "after",
        "asked_keep_alive",
        "auth_failures",
        "drained",
        "eof",
        "fd",
        "group",
        "hangup",
        "out",
        "parser",
        "peer",
        "ready",
        "request",
        "since",
        "sock",
        "state",
        "unsent",
        "watching",
    )

    def __init__(
        self, sock: socket.socket, peer: str, group: str, parser: RequestParser, now: float
    ) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.peer = peer
        self.group = group  # the client address (an IPv6 /64) for per-address caps
        self.parser = parser
        self.state = IDLE
        self.since = now  # when the connection entered its state
        self.out: list[bytes] = []  # answer bytes not yet taken by the kernel
        self.unsent = 0  # their length
        self.request: Any = None  # the request being answered
        self.asked_keep_alive = True
        self.auth_failures = 0
        self.eof = False
        self.ready = False  # input may be waiting in the kernel (unread)
        self.after = KEEP
        self.drained = 0  # input discarded while lingering
        self.watching = False  # writability registered (an answer waited for the kernel)
        self.hangup = False  # the peer closed its side: read until the end of stream


class Loop:
    """Every connection of the edge, and what happens when they are ready."""

    def __init__(
        self,
        http1: Http1Module,
        lane: Lane,
        *,
        limits: tuple[int, int, int, int],
        max_unsent_bytes: int,
        max_auth_failures: int,
        compress_min: int,
        budget: AnswerBudget,
        date: DateLine,
        error_body: ErrorBody,
        handoff: Callable[[Conn, Request], None],
        encode: Callable[[Conn, int, bytes, bytes], None],
        closed: Callable[[Conn], None],
    ) -> None:
        self._http1 = http1
        self._http_error = http1.HttpError
        self._lane = lane
        self._limits = limits  # request line, header bytes, header count, body bytes
        self._max_unsent = max_unsent_bytes
        self._max_auth_failures = max_auth_failures
        self._compress_min = compress_min
        self._budget = budget  # AnswerBudget: batches being assembled hold all of it → 503
        self._date = date  # .line(): the Date header line
        self._error_body = error_body
        self._handoff = handoff  # (conn, request): the Python handler answers it
        self._encode = encode  # (conn, status, headers, body): compress, then answer()
        self._closed = closed  # (conn): the connection is gone
        self._epoll = select.epoll()
        self.conns: dict[int, Conn] = {}
        # Connections to visit again without an event (more input than one read took, or
        # their turn ended); set outside ``poll``, the wake-up descriptor rouses the waiter.
        self._again: list[Conn] = []
        self._polling = False
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._epoll.register(self._wake, select.EPOLLIN)
        self.closing = False
        self.unsent_bytes = 0  # answer bytes waiting for slow clients, all connections
        self.overloaded = 0  # requests answered 503 because of unsent_bytes or the budget
        self.framing_errors: dict[int, int] = {}
        lane.sink = self

    def fileno(self) -> int:
        return self._epoll.fileno()

    def close_loop(self) -> None:
        for conn in list(self.conns.values()):
            self.close(conn)
        if not self._epoll.closed:
            self._epoll.close()
            os.close(self._wake)

    def _schedule(self, conn: Conn) -> None:
        """Visit ``conn`` again soon, even if no event comes for it."""
        if not self._again and not self._polling:
            os.eventfd_write(self._wake, 1)
        self._again.append(conn)

    # --- connections ----------------------------------------------------------------------

    def register(self, sock: socket.socket, peer: str, group: str) -> Conn:
        """A new connection (non-blocking, accepted by the edge): the loop owns it now."""
        line, header_bytes, headers, body = self._limits
        parser = self._http1.RequestParser(line, header_bytes, headers, body)
        conn = Conn(sock, peer, group, parser, time.monotonic())
        self.conns[conn.fd] = conn
        self._epoll.register(conn.fd, _EPOLL_FLAGS)
        return conn

    def close(self, conn: Conn) -> None:
        if conn.state == CLOSED or conn.state == UPGRADED:
            return
        conn.state = CLOSED
        self._forget(conn)
        conn.sock.close()
        self._closed(conn)

    def _forget(self, conn: Conn) -> None:
        self.conns.pop(conn.fd, None)
        if conn.unsent:
            self.unsent_bytes -= conn.unsent
            conn.unsent = 0
            conn.out = []
        try:
            self._epoll.unregister(conn.fd)
        except (OSError, ValueError):
            pass

    def timeout(self, conn: Conn, status: int, message: str) -> None:
        """Too slow (the sweeper decided): tell the client why, best effort, and close."""
        if conn.state == CLOSED or conn.state == UPGRADED:
            return
        body = self._error_body(status, message)
        headers = self._note(conn, None, status, len(body)) + JSON
        response = self._http1.build_response(status, self._date.line() + headers, body, False)
        try:
            conn.sock.send(response)
        except OSError:
            pass
        self.close(conn)

    def detach(self, conn: Conn) -> tuple[int, bytes] | None:
        """Give an upgraded connection away: its file descriptor (the caller owns it now) and
        the bytes read past the request that upgraded it.  None when it cannot be: closed
        meanwhile, or earlier answers still waiting for the kernel (``unsent``)."""
        if conn.state != BUSY or conn.out:
            return None
        self._forget(conn)
        conn.state = UPGRADED
        return conn.sock.detach(), conn.parser.take_buffered()

    @staticmethod
    def idle(conn: Conn) -> bool:
        """Between requests, and holding none the client already sent (buffered, or still in
        the kernel): a connection that may be closed without losing a request.  Called only
        to close one (a sweep, a shutdown), so the kernel is asked: bytes may have come while
        the event loop stalled, before any poll saw them."""
        if conn.state != IDLE or conn.ready or conn.parser.has_partial:
            return False
        try:
            return not conn.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except OSError:  # nothing waiting (EAGAIN), or the connection is broken anyway
            return True

    def begin_shutdown(self) -> None:
        """Close idle connections now; busy ones close after their answer."""
        self.closing = True
        for conn in list(self.conns.values()):
            if self.idle(conn):
                self.close(conn)

    # --- events ---------------------------------------------------------------------------

    def poll(self) -> bool:
        """Serve what is ready now; True when work remains (call again after a checkpoint)."""
        self._polling = True
        try:
            return self._poll()
        finally:
            self._polling = False

    def _poll(self) -> bool:
        again, self._again = self._again, []
        for conn in again:
            if conn.state == IDLE or conn.state == READING:
                self._resume(conn)
        events = self._serve_ready()
        if LOOK_AGAIN <= len(events) < MAX_EVENTS:
            events = self._serve_ready()
        return bool(self._again) or len(events) == MAX_EVENTS

    def _serve_ready(self) -> list[tuple[int, int]]:
        """Serve the connections ready now; the events seen."""
        events = self._epoll.poll(0, MAX_EVENTS)
        conns = self.conns
        for fd, mask in events:
            found = conns.get(fd)
            if found is None:
                if fd == self._wake:
                    try:
                        os.eventfd_read(self._wake)
                    except BlockingIOError:
                        pass
                continue
            conn = found
            if mask & select.EPOLLOUT and conn.out:
                self._write(conn)
            if mask & _HANGUP:
                # The end of stream may have come with the last bytes, after which no read
                # would be short of it: read until recv says so.
                conn.hangup = conn.ready = True
            if mask & ~select.EPOLLOUT:
                state = conn.state
                if state in (IDLE, READING):
                    self._read(conn)
                elif state == LINGER:
                    self._drain(conn)
                elif state != CLOSED:
                    conn.ready = True
        return events

    def _read(self, conn: Conn) -> None:
        """One read (a full buffer means more may wait: the connection comes back later)."""
        try:
            data = conn.sock.recv(RECV_SIZE)
        except BlockingIOError:
            conn.ready = False
            self._process(conn)
            return
        except OSError:
            self.close(conn)
            return
        if data:
            conn.parser.feed(data)
            conn.ready = len(data) == RECV_SIZE or conn.hangup
        else:
            conn.eof = True
            conn.ready = False
            conn.parser.feed_eof()
        self._process(conn)
        if conn.ready and (conn.state == IDLE or conn.state == READING):
            self._schedule(conn)

    def _process(self, conn: Conn) -> None:
        """Answer the complete requests the parser holds, in order, then write."""
        parser = conn.parser
        answered = 0
        while (conn.state == IDLE or conn.state == READING) and conn.after == KEEP:
            # Any: Request | HttpError | None, told apart by isinstance on the twin's class
            # (a Protocol mypy cannot narrow by).
            request: Any = parser.next_event()
            if request is None:
                if conn.eof:
                    conn.after = CLOSE  # the client closed between requests
                elif parser.has_partial:
                    if parser.take_continue():
                        self._queue(conn, CONTINUE)
                    if conn.state != READING:
                        conn.state = READING
                        conn.since = time.monotonic()
                    # The rest of the request is on its way: ACK now, or a client that sends
                    # its head and body apart without TCP_NODELAY waits our delayed ACK.
                    _quick_ack(conn.sock)
                elif self.closing:
                    conn.after = CLOSE
                elif conn.state != IDLE:
                    conn.state = IDLE
                    conn.since = time.monotonic()
                break
            if isinstance(request, self._http_error):
                status = request.status
                self.framing_errors[status] = self.framing_errors.get(status, 0) + 1
                if conn.eof:
                    conn.after = CLOSE  # hung up mid-request: nobody left to answer
                    break
                body = self._error_body(status, request.message)
                headers = self._note(conn, None, status, len(body)) + JSON
                self._queue(
                    conn,
                    self._http1.build_response(status, self._date.line() + headers, body, False),
                )
                conn.after = DRAIN
                break
            conn.request = request
            conn.asked_keep_alive = request.keep_alive
            conn.state = BUSY
            answer = self._dispatch(conn, request)
            if answer is None:
                break  # answered elsewhere, later
            status, headers, body = answer
            if self._wants_coding(request, body):
                self._encode(conn, status, headers, body)
                break
            self._frame(conn, request, status, headers, body)
            answered += 1
            if conn.after != KEEP or conn.unsent >= FLUSH_BYTES:
                break
            if answered >= FAIRNESS_BATCH:
                self._schedule(conn)
                break
        self._flush(conn)

    def _dispatch(self, conn: Conn, request: Request) -> tuple[int, bytes, bytes] | None:
        if self.unsent_bytes > self._max_unsent or self._budget.held >= self._budget.limit:
            # Memory held for clients that do not read, or by batches being assembled, is at
            # its bound: shed new work before it grows.
            self.overloaded += 1
            body = self._error_body(503, "server overloaded: retry shortly")
            return 503, self._note(conn, request, 503, len(body)) + _OVERLOADED_HEADERS, body
        if request.content_encoding is None and request.upgrade is None:
            try:
                answer = self._lane.serve(conn, request, conn.peer, conn.group)
            except Exception:
                # A bug of ours costs this request a 500, never the loop.
                log.exception("unhandled error in the fast lane")
                request.keep_alive = False
                body = self._error_body(500, INTERNAL_ERROR)
                return 500, self._note(conn, request, 500, len(body)) + JSON, body
            if type(answer) is tuple:
                return answer
            if answer != "handoff":
                return None  # deferred: the lane delivers it
        self._handoff(conn, request)
        return None

    def _note(self, conn: Conn, request: Request | None, status: int, size: int) -> bytes:
        """Count and log an answer the loop gives itself (a framing error, a 503 when
        overloaded, a bug's 500) like every other; its ``X-Request-Id`` line."""
        lane = self._lane
        request_id: bytes = lane.ids.take(request.request_id if request is not None else None)
        method = request.method if request is not None else b"-"
        path = lane.log_path(request.path) if request is not None else "-"
        lane.ledger.note(
            "other", status, request_id, conn.peer, method, path, time.perf_counter(), size, "", b""
        )
        return b"X-Request-Id: " + request_id + b"\r\n"

    def _wants_coding(self, request: Request, body: bytes) -> bool:
        """Might the client's Accept-Encoding turn this answer into a coded one?  (The size
        test first: a small answer is coded only when the client refused identity, which
        needs a "=0" somewhere.)"""
        accept = request.accept_encoding
        return (
            accept is not None
            and self._compress_min > 0
            and len(body) > 0
            and (len(body) >= self._compress_min or b"=0" in accept)
        )

    # --- answers --------------------------------------------------------------------------

    def deliver(
        self, conn: Conn, request: Request, status: int, headers: bytes, body: bytes
    ) -> None:
        """A deferred answer of the lane, to ``request``."""
        if conn.state != BUSY or conn.request is not request:
            return  # the connection is gone, or this answer was given already
        if self._wants_coding(conn.request, body):
            self._encode(conn, status, headers, body)
            return
        self.answer(conn, status, headers, body)

    def answer(self, conn: Conn, status: int, headers: bytes, body: bytes) -> None:
        """The answer to the request ``conn`` is busy with; then on with its next ones."""
        if conn.state != BUSY:
            return
        self._frame(conn, conn.request, status, headers, body)
        if conn.unsent >= FLUSH_BYTES:
            self._flush(conn)  # a large answer first; the next requests after it
        if conn.state == IDLE:
            self._resume(conn)

    def _resume(self, conn: Conn) -> None:
        """On with a free connection's next requests (buffered, or still in the kernel)."""
        if conn.ready and conn.after == KEEP:
            self._read(conn)
        else:
            self._process(conn)

    def _frame(
        self, conn: Conn, request: Request, status: int, headers: bytes, body: bytes
    ) -> None:
        """Queue the HTTP response; the connection is free for its next request."""
        if status == 401:
            conn.auth_failures += 1
            if conn.auth_failures >= self._max_auth_failures:
                request.keep_alive = False  # a key guesser gets a new handshake per try
        keep_alive = request.keep_alive and not self.closing
        http10 = request.version == 10
        has_content = bool(body) and status >= 200 and status not in (204, 304)
        http1 = self._http1
        headers = self._date.line() + headers
        if has_content and len(body) >= LARGE_BODY:
            self._queue(
                conn, http1.build_response_head(status, headers, len(body), keep_alive, http10)
            )
            if request.method != b"HEAD":
                self._queue(conn, body)
        else:
            response = http1.build_response(status, headers, body, keep_alive, http10)
            if request.method == b"HEAD" and has_content:
                # HEAD: the headers of the GET answer (Content-Length included), no content.
                response = response[: len(response) - len(body)]
            self._queue(conn, response)
        conn.request = None
        conn.state = IDLE
        conn.since = time.monotonic()  # idle from this answer on (the sweeper's clock)
        if not keep_alive:
            # Closing a connection the client meant to keep (its key guesses, a bug of ours):
            # pipelined requests may be on their way, and closing on unread input resets
            # the connection, which can destroy this answer.
            conn.after = DRAIN if conn.asked_keep_alive and not self.closing else CLOSE

    def _queue(self, conn: Conn, data: bytes) -> None:
        conn.out.append(data)
        conn.unsent += len(data)
        self.unsent_bytes += len(data)

    def _flush(self, conn: Conn) -> None:
        """Write what is queued in one system call; what the kernel leaves waits for it."""
        if conn.out:
            if not self._send_out(conn):
                return
            if conn.out:
                if not conn.watching:
                    conn.watching = True
                    self._epoll.modify(conn.fd, _EPOLL_WRITING)
                # The rest waits for the kernel (EPOLLOUT).  A connection busy with its next
                # request stays busy; the answer it is waiting for queues behind.
                if conn.state != WRITING and conn.state != BUSY:
                    conn.state = WRITING
                    conn.since = time.monotonic()
                return
        if conn.state != BUSY:
            self._written(conn)

    def _send_out(self, conn: Conn) -> bool:
        """Hand the kernel what is queued, ``MAX_PARTS`` pieces per system call, until it is
        all taken or the kernel leaves some (then EPOLLOUT will say when it has room); False
        when the connection broke (it is closed)."""
        while conn.out:
            offered = conn.out[:MAX_PARTS]
            try:
                sent = conn.sock.sendmsg(offered)
            except BlockingIOError:
                return True
            except OSError:
                self.close(conn)
                return False
            self._sent(conn, sent)
            if sent < sum(len(part) for part in offered):
                return True
        return True

    def _write(self, conn: Conn) -> None:
        """The kernel has room again for a slow reader's answer."""
        if not self._send_out(conn):
            return
        if conn.out or conn.state != WRITING:
            return  # more to write, or busy with a request (its answer comes later)
        conn.state = IDLE
        conn.since = time.monotonic()
        self._written(conn)
        if conn.state == IDLE:
            self._resume(conn)

    def _sent(self, conn: Conn, sent: int) -> None:
        conn.unsent -= sent
        self.unsent_bytes -= sent
        out = conn.out
        while sent and out:
            first = out[0]
            if sent >= len(first):
                sent -= len(first)
                out.pop(0)
            else:
                out[0] = first[sent:]
                sent = 0

    def _written(self, conn: Conn) -> None:
        """Everything queued reached the kernel: close if that was the plan."""
        after = conn.after
        if after == CLOSE:
            self.close(conn)
        elif after == DRAIN:
            self._linger(conn)

    def _linger(self, conn: Conn) -> None:
        conn.state = LINGER
        conn.since = time.monotonic()
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self.close(conn)
            return
        self._drain(conn)

    def _drain(self, conn: Conn) -> None:
        """Read and discard a closing client's input until it closes too (or has sent too
        much; the sweeper bounds the time)."""
        while True:
            try:
                data = conn.sock.recv(RECV_SIZE)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                data = b""
            if not data or conn.drained + len(data) > LINGER_MAX_BYTES:
                self.close(conn)
                return
            conn.drained += len(data)

"""One keep-alive HTTP/1.1 connection to an upstream node, shared by many client requests.

Requests are pipelined: each ``submit`` frames its JSON-RPC body and writes the bytes at once
(or queues them behind bytes the kernel has not taken yet) and returns a future; one reader
task parses the responses, which HTTP/1.1 delivers in request order, and resolves the futures
first-in first-out.

The connection knows exactly which requests reached the wire: every request records the
stream offset where its bytes start, and the connection counts the bytes handed to the kernel
(``Wire``, shared with the HTTP/2 connection of h2connection.py).  When the connection breaks,
a request whose first byte was never handed over fails with ``sent=False`` (safe to send
elsewhere, even a write); every other one fails with ``sent=True``.
"""

from __future__ import annotations

import collections
import functools
import socket
import ssl
from collections.abc import Callable
from time import perf_counter
from typing import Any, Protocol

import trio
from trio.lowlevel import wait_readable

from chaingate import netio
from chaingate.rpc.errors import ABANDONED, BAD_RESPONSE, CONNECTION_LOST, TIMEOUT, UpstreamError
from chaingate.rpc.future import Future
from chaingate.twintypes.http1 import ResponseParser

HTTP1, H2 = "http/1.1", "h2"  # ALPN protocol ids


class Transport(Protocol):
    protocol: str  # what ALPN chose: HTTP1 (also without TLS or without ALPN) or H2

    def try_send(self, data: bytes) -> int: ...

    async def send_all(self, data: bytes) -> None: ...

    async def receive(self) -> bytes: ...

    def close(self) -> None: ...


class PlainTransport:
    """A raw non-blocking socket: writes go straight to the kernel when it has room."""

    __slots__ = ("_eager", "_fd", "_sock", "protocol", "try_send")

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._fd = sock.fileno()  # what trio waits on (a socket, it would ask each time)
        self._eager = False
        self.protocol = HTTP1
        # netio's, bound to the socket: one Python frame per write, not two.
        self.try_send: Callable[[bytes], int] = functools.partial(netio.try_send, sock)

    async def send_all(self, data: bytes) -> None:
        await netio.send_all(self._sock, data)

    async def receive(self) -> bytes:
        """Bytes from the socket; b"" at end of stream.

        In request/response traffic the next answer has usually not arrived when we ask, and
        a read that fails raises BlockingIOError — costly in Python.  So wait for readability
        first, unless the previous read filled the buffer (more is probably queued).  (Here,
        not in netio: every coroutine between the reader and trio's wait is resumed again on
        each wake-up.)"""
        sock = self._sock
        data: bytes | None = None
        if self._eager:
            try:
                data = sock.recv(netio.RECV_SIZE)
            except BlockingIOError:
                pass
        while data is None:
            await wait_readable(self._fd)
            try:
                data = sock.recv(netio.RECV_SIZE)
            except BlockingIOError:
                pass
        self._eager = len(data) == netio.RECV_SIZE
        netio.quick_ack(sock)
        return data

    def close(self) -> None:
        self._fd = -1  # never waited on again: the number may be another socket's by then
        netio.close_socket(self._sock)


class TlsTransport:
    """TLS through ``trio.SSLStream``; every write goes through the connection's writer task."""

    __slots__ = ("_stream", "protocol")

    def __init__(self, stream: trio.SSLStream[trio.SocketStream]) -> None:
        self._stream = stream
        self.protocol = stream.selected_alpn_protocol() or HTTP1

    def try_send(self, data: bytes) -> int:
        return 0

    async def send_all(self, data: bytes) -> None:
        await self._stream.send_all(data)

    async def receive(self) -> bytes:
        data = bytes(await self._stream.receive_some(netio.RECV_SIZE))
        netio.quick_ack(self._stream.transport_stream.socket)
        return data

    def close(self) -> None:
        self._stream.transport_stream.socket.close()


async def open_transport(host: str, port: int, tls_context: ssl.SSLContext | None) -> Transport:
    sock = await netio.connect(host, port)
    if tls_context is None:
        return PlainTransport(sock)
    stream = trio.SSLStream(
        trio.SocketStream(trio.socket.from_stdlib_socket(sock)),
        tls_context,
        server_hostname=host,
        https_compatible=True,
    )
    try:
        await stream.do_handshake()
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    return TlsTransport(stream)


# Asked when the answer's body starts (and as it comes) with its declared length (-1: not
# declared): does anyone still want it?  False: the body is dropped as it arrives.
Wanted = Callable[[int], bool]


class Settle(Protocol):
    """Where a request's outcome goes, exactly once: a ``Future``, or an object of the
    caller's that acts on it right where the answer is read (the pool's first attempt of a
    fast-lane group: no future, no callback list, no task)."""

    def set_result(self, value: Any) -> None: ...

    def set_exception(self, error: BaseException) -> None: ...


class Pending:
    __slots__ = ("deadline", "discarded", "future", "start", "wanted")

    def __init__(self, future: Settle, start: int, deadline: float, wanted: Wanted | None) -> None:
        self.future = future
        self.start = start
        self.deadline = deadline
        self.wanted = wanted
        self.discarded = False


class Wire:
    """The sending half shared by both connection kinds: an output buffer, a writer task, and
    the count of bytes handed to the transport (what makes ``sent`` exact).  A subclass reads
    in ``_read_loop`` and fails its requests in ``abort``; ``run()`` runs both loops."""

    multiplexed = False  # answers come in request order (HTTP/1.1), not by stream

    def __init__(self, name: str, transport: Transport) -> None:
        self.name = name
        self.closed = False
        self.last_active = trio.current_time()
        self._transport = transport
        self._out = bytearray()
        self._writer_busy = False
        self._queued = 0  # bytes submitted so far (stream offset of the next request)
        self._sent = 0  # bytes handed to the kernel (or to the TLS layer) so far
        self._wake_writer = trio.Event()
        self._scope = trio.CancelScope()

    def abort(self, kind: str, message: str) -> None:
        raise NotImplementedError

    async def _read_loop(self) -> None:
        raise NotImplementedError

    def _write(self, data: bytes) -> None:
        """Queue bytes behind those already queued; the writer task sends them."""
        self._queued += len(data)
        self._out += data
        if not self._writer_busy:
            self._wake_writer.set()

    async def run(self, closed: Callable[[Any], None] | None = None) -> None:
        """Both loops, until the connection breaks or is aborted; then ``closed(self)``.
        (Run as a task of its own, not awaited by another coroutine: each wake-up of the
        reader resumes every coroutine of the chain it is awaited in.)"""
        try:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._write_loop)
                    await self._read_loop()
                    nursery.cancel_scope.cancel()
        finally:
            try:
                self.abort(CONNECTION_LOST, "connection closed")
                self._transport.close()
            finally:
                if closed is not None:
                    closed(self)

    async def _write_loop(self) -> None:
        try:
            while True:
                await self._wake_writer.wait()
                self._wake_writer = trio.Event()
                while self._out:
                    data = bytes(self._out)
                    self._out.clear()
                    # Counted as sent before the await: if the connection dies mid-write, any
                    # of these bytes may have left, so their requests must not be resent.
                    self._sent += len(data)
                    self._writer_busy = True
                    await self._transport.send_all(data)
                    self._writer_busy = False
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self.abort(CONNECTION_LOST, f"send failed: {exc.__class__.__name__}")


class UpstreamConnection(Wire):
    """A pipelined connection; run ``run()`` in a nursery for as long as it lives."""

    def __init__(
        self,
        name: str,
        transport: Transport,
        parser: ResponseParser,
        http_error: type,
        frame: Callable[[bytes], bytes],
    ) -> None:
        super().__init__(name, transport)
        self.pending: collections.deque[Pending] = collections.deque()
        self._parser = parser
        self._http_error = http_error
        self._frame = frame

    def submit(self, body: bytes, deadline: float, wanted: Wanted | None = None) -> Future[Any]:
        """Queue one JSON-RPC body; the future yields the parsed response or raises
        UpstreamError (``ABANDONED`` when ``wanted`` said no and the body was dropped)."""
        future: Future[Any] = Future()
        self.send(future, body, deadline, wanted)
        return future

    def send(
        self,
        into: Settle,
        body: bytes,
        deadline: float,
        wanted: Wanted | None = None,
        *,
        now: bool = False,
    ) -> None:
        """``submit``, the outcome set on ``into``.  ``now``: written at once even behind
        requests in flight, when nothing waits to be written (a caller that already gathered
        its calls: the fast lane's groups)."""
        if self.closed:
            into.set_exception(
                UpstreamError(CONNECTION_LOST, "connection closed", sent=False, upstream=self.name)
            )
            return
        data = self._frame(body)
        size = len(data)
        busy = bool(self.pending)
        self.pending.append(Pending(into, self._queued, deadline, wanted))
        self._queued += size
        if self._out or self._writer_busy:
            self._out += data
            return
        if busy and not now:
            # Requests are already in flight, so this one would wait for their answers anyway:
            # leave it to the writer task, which sends everything queued by then in one
            # system call.  An idle connection sends at once (no added latency at low load).
            self._out += data
            self._wake_writer.set()
            return
        try:
            taken = self._transport.try_send(data)
        except OSError as exc:
            self.abort(CONNECTION_LOST, f"send failed: {exc.__class__.__name__}")
            return
        self._sent += taken
        if taken < size:
            self._out += memoryview(data)[taken:]
            self._wake_writer.set()

    def abort(self, kind: str, message: str) -> None:
        """Fail every queued request and close; safe to call more than once."""
        if self.closed:
            return
        self.closed = True
        pending, self.pending = self.pending, collections.deque()
        for item in pending:
            item.future.set_exception(
                UpstreamError(kind, message, sent=item.start < self._sent, upstream=self.name)
            )
        self._scope.cancel()

    def expire(self, now: float, idle_after: float) -> None:
        """Abort on a head request past its deadline: HTTP/1.1 answers in order, so a stuck
        head blocks the whole pipeline (retry-safe calls behind it move to another node).
        Close when idle for ``idle_after`` seconds."""
        if self.pending:
            if self.pending[0].deadline <= now:
                self.abort(TIMEOUT, "no answer before the deadline")
        elif now - self.last_active > idle_after:
            self.abort(TIMEOUT, "idle connection closed")

    def _abandoned(self) -> UpstreamError:
        return UpstreamError(ABANDONED, "nobody wanted the answer", sent=True, upstream=self.name)

    def _judge_body(self, head: Pending, wanted: Wanted) -> None:
        """Drop the body being read when nobody wants it (a big answer given up): its bytes
        are consumed in order, never kept."""
        length = self._parser.body_length()
        if length is not None and not wanted(length):
            self._parser.discard_body()
            head.discarded = True

    async def _read_loop(self) -> None:
        parser = self._parser
        http_error = self._http_error
        clock = netio.clock_offset()
        try:
            while True:
                data = await self._transport.receive()
                if data:
                    parser.feed(data)
                else:
                    parser.feed_eof()
                while True:
                    # Any: Response | HttpError | None, told apart by the twin's class (a
                    # Protocol mypy cannot narrow by; neither class has subclasses).
                    event: Any = parser.next_event()
                    if event is None:
                        break
                    if event.__class__ is http_error:
                        message = getattr(event, "message", "")
                        self.abort(BAD_RESPONSE, f"invalid HTTP from upstream: {message}")
                        return
                    pending = self.pending
                    if not pending:
                        self.abort(BAD_RESPONSE, "upstream sent a response nobody asked for")
                        return
                    head = pending.popleft()
                    if head.discarded:
                        head.future.set_exception(self._abandoned())
                    else:
                        head.future.set_result(event)
                    if not self.pending:
                        # Idle from now (``expire`` reads it only while nothing is pending).
                        self.last_active = (
                            clock + perf_counter() if clock is not None else trio.current_time()
                        )
                    if not event.keep_alive:
                        self.abort(CONNECTION_LOST, "upstream closed the connection")
                        return
                if self.pending:
                    head = self.pending[0]
                    if head.wanted is not None and not head.discarded:
                        self._judge_body(head, head.wanted)
                if not data:
                    self.abort(CONNECTION_LOST, "upstream closed the connection")
                    return
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self.abort(CONNECTION_LOST, f"connection error: {exc.__class__.__name__}")

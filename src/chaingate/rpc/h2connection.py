"""One HTTP/2 connection to an upstream node (chosen by ALPN), its requests multiplexed as streams.

The protocol is the ``h2`` library's state machine (sans-IO); this module maps requests to
streams and events to futures, and its only I/O is ``Wire``'s writer task and the read loop.

* Streams: at most the server's ``MAX_CONCURRENT_STREAMS`` (and ``MAX_STREAMS``) are open; the
  rest wait here, unsent, for a stream to close.
* Flow control: request bodies go out as the server's windows allow (the rest on its
  WINDOW_UPDATE); every byte received is acknowledged at once, so the server's answers are
  bounded by ``max_body`` per stream, not by our windows.
* What was sent: as on HTTP/1.1, each stream records the stream offset of its first byte and
  ``Wire`` counts the bytes handed to the transport, so a request still queued when the
  connection breaks fails with ``sent=False``.  HTTP/2 adds two proofs that a request that did
  leave was not processed (RFC 9113 8.7): the server reset its stream with REFUSED_STREAM, or
  its stream id is above a GOAWAY's last-stream-id.  Those fail with kind ``refused`` and
  ``sent=False``; the pool sends them again on another stream (pool.py, ``Upstream.send``).
  Any other reset, or a connection lost with the stream open, is ``sent=True``.
* GOAWAY: no new stream; the streams at or below its last-stream-id are finished; then the
  connection closes and the pool opens another.
* Deadlines: a stream past its deadline is reset (CANCEL) and fails alone — streams do not
  block each other as pipelined HTTP/1.1 answers do — unless nothing at all arrived on the
  connection since that stream was opened: then the connection is presumed dead and aborted.
"""

from __future__ import annotations

import collections
from typing import Any

import trio
from h2.config import H2Configuration
from h2.connection import (
    ConnectionInputs,
    ConnectionState,
    H2Connection,
    H2ConnectionStateMachine,
)
from h2.errors import ErrorCodes
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    RemoteSettingsChanged,
    ResponseReceived,
    StreamEnded,
    StreamReset,
    WindowUpdated,
)
from h2.exceptions import ProtocolError, StreamClosedError
from h2.settings import SettingCodes, Settings

from chaingate.rpc.connection import Transport, Wire
from chaingate.rpc.errors import BAD_RESPONSE, CONNECTION_LOST, REFUSED, TIMEOUT, UpstreamError
from chaingate.rpc.future import Future
from chaingate.rpc.hpack_cache import MemoDecoder, StaticEncoder

STREAM_WINDOW = 1 << 20  # what the server may send on one stream before we acknowledge it
CONNECTION_WINDOW = 16 << 20  # the same for all streams together
MAX_STREAMS = 512  # streams open at once, whatever the server allows
# Streams opened before the server's SETTINGS arrive: the least RFC 9113 (6.5.2) recommends a
# server to allow, so that a burst on a new connection is not refused wholesale.
FIRST_STREAMS = 100
MAX_HEADER_LIST = 64 << 10


class _DrainingStateMachine(H2ConnectionStateMachine):
    """h2 closes its connection state on a received GOAWAY, so the answers to the streams at or
    below the GOAWAY's last-stream-id — which the server is finishing (RFC 9113 6.8) — would be
    protocol errors (python-hyper/h2#1181), and nginx sends a graceful GOAWAY every
    ``keepalive_requests`` streams.  Here the connection stays open for them; we never open a
    stream after a GOAWAY (``Http2Connection.draining``)."""

    _transitions = {
        **H2ConnectionStateMachine._transitions,
        (ConnectionState.CLIENT_OPEN, ConnectionInputs.RECV_GOAWAY): (
            None,
            ConnectionState.CLIENT_OPEN,
        ),
    }


class _Stream:
    """One request: waiting for a stream, then its stream's answer as it arrives."""

    __slots__ = (
        "body",
        "chunks",
        "content_type",
        "deadline",
        "future",
        "opened",
        "retry_after",
        "size",
        "start",
        "status",
        "stream_id",
        "unsent",
    )

    def __init__(self, future: Future[Any], body: bytes, deadline: float) -> None:
        self.future = future
        self.body = body
        self.deadline = deadline
        self.stream_id = 0
        self.start = 0  # stream offset of its first byte (Wire)
        self.opened = 0.0
        self.unsent = memoryview(body)  # body bytes still held back by flow control
        self.status = 0
        self.content_type: bytes | None = None
        self.retry_after: bytes | None = None
        self.chunks: list[bytes] = []
        self.size = 0


class Http2Connection(Wire):
    """A multiplexed connection; run ``run()`` in a nursery for as long as it lives."""

    multiplexed = True

    def __init__(
        self,
        name: str,
        transport: Transport,
        *,
        authority: bytes,
        path: bytes,
        headers: list[tuple[bytes, bytes]],
        max_body: int,
        response_type: type,
    ) -> None:
        super().__init__(name, transport)
        self.pending: dict[int, _Stream] = {}  # open streams by id
        self.waiting: collections.deque[_Stream] = collections.deque()  # no stream yet
        self.draining = False  # a GOAWAY came (or we are closing): no new stream
        self._max_body = max_body
        self._response_type = response_type
        self._head = [
            (b":method", b"POST"),
            (b":scheme", b"https"),
            (b":authority", authority),
            (b":path", path),
            (b"content-type", b"application/json"),
        ]
        self._extra_headers = headers  # checked when the configuration was loaded
        self._blocked: dict[int, _Stream] = {}  # streams whose body waits for a window
        self._last_received = trio.current_time()
        self._stream_limit = FIRST_STREAMS  # until the server's SETTINGS say otherwise
        h2 = H2Connection(
            H2Configuration(
                client_side=True,
                header_encoding=None,
                # Our own headers are fixed and checked at start-up.  Of the server's only
                # :status and retry-after are read, both parsed defensively, and none reaches a
                # client: h2's checks of every answer's headers would cost ~20 µs per request.
                validate_outbound_headers=False,
                normalize_outbound_headers=False,
                validate_inbound_headers=False,
                normalize_inbound_headers=False,
            )
        )
        h2.state_machine = _DrainingStateMachine()
        # Most of HTTP/2's cost per request was HPACK: memoised both ways (hpack_cache.py).
        h2.encoder = StaticEncoder()
        h2.decoder = MemoDecoder(h2.decoder.max_header_list_size)
        h2.local_settings = Settings(
            client=True,
            initial_values={
                SettingCodes.ENABLE_PUSH: 0,
                SettingCodes.MAX_CONCURRENT_STREAMS: 0,  # no server-initiated streams
                SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
                SettingCodes.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST,
            },
        )
        h2.initiate_connection()
        h2.increment_flow_control_window(CONNECTION_WINDOW - 65535)
        self._h2 = h2
        self._flush()

    @property
    def capacity(self) -> int:
        """Streams this connection may have open at once (0 once it drains)."""
        return 0 if self.draining else self._stream_limit

    def submit(self, body: bytes, deadline: float, wanted: Any = None) -> Future[Any]:
        """Send one JSON-RPC body on a stream of its own (or queue it for the next free one);
        the future yields the response or raises UpstreamError.  ``wanted`` is not asked:
        each stream's body is bounded by ``max_body`` and read whole."""
        future: Future[Any] = Future()
        if self.closed:
            future.set_exception(
                UpstreamError(CONNECTION_LOST, "connection closed", sent=False, upstream=self.name)
            )
            return future
        if self.draining:
            future.set_exception(self._refused("the connection is closing (GOAWAY)"))
            return future
        request = _Stream(future, body, deadline)
        if not self.waiting and len(self.pending) < self.capacity:
            self._open(request)
            self._flush()
        else:
            self.waiting.append(request)
        return future

    def abort(self, kind: str, message: str) -> None:
        """Fail every request and close; safe to call more than once."""
        if self.closed:
            return
        self.closed = self.draining = True
        pending, self.pending = self.pending, {}
        waiting, self.waiting = self.waiting, collections.deque()
        self._blocked.clear()
        for request in pending.values():
            request.future.set_exception(
                UpstreamError(kind, message, sent=request.start < self._sent, upstream=self.name)
            )
        for request in waiting:
            request.future.set_exception(
                UpstreamError(kind, message, sent=False, upstream=self.name)
            )
        self._scope.cancel()

    def expire(self, now: float, idle_after: float) -> None:
        """Reset the streams past their deadline; close when idle, or drained after GOAWAY."""
        if self.closed:
            return
        for stream_id, request in list(self.pending.items()):
            if request.deadline > now:
                continue
            if self._last_received < request.opened:
                # Not a byte since this stream was sent: the connection, not the call, is dead.
                self.abort(TIMEOUT, "no answer before the deadline")
                return
            self._cancel(stream_id)
            request.future.set_exception(
                UpstreamError(
                    TIMEOUT,
                    "no answer before the deadline",
                    sent=request.start < self._sent,
                    upstream=self.name,
                )
            )
        if self.waiting:
            kept: collections.deque[_Stream] = collections.deque()
            for request in self.waiting:
                if request.deadline <= now:
                    request.future.set_exception(
                        UpstreamError(
                            TIMEOUT, "no stream free before the deadline", sent=False,
                            upstream=self.name,
                        )
                    )  # fmt: skip
                else:
                    kept.append(request)
            self.waiting = kept
        self._start_waiting()
        self._flush()
        if not self.pending and not self.waiting:
            if self.draining:
                self.abort(CONNECTION_LOST, "connection closed after GOAWAY")
            elif now - self.last_active > idle_after:
                self.abort(TIMEOUT, "idle connection closed")

    # --- sans-IO: what the server sent ------------------------------------------------------

    def receive(self, data: bytes) -> None:
        """Bytes from the server: streams answered, reset or refused; windows opened."""
        self._last_received = trio.current_time()
        try:
            events = self._h2.receive_data(data)
        except ProtocolError as exc:
            # h2's message may quote the server's bytes; the class says enough.
            self.abort(BAD_RESPONSE, f"invalid HTTP/2 from upstream: {exc.__class__.__name__}")
            return
        for event in events:
            if isinstance(event, DataReceived):
                self._on_data(event)
            elif isinstance(event, ResponseReceived):
                self._on_headers(event)
            elif isinstance(event, StreamEnded):
                self._on_end(event.stream_id)
            elif isinstance(event, StreamReset):
                self._on_reset(event)
            elif isinstance(event, WindowUpdated):
                self._resume_bodies()
            elif isinstance(event, RemoteSettingsChanged):
                limit = self._h2.remote_settings.max_concurrent_streams
                self._stream_limit = min(limit, MAX_STREAMS)
                self._start_waiting()  # the limit may have grown
            elif isinstance(event, ConnectionTerminated):
                self._on_goaway(event)
            if self.closed:
                return
            # Trailers, pings (h2 answers them), settings acks, priority: nothing to do.
        self._start_waiting()
        self._flush()

    def _on_headers(self, event: ResponseReceived) -> None:
        request = self.pending.get(event.stream_id)
        if request is None:
            return
        for name, value in event.headers or ():
            if name == b":status":
                request.status = int(value) if value.isdigit() else 0
            elif name == b"content-type":
                request.content_type = bytes(value)
            elif name == b"retry-after":
                request.retry_after = bytes(value)

    def _on_data(self, event: DataReceived) -> None:
        stream_id = event.stream_id
        # Acknowledged at once: the bound on an answer is max_body, not our window.
        self._h2.acknowledge_received_data(event.flow_controlled_length, stream_id)
        request = self.pending.get(stream_id)
        if request is None or not event.data:
            return
        request.size += len(event.data)
        if request.size > self._max_body:
            self._cancel(stream_id)
            request.future.set_exception(
                UpstreamError(
                    BAD_RESPONSE,
                    f"answer larger than max_response_bytes ({self._max_body})",
                    sent=True,
                    upstream=self.name,
                )
            )
            return
        request.chunks.append(event.data)

    def _on_end(self, stream_id: int) -> None:
        request = self.pending.get(stream_id)
        if request is None:
            return
        if request.unsent:
            self._cancel(stream_id)  # answered before its body was all sent: stop sending it
        else:
            self._forget(stream_id)
        if not 100 <= request.status <= 599:
            request.future.set_exception(
                UpstreamError(
                    BAD_RESPONSE, "invalid HTTP/2 from upstream: no status", sent=True,
                    upstream=self.name,
                )
            )  # fmt: skip
            return
        response = self._response_type()
        response.status = request.status
        response.body = b"".join(request.chunks)
        response.keep_alive = True
        response.content_type = request.content_type
        response.retry_after = request.retry_after
        self.last_active = trio.current_time()
        request.future.set_result(response)

    def _on_reset(self, event: StreamReset) -> None:
        request = self._forget(event.stream_id)
        if request is None:
            return
        code = event.error_code
        if event.remote_reset and code == ErrorCodes.REFUSED_STREAM:
            request.future.set_exception(self._refused("the upstream refused the stream"))
            return
        reason = code.name if isinstance(code, ErrorCodes) else str(code)
        # Any other reset may come after the server acted on the call: not a proof of anything.
        kind = CONNECTION_LOST if event.remote_reset else BAD_RESPONSE
        request.future.set_exception(
            UpstreamError(kind, f"stream reset ({reason})", sent=True, upstream=self.name)
        )

    def _on_goaway(self, event: ConnectionTerminated) -> None:
        self.draining = True
        last = event.last_stream_id if event.last_stream_id is not None else 0
        for stream_id in [s for s in self.pending if s > last]:
            request = self._forget(stream_id)
            if request is not None:
                request.future.set_exception(
                    self._refused("the upstream closed the connection before this stream")
                )
        waiting, self.waiting = self.waiting, collections.deque()
        for request in waiting:
            request.future.set_exception(self._refused("the connection is closing (GOAWAY)"))
        if not self.pending:
            self.abort(CONNECTION_LOST, "connection closed after GOAWAY")

    def _refused(self, message: str) -> UpstreamError:
        """Provably not processed: safe to send again, a write included."""
        return UpstreamError(REFUSED, message, sent=False, upstream=self.name)

    # --- sans-IO: what we send ----------------------------------------------------------------

    def _open(self, request: _Stream) -> None:
        h2 = self._h2
        self._flush()  # so that the bytes queued next are this stream's own
        stream_id = h2.get_next_available_stream_id()
        request.stream_id = stream_id
        request.start = self._queued
        request.opened = trio.current_time()
        self.pending[stream_id] = request
        h2.send_headers(
            stream_id,
            [*self._head, (b"content-length", b"%d" % len(request.body)), *self._extra_headers],
        )
        self._send_body(request)

    def _send_body(self, request: _Stream) -> None:
        h2 = self._h2
        stream_id = request.stream_id
        unsent = request.unsent
        while unsent:
            size = min(
                len(unsent), h2.local_flow_control_window(stream_id), h2.max_outbound_frame_size
            )
            if size <= 0:
                self._blocked[stream_id] = request
                break
            h2.send_data(stream_id, bytes(unsent[:size]), end_stream=size == len(unsent))
            unsent = unsent[size:]
        else:
            self._blocked.pop(stream_id, None)
        request.unsent = unsent

    def _resume_bodies(self) -> None:
        for request in list(self._blocked.values()):
            self._send_body(request)

    def _start_waiting(self) -> None:
        while self.waiting and len(self.pending) < self.capacity:
            self._open(self.waiting.popleft())

    def _cancel(self, stream_id: int) -> None:
        """Reset a stream we no longer want (h2 then drops what still arrives on it)."""
        self._forget(stream_id)
        try:
            self._h2.reset_stream(stream_id, ErrorCodes.CANCEL)
        except StreamClosedError:
            pass  # the server closed it in the meantime

    def _forget(self, stream_id: int) -> _Stream | None:
        self._blocked.pop(stream_id, None)
        return self.pending.pop(stream_id, None)

    def _flush(self) -> None:
        data = self._h2.data_to_send()
        if data:
            self._write(data)

    async def _read_loop(self) -> None:
        try:
            while not self.closed:
                data = await self._transport.receive()
                if not data:
                    self.abort(CONNECTION_LOST, "upstream closed the connection")
                    return
                self.receive(data)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self.abort(CONNECTION_LOST, f"connection error: {exc.__class__.__name__}")

"""One HTTP/1.1 request and its response over one stream, framed by h11.

The stream may be a new connection or a kept-alive one (``pool``); each exchange gets its own
``h11.Connection``, so each request carries its own header-size limit.  Afterwards the
exchange says whether the stream may carry another request (``reusable``) and, when it
failed, whether it failed the way a kept-alive connection the server had already closed
fails (``stale``) — the one failure the fetcher retries.
"""

from __future__ import annotations

import h11
import trio

from chaingate.outbound.body import BodyReader
from chaingate.outbound.errors import FetchError, Reason

RECEIVE_SIZE = 65536

_LOST = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


class Exchange:
    def __init__(self, stream: trio.abc.Stream, origin: str, max_header_bytes: int) -> None:
        self._stream = stream
        self._origin = origin  # for messages only
        self._conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=max_header_bytes)
        self._answered = False  # a byte of the response arrived
        self._lost = False  # the peer closed or reset the connection

    @property
    def reusable(self) -> bool:
        """May the stream carry the next request?

        Both messages complete and neither side asked to close (h11 moves a side to
        MUST_CLOSE on ``Connection: close``, HTTP/1.0 or a body delimited by EOF), and nothing
        arrived past the end of the response: bytes the server sent unasked would be read as
        the next request's answer.
        """
        return (
            self._conn.our_state is h11.DONE
            and self._conn.their_state is h11.DONE
            and self._conn.trailing_data == (b"", False)
        )

    @property
    def stale(self) -> bool:
        """Did the peer close the connection before a single byte of the response arrived?"""
        return self._lost and not self._answered

    async def send(self, request: h11.Request, body: bytes) -> None:
        data = self._conn.send(request) or b""
        if body:
            data += self._conn.send(h11.Data(data=body)) or b""
        data += self._conn.send(h11.EndOfMessage()) or b""
        try:
            await self._stream.send_all(data)
        except _LOST:
            self._lost = True
            raise self._error("connection lost while sending the request") from None

    async def receive_head(self) -> h11.Response:
        """The final response's status line and headers (1xx answers are skipped)."""
        while True:
            event = await self._next_event()
            if isinstance(event, h11.Response):
                return event
            if not isinstance(event, h11.InformationalResponse):
                raise self._error("server sent no response")

    async def receive_body(self, reader: BodyReader) -> bytes:
        """The body, fed to ``reader`` as it arrives (which raises once it is too large)."""
        while True:
            event = await self._next_event()
            if not isinstance(event, h11.Data | h11.EndOfMessage):
                raise self._error("server closed the response early")
            try:
                if isinstance(event, h11.EndOfMessage):
                    return reader.finish()
                reader.feed(bytes(event.data))
            except FetchError as exc:  # the reader's own, which knows no origin
                raise FetchError(exc.reason, f"{self._origin}: {exc.message}") from None

    async def _next_event(self) -> object:
        while True:
            try:
                event = self._conn.next_event()
            except h11.RemoteProtocolError:
                raise self._error("invalid HTTP response") from None
            if event is not h11.NEED_DATA:
                return event
            try:
                data = await self._stream.receive_some(RECEIVE_SIZE)
            except _LOST:
                self._lost = True
                raise self._error("connection lost while reading the response") from None
            if data:
                self._answered = True
            else:
                self._lost = True  # EOF: h11 turns it into ConnectionClosed or an error
            self._conn.receive_data(bytes(data))

    def _error(self, what: str) -> FetchError:
        return FetchError(Reason.HTTP_ERROR, f"{self._origin}: {what}")

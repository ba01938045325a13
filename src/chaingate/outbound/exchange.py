"""One HTTP/1.1 request and its response over one stream, framed by h11.

Every request says ``Connection: close``: outbound fetches are rare and go to many hosts, so
a pool would hold sockets for nothing; the stream is closed after the answer.
"""

from __future__ import annotations

from typing import Any

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

    async def send(self, request: h11.Request, body: bytes) -> None:
        data = self._conn.send(request) or b""
        if body:
            data += self._conn.send(h11.Data(data=body)) or b""
        data += self._conn.send(h11.EndOfMessage()) or b""
        try:
            await self._stream.send_all(data)
        except _LOST:
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

    async def _next_event(self) -> Any:
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
                raise self._error("connection lost while reading the response") from None
            self._conn.receive_data(bytes(data))

    def _error(self, what: str) -> FetchError:
        return FetchError(Reason.HTTP_ERROR, f"{self._origin}: {what}")

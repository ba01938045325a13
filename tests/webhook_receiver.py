"""A webhook receiver for tests: HTTP/1.1 (keep-alive) over TLS or plain TCP on loopback.

It records every request (headers, raw body), answers what ``answer`` says (2xx by default),
and can hang or drop the connection — the behaviours of receivers in the wild.  It verifies
nothing itself: the tests verify with code we did not write (``standardwebhooks``) and by
hand.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import h11
import msgspec
import trio
import trustme


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]  # lowercase names
    body: bytes
    at: float  # trio.current_time()

    def json(self) -> Any:
        return msgspec.json.decode(self.body)


# What to do with a request: a status (with an optional body), or "hang", or "drop".
Answer = int | tuple[int, bytes] | str


@dataclass
class Receiver:
    answer: Callable[[Received], Answer] = lambda _r: 200
    received: list[Received] = field(default_factory=list)
    connections: int = 0
    concurrent: int = 0
    max_concurrent: int = 0
    port: int = 0
    delay: float = 0.0  # seconds before each answer
    changed: trio.Event = field(default_factory=trio.Event)

    async def serve(
        self,
        ssl_context: ssl.SSLContext | None = None,
        *,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self.port)
        async with trio.open_nursery() as nursery:
            for listener in listeners:
                nursery.start_soon(
                    trio.serve_listeners, self._connection_handler(ssl_context), [listener]
                )

    def _connection_handler(
        self, ssl_context: ssl.SSLContext | None
    ) -> Callable[[trio.SocketStream], Any]:
        async def handle(raw: trio.SocketStream) -> None:
            self.connections += 1
            stream: trio.abc.Stream = raw
            if ssl_context is not None:
                stream = trio.SSLStream(raw, ssl_context, server_side=True)
                try:
                    await stream.do_handshake()
                except (trio.BrokenResourceError, ssl.SSLError):
                    return
            try:
                await self._serve_connection(stream)
            except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
                pass
            finally:
                await trio.aclose_forcefully(stream)

        return handle

    async def _serve_connection(self, stream: trio.abc.Stream) -> None:
        conn = h11.Connection(h11.SERVER)
        while True:
            request, body = await self._read_request(conn, stream)
            if request is None:
                return
            entry = Received(
                request.method.decode(),
                request.target.decode(),
                {k.decode().lower(): v.decode() for k, v in request.headers},
                body,
                trio.current_time(),
            )
            self.concurrent += 1
            self.max_concurrent = max(self.max_concurrent, self.concurrent)
            try:
                if self.delay:
                    await trio.sleep(self.delay)
                answer = self.answer(entry)
                self.received.append(entry)
                self.changed.set()
                self.changed = trio.Event()
                if answer == "hang":
                    await trio.sleep_forever()
                if answer == "drop":
                    return
                status, payload = answer if isinstance(answer, tuple) else (answer, b"ok")
                assert isinstance(status, int)
                data = conn.send(
                    h11.Response(
                        status_code=status,
                        headers=[
                            ("Content-Length", str(len(payload))),
                            ("Content-Type", "text/plain"),
                        ],
                    )
                )
                data = (data or b"") + (conn.send(h11.Data(data=payload)) or b"")
                data += conn.send(h11.EndOfMessage()) or b""
                await stream.send_all(data)
            finally:
                self.concurrent -= 1
            if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                return
            conn.start_next_cycle()

    @staticmethod
    async def _read_request(
        conn: h11.Connection, stream: trio.abc.Stream
    ) -> tuple[h11.Request | None, bytes]:
        request: h11.Request | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(65536)
                if not data:
                    return None, b""
                conn.receive_data(bytes(data))
                continue
            if isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                return request, bytes(body)
            elif isinstance(event, h11.ConnectionClosed):
                return None, b""

    async def wait_for(self, count: int) -> list[Received]:
        """Until at least ``count`` requests arrived (the caller bounds the wait); all."""
        while len(self.received) < count:
            await self.changed.wait()
        return list(self.received)


def tls_pair() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server, client) contexts: a trustme CA's certificate for 127.0.0.1, and a client
    context that trusts only that CA."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    return server, client

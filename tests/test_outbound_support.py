"""Instruments for the outbound fetcher's tests, and tests that they see what they claim to.

* ``CountingListener`` — a real loopback listener nobody serves.  ``connections()`` drains the
  kernel's accept queue without blocking: a loopback connect completes in the kernel before
  ``connect`` returns, so every connection made so far is counted, accepted or not.
* ``RecordingConnector`` — records every connect attempt the fetcher makes.  It opens a socket
  only for a route it was given (a fake public address → a loopback port) or, if asked, to a
  loopback address; anything else is refused without touching a socket.
* ``StaticResolver`` — answers names from a dict and records the questions.
* ``HttpServer`` — a loopback HTTP/1.1 server (h11 reads each request) whose handlers write
  raw bytes, so a test can send exactly the answer it needs: a redirect, 50 MB, a trickle.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import ipaddress
import socket
import ssl
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import h11
import pytest
import trio

from chaingate.outbound import FetchError, IPAddress, Reason, TcpConnector

LOOPBACK_V4 = ipaddress.IPv4Address("127.0.0.1")
LOOPBACK_V6 = ipaddress.IPv6Address("::1")


def has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


class CountingListener:
    def __init__(self, host: str = "127.0.0.1") -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.bind((host, 0))
        self._sock.listen(128)
        self._sock.setblocking(False)
        self.port: int = self._sock.getsockname()[1]
        self._seen = 0

    def connections(self) -> int:
        while True:
            try:
                conn, _ = self._sock.accept()
            except BlockingIOError:
                return self._seen
            conn.close()
            self._seen += 1

    def close(self) -> None:
        self._sock.close()


@contextmanager
def counting_listener(host: str = "127.0.0.1") -> Iterator[CountingListener]:
    listener = CountingListener(host)
    try:
        yield listener
    finally:
        listener.close()


class CountingStream(trio.abc.Stream):
    """A stream that adds the bytes read through it to its connector's ``received``."""

    def __init__(self, inner: trio.abc.Stream, owner: RecordingConnector) -> None:
        self._inner = inner
        self._owner = owner

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self._inner.receive_some(max_bytes)
        self._owner.received += len(data)
        return data

    async def aclose(self) -> None:
        await self._inner.aclose()


@dataclasses.dataclass(frozen=True)
class Attempt:
    address: IPAddress
    port: int
    server_name: str | None


class RecordingConnector:
    def __init__(
        self,
        routes: Mapping[tuple[str, int], int] | None = None,
        *,
        ssl_context: ssl.SSLContext | None = None,
        pass_loopback: bool = False,
    ) -> None:
        self.routes = {(ipaddress.ip_address(a), p): lp for (a, p), lp in (routes or {}).items()}
        self.pass_loopback = pass_loopback
        self.attempts: list[Attempt] = []
        self.received = 0
        self._real = TcpConnector(ssl_context)

    async def connect(
        self, address: IPAddress, port: int, server_name: str | None
    ) -> trio.abc.Stream:
        self.attempts.append(Attempt(address, port, server_name))
        routed = self.routes.get((address, port))
        if routed is not None:
            stream = await self._real.connect(LOOPBACK_V4, routed, server_name)
        elif self.pass_loopback and address.is_loopback:
            stream = await self._real.connect(address, port, server_name)
        else:
            raise ConnectionRefusedError(errno.ECONNREFUSED, "recorded, never attempted")
        return CountingStream(stream, self)


class StaticResolver:
    def __init__(self, names: Mapping[str, Sequence[str]] | None = None) -> None:
        self.names = {
            name: [ipaddress.ip_address(a) for a in v] for name, v in (names or {}).items()
        }
        self.queries: list[str] = []

    async def resolve(self, host: str, port: int) -> Sequence[IPAddress]:
        self.queries.append(host)
        if host not in self.names:
            raise FetchError(Reason.RESOLVE_FAILED, f"{host} does not resolve")
        return self.names[host]


@dataclasses.dataclass
class SeenRequest:
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k == name.lower()), None)


Handler = Callable[[SeenRequest, trio.abc.Stream], Awaitable[None]]


def head(status: int, headers: Sequence[tuple[str, str]] = ()) -> bytes:
    lines = [f"HTTP/1.1 {status} X"] + [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join([*lines, "Connection: close", "", ""])).encode("latin-1")


def reply(
    status: int = 200,
    body: bytes = b"{}",
    headers: Sequence[tuple[str, str]] = (("Content-Type", "application/json"),),
) -> Handler:
    async def handler(request: SeenRequest, stream: trio.abc.Stream) -> None:
        await stream.send_all(head(status, [*headers, ("Content-Length", str(len(body)))]) + body)

    return handler


def redirect(location: str, status: int = 302) -> Handler:
    return reply(status, b"", [("Location", location)])


class HttpServer:
    """Routes by request target; an unknown target gets 404."""

    def __init__(
        self, routes: Mapping[str, Handler], *, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        self.routes = dict(routes)
        self.ssl_context = ssl_context
        self.requests: list[SeenRequest] = []
        self.connections = 0
        self.port = 0

    async def start(self, nursery: trio.Nursery, host: str = "127.0.0.1") -> HttpServer:
        serve = functools.partial(trio.serve_tcp, host=host)
        listeners = await nursery.start(serve, self._serve, 0)
        self.port = listeners[0].socket.getsockname()[1]
        return self

    async def _serve(self, stream: trio.abc.Stream) -> None:
        self.connections += 1
        if self.ssl_context is not None:
            stream = trio.SSLStream(stream, self.ssl_context, server_side=True)
        try:
            request = await self._read(stream)
            self.requests.append(request)
            await self.routes.get(request.target, reply(404, b"no"))(request, stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.RemoteProtocolError):
            pass  # the client gave up on us: what many of these tests want it to do
        finally:
            await trio.aclose_forcefully(stream)

    @staticmethod
    async def _read(stream: trio.abc.Stream) -> SeenRequest:
        conn = h11.Connection(h11.SERVER)
        start: h11.Request | None = None
        body = b""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(bytes(await stream.receive_some(65536)))
            elif isinstance(event, h11.Request):
                start = event
            elif isinstance(event, h11.Data):
                body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage) and start is not None:
                return SeenRequest(
                    start.method.decode(),
                    start.target.decode(),
                    [(k.decode(), v.decode("latin-1")) for k, v in start.headers],
                    body,
                )
            else:
                raise h11.RemoteProtocolError(f"unexpected {event!r}")


# The instruments themselves: each can see the thing the SSRF tests assert never happens.


def test_counting_listener_counts_connections_nobody_accepted() -> None:
    with counting_listener() as listener:
        assert listener.connections() == 0
        with socket.create_connection(("127.0.0.1", listener.port)):
            pass
        with socket.create_connection(("127.0.0.1", listener.port)):
            pass
        assert listener.connections() == 2


async def test_recording_connector_records_and_never_connects_unrouted() -> None:
    connector = RecordingConnector()
    with pytest.raises(ConnectionRefusedError):
        await connector.connect(ipaddress.ip_address("10.0.0.1"), 80, None)
    assert connector.attempts == [Attempt(ipaddress.ip_address("10.0.0.1"), 80, None)]


async def test_recording_connector_routes_to_loopback(nursery: trio.Nursery) -> None:
    server = await HttpServer({"/": reply()}).start(nursery)
    with counting_listener() as listener:
        connector = RecordingConnector({("203.0.113.7", 80): server.port}, pass_loopback=True)
        stream = await connector.connect(ipaddress.ip_address("203.0.113.7"), 80, None)
        await stream.aclose()
        stream = await connector.connect(LOOPBACK_V4, listener.port, None)
        await stream.aclose()
        assert listener.connections() == 1
    assert len(connector.attempts) == 2


async def test_static_resolver_records_questions() -> None:
    resolver = StaticResolver({"a.example": ["192.0.2.1"]})
    assert await resolver.resolve("a.example", 80) == [ipaddress.ip_address("192.0.2.1")]
    with pytest.raises(FetchError) as caught:
        await resolver.resolve("b.example", 80)
    assert caught.value.reason == Reason.RESOLVE_FAILED
    assert resolver.queries == ["a.example", "b.example"]

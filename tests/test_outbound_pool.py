"""Kept-alive outbound connections: reused when safe, bounded, and never a way around the policy.

The server here is a real loopback HTTP/1.1 server that keeps connections open (the one in
test_outbound_support answers once and closes).  It counts the connections it accepted and
the ones the client closed, which is how these tests see reuse, eviction and expiry.
"""

from __future__ import annotations

import functools
import ipaddress
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import h11
import pytest
import trio
import trio.testing
import trustme

from chaingate.outbound import (
    ConnectionPool,
    Fetcher,
    FetchError,
    FetchLimits,
    IPAddress,
    OutboundPolicy,
    PoolKey,
    PoolLimits,
    Reason,
    Resolver,
    TcpConnector,
)
from chaingate.outbound.net import Connector
from chaingate.outbound.pool import Connection, IdleSet, looks_alive
from tests.test_outbound_support import (
    Attempt,
    RecordingConnector,
    SeenRequest,
    StaticResolver,
)

FAKE_PUBLIC = "203.0.113.7"
ROUTED = OutboundPolicy.production(allow_cidrs=["203.0.113.0/24"])
HOOK = "http://hooks.example/services/T0/B0/s3cr3t"
EVENT = b'{"type": "ADDRESS_ACTIVITY"}'

# Writes the answer to one request; True keeps the connection open for the next one.
Handler = Callable[[SeenRequest, trio.abc.Stream], Awaitable[bool]]


def answer(
    status: int = 200, body: bytes = b"ok", headers: Sequence[tuple[str, str]] = ()
) -> bytes:
    lines = [f"HTTP/1.1 {status} X", *(f"{k}: {v}" for k, v in headers)]
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join([*lines, "", ""])).encode("latin-1") + body


async def ok(request: SeenRequest, stream: trio.abc.Stream) -> bool:
    await stream.send_all(answer())
    return True


async def ok_unless_slow(request: SeenRequest, stream: trio.abc.Stream) -> bool:
    """Answers at once, but never a request whose body is ``slow``: waits for the client to
    hang up instead (which the server counts)."""
    if request.body != b"slow":
        return await ok(request, stream)
    while await stream.receive_some(65536):
        pass
    raise trio.BrokenResourceError("the client hung up")


class KeepAliveServer:
    """Answers every request on a connection with ``handler`` until one of them closes it."""

    def __init__(self, handler: Handler = ok, *, ssl_context: ssl.SSLContext | None = None):
        self.handler = handler
        self.ssl_context = ssl_context
        self.requests: list[tuple[int, SeenRequest]] = []  # (connection number, request)
        self.accepted = 0
        self.client_closed = 0  # connections the client ended (EOF or reset)
        self.server_closed = 0  # connections a handler ended
        self.port = 0

    async def start(self, nursery: trio.Nursery) -> KeepAliveServer:
        serve = functools.partial(trio.serve_tcp, host="127.0.0.1")
        listeners = await nursery.start(serve, self._serve, 0)
        self.port = listeners[0].socket.getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def on(self, connection: int) -> list[SeenRequest]:
        return [request for number, request in self.requests if number == connection]

    async def _serve(self, stream: trio.abc.Stream) -> None:
        number = self.accepted
        self.accepted += 1
        if self.ssl_context is not None:
            stream = trio.SSLStream(stream, self.ssl_context, server_side=True)
        leftover = b""
        try:
            while True:
                conn = h11.Connection(h11.SERVER)
                if leftover:  # (b"" would tell h11 the client closed)
                    conn.receive_data(leftover)
                request = await self._read(stream, conn)
                if request is None:
                    self.client_closed += 1
                    return
                leftover = conn.trailing_data[0]
                self.requests.append((number, request))
                if not await self.handler(request, stream):
                    self.server_closed += 1
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.RemoteProtocolError):
            self.client_closed += 1
        finally:
            await trio.aclose_forcefully(stream)

    @staticmethod
    async def _read(stream: trio.abc.Stream, conn: h11.Connection) -> SeenRequest | None:
        start: h11.Request | None = None
        body = b""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(bytes(await stream.receive_some(65536)))
            elif isinstance(event, h11.ConnectionClosed):
                return None
            elif isinstance(event, h11.Request):
                start = event
            elif isinstance(event, h11.Data):
                body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage) and start is not None:
                headers = [(k.decode(), v.decode("latin-1")) for k, v in start.headers]
                return SeenRequest(start.method.decode(), start.target.decode(), headers, body)
            else:
                raise h11.RemoteProtocolError(f"unexpected {event!r}")


async def eventually(check: Callable[[], bool]) -> None:
    """Wait for the server side of a loopback connection to catch up with the client."""
    with trio.fail_after(5):
        while not check():
            await trio.sleep(0.005)


class Barrier:
    """Holds every answer until ``size`` requests wait: that many in flight at once."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.waiting = 0
        self.opened = trio.Event()

    async def __call__(self, request: SeenRequest, stream: trio.abc.Stream) -> bool:
        self.waiting += 1
        if self.waiting >= self.size:
            self.opened.set()
        await self.opened.wait()
        await stream.send_all(answer())
        return True

    def reset(self) -> None:
        self.waiting = 0
        self.opened = trio.Event()


class Pools:
    """Makes pooled fetchers, and closes their pools when the test ends."""

    def __init__(self) -> None:
        self.made: list[ConnectionPool] = []

    def __call__(
        self,
        policy: OutboundPolicy | None = None,
        limits: PoolLimits | None = None,
        *,
        resolver: Resolver | None = None,
        connector: Connector | None = None,
    ) -> tuple[Fetcher, ConnectionPool]:
        pool = ConnectionPool(limits)
        self.made.append(pool)
        fetcher = Fetcher(
            policy or OutboundPolicy.dev(), resolver=resolver, connector=connector, pool=pool
        )
        return fetcher, pool


@pytest.fixture
async def pooled() -> AsyncIterator[Pools]:
    pools = Pools()
    yield pools
    for pool in pools.made:
        await pool.aclose()


def loopback_key(server: KeepAliveServer) -> PoolKey:
    loopback = ipaddress.ip_address("127.0.0.1")
    return PoolKey("http", "127.0.0.1", server.port, loopback, None)


# Reuse.


async def test_sequential_posts_share_one_connection(nursery: trio.Nursery, pooled: Pools) -> None:
    server = await KeepAliveServer().start(nursery)
    fetcher, pool = pooled()
    async with pool:
        for n in range(10):
            response = await fetcher.post(server.url, EVENT + str(n).encode())
            assert (response.status, response.body) == (200, b"ok")
        assert server.accepted == 1
        assert [r.body for r in server.on(0)] == [EVENT + str(n).encode() for n in range(10)]
        # Kept alive by HTTP/1.1's default: no Connection header at all.
        assert all(r.header("connection") is None for r in server.on(0))
        assert pool.idle == pool.idle_for(loopback_key(server)) == 1
    await eventually(lambda: server.client_closed == 1)  # aclose closed it
    assert pool.idle == 0


async def test_without_a_pool_every_request_has_its_own_connection(nursery: trio.Nursery) -> None:
    server = await KeepAliveServer().start(nursery)
    fetcher = Fetcher(OutboundPolicy.dev())
    for _ in range(3):
        await fetcher.post(server.url, EVENT)
    assert server.accepted == 3
    assert all(request.header("connection") == "close" for _, request in server.requests)


async def test_reserved_headers_stay_reserved_with_a_pool(
    nursery: trio.Nursery, pooled: Pools
) -> None:
    server = await KeepAliveServer().start(nursery)
    fetcher, _ = pooled()
    for name in ("Connection", "Keep-Alive", "Content-Length"):
        with pytest.raises(ValueError, match="set by the fetcher"):
            await fetcher.post(server.url, EVENT, headers={name: "keep-alive"})
    assert server.accepted == 0


@pytest.mark.parametrize(
    "closing",
    [
        answer(headers=[("Connection", "close")]),
        b"HTTP/1.0 200 X\r\nContent-Length: 2\r\n\r\nok",  # 1.0 without keep-alive
        b"HTTP/1.1 200 X\r\n\r\nok",  # body delimited by closing the connection
    ],
    ids=["connection-close", "http-1.0", "until-eof"],
)
async def test_an_answer_that_closes_is_not_reused(
    nursery: trio.Nursery, closing: bytes, pooled: Pools
) -> None:
    async def handler(request: SeenRequest, stream: trio.abc.Stream) -> bool:
        await stream.send_all(closing)
        return False

    server = await KeepAliveServer(handler).start(nursery)
    fetcher, pool = pooled()
    for _ in range(3):
        assert (await fetcher.post(server.url, EVENT)).body == b"ok"
    assert server.accepted == 3
    assert pool.idle == 0


async def test_an_answer_not_read_to_the_end_is_not_reused(
    nursery: trio.Nursery, pooled: Pools
) -> None:
    async def handler(request: SeenRequest, stream: trio.abc.Stream) -> bool:
        await stream.send_all(answer(body=b"x" * 100 if request.body == b"big" else b"ok"))
        return True

    server = await KeepAliveServer(handler).start(nursery)
    fetcher, pool = pooled()
    await fetcher.post(server.url, EVENT)
    with pytest.raises(FetchError) as caught:
        await fetcher.post(server.url, b"big", limits=FetchLimits(max_bytes=10))
    assert caught.value.reason == Reason.TOO_LARGE
    await eventually(lambda: server.client_closed == 1)
    assert pool.idle == 0
    assert (await fetcher.post(server.url, EVENT)).body == b"ok"
    assert server.accepted == 2


async def test_bytes_past_the_answer_are_never_read_as_the_next_answer(
    nursery: trio.Nursery, pooled: Pools
) -> None:
    """A server that sends a second response unasked would answer our next request with it."""
    smuggled = answer(body=b"smuggled")

    async def handler(request: SeenRequest, stream: trio.abc.Stream) -> bool:
        await stream.send_all(
            answer(body=b"first") + smuggled if request.body == b"1" else answer()
        )
        return True

    server = await KeepAliveServer(handler).start(nursery)
    fetcher, pool = pooled()
    assert (await fetcher.post(server.url, b"1")).body == b"first"
    assert pool.idle == 0
    assert (await fetcher.post(server.url, b"2")).body == b"ok"
    assert server.accepted == 2


async def test_a_connection_is_retired_after_max_requests(
    nursery: trio.Nursery, pooled: Pools
) -> None:
    server = await KeepAliveServer().start(nursery)
    fetcher, pool = pooled(limits=PoolLimits(max_requests=3))
    for _ in range(7):
        await fetcher.post(server.url, EVENT)
    assert server.accepted == 3
    assert [len(server.on(n)) for n in range(3)] == [3, 3, 1]
    # The last request a connection carries tells the server so.
    said = [request.header("connection") for request in server.on(0)]
    assert said == [None, None, "close"]
    assert pool.idle == 1


# Bounds.


async def test_concurrency_is_bounded_by_the_callers_and_idle_by_the_pool(
    nursery: trio.Nursery, pooled: Pools
) -> None:
    server = await KeepAliveServer(Barrier(20)).start(nursery)
    fetcher, pool = pooled(limits=PoolLimits(max_idle_per_key=4))
    async with trio.open_nursery() as senders:
        for _ in range(20):
            senders.start_soon(fetcher.post, server.url, EVENT)
    assert server.accepted == 20  # one per request in flight, no more
    assert pool.idle == 4  # the rest were closed as they came back
    await eventually(lambda: server.client_closed == 16)
    for _ in range(20):
        await fetcher.post(server.url, EVENT)
    assert server.accepted == 20
    assert pool.idle == 4


async def test_the_total_bound_closes_the_oldest_idle_connection(
    nursery: trio.Nursery, pooled: Pools
) -> None:
    barrier = Barrier(4)
    server = await KeepAliveServer(barrier).start(nursery)
    resolver = StaticResolver({"a.example": ["127.0.0.1"], "b.example": ["127.0.0.1"]})
    limits = PoolLimits(max_idle_per_key=4, max_idle=5)
    fetcher, pool = pooled(limits=limits, resolver=resolver)

    async def burst(host: str) -> None:
        barrier.reset()
        async with trio.open_nursery() as senders:
            for _ in range(4):
                senders.start_soon(fetcher.post, f"http://{host}:{server.port}/", EVENT)

    await burst("a.example")
    await burst("b.example")
    # Same address, but a different Host: never each other's connections.
    assert server.accepted == 8
    loopback = ipaddress.ip_address("127.0.0.1")
    a_key = PoolKey("http", "a.example", server.port, loopback, None)
    b_key = PoolKey("http", "b.example", server.port, loopback, None)
    assert (pool.idle, pool.idle_for(a_key), pool.idle_for(b_key)) == (5, 1, 4)
    await eventually(lambda: server.client_closed == 3)


async def test_idle_connections_expire_when_the_pool_is_next_used(
    nursery: trio.Nursery, pooled: Pools
) -> None:
    server = await KeepAliveServer().start(nursery)
    fetcher, pool = pooled(limits=PoolLimits(idle_timeout=0.2))
    await fetcher.post(server.url, EVENT)
    await trio.sleep(0.3)
    assert server.client_closed == 0  # nothing has looked at the pool yet
    await fetcher.post(server.url, EVENT)
    assert server.accepted == 2
    assert [len(server.on(n)) for n in range(2)] == [1, 1]
    await eventually(lambda: server.client_closed == 1)


async def test_run_closes_idle_connections_while_nothing_is_sent(
    nursery: trio.Nursery, pooled: Pools
) -> None:
    server = await KeepAliveServer().start(nursery)
    fetcher, pool = pooled(limits=PoolLimits(idle_timeout=0.2))
    nursery.start_soon(pool.run)
    started = trio.current_time()
    await fetcher.post(server.url, EVENT)
    await eventually(lambda: server.client_closed == 1)
    assert trio.current_time() - started >= 0.2
    assert pool.idle == 0
    # And it keeps doing so for connections that go idle later.
    await fetcher.post(server.url, EVENT)
    await eventually(lambda: server.client_closed == 2)
    await pool.aclose()  # run() returns


async def test_aclose_closes_everything_and_later_connections_too(
    nursery: trio.Nursery, pooled: Pools
) -> None:
    server = await KeepAliveServer().start(nursery)
    resolver = StaticResolver({"a.example": ["127.0.0.1"], "b.example": ["127.0.0.1"]})
    fetcher, pool = pooled(resolver=resolver)
    await fetcher.post(f"http://a.example:{server.port}/", EVENT)
    await fetcher.post(f"http://b.example:{server.port}/", EVENT)
    assert pool.idle == 2
    await pool.aclose()
    await eventually(lambda: server.client_closed == 2)
    # A closed pool keeps nothing: the fetcher still works, one connection per request.
    await fetcher.post(f"http://a.example:{server.port}/", EVENT)
    assert pool.idle == 0
    await eventually(lambda: server.client_closed == 3)


def test_a_pool_serves_one_fetcher() -> None:
    pool = ConnectionPool()
    Fetcher(OutboundPolicy.dev(), pool=pool)
    with pytest.raises(ValueError, match="one Fetcher"):
        Fetcher(OutboundPolicy.dev(), pool=pool)


@pytest.mark.parametrize(
    "limits",
    [
        {"max_idle_per_key": 0},
        {"max_idle": 0},
        {"max_requests": 0},
        {"idle_timeout": 0},
    ],
)
def test_pool_limits_are_checked(limits: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be"):
        PoolLimits(**limits)  # type: ignore[arg-type]


# Failures: a connection that saw one is closed, never given back.


async def test_a_timeout_closes_the_connection(nursery: trio.Nursery, pooled: Pools) -> None:
    server = await KeepAliveServer(ok_unless_slow).start(nursery)
    fetcher, pool = pooled()
    await fetcher.post(server.url, EVENT)
    with pytest.raises(FetchError) as caught:
        await fetcher.post(server.url, b"slow", limits=FetchLimits(timeout=0.3))
    assert caught.value.reason == Reason.TIMEOUT
    assert len(server.on(0)) == 2  # the timed-out request went out on the kept-alive one
    await eventually(lambda: server.client_closed == 1)
    assert pool.idle == 0
    await fetcher.post(server.url, EVENT)
    assert server.accepted == 2


class HoldingConnector(TcpConnector):
    """Keeps a reference to every stream, so a connection the fetcher forgets to close stays
    open (rather than being closed by the garbage collector) and the server can tell."""

    def __init__(self) -> None:
        super().__init__()
        self.streams: list[trio.abc.Stream] = []

    async def connect(
        self, address: IPAddress, port: int, server_name: str | None
    ) -> trio.abc.Stream:
        self.streams.append(await super().connect(address, port, server_name))
        return self.streams[-1]


async def test_a_cancelled_request_closes_its_connection(
    nursery: trio.Nursery, pooled: Pools
) -> None:
    server = await KeepAliveServer(ok_unless_slow).start(nursery)
    fetcher, pool = pooled(connector=HoldingConnector())
    await fetcher.post(server.url, EVENT)
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as inner:
            inner.start_soon(fetcher.post, server.url, b"slow")
            await eventually(lambda: len(server.requests) == 2)
            scope.cancel()
    assert scope.cancelled_caught
    assert len(server.on(0)) == 2  # it was the kept-alive connection
    await eventually(lambda: server.client_closed == 1)
    assert pool.idle == 0


# Stale connections: the server closed an idle connection.


async def test_a_stale_connection_is_retried_once_on_a_new_one(
    nursery: trio.Nursery, pooled: Pools
) -> None:
    """Through a connector whose streams cannot be polled, the stale socket is written to."""

    async def answer_then_close(request: SeenRequest, stream: trio.abc.Stream) -> bool:
        await stream.send_all(answer())
        return False  # as a server's own idle timeout would, without saying so

    server = await KeepAliveServer(answer_then_close).start(nursery)
    connector = RecordingConnector({(FAKE_PUBLIC, 80): server.port})
    resolver = StaticResolver({"hooks.example": [FAKE_PUBLIC]})
    fetcher, pool = pooled(ROUTED, resolver=resolver, connector=connector)
    await fetcher.post(HOOK, b"1")
    await eventually(lambda: server.server_closed == 1)
    assert pool.idle == 1  # it looked reusable when it came back

    response = await fetcher.post(HOOK, b"2")
    assert response.status == 200
    assert len(connector.attempts) == 2
    assert [r.body for _, r in server.requests] == [b"1", b"2"]  # each arrived once


async def test_a_closed_idle_socket_is_noticed_before_it_is_written_to(
    nursery: trio.Nursery, pooled: Pools
) -> None:
    async def answer_then_close(request: SeenRequest, stream: trio.abc.Stream) -> bool:
        await stream.send_all(answer())
        return False

    server = await KeepAliveServer(answer_then_close).start(nursery)
    fetcher, pool = pooled()  # trio's own sockets: looks_alive can poll them
    await fetcher.post(server.url, b"1")
    await eventually(lambda: server.server_closed == 1)
    await trio.sleep(0.05)  # the FIN reaches the client's socket
    assert pool.idle == 1
    assert await pool.take(loopback_key(server)) is None  # seen closed, and closed
    assert pool.idle == 0
    await fetcher.post(server.url, b"2")
    assert server.accepted == 2
    assert [r.body for _, r in server.requests] == [b"1", b"2"]


async def test_the_stale_retry_happens_once_and_only_on_reused_connections(
    nursery: trio.Nursery, pooled: Pools
) -> None:
    async def hang_up(request: SeenRequest, stream: trio.abc.Stream) -> bool:
        if request.body == b"fine":
            await stream.send_all(answer())
            return True
        return False  # read the request, closed without a byte of answer

    server = await KeepAliveServer(hang_up).start(nursery)
    connector = RecordingConnector({(FAKE_PUBLIC, 80): server.port})
    resolver = StaticResolver({"hooks.example": [FAKE_PUBLIC]})
    fetcher, _ = pooled(ROUTED, resolver=resolver, connector=connector)

    with pytest.raises(FetchError) as caught:  # a new connection: no retry
        await fetcher.post(HOOK, b"dropped")
    assert caught.value.reason == Reason.HTTP_ERROR
    assert len(connector.attempts) == 1

    await fetcher.post(HOOK, b"fine")  # a second connection, kept alive
    with pytest.raises(FetchError):  # reused and dropped: one retry, dropped again
        await fetcher.post(HOOK, b"dropped")
    assert len(connector.attempts) == 3
    assert [r.body for _, r in server.requests] == [b"dropped", b"fine", b"dropped", b"dropped"]


async def test_no_retry_once_the_answer_has_started(nursery: trio.Nursery, pooled: Pools) -> None:
    async def half_an_answer(request: SeenRequest, stream: trio.abc.Stream) -> bool:
        if request.body == b"fine":
            await stream.send_all(answer())
            return True
        await stream.send_all(b"HTTP/1.1 200 X\r\nContent-Le")
        return False

    server = await KeepAliveServer(half_an_answer).start(nursery)
    connector = RecordingConnector({(FAKE_PUBLIC, 80): server.port})
    resolver = StaticResolver({"hooks.example": [FAKE_PUBLIC]})
    fetcher, pool = pooled(ROUTED, resolver=resolver, connector=connector)
    await fetcher.post(HOOK, b"fine")
    with pytest.raises(FetchError) as caught:
        await fetcher.post(HOOK, b"half")
    assert caught.value.reason == Reason.HTTP_ERROR
    assert len(connector.attempts) == 1
    assert pool.idle == 0


# The policy runs on every request, before any pooled connection is touched.


async def test_dns_rebinding_is_refused_with_a_connection_idle(
    nursery: trio.Nursery, pooled: Pools
) -> None:
    server = await KeepAliveServer().start(nursery)
    connector = RecordingConnector(
        {(FAKE_PUBLIC, 80): server.port, ("203.0.113.8", 80): server.port}
    )
    resolver = StaticResolver({"hooks.example": [FAKE_PUBLIC]})
    fetcher, pool = pooled(ROUTED, resolver=resolver, connector=connector)
    await fetcher.post(HOOK, EVENT)
    assert pool.idle == 1

    for answer_now in (["10.0.0.1"], [FAKE_PUBLIC, "169.254.169.254"]):
        resolver.names["hooks.example"] = [ipaddress.ip_address(a) for a in answer_now]
        with pytest.raises(FetchError) as caught:
            await fetcher.post(HOOK, EVENT)
        assert caught.value.reason == Reason.BLOCKED_ADDRESS
        assert "s3cr3t" not in str(caught.value)
    assert resolver.queries == ["hooks.example"] * 3  # asked again every time
    assert len(connector.attempts) == 1  # no connect...
    assert len(server.requests) == 1  # ...and nothing sent on the idle connection
    assert pool.idle == 1

    # Moved to another allowed address: a new connection there, not the old one.
    resolver.names["hooks.example"] = [ipaddress.ip_address("203.0.113.8")]
    await fetcher.post(HOOK, EVENT)
    assert connector.attempts[-1] == Attempt(ipaddress.ip_address("203.0.113.8"), 80, None)
    assert len(connector.attempts) == 2
    assert server.accepted == 2


async def test_a_policy_refusal_by_name_comes_before_the_pool(
    nursery: trio.Nursery, pooled: Pools
) -> None:
    server = await KeepAliveServer().start(nursery)
    connector = RecordingConnector(pass_loopback=True)
    resolver = StaticResolver({"localhost": ["127.0.0.1"]})
    fetcher, pool = pooled(resolver=resolver, connector=connector)
    url = f"http://localhost:{server.port}/"
    await fetcher.post(url, EVENT)
    assert pool.idle == 1
    # The operator withdraws loopback; the policy is read on every request.
    fetcher.policy = OutboundPolicy()
    with pytest.raises(FetchError) as caught:
        await fetcher.post(url, EVENT)
    assert caught.value.reason == Reason.BLOCKED_ADDRESS
    assert (len(connector.attempts), len(server.requests), resolver.queries) == (
        1,
        1,
        ["localhost"],
    )


# TLS.


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def server_context(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost", "a.example", "b.example").configure_cert(context)
    return context


@pytest.fixture
def client_context(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context


async def test_tls_connections_are_reused_per_server_name(
    nursery: trio.Nursery,
    server_context: ssl.SSLContext,
    client_context: ssl.SSLContext,
    pooled: Pools,
) -> None:
    handshakes: list[str | None] = []
    server_context.sni_callback = lambda _sock, name, _ctx: handshakes.append(name)
    server = await KeepAliveServer(ssl_context=server_context).start(nursery)
    resolver = StaticResolver({"a.example": ["127.0.0.1"], "b.example": ["127.0.0.1"]})
    fetcher, pool = pooled(resolver=resolver, connector=TcpConnector(client_context))
    async with pool:
        for _ in range(5):
            for host in ("a.example", "b.example"):
                response = await fetcher.post(f"https://{host}:{server.port}/hook", EVENT)
                assert response.status == 200
        assert handshakes == ["a.example", "b.example"]
        assert server.accepted == 2
        assert [r.header("host") for r in server.on(0)] == [f"a.example:{server.port}"] * 5
        # Filed under the name its certificate was verified for.
        loopback = ipaddress.ip_address("127.0.0.1")
        tls_key = PoolKey("https", "a.example", server.port, loopback, "a.example")
        assert pool.idle_for(tls_key) == 1


async def test_tls_connection_closed_on_timeout(
    nursery: trio.Nursery,
    server_context: ssl.SSLContext,
    client_context: ssl.SSLContext,
    pooled: Pools,
) -> None:
    server_context.sni_callback = None
    server = await KeepAliveServer(ok_unless_slow, ssl_context=server_context).start(nursery)
    fetcher, pool = pooled(connector=TcpConnector(client_context))
    url = f"https://localhost:{server.port}/hook"
    await fetcher.post(url, EVENT)
    with pytest.raises(FetchError) as caught:
        await fetcher.post(url, b"slow", limits=FetchLimits(timeout=0.3))
    assert caught.value.reason == Reason.TIMEOUT
    await eventually(lambda: server.client_closed == 1)
    assert pool.idle == 0


# The parts on their own.


def _connection(key: PoolKey, idle_since: float) -> Connection:
    stream, _ = trio.testing.memory_stream_pair()
    return Connection(key, stream, requests=1, idle_since=idle_since)


def test_idle_set_takes_the_newest_and_evicts_the_oldest() -> None:
    loopback = ipaddress.ip_address("127.0.0.1")
    a, b = (PoolKey("http", host, 80, loopback, None) for host in ("a.example", "b.example"))
    limits = PoolLimits(max_idle_per_key=2, max_idle=3, idle_timeout=10)
    idle = IdleSet()
    a1, a2, a3, b1, b2 = (_connection(k, t) for k, t in [(a, 1), (a, 2), (a, 3), (b, 4), (b, 5)])
    assert idle.add(a1, limits) == []
    assert idle.add(a2, limits) == []
    assert idle.add(a3, limits) == [a1]  # over the key's bound: its oldest goes
    assert idle.add(b1, limits) == []
    assert idle.add(b2, limits) == [a2]  # over the total: the oldest of all goes
    assert (len(idle), idle.count(a), idle.count(b)) == (3, 1, 2)
    assert idle.take(b) is b2
    assert idle.expire(now=13.5, timeout=10) == [a3]  # idle since 3: expired at 13
    assert idle.take(a) is None
    assert idle.drain() == [b1]
    assert len(idle) == 0


async def test_looks_alive_sees_a_close_and_unasked_bytes(nursery: trio.Nursery) -> None:
    peers: list[trio.SocketStream] = []

    async def keep(stream: trio.SocketStream) -> None:
        peers.append(stream)
        await trio.sleep_forever()

    listeners = await nursery.start(functools.partial(trio.serve_tcp, host="127.0.0.1"), keep, 0)
    port = listeners[0].socket.getsockname()[1]
    quiet, chatty, closed = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(3)]
    await eventually(lambda: len(peers) == 3)

    def peer(client: trio.SocketStream) -> trio.SocketStream:
        local = client.socket.getsockname()
        return next(p for p in peers if p.socket.getpeername() == local)

    await peer(chatty).send_all(b"HTTP/1.1 200 X\r\n")
    await peer(closed).aclose()
    await trio.sleep(0.05)
    assert looks_alive(quiet)
    assert not looks_alive(chatty)
    assert not looks_alive(closed)
    for stream in (quiet, chatty, closed):
        await stream.aclose()
    assert not looks_alive(quiet)  # a socket closed on our side is no connection either


async def test_throughput_with_and_without_keep_alive(nursery: trio.Nursery, pooled: Pools) -> None:
    """Printed for the curious (``-s``); only the connection counts are asserted."""
    server = await KeepAliveServer().start(nursery)
    keep_alive, pool = pooled()
    opened = {}
    async with pool:
        for name, fetcher in (("keep-alive", keep_alive), ("close", Fetcher(OutboundPolicy.dev()))):
            before = server.accepted
            started = time.perf_counter()
            for _ in range(200):
                await fetcher.post(server.url, EVENT)
            elapsed = time.perf_counter() - started
            opened[name] = server.accepted - before
            print(f"\n{name}: 200 POSTs in {elapsed:.3f} s ({200 / elapsed:.0f}/s)")
    assert opened == {"keep-alive": 1, "close": 200}

"""The SSRF table: every row refused under production settings, without a connection.

Loopback rows aim at real loopback listeners (the fetcher's connector is real and passes
loopback through), which must count zero connections.  Rows outside loopback never reach a
socket: the injected resolver answers, the recording connector would record the attempt and
make none, and the test asserts nothing was recorded.  Servers a row needs (the redirecting
host, the 50 MB body, the trickle) listen on loopback and are reached through a fake public
address (203.0.113.7, TEST-NET-3, admitted by the test's ``allow_cidrs``) that only the
recording connector maps to them.
"""

from __future__ import annotations

import ipaddress

import pytest
import trio

from chaingate.outbound import Fetcher, FetchError, FetchLimits, OutboundPolicy, Reason
from tests.test_outbound_support import (
    Attempt,
    HttpServer,
    RecordingConnector,
    SeenRequest,
    StaticResolver,
    counting_listener,
    has_ipv6_loopback,
    head,
    redirect,
    reply,
)

PRODUCTION = OutboundPolicy()
FAKE_PUBLIC = "203.0.113.7"
ROUTED = OutboundPolicy.production(allow_cidrs=["203.0.113.0/24"])  # production + one address
MiB = 1 << 20


async def refused(fetcher: Fetcher, url: str, limits: FetchLimits | None = None) -> FetchError:
    with pytest.raises(FetchError) as caught:
        await fetcher.get(url, limits=limits or FetchLimits(timeout=5))
    return caught.value


# Loopback targets: real listeners, real connector (loopback passes through it).

LOOPBACK_ROWS = [
    ("127.0.0.1", "http://127.0.0.1:{port}/"),
    ("::1", "http://[::1]:{port}/"),
    ("127.0.0.1", "http://[::ffff:127.0.0.1]:{port}/"),
    ("127.0.0.1", "http://loopback.example:{port}/"),  # a name that resolves to loopback
    ("127.0.0.1", "http://localhost:{port}/"),  # refused by name, before the system resolver
    ("127.0.0.1", "http://0.0.0.0:{port}/"),  # Linux delivers this to the local host
    ("127.0.0.2", "http://127.0.0.2:{port}/"),
]
LOOPBACK_NAMES = {"loopback.example": ["127.0.0.1"], "localhost": ["127.0.0.1"]}


@pytest.mark.parametrize(("host", "url"), LOOPBACK_ROWS)
async def test_loopback_targets_are_refused_without_a_connection(host: str, url: str) -> None:
    if host == "::1" and not has_ipv6_loopback():
        pytest.skip("no IPv6 loopback on this machine")
    resolver = StaticResolver(LOOPBACK_NAMES)
    connector = RecordingConnector(pass_loopback=True)
    fetcher = Fetcher(PRODUCTION, resolver=resolver, connector=connector)
    with counting_listener(host) as listener:
        error = await refused(fetcher, url.format(port=listener.port))
        assert error.reason == Reason.BLOCKED_ADDRESS
        assert listener.connections() == 0
    assert connector.attempts == []
    if "localhost" in url:
        assert resolver.queries == []  # refused by name: not even resolved


@pytest.mark.parametrize(("host", "url"), LOOPBACK_ROWS)
async def test_the_same_loopback_targets_answer_under_the_dev_setting(
    host: str, url: str, nursery: trio.Nursery
) -> None:
    """The refusals above are the policy's doing: with allow_loopback the same URLs work
    (except 0.0.0.0, which is never a destination)."""
    if host == "::1" and not has_ipv6_loopback():
        pytest.skip("no IPv6 loopback on this machine")
    server = await HttpServer({"/": reply(body=b'{"ok": true}')}).start(nursery, host)
    resolver = StaticResolver(LOOPBACK_NAMES)
    fetcher = Fetcher(OutboundPolicy.dev(), resolver=resolver)
    if "0.0.0.0" in url:
        error = await refused(fetcher, url.format(port=server.port))
        assert error.reason == Reason.BLOCKED_ADDRESS
        assert server.connections == 0
        return
    response = await fetcher.get(url.format(port=server.port))
    assert (response.status, response.body) == (200, b'{"ok": true}')
    assert server.connections == 1


# Everything else: never a socket.

OUTSIDE_ROWS = [
    "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
    "http://10.0.0.1/",
    "http://100.64.0.1/",
    "http://192.168.1.1/",
    "http://172.16.0.1/",
    "http://[fd00:ec2::254]/latest/meta-data/",
    "http://[::ffff:169.254.169.254]/",
    "http://[::ffff:10.0.0.1]/",
    "http://[64:ff9b::a9fe:a9fe]/",  # NAT64 around the metadata address
    "http://[2002:a00:1::]/",  # 6to4 around 10.0.0.1
    "http://[fe80::1]/",
    "http://metadata.google.internal/computeMetadata/v1/",
    "http://internal.example/",  # resolves to 10.0.0.1
    "http://mixed.example/",  # one public address and one private: refused as a whole
    "http://cgnat.example/",  # resolves to 100.64.0.1
    "http://metadata-alias.example/",  # resolves to 169.254.169.254
]
NAMES = {
    "internal.example": ["10.0.0.1"],
    "mixed.example": ["8.8.8.8", "10.0.0.1"],
    "cgnat.example": ["100.64.0.1"],
    "metadata-alias.example": ["169.254.169.254"],
    "metadata.google.internal": ["169.254.169.254"],
}


@pytest.mark.parametrize("url", OUTSIDE_ROWS)
async def test_addresses_outside_loopback_are_refused_before_any_connect(url: str) -> None:
    resolver = StaticResolver(NAMES)
    connector = RecordingConnector()
    error = await refused(Fetcher(PRODUCTION, resolver=resolver, connector=connector), url)
    assert error.reason == Reason.BLOCKED_ADDRESS
    assert connector.attempts == []
    if "metadata.google.internal" in url:
        assert resolver.queries == []  # refused by name: not even resolved


async def test_the_recording_connector_would_have_seen_an_attempt() -> None:
    """Where the policy allows an address, the connector records it: the zero above counts."""
    connector = RecordingConnector()
    policy = OutboundPolicy.production(allow_private=True)
    error = await refused(Fetcher(policy, connector=connector), "http://10.0.0.1/")
    assert error.reason == Reason.CONNECT_FAILED
    assert connector.attempts == [Attempt(ipaddress.ip_address("10.0.0.1"), 80, None)]


# Redirects: re-checked at every hop, before any connect.


@pytest.mark.parametrize(
    "location",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://[::ffff:169.254.169.254]/",
        "http://metadata.google.internal/",
        "http://internal.example/",
        "http://loopback.example:8080/",
        "http://127.0.0.1:8080/",
        "file:///etc/passwd",
    ],
)
async def test_a_redirect_from_an_allowed_host_to_a_refused_one(
    location: str, nursery: trio.Nursery
) -> None:
    server = await HttpServer({"/token/1": redirect(location)}).start(nursery)
    resolver = StaticResolver({**NAMES, "nft.example": [FAKE_PUBLIC]})
    resolver.names["loopback.example"] = [ipaddress.ip_address("127.0.0.1")]
    connector = RecordingConnector({(FAKE_PUBLIC, 80): server.port})
    fetcher = Fetcher(ROUTED, resolver=resolver, connector=connector)

    error = await refused(fetcher, "http://nft.example/token/1")

    expected = Reason.BAD_URL if location.startswith("file:") else Reason.BLOCKED_ADDRESS
    assert error.reason == expected
    assert [r.target for r in server.requests] == ["/token/1"]  # the first hop happened
    assert connector.attempts == [Attempt(ipaddress.ip_address(FAKE_PUBLIC), 80, None)]


async def test_dns_rebinding_cannot_move_a_checked_connection(nursery: trio.Nursery) -> None:
    """The fetcher connects to the address it checked; a later answer applies to later hops."""

    class Rebinding(StaticResolver):
        async def resolve(self, host: str, port: int) -> list[ipaddress.IPv4Address]:
            self.queries.append(host)
            first = len(self.queries) == 1
            return [ipaddress.IPv4Address(FAKE_PUBLIC if first else "127.0.0.1")]

    server = await HttpServer(
        {"/a": redirect("/b"), "/b": reply(body=b"should not be fetched")}
    ).start(nursery)
    connector = RecordingConnector({(FAKE_PUBLIC, 80): server.port}, pass_loopback=True)
    resolver = Rebinding()
    error = await refused(
        Fetcher(ROUTED, resolver=resolver, connector=connector), "http://r.example/a"
    )
    assert error.reason == Reason.BLOCKED_ADDRESS
    assert resolver.queries == ["r.example", "r.example"]
    assert connector.attempts == [Attempt(ipaddress.ip_address(FAKE_PUBLIC), 80, None)]
    assert [r.target for r in server.requests] == ["/a"]


# Size: 50 MB refused after at most ~1 MiB read.

FIFTY_MB = 50 * 1000 * 1000
BLOCK = b"\0" * 65536


async def fifty_mb_with_length(request: SeenRequest, stream: trio.abc.Stream) -> None:
    await stream.send_all(head(200, [("Content-Length", str(FIFTY_MB))]))
    for _ in range(FIFTY_MB // len(BLOCK)):
        await stream.send_all(BLOCK)


async def fifty_mb_chunked(request: SeenRequest, stream: trio.abc.Stream) -> None:
    await stream.send_all(head(200, [("Transfer-Encoding", "chunked")]))
    chunk = b"%x\r\n" % len(BLOCK) + BLOCK + b"\r\n"
    for _ in range(FIFTY_MB // len(BLOCK)):
        await stream.send_all(chunk)
    await stream.send_all(b"0\r\n\r\n")


async def fifty_mb_until_close(request: SeenRequest, stream: trio.abc.Stream) -> None:
    await stream.send_all(head(200))  # no length: the body ends when the connection does
    for _ in range(FIFTY_MB // len(BLOCK)):
        await stream.send_all(BLOCK)


@pytest.fixture
async def big_server(nursery: trio.Nursery) -> HttpServer:
    routes = {
        "/length": fifty_mb_with_length,
        "/chunked": fifty_mb_chunked,
        "/close": fifty_mb_until_close,
    }
    return await HttpServer(routes).start(nursery)


@pytest.mark.parametrize(
    ("path", "most_read"),
    [
        ("/length", 65536),  # refused on Content-Length: only the read that brought the head
        ("/chunked", MiB + 2 * 65536),  # counted as it arrives: the cap plus one read
        ("/close", MiB + 2 * 65536),
    ],
)
async def test_a_50_mb_body_is_refused_after_about_1_mib(
    path: str, most_read: int, big_server: HttpServer
) -> None:
    connector = RecordingConnector({(FAKE_PUBLIC, 80): big_server.port})
    fetcher = Fetcher(
        ROUTED, resolver=StaticResolver({"big.example": [FAKE_PUBLIC]}), connector=connector
    )
    error = await refused(fetcher, f"http://big.example{path}")
    assert error.reason == Reason.TOO_LARGE
    assert 0 < connector.received <= most_read


# Time: a body trickling 1 byte/s is cut at the deadline (real time: real sockets).


async def trickle(request: SeenRequest, stream: trio.abc.Stream) -> None:
    await stream.send_all(head(200, [("Content-Length", "100")]))
    for _ in range(100):
        await stream.send_all(b"x")
        await trio.sleep(1)


async def test_a_trickling_body_is_cut_at_the_deadline(nursery: trio.Nursery) -> None:
    server = await HttpServer({"/slow": trickle}).start(nursery)
    connector = RecordingConnector({(FAKE_PUBLIC, 80): server.port})
    fetcher = Fetcher(
        ROUTED, resolver=StaticResolver({"slow.example": [FAKE_PUBLIC]}), connector=connector
    )
    started = trio.current_time()
    error = await refused(fetcher, "http://slow.example/slow", FetchLimits(timeout=2.5))
    elapsed = trio.current_time() - started
    assert error.reason == Reason.TIMEOUT
    assert 2.5 <= elapsed < 3.5
    assert connector.received < 200  # the head and two or three body bytes

"""The fetcher as its callers use it: metadata GETs, webhook POSTs, redirects, content types.

Servers listen on loopback; a fake public name (203.0.113.7, admitted by ``allow_cidrs``) is
mapped onto them by the recording connector, so these run under production settings.
"""

from __future__ import annotations

import gzip
import ipaddress
import json
import math

import pytest
import trio

from chaingate.outbound import (
    Fetcher,
    FetchError,
    FetchLimits,
    IPAddress,
    OutboundPolicy,
    Reason,
    SystemResolver,
)
from tests.test_outbound_support import (
    Attempt,
    Handler,
    HttpServer,
    RecordingConnector,
    SeenRequest,
    StaticResolver,
    head,
    redirect,
    reply,
)

FAKE_PUBLIC = "203.0.113.7"
ROUTED = OutboundPolicy.production(allow_cidrs=["203.0.113.0/24"])
METADATA = b'{"name": "Token #1", "image": "ipfs://bafy/1.png"}'


async def serve(
    nursery: trio.Nursery, routes: dict[str, Handler], names: tuple[str, ...] = ("nft.example",)
) -> tuple[HttpServer, RecordingConnector, Fetcher]:
    server = await HttpServer(routes).start(nursery)
    connector = RecordingConnector({(FAKE_PUBLIC, 80): server.port})
    resolver = StaticResolver({name: [FAKE_PUBLIC] for name in names})
    return server, connector, Fetcher(ROUTED, resolver=resolver, connector=connector)


async def test_get_metadata(nursery: trio.Nursery) -> None:
    server, _, fetcher = await serve(nursery, {"/token/1.json?v=2": reply(body=METADATA)})
    response = await fetcher.get(
        "http://nft.example/token/1.json?v=2",
        limits=FetchLimits(content_types=("application/json",)),
    )
    assert response.ok and response.status == 200
    assert json.loads(response.body)["name"] == "Token #1"
    assert response.media_type == "application/json"
    assert response.url == "http://nft.example/token/1.json?v=2"
    (seen,) = server.requests
    assert (seen.method, seen.header("host")) == ("GET", "nft.example")
    assert seen.header("accept-encoding") == "identity"
    assert seen.header("connection") == "close"
    assert (seen.header("user-agent") or "").startswith("chaingate/")


@pytest.mark.parametrize(
    ("content_type", "accepted"),
    [
        ("application/json", True),
        ("application/json; charset=utf-8", True),
        ("Application/JSON", True),
        ("text/html", False),
        ("application/json-seq", False),
        (None, False),
    ],
)
async def test_content_type_is_checked_before_the_body(
    content_type: str | None, accepted: bool, nursery: trio.Nursery
) -> None:
    headers = [] if content_type is None else [("Content-Type", content_type)]
    _, connector, fetcher = await serve(nursery, {"/m": reply(body=METADATA, headers=headers)})
    limits = FetchLimits(content_types=("application/json",))
    if accepted:
        assert (await fetcher.get("http://nft.example/m", limits=limits)).body == METADATA
        return
    with pytest.raises(FetchError) as caught:
        await fetcher.get("http://nft.example/m", limits=limits)
    assert caught.value.reason == Reason.BAD_CONTENT_TYPE
    assert connector.received < len(head(200, headers)) + 100  # head only, not the body


async def test_error_statuses_are_answers_not_content_type_failures(nursery: trio.Nursery) -> None:
    page = reply(404, b"<h1>gone</h1>", [("Content-Type", "text/html")])
    _, _, fetcher = await serve(nursery, {"/m": page})
    response = await fetcher.get(
        "http://nft.example/m", limits=FetchLimits(content_types=("application/json",))
    )
    assert (response.status, response.ok, response.body) == (404, False, b"<h1>gone</h1>")


async def test_a_gzip_answer_is_inflated_and_a_gzip_bomb_refused(nursery: trio.Nursery) -> None:
    encoded = [("Content-Type", "application/json"), ("Content-Encoding", "gzip")]
    bomb = gzip.compress(b" " * (50 << 20), compresslevel=9)
    _, _, fetcher = await serve(
        nursery,
        {
            "/small": reply(body=gzip.compress(METADATA), headers=encoded),
            "/bomb": reply(body=bomb, headers=encoded),
        },
    )
    assert (await fetcher.get("http://nft.example/small")).body == METADATA
    with pytest.raises(FetchError) as caught:
        await fetcher.get("http://nft.example/bomb")
    assert caught.value.reason == Reason.TOO_LARGE


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
async def test_three_redirects_are_followed(status: int, nursery: trio.Nursery) -> None:
    routes = {f"/hop/{n}": redirect(f"/hop/{n - 1}", status) for n in range(1, 5)}
    routes["/hop/0"] = reply(body=METADATA)
    server, _, fetcher = await serve(nursery, routes)
    response = await fetcher.get("http://nft.example/hop/3")
    assert (response.body, response.url) == (METADATA, "http://nft.example/hop/0")
    assert [r.target for r in server.requests] == ["/hop/3", "/hop/2", "/hop/1", "/hop/0"]


async def test_a_fourth_redirect_is_refused(nursery: trio.Nursery) -> None:
    routes = {f"/hop/{n}": redirect(f"/hop/{n - 1}") for n in range(1, 5)}
    routes["/hop/0"] = reply(body=METADATA)
    server, _, fetcher = await serve(nursery, routes)
    with pytest.raises(FetchError) as caught:
        await fetcher.get("http://nft.example/hop/4")
    assert caught.value.reason == Reason.TOO_MANY_REDIRECTS
    assert [r.target for r in server.requests] == ["/hop/4", "/hop/3", "/hop/2", "/hop/1"]


async def test_a_caller_may_allow_fewer_redirects(nursery: trio.Nursery) -> None:
    server, _, fetcher = await serve(nursery, {"/a": redirect("/b"), "/b": reply()})
    with pytest.raises(FetchError) as caught:
        await fetcher.get("http://nft.example/a", limits=FetchLimits(max_redirects=0))
    assert caught.value.reason == Reason.TOO_MANY_REDIRECTS
    assert len(server.requests) == 1


async def test_caller_headers_stay_with_their_origin(nursery: trio.Nursery) -> None:
    routes = {
        "/a": redirect("/b"),
        "/b": redirect("http://other.example/c"),
        "/c": reply(),
    }
    server, _, fetcher = await serve(nursery, routes, names=("nft.example", "other.example"))
    await fetcher.get(
        "http://nft.example/a",
        headers={"Authorization": "Bearer gateway-token", "Accept": "application/json"},
    )
    a, b, c = server.requests
    assert a.header("authorization") == b.header("authorization") == "Bearer gateway-token"
    assert c.header("authorization") is None
    assert c.header("accept") == "application/json"
    assert c.header("host") == "other.example"


async def test_webhook_post(nursery: trio.Nursery) -> None:
    server, _, fetcher = await serve(nursery, {"/hooks/abc": reply(204, b"", [])})
    payload = json.dumps({"type": "ADDRESS_ACTIVITY", "id": "wh_1"}).encode()
    response = await fetcher.post(
        "http://nft.example/hooks/abc",
        payload,
        headers=[("Content-Type", "application/json"), ("X-Chaingate-Signature", "v1=abc")],
        limits=FetchLimits(max_bytes=64 * 1024, timeout=5),
    )
    assert response.status == 204
    (seen,) = server.requests
    assert (seen.method, seen.body) == ("POST", payload)
    assert seen.header("content-length") == str(len(payload))
    assert seen.header("content-type") == "application/json"
    assert seen.header("x-chaingate-signature") == "v1=abc"


async def test_an_empty_post_says_content_length_zero(nursery: trio.Nursery) -> None:
    server, _, fetcher = await serve(nursery, {"/ping": reply()})
    await fetcher.post("http://nft.example/ping", b"")
    assert server.requests[0].header("content-length") == "0"


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
async def test_a_post_redirect_is_the_answer(status: int, nursery: trio.Nursery) -> None:
    server, connector, fetcher = await serve(
        nursery, {"/hook": redirect("http://169.254.169.254/", status)}
    )
    response = await fetcher.post("http://nft.example/hook", b"{}")
    assert response.status == status
    assert response.header("location") == "http://169.254.169.254/"
    assert len(server.requests) == 1
    assert connector.attempts == [Attempt(ipaddress.ip_address(FAKE_PUBLIC), 80, None)]


async def test_reserved_or_invalid_headers_are_programming_errors() -> None:
    fetcher = Fetcher(connector=RecordingConnector())
    for headers in ({"Host": "evil"}, {"Transfer-Encoding": "chunked"}, {"X": "a\r\nB: c"}):
        with pytest.raises(ValueError, match="header"):
            await fetcher.get("http://example.com/", headers=headers)


async def test_invalid_http_is_an_http_error(nursery: trio.Nursery) -> None:
    async def garbage(request: SeenRequest, stream: trio.abc.Stream) -> None:
        await stream.send_all(b"SMTP ready\r\n\r\n")

    async def cut(request: SeenRequest, stream: trio.abc.Stream) -> None:
        await stream.send_all(head(200, [("Content-Length", "100")]) + b"short")

    _, _, fetcher = await serve(nursery, {"/garbage": garbage, "/cut": cut})
    for path in ("/garbage", "/cut"):
        with pytest.raises(FetchError) as caught:
            await fetcher.get(f"http://nft.example{path}")
        assert caught.value.reason == Reason.HTTP_ERROR, path


# Connecting: addresses in order, a connect timeout each, the one deadline over everything.


class StallingConnector(RecordingConnector):
    """Never completes a connect to the addresses it is told to stall on."""

    def __init__(self, stall: set[str], routes: dict[tuple[str, int], int] | None = None) -> None:
        super().__init__(routes)
        self.stall = {ipaddress.ip_address(a) for a in stall}

    async def connect(
        self, address: IPAddress, port: int, server_name: str | None
    ) -> trio.abc.Stream:
        if address in self.stall:
            self.attempts.append(Attempt(address, port, server_name))
            await trio.sleep_forever()
        return await super().connect(address, port, server_name)


async def test_addresses_are_tried_in_order_after_a_connect_timeout(nursery: trio.Nursery) -> None:
    server = await HttpServer({"/": reply(body=METADATA)}).start(nursery)
    connector = StallingConnector({"203.0.113.1"}, routes={(FAKE_PUBLIC, 80): server.port})
    resolver = StaticResolver({"two.example": ["203.0.113.1", "203.0.113.2", FAKE_PUBLIC]})
    fetcher = Fetcher(ROUTED, resolver=resolver, connector=connector)
    response = await fetcher.get("http://two.example/", limits=FetchLimits(connect_timeout=0.2))
    assert response.body == METADATA
    assert [str(a.address) for a in connector.attempts] == [
        "203.0.113.1",  # stalled: given up after connect_timeout
        "203.0.113.2",  # refused
        FAKE_PUBLIC,
    ]


async def test_connect_failures_name_no_path(autojump_clock: trio.abc.Clock) -> None:
    connector = StallingConnector({"203.0.113.1"})
    resolver = StaticResolver({"hooks.example": ["203.0.113.1", "203.0.113.2"]})
    fetcher = Fetcher(ROUTED, resolver=resolver, connector=connector)
    with pytest.raises(FetchError) as caught:
        await fetcher.post("https://hooks.example/services/T0/B0/s3cr3t", b"{}")
    assert caught.value.reason == Reason.CONNECT_FAILED
    assert "s3cr3t" not in str(caught.value) and "hooks.example" in str(caught.value)
    assert len(connector.attempts) == 2


async def test_the_deadline_covers_every_step(autojump_clock: trio.abc.Clock) -> None:
    connector = StallingConnector({"203.0.113.1", "203.0.113.2"})
    resolver = StaticResolver({"slow.example": ["203.0.113.1", "203.0.113.2"]})
    fetcher = Fetcher(ROUTED, resolver=resolver, connector=connector)
    started = trio.current_time()
    with pytest.raises(FetchError) as caught:
        await fetcher.get(
            "https://slow.example/?token=s3cr3t", limits=FetchLimits(timeout=4, connect_timeout=3)
        )
    assert caught.value.reason == Reason.TIMEOUT
    assert math.isclose(trio.current_time() - started, 4)
    assert "s3cr3t" not in str(caught.value)
    assert len(connector.attempts) == 2  # the second attempt was cut by the deadline


async def test_head_is_not_refused_for_the_size_it_announces(nursery: trio.Nursery) -> None:
    async def large(request: SeenRequest, stream: trio.abc.Stream) -> None:
        await stream.send_all(head(200, [("Content-Length", str(50 << 20))]))

    _, _, fetcher = await serve(nursery, {"/big": large})
    response = await fetcher.request("HEAD", "http://nft.example/big")
    assert (response.status, response.body) == (200, b"")
    assert response.header("content-length") == str(50 << 20)
    with pytest.raises(FetchError) as caught:
        await fetcher.get("http://nft.example/big")
    assert caught.value.reason == Reason.TOO_LARGE


async def test_the_system_resolver_answers_from_the_hosts_file() -> None:
    """The default resolver, on names that never leave the machine."""
    addresses = await SystemResolver().resolve("localhost", 80)
    assert addresses and all(address.is_loopback for address in addresses)
    assert await SystemResolver().resolve("127.0.0.1", 80) == [ipaddress.ip_address("127.0.0.1")]

"""HTTPS: a local server with a certificate from a trustme CA.

Under the dev setting the fetcher reaches it on loopback with the CA in its trust store; without
the CA, or under a name the certificate does not carry, verification fails.  Through a fake
public address the certificate is checked against the URL's host name (sent as SNI), not the
address connected to.
"""

from __future__ import annotations

import ipaddress
import ssl

import pytest
import trio
import trustme

from chaingate.outbound import (
    Fetcher,
    FetchError,
    FetchLimits,
    OutboundPolicy,
    Reason,
    TcpConnector,
)
from tests.test_outbound_support import (
    Attempt,
    HttpServer,
    RecordingConnector,
    StaticResolver,
    reply,
)

METADATA = b'{"name": "Token #7"}'


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def server_context(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost", "nft.example").configure_cert(context)
    return context


@pytest.fixture
def client_context(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context


async def start(
    nursery: trio.Nursery, server_context: ssl.SSLContext
) -> tuple[HttpServer, list[str | None]]:
    names: list[str | None] = []
    server_context.sni_callback = lambda _sock, name, _ctx: names.append(name)
    routes = {"/token/7.json": reply(body=METADATA)}
    return await HttpServer(routes, ssl_context=server_context).start(nursery), names


async def test_https_under_the_dev_setting(
    nursery: trio.Nursery, server_context: ssl.SSLContext, client_context: ssl.SSLContext
) -> None:
    server, sni = await start(nursery, server_context)
    fetcher = Fetcher(OutboundPolicy.dev(), connector=TcpConnector(client_context))
    response = await fetcher.get(
        f"https://localhost:{server.port}/token/7.json",
        limits=FetchLimits(content_types=("application/json",)),
    )
    assert (response.status, response.body) == (200, METADATA)
    assert sni == ["localhost"]
    assert server.requests[0].header("host") == f"localhost:{server.port}"


async def test_https_without_the_ca_fails_verification(
    nursery: trio.Nursery, server_context: ssl.SSLContext
) -> None:
    server, _ = await start(nursery, server_context)
    fetcher = Fetcher(OutboundPolicy.dev())  # the system trust store: trustme's CA is not in it
    with pytest.raises(FetchError) as caught:
        await fetcher.get(f"https://localhost:{server.port}/token/7.json")
    assert caught.value.reason == Reason.TLS
    assert server.requests == []


async def test_https_to_a_name_the_certificate_lacks_fails(
    nursery: trio.Nursery, server_context: ssl.SSLContext, client_context: ssl.SSLContext
) -> None:
    server, _ = await start(nursery, server_context)
    fetcher = Fetcher(OutboundPolicy.dev(), connector=TcpConnector(client_context))
    with pytest.raises(FetchError) as caught:
        await fetcher.get(f"https://127.0.0.1:{server.port}/token/7.json")
    assert caught.value.reason == Reason.TLS
    assert server.requests == []


async def test_https_checks_the_url_host_not_the_address(
    nursery: trio.Nursery, server_context: ssl.SSLContext, client_context: ssl.SSLContext
) -> None:
    server, sni = await start(nursery, server_context)
    connector = RecordingConnector({("203.0.113.7", 443): server.port}, ssl_context=client_context)
    resolver = StaticResolver({"nft.example": ["203.0.113.7"], "evil.example": ["203.0.113.7"]})
    policy = OutboundPolicy.production(allow_cidrs=["203.0.113.0/24"])
    fetcher = Fetcher(policy, resolver=resolver, connector=connector)

    response = await fetcher.get("https://nft.example/token/7.json")
    assert response.body == METADATA
    assert sni == ["nft.example"]
    assert connector.attempts == [Attempt(ipaddress.ip_address("203.0.113.7"), 443, "nft.example")]

    with pytest.raises(FetchError) as caught:
        await fetcher.get("https://evil.example/token/7.json")
    assert caught.value.reason == Reason.TLS
    assert len(server.requests) == 1

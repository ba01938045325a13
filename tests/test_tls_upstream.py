"""An https:// upstream: a real TLS terminator (trio's SSLStream) in front of a real anvil."""

from __future__ import annotations

import functools
import ssl
import subprocess
from pathlib import Path

import pytest
import trio

from chaingate.devnet.anvil import AnvilProcess
from tests.conftest import StartGateway


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("tls")
    key, cert = directory / "key.pem", directory / "cert.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    return key, cert


async def _relay(client: trio.abc.Stream, node_port: int) -> None:
    node = await trio.open_tcp_stream("127.0.0.1", node_port)

    async def pump(source: trio.abc.Stream, sink: trio.abc.Stream) -> None:
        try:
            while data := await source.receive_some(65536):
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async with node, client, trio.open_nursery() as nursery:
        nursery.start_soon(pump, node, client)
        await pump(client, node)
        nursery.cancel_scope.cancel()


async def start_tls_relay(
    nursery: trio.Nursery, certificate: tuple[Path, Path], node_port: int
) -> int:
    key, cert = certificate
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)

    async def handler(stream: trio.SSLStream[trio.SocketStream]) -> None:
        try:
            await _relay(stream, node_port)
        except trio.BrokenResourceError:
            pass  # the client refused our certificate: that is what one test wants

    serve = functools.partial(trio.serve_ssl_over_tcp, host="127.0.0.1")
    listeners = await nursery.start(serve, handler, 0, server_context)
    return int(listeners[0].transport_listener.socket.getsockname()[1])


async def test_https_upstream_with_a_private_ca(
    start_gateway: StartGateway,
    anvil: AnvilProcess,
    nursery: trio.Nursery,
    certificate: tuple[Path, Path],
) -> None:
    port = await start_tls_relay(nursery, certificate, anvil.port)
    gw = await start_gateway(
        [{"url": f"https://localhost:{port}/", "name": "tls", "ca_file": str(certificate[1])}]
    )
    assert (await gw.rpc("eth_chainId"))["result"] == "0x7a69"
    async with gw.client() as client:
        response = await client.post(
            "/v1/rpc/ethereum/devnet",
            json=[{"jsonrpc": "2.0", "id": i, "method": "eth_blockNumber"} for i in range(30)],
        )
    assert [r["id"] for r in response.json()] == list(range(30))


async def test_https_upstream_with_an_untrusted_certificate_fails_cleanly(
    start_gateway: StartGateway,
    anvil: AnvilProcess,
    nursery: trio.Nursery,
    certificate: tuple[Path, Path],
) -> None:
    port = await start_tls_relay(nursery, certificate, anvil.port)
    gw = await start_gateway([{"url": f"https://localhost:{port}/", "name": "tls"}])
    reply = await gw.rpc("eth_chainId")
    assert reply["error"]["code"] == -32603
    assert reply["error"]["data"]["reason"] in {"connect", "unavailable"}

"""The devnet's own metadata documents on loopback, run by ``chaingate dev``.

The devnet's NFTs name their metadata the three ways a reader meets (``chaingate.devnet.demo``):
``data:`` URIs, ``ipfs://`` URIs (real CIDs of the documents) and ``https://`` URLs of the
devnet's host ``metadata.chaingate.localhost``.  No public gateway has the IPFS ones, that
host exists nowhere, and a dev machine may have no internet: ``chaingate dev`` serves both
kinds from one loopback port.

* ``GET /ipfs/<cid>``: this server is first in the devnet's ``metadata.ipfs_gateways``.
* ``GET /devnet/...``: chaingate dev's fetcher resolves and connects through ``DevnetHost``,
  which sends ``https://metadata.chaingate.localhost/...`` here — plain HTTP on loopback, as no
  CA signs a ``.localhost`` name (RFC 6761 keeps such names on this machine).  Every other URL
  is fetched as in production: DNS, verified TLS, the outbound policy.

Anything else is 404; one request per connection, bounded in size and time.  Image URLs shown
to clients keep naming the public gateway (``image_gateway_url``), as they would on a real
chain.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Mapping, Sequence

import h11
import trio

from chaingate.outbound import IPAddress, SystemResolver, TcpConnector

MAX_REQUEST_BYTES = 16 * 1024
REQUEST_SECONDS = 10.0
LOOPBACK = ipaddress.ip_address("127.0.0.1")


async def serve_documents(
    documents: Mapping[str, bytes],
    *,
    host: str = "127.0.0.1",
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``documents`` (by URL path) until cancelled; started with the server's base URL."""
    listeners = await trio.open_tcp_listeners(0, host=host)
    port = listeners[0].socket.getsockname()[1]
    task_status.started(f"http://{host}:{port}")
    await trio.serve_listeners(functools.partial(_answer, documents), listeners)


class DevnetHost:
    """chaingate dev's fetcher's resolver and connector: ``host`` over https is the document
    server on loopback ``port``; every other name and address goes where the system says."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host.lower()
        self.port = port
        self._resolver = SystemResolver()
        self._connector = TcpConnector()

    async def resolve(self, host: str, port: int) -> Sequence[IPAddress]:
        if host.rstrip(".").lower() == self.host:
            return [LOOPBACK]
        return await self._resolver.resolve(host, port)

    async def connect(
        self, address: IPAddress, port: int, server_name: str | None
    ) -> trio.abc.Stream:
        if server_name is not None and server_name.rstrip(".").lower() == self.host:
            return await self._connector.connect(LOOPBACK, self.port, None)
        return await self._connector.connect(address, port, server_name)


async def _answer(documents: Mapping[str, bytes], stream: trio.SocketStream) -> None:
    async with stream:
        with trio.move_on_after(REQUEST_SECONDS):
            connection = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_BYTES)
            try:
                request = await _request(connection, stream)
            except h11.RemoteProtocolError:
                return
            if request is None:
                return
            status, body = _lookup(documents, request)
            headers = [
                ("content-type", "application/json" if status == 200 else "text/plain"),
                ("content-length", str(len(body))),
                ("connection", "close"),
            ]
            data = connection.send(h11.Response(status_code=status, headers=headers))
            data += connection.send(h11.Data(data=body)) or b""
            data += connection.send(h11.EndOfMessage()) or b""
            try:
                await stream.send_all(data or b"")
            except trio.BrokenResourceError:
                return


async def _request(connection: h11.Connection, stream: trio.SocketStream) -> h11.Request | None:
    while True:
        event = connection.next_event()
        if isinstance(event, h11.Request):
            return event
        if event is h11.NEED_DATA:
            try:
                data = await stream.receive_some(4096)
            except trio.BrokenResourceError:
                return None
            connection.receive_data(data)
            if not data:
                return None
            continue
        return None  # the client closed, or something that is no request


def _lookup(documents: Mapping[str, bytes], request: h11.Request) -> tuple[int, bytes]:
    path = request.target.decode("ascii", "replace").split("?", 1)[0]
    if request.method != b"GET":
        return 404, b"not found\n"
    document = documents.get(path.rstrip("/") if path.startswith("/ipfs/") else path)
    if document is None:
        return 404, b"no such document on the devnet\n"
    return 200, document

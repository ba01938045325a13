"""A local IPFS gateway for the devnet's own documents, run by ``chaingate dev``.

The devnet's NFTs name some of their metadata by ``ipfs://`` URI (real CIDs of the documents,
``chaingate.devnet.demo.ipfs_documents``).  No public gateway has them, and a dev machine may
have no internet: ``chaingate dev`` serves them on a loopback port and puts that gateway first
in the devnet's ``metadata.ipfs_gateways`` (the outbound fetcher allows loopback only under
``chaingate dev``).  ``GET /ipfs/<cid>`` answers the document, anything else 404; one request
per connection, bounded in size and time.  Image URLs shown to clients keep naming the public
gateway (``image_gateway_url``), as they would on a real chain.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import h11
import trio

MAX_REQUEST_BYTES = 16 * 1024
REQUEST_SECONDS = 10.0


async def serve_ipfs_gateway(
    documents: Mapping[str, bytes],
    *,
    host: str = "127.0.0.1",
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``documents`` (by CID) until cancelled; started with the gateway's base URL."""
    listeners = await trio.open_tcp_listeners(0, host=host)
    port = listeners[0].socket.getsockname()[1]
    task_status.started(f"http://{host}:{port}")
    await trio.serve_listeners(functools.partial(_answer, documents), listeners)


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
    target = request.target.decode("ascii", "replace").split("?", 1)[0]
    if request.method != b"GET" or not target.startswith("/ipfs/"):
        return 404, b"not found\n"
    document = documents.get(target.removeprefix("/ipfs/").strip("/"))
    if document is None:
        return 404, b"no such document on the devnet\n"
    return 200, document

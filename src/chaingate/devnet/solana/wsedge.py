"""The node's PubSub edge: WebSocket (wsproto on trio) in front of a ``pubsub.Hub``.

Every frame a connection sends (replies, pongs, notifications from the slot clock) goes through
one bounded outbox and one writer task.  A client that lets the outbox fill is dropped: a slow
reader must not hold up the slot clock, which is what produces the notifications.
"""

from __future__ import annotations

import functools
import logging

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Ping,
    Request,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

from chaingate.devnet.solana.pubsub import Hub

log = logging.getLogger("chaingate.devnet.solana")
OUTBOX = 4096
MAX_MESSAGE_BYTES = 64 * 1024
DRAIN_SECONDS = 5.0


async def serve_pubsub(
    hub: Hub,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve PubSub until cancelled; started with its ``ws://`` URL."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()[1]
    task_status.started(f"ws://{host}:{bound}")
    await trio.serve_listeners(functools.partial(_connection, hub), listeners)


class _Client:
    """One connection's sending side: wsproto's state and the outbox to the writer."""

    def __init__(self) -> None:
        self.ws = WSConnection(ConnectionType.SERVER)
        self.outbox, self.pending = trio.open_memory_channel[bytes](OUTBOX)
        self.owned: set[int] = set()

    def put(self, wire: bytes) -> None:
        try:
            self.outbox.send_nowait(wire)
        except trio.WouldBlock:
            self.outbox.close()  # too slow a reader: the writer stops, the connection ends
        except trio.ClosedResourceError:
            pass

    def send_text(self, frame: bytes) -> None:
        try:
            self.put(self.ws.send(TextMessage(frame.decode())))
        except LocalProtocolError:
            pass  # closing already


async def _connection(hub: Hub, stream: trio.SocketStream) -> None:
    """One client's connection; whatever goes wrong in it ends it, never the server."""
    try:
        await _serve_connection(hub, stream)
    except Exception:
        log.exception("solana node: a PubSub connection failed")


async def _serve_connection(hub: Hub, stream: trio.SocketStream) -> None:
    client = _Client()
    async with stream, trio.open_nursery() as nursery:
        nursery.start_soon(_writer, stream, client.pending, nursery.cancel_scope)
        try:
            await _reader(hub, client, stream)
        finally:
            hub.drop(client.owned)
            client.outbox.close()  # the writer sends what is queued (a close reply), then ends
            nursery.cancel_scope.deadline = trio.current_time() + DRAIN_SECONDS


async def _reader(hub: Hub, client: _Client, stream: trio.SocketStream) -> None:
    parts: list[str] = []
    while True:
        try:
            data = await stream.receive_some(65536)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        if not data:
            return
        try:
            client.ws.receive_data(data)
            for event in client.ws.events():
                if not _handle(hub, client, event, parts):
                    return
        except (RemoteProtocolError, LocalProtocolError):
            return


def _handle(hub: Hub, client: _Client, event: Event, parts: list[str]) -> bool:
    """Answer ``event``; False when the connection is over."""
    if isinstance(event, Request):
        client.put(client.ws.send(AcceptConnection()))
    elif isinstance(event, CloseConnection):
        client.put(client.ws.send(event.response()))
        return False
    elif isinstance(event, Ping):
        client.put(client.ws.send(event.response()))
    elif isinstance(event, TextMessage | BytesMessage):
        parts.append(event.data if isinstance(event.data, str) else event.data.decode())
        if sum(map(len, parts)) > MAX_MESSAGE_BYTES:
            return False
        if event.message_finished:
            request, parts[:] = "".join(parts).encode(), []
            client.send_text(hub.answer(request, client.send_text, client.owned))
    return True


async def _writer(
    stream: trio.SocketStream, pending: trio.MemoryReceiveChannel[bytes], scope: trio.CancelScope
) -> None:
    async for wire in pending:
        try:
            await stream.send_all(wire)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            break
    scope.cancel()

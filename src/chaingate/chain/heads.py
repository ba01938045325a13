"""New-head notifications from an upstream's WebSocket (``eth_subscribe("newHeads")``).

A notification only *wakes* the follower; the follower still reads the head and its parents
over HTTP through the pool, so ordering, reorg handling and failover stay in one place.
Without a WebSocket (or while it is down) the follower falls back to polling on its own.
"""

from __future__ import annotations

import logging
import ssl
from urllib.parse import urlsplit

import msgspec
import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    Ping,
    Request,
    TextMessage,
)

from chaingate.wsupstream import UpstreamMessages

log = logging.getLogger("chaingate.follower")

_SUBSCRIBE = b'{"jsonrpc":"2.0","id":1,"method":"eth_subscribe","params":["newHeads"]}'
MAX_MESSAGE = 1 << 20
MAX_BACKOFF = 10.0


class _Push(msgspec.Struct):
    method: str | None = None
    error: dict[str, object] | None = None


_decode_push = msgspec.json.Decoder(_Push).decode


class HeadNotifier:
    """Keeps one WebSocket subscription open per URL; sets ``wake`` on every new head."""

    def __init__(self, urls: list[str], label: str) -> None:
        self.urls = urls
        self.label = label
        self.wake = trio.Event()
        self.connected = 0  # subscriptions currently open
        self.notifications = 0

    def take(self) -> bool:
        """True (and re-arm) if a head arrived since the last call."""
        if not self.wake.is_set():
            return False
        self.wake = trio.Event()
        return True

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            for url in self.urls:
                nursery.start_soon(self._keep_subscribed, url)

    async def _keep_subscribed(self, url: str) -> None:
        failures = 0
        while True:
            try:
                await self._subscribe(url)
                failures = 0
            except (OSError, trio.BrokenResourceError, ConnectionError, ValueError) as exc:
                failures += 1
                if failures in (1, 10) or failures % 100 == 0:
                    log.warning(
                        "upstream newHeads subscription failed; polling meanwhile",
                        extra={"fields": {"network": self.label, "error": str(exc)[:200]}},
                    )
            await trio.sleep(min(MAX_BACKOFF, 0.25 * 2**failures))

    async def _subscribe(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("ws", "wss") or not parts.hostname:
            raise ValueError("ws_url must be ws:// or wss://")
        port = parts.port or (443 if parts.scheme == "wss" else 80)
        stream: trio.abc.Stream = await trio.open_tcp_stream(parts.hostname, port)
        if parts.scheme == "wss":
            stream = trio.SSLStream(
                stream, ssl.create_default_context(), server_hostname=parts.hostname
            )
        async with stream:
            ws = WSConnection(ConnectionType.CLIENT)
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            await stream.send_all(ws.send(Request(host=parts.hostname, target=target)))
            messages = UpstreamMessages(MAX_MESSAGE)
            subscribed = False
            try:
                while True:
                    data = await stream.receive_some(65536)
                    if not data:
                        raise ConnectionError("upstream closed the WebSocket")
                    ws.receive_data(bytes(data))
                    for event in ws.events():
                        if isinstance(event, AcceptConnection):
                            await stream.send_all(ws.send(TextMessage(_SUBSCRIBE.decode())))
                        elif isinstance(event, Ping):
                            await stream.send_all(ws.send(event.response()))
                        elif (message := messages.complete(event)) is not None:
                            push = _decode_push(message)
                            if push.method == "eth_subscription":
                                self.notifications += 1
                                self.wake.set()
                            elif push.error is not None:
                                raise ConnectionError(f"eth_subscribe refused: {push.error}")
                            elif not subscribed:
                                subscribed = True
                                self.connected += 1
            except msgspec.DecodeError as exc:
                raise ConnectionError(f"upstream sent invalid JSON: {exc}") from None
            finally:
                if subscribed:
                    self.connected -= 1

"""A small blocking WebSocket client on wsproto (sans-IO) over a socket: gevent-friendly, since
locust's process has its sockets patched, and enough for subscriptions (text frames)."""

from __future__ import annotations

import contextlib
import socket
import ssl
from urllib.parse import urlsplit

from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    CloseConnection,
    Event,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError

RECV_BYTES = 65536
MAX_MESSAGE = 16 * 1024 * 1024  # one push larger than this is a broken target


class WsError(Exception):
    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status  # the HTTP status of a refused upgrade


class WsClient:
    def __init__(self, url: str, headers: dict[str, str], timeout: float) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("ws", "wss"):
            raise WsError(f"not a ws:// or wss:// URL: {parts.scheme}")
        port = parts.port or (443 if parts.scheme == "wss" else 80)
        raw = socket.create_connection((parts.hostname or "", port), timeout=timeout)
        if parts.scheme == "wss":
            raw = ssl.create_default_context().wrap_socket(raw, server_hostname=parts.hostname)
        self.sock = raw
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.pending: list[str] = []
        self._parts: list[str] = []
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._send(
            Request(
                host=parts.netloc.rsplit("@", 1)[-1],
                target=target,
                extra_headers=[(k.encode(), v.encode()) for k, v in headers.items()],
            )
        )
        self._handshake()

    def _send(self, event: Event) -> None:
        self.sock.sendall(self.ws.send(event))

    def _handshake(self) -> None:
        while True:
            self._feed()
            for event in self.ws.events():
                if isinstance(event, AcceptConnection):
                    return
                if isinstance(event, RejectConnection):
                    body = b""
                    if event.has_body:
                        for more in self.ws.events():
                            if isinstance(more, RejectData):
                                body += more.data
                    detail = f"upgrade refused: HTTP {event.status_code} {body[:120]!r}"
                    raise WsError(detail, event.status_code)

    def _feed(self) -> None:
        data = self.sock.recv(RECV_BYTES)
        if not data:
            raise WsError("connection closed")
        self.ws.receive_data(data)

    def send_text(self, text: str) -> None:
        self._send(TextMessage(data=text))

    def recv_text(self, timeout: float) -> str | None:
        """The next text message, or None if none came within ``timeout`` seconds."""
        if self.pending:
            return self.pending.pop(0)
        self.sock.settimeout(timeout)
        try:
            while not self.pending:
                self._feed()
                self._drain_events()
        except TimeoutError:
            return None
        return self.pending.pop(0)

    def _drain_events(self) -> None:
        for event in self.ws.events():
            if isinstance(event, TextMessage):
                self._parts.append(event.data)
                if sum(len(p) for p in self._parts) > MAX_MESSAGE:
                    raise WsError("message too large")
                if event.message_finished:
                    self.pending.append("".join(self._parts))
                    self._parts = []
            elif isinstance(event, Ping):
                self._send(event.response())
            elif isinstance(event, CloseConnection):
                raise WsError(f"closed by the server: {event.code} {event.reason or ''}")

    def close(self) -> None:
        # Closing a broken connection has nothing to report: the socket is closed either way.
        with contextlib.suppress(OSError, LocalProtocolError):
            self._send(CloseConnection(code=1000))
        self.sock.close()

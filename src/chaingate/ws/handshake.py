"""The server side of RFC 6455's opening handshake, on a request the edge already parsed.

Pure functions: check the upgrade request, find the API key in the query string, build the
``101 Switching Protocols`` answer.  permessage-deflate is negotiated by
``chaingate.ws.deflate`` (its header line goes in ``extra``); no subprotocol is.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from urllib.parse import parse_qsl

from chaingate.twintypes.http1 import Request

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
MAX_QUERY_FIELDS = 20


class HandshakeError(Exception):
    """Not a valid WebSocket upgrade: HTTP status, message, extra header lines."""

    def __init__(self, status: int, message: str, headers: bytes = b"") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


def _tokens(value: bytes) -> set[bytes]:
    return {token.strip(b" \t").lower() for token in value.split(b",")}


def websocket_key(request: Request) -> bytes:
    """The client's ``Sec-WebSocket-Key`` after checking the upgrade; or HandshakeError."""
    if request.version != 11:
        raise HandshakeError(400, "a WebSocket upgrade needs HTTP/1.1")
    connection: set[bytes] = set()
    version = key = None
    for name, value in request.headers:
        if name == b"connection":
            connection |= _tokens(value)
        elif name == b"sec-websocket-version":
            version = value
        elif name == b"sec-websocket-key":
            key = value
    if b"websocket" not in _tokens(request.upgrade or b"") or b"upgrade" not in connection:
        raise HandshakeError(400, "expected Upgrade: websocket and Connection: Upgrade")
    if version != b"13":
        raise HandshakeError(
            426, "unsupported WebSocket version: use 13", b"Sec-WebSocket-Version: 13\r\n"
        )
    if key is None:
        raise HandshakeError(400, "missing Sec-WebSocket-Key")
    try:
        raw = base64.b64decode(key, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 16:
        raise HandshakeError(400, "invalid Sec-WebSocket-Key")
    return bytes(key)


def accept_value(key: bytes) -> bytes:
    return base64.b64encode(hashlib.sha1(key + GUID).digest())  # noqa: S324 (RFC 6455 says SHA-1)


def switching_protocols(key: bytes, extra: bytes = b"") -> bytes:
    """The whole 101 answer (no Content-Length: a 1xx never has one)."""
    return (
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Accept: " + accept_value(key) + b"\r\n" + extra + b"\r\n"
    )


def query_api_key(query: bytes) -> bytes | None:
    """``apiKey`` from the query string, as the spec's WebSocket section passes it."""
    return query_value(query, "apiKey")


def query_value(query: bytes, wanted: str) -> bytes | None:
    """The first value of ``wanted`` in the query string, or None."""
    if not query:
        return None
    try:
        pairs = parse_qsl(
            query.decode("latin-1"), keep_blank_values=True, max_num_fields=MAX_QUERY_FIELDS
        )
    except ValueError:
        return None
    for name, value in pairs:
        if name == wanted:
            return value.encode("latin-1", "replace")
    return None

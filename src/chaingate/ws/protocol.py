"""Bytes on the wire: server frames, subscription pushes, JSON-RPC replies, incoming calls.

Reading client frames (masked, possibly fragmented, control frames, the closing handshake) is
wsproto's job.  Outgoing data frames are built here: a server frame is unmasked, so its header
depends only on the payload length — the fan-out builds it once per event and every
subscriber's frame is that header, its own ``params`` prefix and the shared result.
"""

from __future__ import annotations

import math
import secrets
import struct
from typing import Any

import msgspec

from chaingate.framing_constants import MAX_JSON_DEPTH

TEXT = 0x1
CLOSE = 0x8
PING = 0x9

PUSH_HEAD = b'{"jsonrpc":"2.0","method":"eth_subscription","params":{"subscription":"'
PUSH_MID = b'","result":'
PUSH_TAIL = b"}}"
# Subscription ids are 16 random bytes in hex, like geth's: every prefix has the same length.
SUBSCRIPTION_ID_BYTES = 16
PUSH_PREFIX_LEN = len(PUSH_HEAD) + 2 + 2 * SUBSCRIPTION_ID_BYTES + len(PUSH_MID)

# What a push costs: compute units per byte of the JSON message, rounded up per message
# (Alchemy bills 0.04 CU per byte of subscription data).
CU_PER_BYTE = 0.04

# JSON-RPC error codes used on the socket besides the proxy's own.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
RESOURCE_UNAVAILABLE = -32002  # EIP-1474; for refusals the HTTP proxy answers 401/403 to
LIMIT_EXCEEDED = -32005  # EIP-1474, as the HTTP proxy uses it for 429
# The framing's own words for JSON nested too deep and for bytes that are not UTF-8 (a binary
# frame's: the HTTP proxy answers them too).
MSG_TOO_DEEP = f"parse error: JSON nested deeper than {MAX_JSON_DEPTH} levels"
MSG_BAD_UTF8 = "parse error: body is not valid UTF-8"


def utf8(message: bytes) -> bool:
    try:
        message.decode()
    except UnicodeDecodeError:
        return False
    return True


def frame_header(length: int, opcode: int = TEXT) -> bytes:
    """The header of one final, unmasked server frame carrying ``length`` bytes."""
    first = 0x80 | opcode
    if length < 126:
        return bytes((first, length))
    if length < 65536:
        return struct.pack("!BBH", first, 126, length)
    return struct.pack("!BBQ", first, 127, length)


def text_frame(payload: bytes) -> bytes:
    return frame_header(len(payload)) + payload


RSV1 = 0x40  # permessage-deflate: this message's payload is deflated


def deflated_frame(payload: bytes) -> bytes:
    """A final text frame carrying a payload deflated by ``chaingate.ws.deflate``."""
    header = frame_header(len(payload))
    return bytes((header[0] | RSV1,)) + header[1:] + payload


def new_subscription_id() -> str:
    return "0x" + secrets.token_hex(SUBSCRIPTION_ID_BYTES)


def push_prefix(subscription_id: str) -> bytes:
    """Everything of a push before its result; ``PUSH_PREFIX_LEN`` bytes."""
    return PUSH_HEAD + subscription_id.encode() + PUSH_MID


def push_cost(payload_bytes: int) -> int:
    return max(1, math.ceil(payload_bytes * CU_PER_BYTE))


class Push:
    """One event's result, framed for every subscriber of a kind (same length for all)."""

    __slots__ = ("cu", "header", "tail")

    def __init__(self, result: bytes) -> None:
        self.tail = result + PUSH_TAIL
        length = PUSH_PREFIX_LEN + len(self.tail)
        self.header = frame_header(length)
        self.cu = push_cost(length)

    def frame(self, prefix: bytes) -> bytes:
        return self.header + prefix + self.tail


_encoder = msgspec.json.Encoder()
encode = _encoder.encode


def result_reply(id_raw: bytes, result: bytes) -> bytes:
    return b'{"jsonrpc":"2.0","id":' + id_raw + b',"result":' + result + b"}"


def error_reply(id_raw: bytes, code: int, message: str, data: object = None) -> bytes:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return b'{"jsonrpc":"2.0","id":' + id_raw + b',"error":' + encode(error) + b"}"


class Call(msgspec.Struct):
    """The parts of an incoming single call the socket layer reads itself."""

    method: Any = None
    params: msgspec.Raw = msgspec.Raw(b"")
    id: msgspec.Raw = msgspec.Raw(b"")


_decode_call = msgspec.json.Decoder(Call).decode


def peek_call(message: bytes) -> Call | None:
    """The method and id of a single call, or None (a batch, or not valid JSON: the RPC
    service answers those exactly as the HTTP proxy does)."""
    start = message.lstrip()[:1]
    if start != b"{":
        return None
    try:
        return _decode_call(message)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, UnicodeDecodeError):
        # RecursionError: nested deeper than the decoder goes; UnicodeDecodeError: a binary
        # frame that is not UTF-8.  The RPC service's framing answers both with -32700, as it
        # does over HTTP.
        return None


def id_bytes(call: Call) -> bytes:
    """The call's id as it came; ``null`` when absent or not a valid id type."""
    raw = bytes(call.id)
    if not raw or raw[:1] in (b"{", b"["):
        return b"null"
    return raw

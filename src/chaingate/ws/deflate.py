"""permessage-deflate (RFC 7692) with bounded memory: negotiation, inflating what the client
sends, deflating what we send.

Both directions without context takeover: we answer every offer with
``server_no_context_takeover; client_no_context_takeover`` (RFC 7692 7.1.1: a server may add
either unasked).  So no connection keeps a compressor or an LZ77 window between messages —
an idle socket costs nothing, a busy one at most one inflater (~40 KB) while a message is
arriving.  Inflation is bounded by ``max_message_bytes``: zlib is asked for at most one byte
past what the message may still hold, and a message over it is closed with 1009 before more
is inflated (a compressed bomb costs the cap, not its inflated size).

What we send: replies of at least ``min_bytes`` are deflated (level 1, measured); smaller
ones, acks and subscription pushes go as they are (RFC 7692 lets every message choose; a push
frame is built once per event for every subscriber, and coding it per subscriber would
multiply the fan-out's CPU by the subscriber count).
"""

from __future__ import annotations

import zlib

from wsproto.extensions import PerMessageDeflate
from wsproto.frame_protocol import CloseReason, FrameDecoder, FrameProtocol, Opcode, RsvBits

from chaingate.twintypes.http1 import Request

NAME = b"permessage-deflate"
LEVEL = 1
_SYNC_TAIL = b"\x00\x00\xff\xff"


class Negotiated:
    """An accepted offer: the response header line and how we deflate."""

    __slots__ = ("header", "min_bytes", "window_bits")

    def __init__(self, window_bits: int, min_bytes: int) -> None:
        self.window_bits = window_bits
        self.min_bytes = min_bytes
        params = b"; server_no_context_takeover; client_no_context_takeover"
        if window_bits < 15:
            params += b"; server_max_window_bits=%d" % window_bits
        self.header = b"Sec-WebSocket-Extensions: " + NAME + params + b"\r\n"


def _accept_offer(params: list[bytes]) -> int | None:
    """The window bits we may use for an offer's parameters, or None to decline it."""
    seen: set[bytes] = set()
    window_bits = 15
    for param in params:
        name, eq, value = param.partition(b"=")
        name = name.strip(b" \t").lower()
        value = value.strip(b" \t").strip(b'"')
        if not name:
            continue
        if name in seen:
            return None  # RFC 7692 7.1: a repeated parameter makes the offer invalid
        seen.add(name)
        if name in (b"server_no_context_takeover", b"client_no_context_takeover"):
            if eq:
                return None
        elif name == b"server_max_window_bits":
            if not value.isdigit() or not 8 <= int(value) <= 15:
                return None
            # zlib's raw deflate has no 8-bit window; 9 would break the client's limit.
            if int(value) < 9:
                return None
            window_bits = int(value)
        elif name == b"client_max_window_bits":
            if eq and (not value.isdigit() or not 8 <= int(value) <= 15):
                return None
        else:
            return None  # a parameter we do not know: decline this offer
    return window_bits


def negotiate(request: Request, min_bytes: int) -> Negotiated | None:
    """The first acceptable permessage-deflate offer of the upgrade request, or None (no
    offer, none acceptable, or ``min_bytes`` 0: compression off)."""
    if min_bytes <= 0:
        return None
    for name, value in request.headers:
        if name != b"sec-websocket-extensions":
            continue
        for offer in value.split(b","):
            parts = offer.split(b";")
            if parts[0].strip(b" \t").lower() != NAME:
                continue
            window_bits = _accept_offer(parts[1:])
            if window_bits is not None:
                return Negotiated(window_bits, min_bytes)
    return None


def deflate_message(payload: bytes, window_bits: int) -> bytes:
    """One message's payload deflated on its own (no context takeover), the trailing
    ``00 00 ff ff`` of the sync flush removed (RFC 7692 7.2.1)."""
    compressor = zlib.compressobj(LEVEL, zlib.DEFLATED, -window_bits)
    data = compressor.compress(payload) + compressor.flush(zlib.Z_SYNC_FLUSH)
    return data[:-4] if data.endswith(_SYNC_TAIL) else data


class InboundDeflate(PerMessageDeflate):
    """wsproto's permessage-deflate for the frames the client sends, with inflation bounded
    by ``max_message_bytes`` and no inflater kept between messages.  (Our data frames are
    built by ``chaingate.ws.protocol``, never by wsproto; control frames are not deflated.)"""

    def __init__(self, max_message_bytes: int) -> None:
        super().__init__(client_no_context_takeover=True, server_no_context_takeover=True)
        self._enabled = True  # negotiated by ``negotiate`` before the connection exists
        self._max = max_message_bytes
        self._inflated = 0
        self._control = False

    def frame_inbound_header(
        self,
        proto: FrameDecoder | FrameProtocol,
        opcode: Opcode,
        rsv: RsvBits,
        payload_length: int,
    ) -> CloseReason | RsvBits:
        # Control frames may come between a message's fragments: they must not touch its
        # state (wsproto's own class resets it on a ping).
        self._control = opcode.iscontrol()
        if self._control:
            return CloseReason.PROTOCOL_ERROR if rsv.rsv1 else RsvBits(False, False, False)
        return super().frame_inbound_header(proto, opcode, rsv, payload_length)

    def _inflate(self, data: bytes) -> bytes | CloseReason:
        assert self._decompressor is not None
        try:
            out = self._decompressor.decompress(data, self._max - self._inflated + 1)
        except zlib.error:
            return CloseReason.INVALID_FRAME_PAYLOAD_DATA
        self._inflated += len(out)
        if self._inflated > self._max:
            self._decompressor = None
            return CloseReason.MESSAGE_TOO_BIG
        return out

    def frame_inbound_payload_data(
        self, proto: FrameDecoder | FrameProtocol, data: bytes
    ) -> bytes | CloseReason:
        if self._control or not self._inbound_compressed:
            return data
        return self._inflate(bytes(data))

    def frame_inbound_complete(
        self, proto: FrameDecoder | FrameProtocol, fin: bool
    ) -> bytes | CloseReason | None:
        if self._control or not fin:
            return None
        compressed = self._inbound_compressed
        self._inbound_compressed = None
        if not compressed:
            return None
        out = self._inflate(_SYNC_TAIL)
        self._decompressor = None  # client_no_context_takeover: a fresh one per message
        self._inflated = 0
        return out

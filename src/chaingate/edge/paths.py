"""The one path the edge authorises, routes and logs: request targets normalised once.

A request path is percent-decoded exactly once, here, and everything after — the scope check,
the route, the REST app, the access log — sees that same decoded path.  Deciding on the raw
path and handing a decoded one onwards is how ``/v1/%67as/...`` slipped past a scope check.

Refused (400) rather than repaired, because a repair is a second interpretation: a malformed
``%`` escape; an encoded ``/`` or ``\\`` (it would create or hide a path segment); an encoded
control character or NUL; bytes that are not UTF-8 once decoded; ``.`` and ``..`` segments,
encoded or not (clients resolve them before sending); and empty segments (``//``), which
would otherwise be merged — or redirected — behind our back.  A trailing ``/`` is left as it
is: it names no route and answers 404.
``loggable_path`` (what the access log shows of a path) lives with the rest of the key-shaped
rule in ``chaingate.redaction``.
"""

from __future__ import annotations

_HEX = b"0123456789abcdefABCDEF"
# Separators and control characters may not be smuggled in through an escape.
_FORBIDDEN_DECODED = frozenset(b"/\\\x7f" + bytes(range(0x20)))


class PathError(ValueError):
    """Why a request path is refused; the message is the client's 400."""


def normalize_path(raw: bytes) -> bytes:
    """The decoded path of a request target's path part, or PathError."""
    if b"%" not in raw and b"/." not in raw and b"//" not in raw:
        return raw  # the common case: nothing to decode, nothing to check
    path = _percent_decode(raw) if b"%" in raw else raw
    segments = path.split(b"/")
    # segments[0] is the empty text before the leading "/"; the last may be empty (a
    # trailing slash); any other empty segment is a "//".
    for index, segment in enumerate(segments[1:], 1):
        if segment in (b".", b".."):
            raise PathError("the path may not contain '.' or '..' segments")
        if not segment and index != len(segments) - 1:
            raise PathError("the path may not contain empty segments ('//')")
    return path


def _percent_decode(raw: bytes) -> bytes:
    out = bytearray()
    at = 0
    while True:
        escape = raw.find(b"%", at)
        if escape < 0:
            out += raw[at:]
            break
        out += raw[at:escape]
        digits = raw[escape + 1 : escape + 3]
        if len(digits) != 2 or digits[0] not in _HEX or digits[1] not in _HEX:
            raise PathError("malformed percent-encoding in the path")
        byte = int(digits, 16)
        if byte in _FORBIDDEN_DECODED:
            raise PathError(f"the path may not contain an encoded %{byte:02X}")
        out.append(byte)
        at = escape + 3
    decoded = bytes(out)
    try:
        decoded.decode("utf-8")
    except UnicodeDecodeError:
        raise PathError("the decoded path is not UTF-8") from None
    return decoded

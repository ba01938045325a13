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
"""

from __future__ import annotations

import re

_HEX = b"0123456789abcdefABCDEF"
# Separators and control characters may not be smuggled in through an escape.
_FORBIDDEN_DECODED = frozenset(b"/\\\x7f" + bytes(range(0x20)))


def _key_shaped(before: str, after: str) -> str:
    """Key-shaped text: our API keys and webhook secrets, and any long token-like run with
    digits among its letters (another provider's key pasted into a URL: 32 random characters
    hold digits) — but not names made of letters and ``_``/``-`` (a field or a method,
    snake_case or camelCase: what a client reads to fix its request), hex hashes and addresses
    (0x...) or decimal token ids, which are what a path is for.  ``before`` and ``after``
    bound a run: path separators in a path, any character a token does not hold in a
    message."""
    return (
        r"svc_(?:live|test)_[A-Za-z0-9]*"
        r"|whsec_[A-Za-z0-9+/=_-]*"
        rf"|{before}(?!0x)(?![0-9]+{after})(?=[A-Za-z_-]*[0-9])[A-Za-z0-9_-]{{32,}}{after}"
    )


# Redacted in the access log (``loggable_path``) ...
_KEY_SHAPED = re.compile(_key_shaped(r"(?<=/)", r"(?=/|$)").encode())
# ... and in what an answer says (``redact_key_shaped``).
_KEY_SHAPED_TEXT = re.compile(_key_shaped(r"(?<![A-Za-z0-9_-])", r"(?![A-Za-z0-9_-])"))
REDACTED = b"[redacted]"


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


def redact_key_shaped(text: str) -> str:
    """``text`` with key-shaped runs replaced by ``[redacted]``: what an error message may
    echo of a client's input (a key pasted into a path must not come back in the answer, nor
    go on to whatever logs or shows it)."""
    if "svc_" not in text and "whsec_" not in text and len(text) < 32:
        return text
    return _KEY_SHAPED_TEXT.sub(REDACTED.decode(), text)


def loggable_path(path: bytes, limit: int = 256) -> str:
    """``path`` for the access log: key-shaped text redacted, length bounded."""
    if b"svc_" in path or b"whsec_" in path or len(path) >= 40:
        path = _KEY_SHAPED.sub(REDACTED, path)
    return path[:limit].decode("latin-1")

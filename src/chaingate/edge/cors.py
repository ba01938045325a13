"""CORS: what lets a browser page call the API, and what its answers say to the browser.

A browser asks first (``OPTIONS`` preflight, no API key: browsers never send credentials on a
preflight) and then sends the request with the key.  The preflight cannot know the key, so it
allows any well-formed origin; the real request is where the key's origin allowlist is
enforced (``chaingate.auth.allowlists``): an origin the key does not allow is refused 403 and
that answer carries no CORS headers, so the page reads nothing.  A key with no origin list may
be used from any origin (as Alchemy and Infura do).

Answers to a request carrying ``Origin`` echo it in ``Access-Control-Allow-Origin`` (never
``*`` with a list in force, and never an origin that is not well formed), say
``Vary: Origin``, and expose the headers a client needs to back off (``X-RateLimit-*``,
``Retry-After``) and to report (``X-Request-Id``).  Requests without ``Origin`` (servers,
curl) get none of this.  No credentials mode: keys travel in headers, never in cookies.
"""

from __future__ import annotations

import re

from chaingate.framing_constants import NOSNIFF

# What browsers put in Origin: scheme://host[:port], or "null" for an opaque origin (a page
# opened from a file, a sandboxed frame).  Anything else is not echoed.
_ORIGIN = re.compile(
    rb"(?:https?://(?:[A-Za-z0-9.-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\])(?::[0-9]{1,5})?)|null"
)

RPC_METHODS = b"POST, OPTIONS"
REST_METHODS = b"GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"
# The request headers a page may send: JSON bodies, the spec's two ways to pass the key, its
# own request id, a compressed body.
ALLOW_HEADERS = b"Content-Type, X-API-Key, Authorization, X-Request-Id, Content-Encoding"
EXPOSE_HEADERS = (
    b"X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset, Retry-After, X-Request-Id, "
    b"X-Cache"
)
# A preflight says nosniff too (framing_constants.NOSNIFF), body or not.
_LINE_END_NOSNIFF = b"\r\n" + NOSNIFF
# Chromium caps a preflight's cache at 2 hours (Firefox at 24): ask for the most that counts.
MAX_AGE = 7200

_ANSWER_TAIL = b"\r\nVary: Origin\r\nAccess-Control-Expose-Headers: " + EXPOSE_HEADERS + b"\r\n"
_PREFLIGHT_TAIL = (
    b"\r\nAccess-Control-Allow-Headers: "
    + ALLOW_HEADERS
    + b"\r\nAccess-Control-Max-Age: %d\r\n" % MAX_AGE
)


def well_formed(origin: bytes) -> bool:
    return len(origin) <= 300 and _ORIGIN.fullmatch(origin) is not None


def answer_headers(origin: bytes | None) -> bytes:
    """Header lines for an answer to a request from ``origin`` (b"" without one)."""
    if origin is None or not well_formed(origin):
        return b""
    return b"Access-Control-Allow-Origin: " + origin + _ANSWER_TAIL


def preflight(origin: bytes | None, methods: bytes) -> tuple[int, bytes, bytes]:
    """The answer to an ``OPTIONS`` request: 204, with what a preflight from a well-formed
    origin asks (a plain OPTIONS just learns the methods).  The origin itself is granted
    the way every answer to a browser is, by ``answer_headers``, which the edge adds."""
    allow = b"Allow: " + methods + _LINE_END_NOSNIFF
    if origin is None or not well_formed(origin):
        return 204, allow, b""
    return 204, allow + b"Access-Control-Allow-Methods: " + methods + _PREFLIGHT_TAIL, b""

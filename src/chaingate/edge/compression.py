"""HTTP content codings at the edge, sans-IO: which coding an answer gets, coding it, and
undoing a request body's ``Content-Encoding`` under a cap.

Answers: zstd or gzip (level 1 of each: measured, docs/decisions/rpc.md "Compression") when the
client's ``Accept-Encoding`` allows it (q-values, ``*``, ``identity;q=0``; RFC 9110 12.5.3)
and the answer is at least ``min_bytes`` of a textual type.  Smaller answers fit one TCP
segment anyway: coding them costs CPU on both sides and saves no packet — unless the client
refused ``identity``, which is honoured.  Every answer that could have been coded carries
``Vary: Accept-Encoding`` (as nginx's ``gzip_vary`` does), coded or not.

Request bodies: ``gzip`` (and ``identity``) are undone; the inflated size is capped by the
body limit and inflation stops one byte past it, so a zip bomb costs at most the cap (413).
Any other coding is 415 with ``Accept-Encoding: gzip``.
"""

from __future__ import annotations

import re
import zlib

import zstandard

from chaingate.twintypes.http1 import Request

GZIP = b"gzip"
ZSTD = b"zstd"
# Level 1 of each (measured on a 267 KB eth_getBlockByNumber(..., true) answer: gzip level 6
# is 2.6x slower than level 1 for 10% fewer bytes; zstd level 1 is 4x faster than gzip
# level 1 and 25% smaller).
GZIP_LEVEL = 1
ZSTD_LEVEL = 1
# Answers at least this large are coded in a worker thread (zlib and zstd release the GIL):
# gzip codes ~190 KB per millisecond of event loop, and a thread costs ~0.12 ms.
THREAD_BYTES = 128 << 10

# Codings we produce, best first: on equal q-values the client gets the first.
_OURS: tuple[bytes, ...] = (ZSTD, GZIP)
_ALIASES = {b"x-gzip": GZIP}
_TEXTUAL = re.compile(
    rb"(?:text/[^;]*|application/(?:json|[^;/]*\+json|javascript|xml|[^;/]*\+xml)"
    rb"|image/svg\+xml)\Z"
)
_CONTENT_TYPE = re.compile(rb"(?im)^content-type:[ \t]*([^;\r\n]*)")
_HAS_CODING = re.compile(rb"(?im)^content-encoding:")
_QVALUE = re.compile(rb"(?:0(?:\.[0-9]{0,3})?|1(?:\.0{0,3})?)\Z")
VARY = b"Vary: Accept-Encoding\r\n"
_CODED_HEADERS = {coding: b"Content-Encoding: " + coding + b"\r\n" + VARY for coding in _OURS}
# Accept-Encoding values seen, parsed (clients send a handful of distinct ones); bounded.
_CACHE_MAX = 256


class Preferences:
    """One ``Accept-Encoding`` value: each of our codings' q-value, and identity's."""

    __slots__ = ("best", "best_q", "identity_q")

    def __init__(self, best: bytes | None, best_q: float, identity_q: float) -> None:
        self.best = best  # our coding the client likes most (q > 0), or None
        self.best_q = best_q
        self.identity_q = identity_q


def parse_accept_encoding(value: bytes) -> Preferences:
    """RFC 9110 12.5.3: ``coding[;q=x]`` elements; ``*`` stands for every coding not named;
    identity is acceptable unless ``identity;q=0``, or ``*;q=0`` without identity named.
    An element with a malformed q-value is ignored."""
    named: dict[bytes, float] = {}
    for element in value.split(b","):
        parts = element.split(b";")
        coding = parts[0].strip(b" \t").lower()
        if not coding:
            continue
        q = 1.0
        for param in parts[1:]:
            name, _, raw = param.strip(b" \t").partition(b"=")
            if name.lower() == b"q":
                if not _QVALUE.match(raw):
                    q = -1.0
                    break
                q = float(raw)
        if q < 0:
            continue
        coding = _ALIASES.get(coding, coding)
        named.setdefault(coding, q)
    star = named.get(b"*")
    best: bytes | None = None
    best_q = 0.0
    for coding in _OURS:
        q = named.get(coding, star if star is not None else 0.0)
        if q > best_q:
            best, best_q = coding, q
    identity_q = named.get(b"identity", star if star is not None else 1.0)
    return Preferences(best, best_q, identity_q)


_cache: dict[bytes, Preferences] = {}


def preferences(value: bytes) -> Preferences:
    found = _cache.get(value)
    if found is None:
        if len(_cache) >= _CACHE_MAX:
            _cache.clear()
        found = _cache[value] = parse_accept_encoding(value)
    return found


def textual(headers: bytes) -> bool:
    """Whether the answer's Content-Type is one that compresses (JSON, text, XML, SVG)."""
    match = _CONTENT_TYPE.search(headers)
    return match is not None and _TEXTUAL.match(match.group(1).strip().lower()) is not None


def plan(
    accept: bytes, status: int, headers: bytes, size: int, min_bytes: int
) -> tuple[bytes | None, bool]:
    """(coding or None, whether the answer needs ``Vary: Accept-Encoding``)."""
    if size == 0 or status < 200 or status in (204, 304) or min_bytes <= 0:
        return None, False
    prefs = preferences(accept)
    big = size >= min_bytes
    if not big and prefs.identity_q > 0:
        return None, False
    if _HAS_CODING.search(headers) or not textual(headers):
        return None, False
    if prefs.best is None or prefs.identity_q > prefs.best_q:
        # Nothing of ours is acceptable (identity is sent even when refused: an answer the
        # client may not like beats none), or the client prefers identity.
        return None, big
    return prefs.best, True


def encode(coding: bytes, body: bytes) -> bytes:
    if coding == ZSTD:
        # A compressor per call: one object must not be used by two threads at once.
        return zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(body)
    return zlib.compress(body, GZIP_LEVEL, wbits=31)


def coded_headers(coding: bytes) -> bytes:
    return _CODED_HEADERS[coding]


# --- request bodies ---------------------------------------------------------------------


class BodyError(Exception):
    """A request body that cannot be decoded: status (400, 413, 415) and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


ACCEPTED_REQUEST_CODINGS = b"Accept-Encoding: gzip\r\n"


def decode_body(content_encoding: bytes, body: bytes, cap: int) -> bytes:
    """``body`` with its content coding undone, at most ``cap`` bytes; BodyError otherwise.

    Inflation asks zlib for at most ``cap + 1`` bytes: a body that would inflate past the cap
    is refused having produced no more than that (a 10 KB bomb of 10 MB costs ``cap``)."""
    codings = [c.strip(b" \t").lower() for c in content_encoding.split(b",")]
    codings = [c for c in codings if c and c != b"identity"]
    if not codings:
        return body
    if len(codings) > 1 or _ALIASES.get(codings[0], codings[0]) != GZIP:
        raise BodyError(
            415, "unsupported Content-Encoding: request bodies may be gzip (or identity)"
        )
    if not body:
        return body
    inflater = zlib.decompressobj(wbits=31)
    try:
        out = inflater.decompress(body, cap + 1)
    except zlib.error:
        raise BodyError(400, "request body is not valid gzip") from None
    if len(out) > cap:
        raise BodyError(413, f"request body too large once inflated (limit {cap} bytes)")
    if not inflater.eof:
        raise BodyError(400, "gzip request body is truncated")
    if inflater.unused_data:
        raise BodyError(400, "data after the end of the gzip request body")
    return out


def replace_body(request: Request, body: bytes) -> None:
    """Hand the inflated body on as if it had come so: the coding and the length that
    described the bytes on the wire go (the REST app sees these headers)."""
    request.body = body
    request.content_encoding = None
    headers = [
        (name, value)
        for name, value in request.headers
        if name not in (b"content-encoding", b"content-length")
    ]
    headers.append((b"content-length", b"%d" % len(body)))
    request.headers = headers

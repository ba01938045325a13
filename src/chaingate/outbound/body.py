"""A response body collected under a byte cap, inflated if the server compressed it anyway.

Sans-IO: ``feed`` the bytes as they arrive, ``finish`` at the end of the message.  The cap
applies to what the caller gets (inflated bytes) and to what crosses the wire, so neither a
large body nor a small compressed bomb gets past ``max_bytes``: inflation is asked for at most
one byte more than the room left.
"""

from __future__ import annotations

import zlib

from chaingate.outbound.errors import FetchError, Reason

# Content-Encoding values we undo; we ask for identity, but some servers compress regardless.
GZIP_ENCODINGS = frozenset({"gzip", "x-gzip"})


def content_encoding(value: str | None) -> str | None:
    """None for an identity body, "gzip" for gzip; FetchError for anything else."""
    if value is None:
        return None
    coding = value.strip().lower()
    if coding in ("", "identity"):
        return None
    if coding in GZIP_ENCODINGS:
        return "gzip"
    raise FetchError(Reason.HTTP_ERROR, "response uses a content encoding we did not ask for")


class BodyReader:
    def __init__(self, max_bytes: int, encoding: str | None) -> None:
        self._max = max_bytes
        self._wire = 0
        self._parts: list[bytes] = []
        self._size = 0
        self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS) if encoding == "gzip" else None

    def feed(self, data: bytes) -> None:
        self._wire += len(data)
        if self._wire > self._max:
            raise self._too_large()
        if self._inflate is None:
            self._keep(data)
            return
        try:
            # At most one byte more than the room left: enough to know it does not fit.
            out = self._inflate.decompress(data, self._max - self._size + 1)
        except zlib.error:
            raise FetchError(Reason.HTTP_ERROR, "response body is not valid gzip") from None
        # Input left unconsumed means the output hit that bound, so _keep raises.
        self._keep(out)

    def finish(self) -> bytes:
        if self._inflate is not None:
            try:
                self._keep(self._inflate.flush())
            except zlib.error:
                raise FetchError(Reason.HTTP_ERROR, "response body is not valid gzip") from None
            if not self._inflate.eof:
                raise FetchError(Reason.HTTP_ERROR, "gzip response body is truncated")
        return b"".join(self._parts)

    def _keep(self, data: bytes) -> None:
        self._size += len(data)
        if self._size > self._max:
            raise self._too_large()
        if data:
            self._parts.append(data)

    def _too_large(self) -> FetchError:
        return FetchError(Reason.TOO_LARGE, f"response body larger than {self._max} bytes")

"""HTTP/1.1 framing, sans-IO: the pure-Python twin of ``native/http1.pyx``.

Three jobs, no I/O:

* ``RequestParser`` turns the bytes a client sends into ``Request`` objects (keep-alive and
  pipelining: many requests per connection, handed out in order) or one ``HttpError``, after
  which the connection must be closed.
* ``ResponseParser`` does the same for the responses of an upstream node.
* ``build_response`` / ``build_request`` assemble outgoing messages.

The parser is deliberately strict where leniency is dangerous (request smuggling: both
Content-Length and Transfer-Encoding, differing Content-Lengths, obs-fold, whitespace before the
colon, bare CR/LF) and bounded everywhere (request line 414, header section 431, body 413).

This module is the specification of behaviour: the compiled twin must return equal results for
every input, which ``tests/test_framing_properties.py`` checks with hypothesis.
"""

from __future__ import annotations

import io
import re

from chaingate.framing_constants import (
    CHUNK_LINE_MAX,
    EXPECT_OTHER,
    PARTIAL_BODY_MIN,
    PREALLOCATE_MIN,
    REASONS,
    TOKEN_CHARS,
)

__all__ = [
    "IMPLEMENTATION",
    "HttpError",
    "Request",
    "RequestParser",
    "Response",
    "ResponseParser",
    "build_request",
    "build_response",
    "build_response_head",
]

IMPLEMENTATION = "pure"

_VERSION_RE = re.compile(rb"HTTP/[0-9]\.[0-9]\Z")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_DIGITS = frozenset(b"0123456789")
_TOKEN = frozenset(TOKEN_CHARS)
# Field-value bytes: HTAB, visible ASCII, SP, obs-text.  Everything else (NUL, CR, LF, DEL...)
# is refused.
_VALUE_OK = frozenset([9, *range(0x20, 0x7F), *range(0x80, 0x100)])
_TARGET_OK = frozenset(range(0x21, 0x7F))

# Headers the parsers hand out by name; when one repeats, its first value counts.
_FIRST_VALUE_WINS = {
    b"content-type": "content_type",
    b"x-request-id": "request_id",
    b"upgrade": "upgrade",
    b"retry-after": "retry_after",
    b"origin": "origin",
}
# List-valued headers the parsers hand out by name; repeats combine as one comma-separated
# list (RFC 9110 5.3), so ``Accept-Encoding: gzip`` + ``Accept-Encoding: br`` is ``gzip, br``.
_LIST_VALUED = {
    b"accept-encoding": "accept_encoding",
    b"content-encoding": "content_encoding",
}

# Parser states.
_HEAD = 0
_BODY_LENGTH = 1
_CHUNK_SIZE = 2
_CHUNK_DATA = 3
_CHUNK_TRAILER = 4
_BODY_UNTIL_EOF = 5


class HttpError:
    """A framing failure: the peer gets ``status`` (server side) and the connection closes."""

    __slots__ = ("message", "status")

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message

    def __repr__(self) -> str:
        return f"HttpError({self.status}, {self.message!r})"


class Request:
    """One complete client request.  Header names are lower-cased; values are OWS-stripped."""

    __slots__ = (
        "accept_encoding",
        "api_key",
        "authorization",
        "body",
        "content_encoding",
        "content_type",
        "expect_continue",
        "headers",
        "host",
        "keep_alive",
        "method",
        "origin",
        "path",
        "query",
        "request_id",
        "target",
        "upgrade",
        "version",
    )

    method: bytes
    target: bytes
    path: bytes
    query: bytes
    version: int
    keep_alive: bool
    body: bytes
    headers: list[tuple[bytes, bytes]]
    host: bytes | None
    content_type: bytes | None
    api_key: bytes | None
    authorization: bytes | None
    request_id: bytes | None
    upgrade: bytes | None
    origin: bytes | None
    accept_encoding: bytes | None
    content_encoding: bytes | None
    expect_continue: bool


class Response:
    """One complete upstream response."""

    __slots__ = ("body", "content_type", "keep_alive", "retry_after", "status")

    status: int
    body: bytes
    keep_alive: bool
    content_type: bytes | None
    retry_after: bytes | None


class _Head:
    """What both parsers learn from a header section."""

    __slots__ = (
        "accept_encoding",
        "api_key",
        "authorization",
        "chunked",
        "close",
        "content_encoding",
        "content_length",
        "content_type",
        "expect",
        "headers",
        "host",
        "host_count",
        "keep_alive_token",
        "origin",
        "request_id",
        "retry_after",
        "transfer_encoding",
        "upgrade",
    )

    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.content_length = -1
        self.transfer_encoding: bytes | None = None
        self.chunked = False
        self.close = False
        self.keep_alive_token = False
        self.host: bytes | None = None
        self.host_count = 0
        self.expect = 0  # 0 none, 1 100-continue, EXPECT_OTHER anything else
        self.content_type: bytes | None = None
        self.api_key: bytes | None = None
        self.authorization: bytes | None = None
        self.request_id: bytes | None = None
        self.upgrade: bytes | None = None
        self.retry_after: bytes | None = None
        self.origin: bytes | None = None
        self.accept_encoding: bytes | None = None
        self.content_encoding: bytes | None = None


def _field_line(line: bytes) -> tuple[bytes, bytes] | str:
    """Split and validate one ``name: value`` line; a str return is the error message."""
    if not line or line[0] in (32, 9):
        return "obsolete line folding is not accepted"
    colon = line.find(b":")
    if colon <= 0:
        return "header line without a name and colon"
    name = line[:colon]
    for c in name:
        if c not in _TOKEN:
            return "invalid character in header name"
    value = line[colon + 1 :].strip(b" \t")
    for c in value:
        if c not in _VALUE_OK:
            return "invalid character in header value"
    return name.lower(), value


def _parse_fields(block: bytes, max_headers: int) -> _Head | HttpError:
    """Parse the field lines of ``block`` (each terminated by CRLF, blank line excluded)."""
    head = _Head()
    te_parts: list[bytes] = []
    start = 0
    end = len(block)
    count = 0
    while start < end:
        nl = block.find(b"\r\n", start)
        line = block[start:nl]
        start = nl + 2
        if b"\r" in line or b"\n" in line:
            return HttpError(400, "bare CR or LF in header section")
        parsed = _field_line(line)
        if isinstance(parsed, str):
            return HttpError(400, parsed)
        count += 1
        if count > max_headers:
            return HttpError(431, f"more than {max_headers} header fields")
        name, value = parsed
        head.headers.append((name, value))
        if name == b"content-length":
            if not value or len(value) > 18 or any(c not in _DIGITS for c in value):
                return HttpError(400, "invalid Content-Length")
            n = int(value)
            if head.content_length >= 0 and head.content_length != n:
                return HttpError(400, "conflicting Content-Length headers")
            head.content_length = n
        elif name == b"transfer-encoding":
            te_parts.append(value.lower())
        elif name == b"connection":
            for token in value.lower().split(b","):
                token = token.strip(b" \t")
                if token == b"close":
                    head.close = True
                elif token == b"keep-alive":
                    head.keep_alive_token = True
        elif name == b"host":
            head.host_count += 1
            head.host = value
        elif name == b"expect":
            head.expect = 1 if value.lower() == b"100-continue" else EXPECT_OTHER
        elif name == b"x-api-key":
            # Credentials are never ambiguous: which of two keys would be the caller's?
            if head.api_key is not None:
                return HttpError(400, "more than one X-API-Key header")
            head.api_key = value
        elif name == b"authorization":
            if head.authorization is not None:
                return HttpError(400, "more than one Authorization header")
            head.authorization = value
        elif name in _FIRST_VALUE_WINS:
            attribute = _FIRST_VALUE_WINS[name]
            if getattr(head, attribute) is None:
                setattr(head, attribute, value)
        elif name in _LIST_VALUED:
            attribute = _LIST_VALUED[name]
            previous = getattr(head, attribute)
            setattr(head, attribute, value if previous is None else previous + b", " + value)
    if te_parts:
        head.transfer_encoding = b", ".join(te_parts)
        head.chunked = head.transfer_encoding == b"chunked"
    return head


def _check_trailer_line(line: bytes) -> HttpError | None:
    if b"\r" in line or b"\n" in line:
        return HttpError(400, "bare CR or LF in trailer section")
    parsed = _field_line(line)
    if isinstance(parsed, str):
        return HttpError(400, parsed)
    return None


class _BodyReader:
    """Body framing shared by both parsers: Content-Length, chunked, or until EOF."""

    __slots__ = (
        "buf",
        "chunk_left",
        "direct",
        "discard",
        "filled",
        "max_body",
        "max_header_bytes",
        "parts",
        "pos",
        "received",
        "remaining",
        "state",
        "trailer_bytes",
        "whole",
    )

    def __init__(self, max_body: int, max_header_bytes: int) -> None:
        self.buf = b""
        self.pos = 0
        self.state = _HEAD
        self.max_body = max_body
        self.max_header_bytes = max_header_bytes
        self.parts: list[bytes] = []
        self.discard = False  # the body is counted and dropped, not kept (ResponseParser)
        self.direct = False  # a declared length: the bytes go straight into ``whole``
        self.whole: io.BytesIO | None = None  # the body as it comes (``preallocate``)
        self.received = 0
        self.remaining = 0
        self.chunk_left = 0
        self.trailer_bytes = 0

    def append(self, data: bytes) -> None:
        if self.pos >= len(self.buf):
            self.buf = data
            self.pos = 0
        elif self.pos:
            self.buf = self.buf[self.pos :] + data
            self.pos = 0
        elif self.buf:
            self.buf += data
        else:
            self.buf = data

    def start_body(self, chunked: bool, length: int, until_eof: bool) -> None:
        self.parts = []
        self.discard = False
        self.direct = False
        self.whole = None
        self.received = 0
        if chunked:
            self.state = _CHUNK_SIZE
        elif until_eof:
            self.state = _BODY_UNTIL_EOF
        else:
            self.state = _BODY_LENGTH
            self.remaining = length

    def preallocate(self) -> None:
        """The declared body goes into one buffer as it comes, which becomes the body: a big
        body is never held twice (its pieces and their join, or a buffer and its copy), and
        its pages are touched only as its bytes arrive.  The compiled twin allocates the
        body's bytes uninitialised, whole; this one writes to an ``io.BytesIO``, which grows
        by realloc (nothing zero-filled ahead of the bytes) and whose ``getvalue`` hands its
        buffer over without a copy."""
        self.direct = True
        self.whole = io.BytesIO()

    def _step_direct(self, buf: bytes) -> bytes | None:
        """A declared body going into its preallocated buffer."""
        take = min(len(buf) - self.pos, self.remaining)
        if self.whole is not None:
            self.whole.write(memoryview(buf)[self.pos : self.pos + take])
        self.pos += take
        self.remaining -= take
        if self.remaining:
            return None
        self.state = _HEAD
        self.direct = False
        whole, self.whole = self.whole, None
        return b"" if whole is None else whole.getvalue()

    def _step_length(self, buf: bytes) -> bytes | None:
        """A declared body gathered in pieces (or discarded)."""
        available = len(buf) - self.pos
        if available < self.remaining:
            if available >= PARTIAL_BODY_MIN:
                # Set a big body's bytes aside as they come: appending every read to one
                # bytes object would copy the body over and over (quadratic).
                if not self.discard:
                    self.parts.append(buf[self.pos :])
                self.remaining -= available
                self.pos = len(buf)
            return None
        body = b"" if self.discard else buf[self.pos : self.pos + self.remaining]
        self.pos += self.remaining
        self.state = _HEAD
        if self.parts:
            self.parts.append(body)
            body = b"".join(self.parts)
            self.parts = []
        return body

    def step(self, too_large: str) -> bytes | HttpError | None:
        """Advance the body; return the whole body once complete, None when more is needed."""
        buf = self.buf
        while True:
            state = self.state
            if state == _BODY_LENGTH:
                return self._step_direct(buf) if self.direct else self._step_length(buf)
            if state == _BODY_UNTIL_EOF:
                available = len(buf) - self.pos
                if self.received + available > self.max_body:
                    return HttpError(413, too_large)
                if available:
                    if not self.discard:
                        self.parts.append(buf[self.pos :])
                    self.received += available
                    self.pos = len(buf)
                return None
            if state == _CHUNK_SIZE:
                nl = buf.find(b"\r\n", self.pos)
                if nl < 0:
                    if len(buf) - self.pos > CHUNK_LINE_MAX:
                        return HttpError(400, "chunk size line too long")
                    return None
                if nl - self.pos > CHUNK_LINE_MAX:
                    return HttpError(400, "chunk size line too long")
                line = buf[self.pos : nl]
                semi = line.find(b";")
                size_part = line if semi < 0 else line[:semi]
                size_part = size_part.rstrip(b" \t")
                if not size_part or len(size_part) > 16 or any(c not in _HEX for c in size_part):
                    return HttpError(400, "invalid chunk size")
                for c in line:
                    if (c < 0x20 and c != 9) or c == 0x7F:
                        return HttpError(400, "invalid character in chunk extension")
                size = int(size_part, 16)
                if self.received + size > self.max_body:
                    return HttpError(413, too_large)
                self.pos = nl + 2
                if size == 0:
                    self.state = _CHUNK_TRAILER
                    self.trailer_bytes = 0
                else:
                    self.chunk_left = size
                    self.state = _CHUNK_DATA
            elif state == _CHUNK_DATA:
                need = self.chunk_left
                if len(buf) - self.pos < need + 2:
                    return None
                if buf[self.pos + need : self.pos + need + 2] != b"\r\n":
                    return HttpError(400, "chunk data not followed by CRLF")
                if not self.discard:
                    self.parts.append(buf[self.pos : self.pos + need])
                self.received += need
                self.pos += need + 2
                self.state = _CHUNK_SIZE
            else:  # _CHUNK_TRAILER
                nl = buf.find(b"\r\n", self.pos)
                if nl < 0:
                    if self.trailer_bytes + len(buf) - self.pos > self.max_header_bytes:
                        return HttpError(431, "trailer section too large")
                    return None
                self.trailer_bytes += nl + 2 - self.pos
                if self.trailer_bytes > self.max_header_bytes:
                    return HttpError(431, "trailer section too large")
                line = buf[self.pos : nl]
                self.pos = nl + 2
                if not line:
                    self.state = _HEAD
                    body = b"".join(self.parts)
                    self.parts = []
                    return body
                error = _check_trailer_line(line)
                if error is not None:
                    return error

    def finish_until_eof(self) -> bytes:
        body = b"".join(self.parts)
        self.parts = []
        self.state = _HEAD
        return body


def _blank_line(buf: bytes, start: int, end: int) -> int:
    """Index of the LF that starts the first empty line (LF LF or LF CR LF) at or after
    ``start``, or -1."""
    lf_lf = buf.find(b"\n\n", start, end)
    lf_crlf = buf.find(b"\n\r\n", start, end)
    if lf_lf < 0:
        return lf_crlf
    if lf_crlf < 0:
        return lf_lf
    return min(lf_lf, lf_crlf)


_BARE_LF = "bare CR or LF in the message head"


def _find_head(
    reader: _BodyReader, max_line: int, max_header_bytes: int, line_error: int, scan_from: int
) -> tuple[int, int] | HttpError | int:
    """Locate the start line and the empty line ending the header section.

    Returns ``(line_end, head_end)`` when complete, an ``HttpError`` when a bound is exceeded,
    or an int: where the next search for the end may start, relative to ``reader.pos`` (the
    buffer is compacted between feeds, so absolute offsets would go stale).

    Lines are found by their LF, so a head whose lines end in a bare LF is recognised when
    its empty line arrives — and refused then (400), at once: waiting for a CRLF that never
    comes would cost the client the read timeout and a 408.  Everything is decided on the
    complete head, so the answer does not depend on how the bytes were split into reads.
    """
    buf = reader.buf
    pos = reader.pos
    end = len(buf)
    first_lf = buf.find(b"\n", pos)
    if first_lf < 0:
        if end - pos > max_line + 1:
            return HttpError(line_error, "start line too long")
        return scan_from
    line_end = first_lf - 1 if first_lf > pos and buf[first_lf - 1] == 13 else first_lf
    if line_end - pos > max_line:
        return HttpError(line_error, "start line too long")
    blank = _blank_line(buf, max(first_lf, pos + scan_from), end)
    if blank < 0:
        if end - (line_end + 2) > max_header_bytes:
            return HttpError(431, "header section too large")
        # An empty line starting at end - 2 or later may still be completing.
        return max(first_lf, end - 2) - pos
    head_end = blank + 2 if buf[blank + 1] == 10 else blank + 3
    if head_end - (line_end + 2) > max_header_bytes:
        return HttpError(431, "header section too large")
    if buf.count(b"\n", pos, head_end) != buf.count(b"\r\n", pos, head_end):
        return HttpError(400, _BARE_LF)
    return line_end, head_end


class RequestParser:
    """Incremental parser for the requests of one client connection."""

    def __init__(
        self,
        max_line: int = 8192,
        max_header_bytes: int = 16384,
        max_headers: int = 100,
        max_body: int = 1 << 20,
    ) -> None:
        self._reader = _BodyReader(max_body, max_header_bytes)
        self._max_line = max_line
        self._max_header_bytes = max_header_bytes
        self._max_headers = max_headers
        self._max_body = max_body
        self._error: HttpError | None = None
        self._pending: Request | None = None
        self._scan_from = 0
        self._eof = False
        self._continue_due = False

    def feed(self, data: bytes) -> None:
        if self._error is None and not self._eof:
            self._reader.append(data)

    def feed_eof(self) -> None:
        self._eof = True

    @property
    def has_partial(self) -> bool:
        """True when bytes of an unfinished request are buffered."""
        reader = self._reader
        return self._pending is not None or len(reader.buf) > reader.pos

    @property
    def closed(self) -> bool:
        """True when no further request can come: EOF seen and nothing buffered, or an error."""
        return self._error is not None or (self._eof and not self.has_partial)

    def take_continue(self) -> bool:
        """True once per request that asked for ``Expect: 100-continue`` and awaits its body."""
        due = self._continue_due
        self._continue_due = False
        return due

    def take_buffered(self) -> bytes:
        """Bytes received after the last complete request, handed over and forgotten (the
        edge calls it when a request upgrades the connection to another protocol)."""
        reader = self._reader
        rest = reader.buf[reader.pos :]
        reader.buf = b""
        reader.pos = 0
        return rest

    def next_event(self) -> Request | HttpError | None:
        """The next complete request, an error (final), or None when more bytes are needed."""
        if self._error is not None:
            return self._error
        event = self._next()
        if isinstance(event, HttpError):
            self._error = event
        elif event is None and self._eof and self.has_partial:
            event = self._error = HttpError(400, "connection closed in the middle of a request")
        return event

    def _next(self) -> Request | HttpError | None:
        reader = self._reader
        if self._pending is None:
            buf = reader.buf
            # RFC 9112 2.2: ignore empty lines before a request line.
            while buf.startswith(b"\r\n", reader.pos):
                reader.pos += 2
            if reader.pos >= len(buf):
                return None
            found = _find_head(reader, self._max_line, self._max_header_bytes, 414, self._scan_from)
            if isinstance(found, HttpError):
                return found
            if isinstance(found, int):
                self._scan_from = found
                return None
            self._scan_from = 0
            line_end, head_end = found
            request = self._start_request(
                buf[reader.pos : line_end], buf[line_end + 2 : head_end - 2]
            )
            reader.pos = head_end
            if isinstance(request, HttpError):
                return request
            self._pending = request
        request = self._pending
        body = reader.step("request body too large")
        if body is None:
            return None
        if isinstance(body, HttpError):
            return body
        self._pending = None
        self._continue_due = False
        request.body = body
        return request

    def _start_request(self, line: bytes, block: bytes) -> Request | HttpError:
        parts = line.split(b" ")
        if len(parts) != 3 or not parts[0] or not parts[1] or not parts[2]:
            return HttpError(400, "malformed request line")
        method, target, version_bytes = parts
        for c in method:
            if c not in _TOKEN:
                return HttpError(400, "invalid request method")
        for c in target:
            if c not in _TARGET_OK:
                return HttpError(400, "invalid request target")
        if target[0] != 0x2F and target != b"*":
            return HttpError(400, "request target must be in origin form")
        if version_bytes == b"HTTP/1.1":
            version = 11
        elif version_bytes == b"HTTP/1.0":
            version = 10
        elif _VERSION_RE.match(version_bytes):
            return HttpError(505, "HTTP version not supported")
        else:
            return HttpError(400, "malformed HTTP version")
        head = _parse_fields(block, self._max_headers)
        if isinstance(head, HttpError):
            return head
        if head.transfer_encoding is not None:
            if head.content_length >= 0:
                return HttpError(400, "both Content-Length and Transfer-Encoding")
            if version == 10:
                return HttpError(400, "Transfer-Encoding in an HTTP/1.0 request")
            if not head.chunked:
                return HttpError(501, "unsupported Transfer-Encoding")
        if head.host_count > 1:
            return HttpError(400, "more than one Host header")
        if version == 11 and head.host_count == 0:
            return HttpError(400, "missing Host header")
        if head.expect == EXPECT_OTHER and version == 11:
            return HttpError(417, "unsupported Expect header")
        if head.content_length > self._max_body:
            return HttpError(413, "request body too large")
        request = Request()
        request.method = method
        request.target = target
        query_at = target.find(b"?")
        if query_at < 0:
            request.path = target
            request.query = b""
        else:
            request.path = target[:query_at]
            request.query = target[query_at + 1 :]
        request.version = version
        if version == 11:
            request.keep_alive = not head.close
        else:
            request.keep_alive = head.keep_alive_token and not head.close
        request.body = b""
        request.headers = head.headers
        request.host = head.host
        request.content_type = head.content_type
        request.api_key = head.api_key
        request.authorization = head.authorization
        request.request_id = head.request_id
        request.upgrade = head.upgrade
        request.origin = head.origin
        request.accept_encoding = head.accept_encoding
        request.content_encoding = head.content_encoding
        request.expect_continue = head.expect == 1 and version == 11
        has_body = head.chunked or head.content_length > 0
        self._reader.start_body(head.chunked, max(head.content_length, 0), False)
        self._continue_due = request.expect_continue and has_body
        return request


class ResponseParser:
    """Incremental parser for the responses on one upstream connection (in request order)."""

    def __init__(
        self,
        max_line: int = 8192,
        max_header_bytes: int = 65536,
        max_headers: int = 200,
        max_body: int = 64 << 20,
    ) -> None:
        self._reader = _BodyReader(max_body, max_header_bytes)
        self._max_line = max_line
        self._max_header_bytes = max_header_bytes
        self._max_headers = max_headers
        self._error: HttpError | None = None
        self._pending: Response | None = None
        self._length = -1  # the Content-Length of the body being read; -1: not declared
        self._scan_from = 0
        self._eof = False

    def feed(self, data: bytes) -> None:
        if self._error is None and not self._eof:
            self._reader.append(data)

    def feed_eof(self) -> None:
        self._eof = True

    def body_length(self) -> int | None:
        """The declared length of the body being read (-1: chunked or until EOF); None when
        no body is being read."""
        return None if self._pending is None else self._length

    def discard_body(self) -> None:
        """Drop the body being read, and the rest of it as it comes: the response completes
        with an empty body (nobody wants it; its bytes are still consumed in order)."""
        reader = self._reader
        reader.discard = True
        reader.parts = []
        reader.whole = None

    @property
    def has_partial(self) -> bool:
        reader = self._reader
        return self._pending is not None or len(reader.buf) > reader.pos

    def next_event(self) -> Response | HttpError | None:
        if self._error is not None:
            return self._error
        event = self._next()
        if isinstance(event, HttpError):
            self._error = event
        elif event is None and self._eof:
            reader = self._reader
            if self._pending is not None and reader.state == _BODY_UNTIL_EOF:
                response = self._pending
                self._pending = None
                response.body = reader.finish_until_eof()
                return response
            if self.has_partial:
                event = self._error = HttpError(
                    502, "connection closed in the middle of a response"
                )
        return event

    def _next(self) -> Response | HttpError | None:
        reader = self._reader
        while self._pending is None:
            buf = reader.buf
            if reader.pos >= len(buf):
                return None
            found = _find_head(reader, self._max_line, self._max_header_bytes, 502, self._scan_from)
            if isinstance(found, HttpError):
                return HttpError(502, found.message)
            if isinstance(found, int):
                self._scan_from = found
                return None
            self._scan_from = 0
            line_end, head_end = found
            response = self._start_response(
                buf[reader.pos : line_end], buf[line_end + 2 : head_end - 2]
            )
            reader.pos = head_end
            if isinstance(response, HttpError):
                return response
            if 100 <= response.status < 200:
                continue  # interim response: the real one follows
            self._pending = response
        response = self._pending
        body = reader.step("response body too large")
        if body is None:
            return None
        if isinstance(body, HttpError):
            return HttpError(502, body.message)
        self._pending = None
        response.body = body
        return response

    def _start_response(self, line: bytes, block: bytes) -> Response | HttpError:
        if len(line) < 12 or line[8] != 0x20:
            return HttpError(502, "malformed status line")
        version_bytes = line[:8]
        if version_bytes == b"HTTP/1.1":
            version = 11
        elif version_bytes == b"HTTP/1.0":
            version = 10
        else:
            return HttpError(502, "unsupported HTTP version in response")
        code = line[9:12]
        if any(c not in _DIGITS for c in code) or (len(line) > 12 and line[12] != 0x20):
            return HttpError(502, "malformed status code")
        status = int(code)
        if status < 100:
            return HttpError(502, "malformed status code")
        head = _parse_fields(block, self._max_headers)
        if isinstance(head, HttpError):
            return HttpError(502, head.message)
        response = Response()
        response.status = status
        response.body = b""
        response.content_type = head.content_type
        response.retry_after = head.retry_after
        if version == 11:
            response.keep_alive = not head.close
        else:
            response.keep_alive = head.keep_alive_token and not head.close
        if 100 <= status < 200 or status in (204, 304):
            self._reader.start_body(False, 0, False)
            return response
        self._length = -1
        if head.transfer_encoding is not None:
            if not head.chunked:
                return HttpError(502, "unsupported Transfer-Encoding in response")
            self._reader.start_body(True, 0, False)
        elif head.content_length >= 0:
            if head.content_length > self._reader.max_body:
                return HttpError(502, "response body too large")
            self._length = head.content_length
            self._reader.start_body(False, head.content_length, False)
            if head.content_length >= PREALLOCATE_MIN:
                self._reader.preallocate()
        else:
            response.keep_alive = False
            self._reader.start_body(False, 0, True)
        return response


def build_response(
    status: int, headers: bytes, body: bytes, keep_alive: bool, http10: bool = False
) -> bytes:
    """Assemble a response.  ``headers`` holds complete ``Name: value\\r\\n`` lines."""
    if not 100 <= status <= 999:
        raise ValueError("status must be a three-digit code")
    reason = REASONS.get(status, b"Unknown")
    if not keep_alive:
        connection = b"Connection: close\r\n"
    elif http10:
        connection = b"Connection: keep-alive\r\n"
    else:
        connection = b""
    if status == 204 or status == 304 or status < 200:
        # RFC 9110: these responses have no content and no Content-Length (a 304's body would
        # be read as the start of the next response).
        return b"HTTP/1.1 %d %s\r\n%s%s\r\n" % (status, reason, connection, headers)
    return b"HTTP/1.1 %d %s\r\nContent-Length: %d\r\n%s%s\r\n%s" % (
        status,
        reason,
        len(body),
        connection,
        headers,
        body,
    )


def build_response_head(
    status: int, headers: bytes, body_length: int, keep_alive: bool, http10: bool = False
) -> bytes:
    """The status line and header section of a response whose body is sent separately (a
    large body is written after it as it is, rather than copied into one message)."""
    if not 200 <= status <= 999 or status in (204, 304):
        raise ValueError("only a response with content has a separate body")
    reason = REASONS.get(status, b"Unknown")
    if not keep_alive:
        connection = b"Connection: close\r\n"
    elif http10:
        connection = b"Connection: keep-alive\r\n"
    else:
        connection = b""
    return b"HTTP/1.1 %d %s\r\nContent-Length: %d\r\n%s%s\r\n" % (
        status,
        reason,
        body_length,
        connection,
        headers,
    )


def build_request(path: bytes, host: bytes, headers: bytes, body: bytes) -> bytes:
    """Assemble a JSON POST to an upstream node (keep-alive, Content-Length framed)."""
    return (
        b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n%s\r\n%s" % (path, host, len(body), headers, body)
    )

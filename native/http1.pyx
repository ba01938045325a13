# cython: language_level=3
"""HTTP/1.1 framing, sans-IO: the compiled twin of ``chaingate/_pure/http1.py``.

The pure module is the specification; this one must give equal results for every input (the
hypothesis tests in ``tests/test_framing_properties.py`` feed both the same bytes).  It differs
only in how it gets there: it walks the buffer with C pointers and builds the header list of a
request lazily, because the RPC hot path never looks at it.
"""

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.string cimport memchr, memcmp, memcpy

from cformat cimport int_width, write_int

from chaingate.framing_constants import CHUNK_LINE_MAX as _CHUNK_LINE_MAX_PY
from chaingate.framing_constants import EXPECT_OTHER as _EXPECT_OTHER_PY
from chaingate.framing_constants import PARTIAL_BODY_MIN as _PARTIAL_BODY_MIN_PY
from chaingate.framing_constants import PREALLOCATE_MIN as _PREALLOCATE_MIN_PY
from chaingate.framing_constants import REASONS as _REASONS
from chaingate.framing_constants import TOKEN_CHARS as _TOKEN_CHARS

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

IMPLEMENTATION = "compiled"

cdef Py_ssize_t CHUNK_LINE_MAX = _CHUNK_LINE_MAX_PY
cdef int EXPECT_OTHER = _EXPECT_OTHER_PY
cdef Py_ssize_t PARTIAL_BODY_MIN = _PARTIAL_BODY_MIN_PY
cdef Py_ssize_t PREALLOCATE_MIN = _PREALLOCATE_MIN_PY

cdef enum:
    S_HEAD = 0
    S_BODY_LENGTH = 1
    S_CHUNK_SIZE = 2
    S_CHUNK_DATA = 3
    S_CHUNK_TRAILER = 4
    S_BODY_UNTIL_EOF = 5

cdef bint TOKEN[256]
cdef bint VALUE_OK[256]
cdef bint TARGET_OK[256]
cdef signed char HEXVAL[256]

cdef void _init_tables():
    cdef int i
    for i in range(256):
        TOKEN[i] = 0
        VALUE_OK[i] = (i == 9) or (0x20 <= i < 0x7F) or (i >= 0x80)
        TARGET_OK[i] = 0x21 <= i < 0x7F
        HEXVAL[i] = -1
    for i in range(len(_TOKEN_CHARS)):
        TOKEN[<unsigned char>_TOKEN_CHARS[i]] = 1
    for i in range(10):
        HEXVAL[48 + i] = i
    for i in range(6):
        HEXVAL[97 + i] = 10 + i
        HEXVAL[65 + i] = 10 + i

_init_tables()

# Reason phrases indexed by status for the response builder.
cdef list _REASON_BY_STATUS = [None] * 600
for _code, _reason in _REASONS.items():
    _REASON_BY_STATUS[_code] = _reason


cdef inline bytes _sub(bytes buf, Py_ssize_t start, Py_ssize_t end):
    """buf[start:end] without building slice objects (the hot path makes many of these)."""
    return PyBytes_FromStringAndSize(PyBytes_AS_STRING(buf) + start, end - start)


cdef inline Py_ssize_t _find_crlf(const unsigned char* p, Py_ssize_t start, Py_ssize_t end):
    """Offset of the first CRLF at or after ``start``, or -1."""
    cdef const unsigned char* hit
    while start < end - 1:
        hit = <const unsigned char*>memchr(p + start, 13, end - 1 - start)
        if hit == NULL:
            return -1
        start = hit - p
        if p[start + 1] == 10:
            return start
        start += 1
    return -1


cdef inline bint _ieq(const unsigned char* p, Py_ssize_t n, const char* lit, Py_ssize_t litn):
    """Case-insensitive compare of p[0:n] with a lower-case ASCII literal."""
    cdef Py_ssize_t i
    cdef unsigned char c
    if n != litn:
        return 0
    for i in range(n):
        c = p[i]
        if 65 <= c <= 90:
            c += 32
        if c != <unsigned char>lit[i]:
            return 0
    return 1


cdef inline bint _has_cr_or_lf(const unsigned char* p, Py_ssize_t start, Py_ssize_t end):
    return memchr(p + start, 13, end - start) != NULL or memchr(p + start, 10, end - start) != NULL


cdef bytes _lower(const unsigned char* p, Py_ssize_t n):
    cdef bytes out = PyBytes_FromStringAndSize(NULL, n)
    cdef unsigned char* q = <unsigned char*>PyBytes_AS_STRING(out)
    cdef Py_ssize_t i
    cdef unsigned char c
    for i in range(n):
        c = p[i]
        if 65 <= c <= 90:
            c += 32
        q[i] = c
    return out


@cython.no_gc  # bytes, str, numbers (and lists of them): never part of a cycle
cdef class HttpError:
    """A framing failure: the peer gets ``status`` (server side) and the connection closes."""

    cdef public int status
    cdef public str message

    def __init__(self, int status, str message):
        self.status = status
        self.message = message

    def __repr__(self):
        return f"HttpError({self.status}, {self.message!r})"


@cython.no_gc  # bytes, str, numbers (and lists of them): never part of a cycle
cdef class Request:
    """One complete client request.  Header names are lower-cased; values are OWS-stripped."""

    cdef public bytes method
    cdef public bytes target
    cdef public bytes path
    cdef public bytes query
    cdef public int version
    cdef public bint keep_alive
    cdef public bytes body
    cdef public object host
    cdef public object content_type
    cdef public object api_key
    cdef public object authorization
    cdef public object request_id
    cdef public object upgrade
    cdef public object origin
    cdef public object accept_encoding
    cdef public object content_encoding
    cdef public bint expect_continue
    cdef bytes _block
    cdef object _headers

    @property
    def headers(self):
        if self._headers is None:
            self._headers = _collect_headers(self._block)
        return self._headers

    @headers.setter
    def headers(self, value):
        self._headers = value


@cython.no_gc  # bytes, str, numbers (and lists of them): never part of a cycle
cdef class Response:
    """One complete upstream response."""

    cdef public int status
    cdef public bytes body
    cdef public bint keep_alive
    cdef public object content_type
    cdef public object retry_after


cdef list _collect_headers(bytes block):
    """Rebuild the (name, value) list from a header block already validated by _parse_fields."""
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(block)
    cdef Py_ssize_t end = PyBytes_GET_SIZE(block)
    cdef Py_ssize_t start = 0, nl, colon, vs, ve
    cdef list out = []
    while start < end:
        nl = _find_crlf(p, start, end)
        colon = start
        while p[colon] != 58:
            colon += 1
        vs = colon + 1
        ve = nl
        while vs < ve and (p[vs] == 32 or p[vs] == 9):
            vs += 1
        while ve > vs and (p[ve - 1] == 32 or p[ve - 1] == 9):
            ve -= 1
        out.append((_lower(p + start, colon - start), _sub(block, vs, ve)))
        start = nl + 2
    return out


@cython.no_gc  # bytes, str, numbers (and lists of them): never part of a cycle
cdef class _Head:
    cdef Py_ssize_t content_length
    cdef object transfer_encoding
    cdef bint chunked
    cdef bint close
    cdef bint keep_alive_token
    cdef object host
    cdef int host_count
    cdef int expect
    cdef object content_type
    cdef object api_key
    cdef object authorization
    cdef object request_id
    cdef object upgrade
    cdef object retry_after
    cdef object origin
    cdef object accept_encoding
    cdef object content_encoding

    def __cinit__(self):
        self.content_length = -1


cdef object _field_line(const unsigned char* p, Py_ssize_t start, Py_ssize_t end,
                        Py_ssize_t* colon_out, Py_ssize_t* vs_out, Py_ssize_t* ve_out):
    """Validate one field line; return None when fine, else the error message."""
    cdef Py_ssize_t colon, vs, ve, i
    if start == end or p[start] == 32 or p[start] == 9:
        return "obsolete line folding is not accepted"
    colon = -1
    for i in range(start, end):
        if p[i] == 58:
            colon = i
            break
    if colon <= start:
        return "header line without a name and colon"
    for i in range(start, colon):
        if not TOKEN[p[i]]:
            return "invalid character in header name"
    vs = colon + 1
    ve = end
    while vs < ve and (p[vs] == 32 or p[vs] == 9):
        vs += 1
    while ve > vs and (p[ve - 1] == 32 or p[ve - 1] == 9):
        ve -= 1
    for i in range(vs, ve):
        if not VALUE_OK[p[i]]:
            return "invalid character in header value"
    colon_out[0] = colon
    vs_out[0] = vs
    ve_out[0] = ve
    return None


cdef object _parse_fields(bytes buf, Py_ssize_t start, Py_ssize_t end, int max_headers):
    """Parse field lines in buf[start:end] (each ends in CRLF); return a _Head or HttpError."""
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(buf)
    cdef _Head head = _Head()
    cdef Py_ssize_t nl, colon = 0, vs = 0, ve = 0, n, i, t0, t1
    cdef int count = 0
    cdef long long value_int
    cdef object err
    cdef list te_parts = None
    while start < end:
        nl = _find_crlf(p, start, end)
        if _has_cr_or_lf(p, start, nl):
            return HttpError(400, "bare CR or LF in header section")
        err = _field_line(p, start, nl, &colon, &vs, &ve)
        if err is not None:
            return HttpError(400, err)
        count += 1
        if count > max_headers:
            return HttpError(431, f"more than {max_headers} header fields")
        n = colon - start
        if n == 14 and _ieq(p + start, n, b"content-length", 14):
            if ve == vs or ve - vs > 18:
                return HttpError(400, "invalid Content-Length")
            value_int = 0
            for i in range(vs, ve):
                if not (48 <= p[i] <= 57):
                    return HttpError(400, "invalid Content-Length")
                value_int = value_int * 10 + (p[i] - 48)
            if head.content_length >= 0 and head.content_length != value_int:
                return HttpError(400, "conflicting Content-Length headers")
            head.content_length = value_int
        elif n == 17 and _ieq(p + start, n, b"transfer-encoding", 17):
            if te_parts is None:
                te_parts = []
            te_parts.append(_lower(p + vs, ve - vs))
        elif n == 10 and _ieq(p + start, n, b"connection", 10):
            # Comma-separated tokens, each stripped of OWS.
            i = vs
            while i <= ve:
                t0 = i
                while i < ve and p[i] != 44:
                    i += 1
                t1 = i
                while t0 < t1 and (p[t0] == 32 or p[t0] == 9):
                    t0 += 1
                while t1 > t0 and (p[t1 - 1] == 32 or p[t1 - 1] == 9):
                    t1 -= 1
                if _ieq(p + t0, t1 - t0, b"close", 5):
                    head.close = 1
                elif _ieq(p + t0, t1 - t0, b"keep-alive", 10):
                    head.keep_alive_token = 1
                i += 1
        elif n == 4 and _ieq(p + start, n, b"host", 4):
            head.host_count += 1
            head.host = _sub(buf, vs, ve)
        elif n == 6 and _ieq(p + start, n, b"expect", 6):
            head.expect = 1 if _ieq(p + vs, ve - vs, b"100-continue", 12) else EXPECT_OTHER
        elif n == 12 and _ieq(p + start, n, b"content-type", 12):
            if head.content_type is None:
                head.content_type = _sub(buf, vs, ve)
        elif n == 9 and _ieq(p + start, n, b"x-api-key", 9):
            # Credentials are never ambiguous: which of two keys would be the caller's?
            if head.api_key is not None:
                return HttpError(400, "more than one X-API-Key header")
            head.api_key = _sub(buf, vs, ve)
        elif n == 13 and _ieq(p + start, n, b"authorization", 13):
            if head.authorization is not None:
                return HttpError(400, "more than one Authorization header")
            head.authorization = _sub(buf, vs, ve)
        elif n == 12 and _ieq(p + start, n, b"x-request-id", 12):
            if head.request_id is None:
                head.request_id = _sub(buf, vs, ve)
        elif n == 7 and _ieq(p + start, n, b"upgrade", 7):
            if head.upgrade is None:
                head.upgrade = _sub(buf, vs, ve)
        elif n == 11 and _ieq(p + start, n, b"retry-after", 11):
            if head.retry_after is None:
                head.retry_after = _sub(buf, vs, ve)
        elif n == 6 and _ieq(p + start, n, b"origin", 6):
            if head.origin is None:
                head.origin = _sub(buf, vs, ve)
        elif n == 15 and _ieq(p + start, n, b"accept-encoding", 15):
            # List-valued: repeats combine as one comma-separated list (RFC 9110 5.3).
            if head.accept_encoding is None:
                head.accept_encoding = _sub(buf, vs, ve)
            else:
                head.accept_encoding = head.accept_encoding + b", " + _sub(buf, vs, ve)
        elif n == 16 and _ieq(p + start, n, b"content-encoding", 16):
            if head.content_encoding is None:
                head.content_encoding = _sub(buf, vs, ve)
            else:
                head.content_encoding = head.content_encoding + b", " + _sub(buf, vs, ve)
        start = nl + 2
    if te_parts is not None:
        head.transfer_encoding = b", ".join(te_parts)
        head.chunked = head.transfer_encoding == b"chunked"
    return head


cdef class _BodyReader:
    """Body framing shared by both parsers: Content-Length, chunked, or until EOF."""

    cdef bytes buf
    cdef Py_ssize_t pos
    cdef int state
    cdef Py_ssize_t max_body
    cdef Py_ssize_t max_header_bytes
    cdef list parts
    cdef bint discard  # the body is counted and dropped, not kept (ResponseParser)
    cdef bint direct  # a declared length: the bytes go straight into ``whole``
    cdef object whole  # the body, allocated whole when its head came (ResponseParser), or None
    cdef Py_ssize_t filled
    cdef Py_ssize_t received
    cdef Py_ssize_t remaining
    cdef Py_ssize_t chunk_left
    cdef Py_ssize_t trailer_bytes

    def __cinit__(self, Py_ssize_t max_body, Py_ssize_t max_header_bytes):
        self.buf = b""
        self.pos = 0
        self.state = S_HEAD
        self.max_body = max_body
        self.max_header_bytes = max_header_bytes
        self.parts = []

    cdef void append(self, bytes data):
        if self.pos >= PyBytes_GET_SIZE(self.buf):
            self.buf = data
            self.pos = 0
        elif self.pos:
            self.buf = self.buf[self.pos:] + data
            self.pos = 0
        elif PyBytes_GET_SIZE(self.buf):
            self.buf = self.buf + data
        else:
            self.buf = data

    cdef void start_body(self, bint chunked, Py_ssize_t length, bint until_eof):
        self.parts = []
        self.discard = 0
        self.direct = 0
        self.whole = None
        self.received = 0
        if chunked:
            self.state = S_CHUNK_SIZE
        elif until_eof:
            self.state = S_BODY_UNTIL_EOF
        else:
            self.state = S_BODY_LENGTH
            self.remaining = length

    cdef void preallocate(self):
        """The declared body is allocated whole now and filled as it comes: a big body is
        never held twice (its pieces and their join), and leaves no pieces behind in the
        allocator's heap.  Pages are touched only as bytes arrive."""
        self.direct = 1
        self.whole = PyBytes_FromStringAndSize(NULL, self.remaining)
        self.filled = 0

    cdef object step(self, str too_large):
        cdef bytes buf = self.buf
        cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(buf)
        cdef Py_ssize_t n = PyBytes_GET_SIZE(buf)
        cdef Py_ssize_t nl, size_end, i, need, available
        cdef unsigned long long size
        cdef bytes body
        cdef object err
        cdef Py_ssize_t colon = 0, vs = 0, ve = 0
        while True:
            if self.state == S_BODY_LENGTH and self.direct:
                available = n - self.pos
                if available > self.remaining:
                    available = self.remaining
                if self.whole is not None:
                    memcpy(PyBytes_AS_STRING(self.whole) + self.filled, p + self.pos, available)
                self.filled += available
                self.pos += available
                self.remaining -= available
                if self.remaining:
                    return None
                self.state = S_HEAD
                self.direct = 0
                body = b"" if self.whole is None else <bytes>self.whole
                self.whole = None
                return body
            if self.state == S_BODY_LENGTH:
                available = n - self.pos
                if available < self.remaining:
                    if available >= PARTIAL_BODY_MIN:
                        # Set a big body's bytes aside as they come: appending every read to
                        # one bytes object would copy the body over and over (quadratic).
                        if not self.discard:
                            self.parts.append(_sub(buf, self.pos, n))
                        self.remaining -= available
                        self.pos = n
                    return None
                if self.discard:
                    body = b""
                elif self.pos == 0 and self.remaining == n:
                    body = buf
                else:
                    body = _sub(buf, self.pos, self.pos + self.remaining)
                self.pos += self.remaining
                self.state = S_HEAD
                if self.parts:
                    self.parts.append(body)
                    body = b"".join(self.parts)
                    self.parts = []
                return body
            if self.state == S_BODY_UNTIL_EOF:
                available = n - self.pos
                if self.received + available > self.max_body:
                    return HttpError(413, too_large)
                if available:
                    if not self.discard:
                        self.parts.append(buf[self.pos:])
                    self.received += available
                    self.pos = n
                return None
            if self.state == S_CHUNK_SIZE:
                nl = _find_crlf(p, self.pos, n)
                if nl < 0:
                    if n - self.pos > CHUNK_LINE_MAX:
                        return HttpError(400, "chunk size line too long")
                    return None
                if nl - self.pos > CHUNK_LINE_MAX:
                    return HttpError(400, "chunk size line too long")
                size_end = self.pos
                while size_end < nl and p[size_end] != 59:
                    size_end += 1
                while size_end > self.pos and (p[size_end - 1] == 32 or p[size_end - 1] == 9):
                    size_end -= 1
                if size_end == self.pos or size_end - self.pos > 16:
                    return HttpError(400, "invalid chunk size")
                size = 0
                for i in range(self.pos, size_end):
                    if HEXVAL[p[i]] < 0:
                        return HttpError(400, "invalid chunk size")
                    size = size * 16 + HEXVAL[p[i]]
                for i in range(self.pos, nl):
                    if (p[i] < 0x20 and p[i] != 9) or p[i] == 0x7F:
                        return HttpError(400, "invalid character in chunk extension")
                # Compare without adding: 16 hex digits can reach 2**64 - 1.
                if size > <unsigned long long>(self.max_body - self.received):
                    return HttpError(413, too_large)
                self.pos = nl + 2
                if size == 0:
                    self.state = S_CHUNK_TRAILER
                    self.trailer_bytes = 0
                else:
                    self.chunk_left = size
                    self.state = S_CHUNK_DATA
            elif self.state == S_CHUNK_DATA:
                need = self.chunk_left
                if n - self.pos < need + 2:
                    return None
                if p[self.pos + need] != 13 or p[self.pos + need + 1] != 10:
                    return HttpError(400, "chunk data not followed by CRLF")
                if not self.discard:
                    self.parts.append(_sub(buf, self.pos, self.pos + need))
                self.received += need
                self.pos += need + 2
                self.state = S_CHUNK_SIZE
            else:
                nl = _find_crlf(p, self.pos, n)
                if nl < 0:
                    if self.trailer_bytes + n - self.pos > self.max_header_bytes:
                        return HttpError(431, "trailer section too large")
                    return None
                self.trailer_bytes += nl + 2 - self.pos
                if self.trailer_bytes > self.max_header_bytes:
                    return HttpError(431, "trailer section too large")
                if nl == self.pos:
                    self.pos = nl + 2
                    self.state = S_HEAD
                    body = b"".join(self.parts)
                    self.parts = []
                    return body
                i = self.pos
                self.pos = nl + 2
                if _has_cr_or_lf(p, i, nl):
                    return HttpError(400, "bare CR or LF in trailer section")
                err = _field_line(p, i, nl, &colon, &vs, &ve)
                if err is not None:
                    return HttpError(400, err)

    cdef bytes finish_until_eof(self):
        cdef bytes body = b"".join(self.parts)
        self.parts = []
        self.state = S_HEAD
        return body


cdef inline Py_ssize_t _blank_line(const unsigned char* p, Py_ssize_t start, Py_ssize_t end):
    """Offset of the LF that starts the first empty line (LF LF or LF CR LF) at or after
    ``start``, or -1."""
    cdef const unsigned char* hit
    while start < end - 1:
        hit = <const unsigned char*>memchr(p + start, 10, end - 1 - start)
        if hit == NULL:
            return -1
        start = hit - p
        if p[start + 1] == 10:
            return start
        if p[start + 1] == 13 and start + 2 < end and p[start + 2] == 10:
            return start
        start += 1
    return -1


cdef inline bint _has_bare_lf(const unsigned char* p, Py_ssize_t start, Py_ssize_t end):
    cdef const unsigned char* hit
    while start < end:
        hit = <const unsigned char*>memchr(p + start, 10, end - start)
        if hit == NULL:
            return 0
        if hit == p + start or hit[-1] != 13:
            return 1
        start = hit - p + 1
    return 0


cdef str _BARE_LF = "bare CR or LF in the message head"


cdef object _find_head(_BodyReader reader, Py_ssize_t max_line, Py_ssize_t max_header_bytes,
                       int line_error, Py_ssize_t scan_from,
                       Py_ssize_t* line_end_out, Py_ssize_t* head_end_out):
    """Return None when the head is complete (offsets written out), an HttpError, or the int
    offset, relative to reader.pos, from which the next search may start.  Lines are found by
    their LF; a complete head with a bare LF is refused (see the pure twin)."""
    cdef bytes buf = reader.buf
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(buf)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(buf)
    cdef Py_ssize_t pos = reader.pos
    cdef const unsigned char* hit = NULL
    cdef Py_ssize_t first_lf = -1, line_end, blank, head_end
    if n > pos:
        hit = <const unsigned char*>memchr(p + pos, 10, n - pos)
    if hit == NULL:
        if n - pos > max_line + 1:
            return HttpError(line_error, "start line too long")
        return scan_from
    first_lf = hit - p
    line_end = first_lf - 1 if first_lf > pos and p[first_lf - 1] == 13 else first_lf
    if line_end - pos > max_line:
        return HttpError(line_error, "start line too long")
    blank = _blank_line(p, first_lf if first_lf > pos + scan_from else pos + scan_from, n)
    if blank < 0:
        if n - (line_end + 2) > max_header_bytes:
            return HttpError(431, "header section too large")
        return (first_lf if first_lf > n - 2 else n - 2) - pos
    head_end = blank + 2 if p[blank + 1] == 10 else blank + 3
    if head_end - (line_end + 2) > max_header_bytes:
        return HttpError(431, "header section too large")
    if _has_bare_lf(p, pos, head_end):
        return HttpError(400, _BARE_LF)
    line_end_out[0] = line_end
    head_end_out[0] = head_end
    return None


cdef class RequestParser:
    """Incremental parser for the requests of one client connection."""

    cdef _BodyReader _reader
    cdef Py_ssize_t _max_line
    cdef Py_ssize_t _max_header_bytes
    cdef int _max_headers
    cdef Py_ssize_t _max_body
    cdef object _error
    cdef Request _pending
    cdef Py_ssize_t _scan_from
    cdef bint _eof
    cdef bint _continue_due

    def __init__(self, Py_ssize_t max_line=8192, Py_ssize_t max_header_bytes=16384,
                 int max_headers=100, Py_ssize_t max_body=1 << 20):
        self._reader = _BodyReader(max_body, max_header_bytes)
        self._max_line = max_line
        self._max_header_bytes = max_header_bytes
        self._max_headers = max_headers
        self._max_body = max_body
        self._error = None
        self._pending = None
        self._scan_from = 0
        self._eof = 0
        self._continue_due = 0

    def feed(self, bytes data):
        if self._error is None and not self._eof:
            self._reader.append(data)

    def feed_eof(self):
        self._eof = 1

    cdef inline bint _partial(self):
        return self._pending is not None or PyBytes_GET_SIZE(self._reader.buf) > self._reader.pos

    @property
    def has_partial(self):
        return self._partial()

    @property
    def closed(self):
        return self._error is not None or (self._eof and not self._partial())

    def take_continue(self):
        cdef bint due = self._continue_due
        self._continue_due = 0
        return due

    def take_buffered(self):
        """Bytes received after the last complete request, handed over and forgotten (the
        edge calls it when a request upgrades the connection to another protocol)."""
        cdef _BodyReader reader = self._reader
        cdef bytes rest = reader.buf[reader.pos:]
        reader.buf = b""
        reader.pos = 0
        return rest

    def next_event(self):
        if self._error is not None:
            return self._error
        event = self._next()
        if isinstance(event, HttpError):
            self._error = event
        elif event is None and self._eof and self._partial():
            event = self._error = HttpError(400, "connection closed in the middle of a request")
        return event

    cdef object _next(self):
        cdef _BodyReader reader = self._reader
        cdef bytes buf
        cdef const unsigned char* p
        cdef Py_ssize_t n, line_end = 0, head_end = 0
        cdef object found, request, body
        if self._pending is None:
            buf = reader.buf
            p = <const unsigned char*>PyBytes_AS_STRING(buf)
            n = PyBytes_GET_SIZE(buf)
            while reader.pos + 1 < n and p[reader.pos] == 13 and p[reader.pos + 1] == 10:
                reader.pos += 2
            if reader.pos >= n:
                return None
            found = _find_head(reader, self._max_line, self._max_header_bytes, 414,
                               self._scan_from, &line_end, &head_end)
            if found is not None:
                if isinstance(found, HttpError):
                    return found
                self._scan_from = found
                return None
            self._scan_from = 0
            request = self._start_request(buf, reader.pos, line_end, head_end)
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
        self._continue_due = 0
        (<Request>request).body = body
        return request

    cdef object _start_request(self, bytes buf, Py_ssize_t start, Py_ssize_t line_end,
                               Py_ssize_t head_end):
        cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(buf)
        cdef Py_ssize_t sp1 = -1, sp2 = -1, spaces = 0, i, q
        cdef int version
        cdef Request request
        cdef _Head head
        cdef bint has_body
        for i in range(start, line_end):
            if p[i] == 32:
                spaces += 1
                if sp1 < 0:
                    sp1 = i
                elif sp2 < 0:
                    sp2 = i
        if spaces != 2 or sp1 == start or sp2 == sp1 + 1 or sp2 == line_end - 1:
            return HttpError(400, "malformed request line")
        for i in range(start, sp1):
            if not TOKEN[p[i]]:
                return HttpError(400, "invalid request method")
        for i in range(sp1 + 1, sp2):
            if not TARGET_OK[p[i]]:
                return HttpError(400, "invalid request target")
        if p[sp1 + 1] != 47 and not (sp2 - sp1 == 2 and p[sp1 + 1] == 42):
            return HttpError(400, "request target must be in origin form")
        if line_end - sp2 - 1 == 8 and memcmp(p + sp2 + 1, b"HTTP/1.", 7) == 0 and (
                p[sp2 + 8] == 49 or p[sp2 + 8] == 48):
            version = 11 if p[sp2 + 8] == 49 else 10
        elif (line_end - sp2 - 1 == 8 and memcmp(p + sp2 + 1, b"HTTP/", 5) == 0
              and 48 <= p[sp2 + 6] <= 57 and p[sp2 + 7] == 46 and 48 <= p[sp2 + 8] <= 57):
            return HttpError(505, "HTTP version not supported")
        else:
            return HttpError(400, "malformed HTTP version")
        found = _parse_fields(buf, line_end + 2, head_end - 2, self._max_headers)
        if isinstance(found, HttpError):
            return found
        head = <_Head>found
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
        request = Request.__new__(Request)
        request.method = _sub(buf, start, sp1)
        request.target = _sub(buf, sp1 + 1, sp2)
        q = -1
        for i in range(sp1 + 1, sp2):
            if p[i] == 63:
                q = i
                break
        if q < 0:
            request.path = request.target
            request.query = b""
        else:
            request.path = _sub(buf, sp1 + 1, q)
            request.query = _sub(buf, q + 1, sp2)
        request.version = version
        if version == 11:
            request.keep_alive = not head.close
        else:
            request.keep_alive = head.keep_alive_token and not head.close
        request.body = b""
        request._block = _sub(buf, line_end + 2, head_end - 2)
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
        self._reader.start_body(head.chunked, head.content_length if head.content_length > 0 else 0, 0)
        self._continue_due = request.expect_continue and has_body
        return request


cdef class ResponseParser:
    """Incremental parser for the responses on one upstream connection (in request order)."""

    cdef _BodyReader _reader
    cdef Py_ssize_t _max_line
    cdef Py_ssize_t _max_header_bytes
    cdef int _max_headers
    cdef object _error
    cdef Response _pending
    cdef Py_ssize_t _length  # the Content-Length of the body being read; -1: not declared
    cdef Py_ssize_t _scan_from
    cdef bint _eof

    def __init__(self, Py_ssize_t max_line=8192, Py_ssize_t max_header_bytes=65536,
                 int max_headers=200, Py_ssize_t max_body=64 << 20):
        self._reader = _BodyReader(max_body, max_header_bytes)
        self._max_line = max_line
        self._max_header_bytes = max_header_bytes
        self._max_headers = max_headers
        self._error = None
        self._pending = None
        self._length = -1
        self._scan_from = 0
        self._eof = 0

    def feed(self, bytes data):
        if self._error is None and not self._eof:
            self._reader.append(data)

    def feed_eof(self):
        self._eof = 1

    def body_length(self):
        """The declared length of the body being read (-1: chunked or until EOF); None when
        no body is being read."""
        return None if self._pending is None else self._length

    def discard_body(self):
        """Drop the body being read, and the rest of it as it comes: the response completes
        with an empty body (nobody wants it; its bytes are still consumed in order)."""
        self._reader.discard = 1
        self._reader.parts = []
        self._reader.whole = None

    @property
    def has_partial(self):
        return self._pending is not None or PyBytes_GET_SIZE(self._reader.buf) > self._reader.pos

    def next_event(self):
        cdef Response response
        if self._error is not None:
            return self._error
        event = self._next()
        if isinstance(event, HttpError):
            self._error = event
        elif event is None and self._eof:
            if self._pending is not None and self._reader.state == S_BODY_UNTIL_EOF:
                response = self._pending
                self._pending = None
                response.body = self._reader.finish_until_eof()
                return response
            if self.has_partial:
                event = self._error = HttpError(502, "connection closed in the middle of a response")
        return event

    cdef object _next(self):
        cdef _BodyReader reader = self._reader
        cdef bytes buf
        cdef Py_ssize_t line_end = 0, head_end = 0
        cdef object found, response, body
        while self._pending is None:
            buf = reader.buf
            if reader.pos >= PyBytes_GET_SIZE(buf):
                return None
            found = _find_head(reader, self._max_line, self._max_header_bytes, 502,
                               self._scan_from, &line_end, &head_end)
            if found is not None:
                if isinstance(found, HttpError):
                    return HttpError(502, (<HttpError>found).message)
                self._scan_from = found
                return None
            self._scan_from = 0
            response = self._start_response(buf, reader.pos, line_end, head_end)
            reader.pos = head_end
            if isinstance(response, HttpError):
                return response
            if 100 <= (<Response>response).status < 200:
                continue
            self._pending = response
        response = self._pending
        body = reader.step("response body too large")
        if body is None:
            return None
        if isinstance(body, HttpError):
            return HttpError(502, (<HttpError>body).message)
        self._pending = None
        (<Response>response).body = body
        return response

    cdef object _start_response(self, bytes buf, Py_ssize_t start, Py_ssize_t line_end,
                                Py_ssize_t head_end):
        cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(buf)
        cdef Py_ssize_t n = line_end - start
        cdef int version, status
        cdef Response response
        cdef _Head head
        if n < 12 or p[start + 8] != 32:
            return HttpError(502, "malformed status line")
        if memcmp(p + start, b"HTTP/1.1", 8) == 0:
            version = 11
        elif memcmp(p + start, b"HTTP/1.0", 8) == 0:
            version = 10
        else:
            return HttpError(502, "unsupported HTTP version in response")
        if not (48 <= p[start + 9] <= 57 and 48 <= p[start + 10] <= 57 and 48 <= p[start + 11] <= 57) or (
                n > 12 and p[start + 12] != 32):
            return HttpError(502, "malformed status code")
        status = (p[start + 9] - 48) * 100 + (p[start + 10] - 48) * 10 + (p[start + 11] - 48)
        if status < 100:
            return HttpError(502, "malformed status code")
        found = _parse_fields(buf, line_end + 2, head_end - 2, self._max_headers)
        if isinstance(found, HttpError):
            return HttpError(502, (<HttpError>found).message)
        head = <_Head>found
        response = Response.__new__(Response)
        response.status = status
        response.body = b""
        response.content_type = head.content_type
        response.retry_after = head.retry_after
        if version == 11:
            response.keep_alive = not head.close
        else:
            response.keep_alive = head.keep_alive_token and not head.close
        if 100 <= status < 200 or status == 204 or status == 304:
            self._reader.start_body(0, 0, 0)
            return response
        self._length = -1
        if head.transfer_encoding is not None:
            if not head.chunked:
                return HttpError(502, "unsupported Transfer-Encoding in response")
            self._reader.start_body(1, 0, 0)
        elif head.content_length >= 0:
            if head.content_length > self._reader.max_body:
                return HttpError(502, "response body too large")
            self._length = head.content_length
            self._reader.start_body(0, head.content_length, 0)
            if head.content_length >= PREALLOCATE_MIN:
                self._reader.preallocate()
        else:
            response.keep_alive = 0
            self._reader.start_body(0, 0, 1)
        return response


cdef inline Py_ssize_t _put(char* q, Py_ssize_t at, const char* s, Py_ssize_t n):
    memcpy(q + at, s, n)
    return at + n


def build_response(object status, bytes headers, bytes body, bint keep_alive, bint http10=False):
    """Assemble a response.  ``headers`` holds complete ``Name: value\\r\\n`` lines."""
    # Range-check the Python int before converting it: an out-of-range status must be the
    # ValueError of the pure twin, not an OverflowError from the C conversion.
    if not 100 <= status <= 999:
        raise ValueError("status must be a three-digit code")
    cdef int code = status
    cdef object reason_obj = _REASON_BY_STATUS[code] if code < 600 else None
    cdef bytes reason = reason_obj if reason_obj is not None else b"Unknown"
    cdef const char* connection
    cdef Py_ssize_t connection_len
    if not keep_alive:
        connection = b"Connection: close\r\n"
        connection_len = 19
    elif http10:
        connection = b"Connection: keep-alive\r\n"
        connection_len = 24
    else:
        connection = b""
        connection_len = 0
    if code == 204 or code == 304 or code < 200:
        # RFC 9110: these responses have no content and no Content-Length (a 304's body would
        # be read as the start of the next response).
        return b"HTTP/1.1 %d %s\r\n%s%s\r\n" % (
            code, reason, connection[:connection_len], headers)
    cdef Py_ssize_t body_len = PyBytes_GET_SIZE(body)
    cdef Py_ssize_t headers_len = PyBytes_GET_SIZE(headers)
    cdef Py_ssize_t reason_len = PyBytes_GET_SIZE(reason)
    cdef Py_ssize_t total = (9 + 3 + 1 + reason_len + 18 + int_width(body_len) + 2 + connection_len
                             + headers_len + 2 + body_len)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, total)
    cdef char* q = PyBytes_AS_STRING(out)
    cdef Py_ssize_t at = 0
    at = _put(q, at, b"HTTP/1.1 ", 9)
    at += write_int(q + at, code)
    q[at] = 32
    at += 1
    at = _put(q, at, PyBytes_AS_STRING(reason), reason_len)
    at = _put(q, at, b"\r\nContent-Length: ", 18)
    at += write_int(q + at, body_len)
    at = _put(q, at, b"\r\n", 2)
    at = _put(q, at, connection, connection_len)
    at = _put(q, at, PyBytes_AS_STRING(headers), headers_len)
    at = _put(q, at, b"\r\n", 2)
    _put(q, at, PyBytes_AS_STRING(body), body_len)
    return out


def build_response_head(object status, bytes headers, Py_ssize_t body_length, bint keep_alive,
                        bint http10=False):
    """The status line and header section of a response whose body is sent separately (a
    large body is written after it as it is, rather than copied into one message)."""
    if not 200 <= status <= 999 or status in (204, 304):
        raise ValueError("only a response with content has a separate body")
    cdef int code = status
    cdef object reason_obj = _REASON_BY_STATUS[code] if code < 600 else None
    cdef bytes reason = reason_obj if reason_obj is not None else b"Unknown"
    cdef bytes connection
    if not keep_alive:
        connection = b"Connection: close\r\n"
    elif http10:
        connection = b"Connection: keep-alive\r\n"
    else:
        connection = b""
    return b"HTTP/1.1 %d %s\r\nContent-Length: %d\r\n%s%s\r\n" % (
        code, reason, body_length, connection, headers)


def build_request(bytes path, bytes host, bytes headers, bytes body):
    """Assemble a JSON POST to an upstream node (keep-alive, Content-Length framed)."""
    return (
        b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n%s\r\n%s" % (path, host, len(body), headers, body)
    )

# cython: language_level=3
"""JSON-RPC 2.0 envelope framing: the compiled twin of ``chaingate/_pure/jsonrpc.py``.

Same contract as the pure module (which is the specification): one strict pass over the body,
raw byte spans for ``id``/``params``/``result``/``error``, equal results for every input.  The
difference is speed: the scan walks a C pointer and matches member names without building str
objects, and replies are assembled with a single allocation.
"""

import json

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DATA, PyUnicode_DecodeUTF8, PyUnicode_GET_LENGTH
from libc.string cimport memchr, memcmp, memcpy

from cformat cimport int_width, write_int
from cjson cimport any_high as _any_high, json_ws as _ws, plain_run as _plain_run
from creply cimport error_reply_of, join_present, result_reply_of

from chaingate.framing_constants import MAX_JSON_DEPTH as _MAX_DEPTH_PY
from chaingate._pure.jsonrpc import result_block as _result_block_decoded
from chaingate._pure.jsonrpc import (
    MSG_BAD_ID,
    MSG_BAD_METHOD,
    MSG_BAD_PARAMS,
    MSG_BAD_UTF8,
    MSG_BAD_VERSION,
    MSG_BATCH_ITEM,
    MSG_EMPTY_BATCH,
    MSG_INVALID_JSON,
    MSG_NO_METHOD,
    MSG_NOT_CALL,
    MSG_TOO_DEEP,
)

__all__ = [
    "IMPLEMENTATION",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "Call",
    "ParsedRequest",
    "ParsedResponse",
    "Reply",
    "array_item",
    "error_reply",
    "join_batch",
    "parse_request",
    "parse_response",
    "raw_error_reply",
    "result_block",
    "result_reply",
    "upstream_batch",
    "upstream_request",
]

IMPLEMENTATION = "compiled"

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

cdef int MAX_DEPTH = _MAX_DEPTH_PY
cdef Py_ssize_t SYNTAX = -1
cdef Py_ssize_t TOO_DEEP = -2

# Member names the scanner cares about.
cdef enum:
    K_ID = 0
    K_JSONRPC = 1
    K_METHOD = 2
    K_PARAMS = 3
    K_RESULT = 4
    K_ERROR = 5
    K_COUNT = 6

cdef bint IS_HEX[256]
cdef void _init():
    cdef int i
    for i in range(256):
        IS_HEX[i] = (48 <= i <= 57) or (65 <= i <= 70) or (97 <= i <= 102)
_init()


# The fields of these four classes are declared in chaingate/_native/jsonrpc.pxd (the lane
# reads them as C members).
@cython.no_gc  # bytes, str, numbers (and lists of them): never part of a cycle
@cython.freelist(64)  # one per call (per request, per response): memory reused in turn
cdef class Call:
    def __init__(self, id, method, params, int error, str message):
        self.id = id
        self.method = method
        self.params = params
        self.error = error
        self.message = message


@cython.no_gc  # bytes, str, numbers (and lists of them): never part of a cycle
@cython.freelist(8)  # one per call (per request, per response): memory reused in turn
cdef class ParsedRequest:
    def __init__(self, bint batch, list calls, int error, str message):
        self.batch = batch
        self.calls = calls
        self.error = error
        self.message = message


# What a scan found of the block a result names (``result_block``'s answer): a block number
# (>= 0), none, or not decided by the scan (the pure twin's decoder decides).
cdef enum:
    BLOCK_NONE = -1
    BLOCK_ASK = -2


@cython.no_gc  # bytes, str, numbers (and lists of them): never part of a cycle
@cython.freelist(64)  # one per call (per request, per response): memory reused in turn
cdef class Reply:
    def __init__(self, id, result, error):
        self.id = id
        self.result = result
        self.error = error
        self._block = BLOCK_ASK

    @property
    def id(self):
        """The raw JSON of the reply's id (None: none)."""
        if self._lazy:
            self._id = _decimal_bytes(self._number)
            self._lazy = False
        return self._id

    @id.setter
    def id(self, value):
        self._id = value
        self._lazy = False
        self._number = _decimal_id(value)

    @property
    def block(self):
        """``result_block(result)`` (None without a result), mostly read while the response
        was scanned: a receipt's answer is not scanned twice."""
        if self._block >= 0:
            return self._block
        if self._block == BLOCK_NONE or self.result is None:
            return None
        return result_block(self.result)


@cython.no_gc  # bytes, str, numbers (and lists of them): never part of a cycle
@cython.freelist(8)  # one per call (per request, per response): memory reused in turn
cdef class ParsedResponse:
    def __init__(self, bint batch, list replies):
        self.batch = batch
        self.replies = replies


cdef inline bytes _sub(bytes buf, Py_ssize_t start, Py_ssize_t end):
    """buf[start:end] without building slice objects."""
    return PyBytes_FromStringAndSize(PyBytes_AS_STRING(buf) + start, end - start)


cdef inline Call _new_call(object id, object method, object params, int error, str message):
    cdef Call call = Call.__new__(Call)
    call.id = id
    call.method = method
    call.params = params
    call.error = error
    call.message = message
    return call


cdef inline ParsedRequest _parsed(bint batch, list calls, int error, str message):
    cdef ParsedRequest parsed = ParsedRequest.__new__(ParsedRequest)
    parsed.batch = batch
    parsed.calls = calls
    parsed.error = error
    parsed.message = message
    return parsed


cdef inline Py_ssize_t _string_end(const unsigned char* p, Py_ssize_t i, Py_ssize_t n,
                                   bint* escaped) noexcept:
    """``i`` is just past the opening quote; return the offset past the closing quote."""
    cdef unsigned char c
    while i < n:
        i = _plain_run(p, i, n)
        if i >= n:
            break
        c = p[i]
        if c == 34:
            return i + 1
        if c == 92:
            escaped[0] = 1
            if i + 1 >= n:
                return SYNTAX
            c = p[i + 1]
            if c == 117:
                if i + 6 > n:
                    return SYNTAX
                if not (IS_HEX[p[i + 2]] and IS_HEX[p[i + 3]] and IS_HEX[p[i + 4]] and IS_HEX[p[i + 5]]):
                    return SYNTAX
                i += 6
            elif c == 34 or c == 92 or c == 47 or c == 98 or c == 102 or c == 110 or c == 114 or c == 116:
                i += 2
            else:
                return SYNTAX
        else:
            return SYNTAX  # a control byte
    return SYNTAX


cdef inline bint _digit(unsigned char c) noexcept:
    return 48 <= c <= 57


cdef inline Py_ssize_t _number_end(const unsigned char* p, Py_ssize_t i, Py_ssize_t n) noexcept:
    cdef Py_ssize_t j = i, k
    if j < n and p[j] == 45:
        j += 1
    if j < n and p[j] == 48:
        j += 1
    elif j < n and 49 <= p[j] <= 57:
        j += 1
        while j < n and _digit(p[j]):
            j += 1
    else:
        return SYNTAX
    if j + 1 < n and p[j] == 46 and _digit(p[j + 1]):
        j += 2
        while j < n and _digit(p[j]):
            j += 1
    if j < n and (p[j] == 101 or p[j] == 69):
        k = j + 1
        if k < n and (p[k] == 43 or p[k] == 45):
            k += 1
        if k < n and _digit(p[k]):
            k += 1
            while k < n and _digit(p[k]):
                k += 1
            j = k
    return j


cdef Py_ssize_t _skip(const unsigned char* p, Py_ssize_t i, Py_ssize_t n, int depth) noexcept:
    """End offset of the JSON value starting at ``i`` (no leading whitespace), or < 0."""
    cdef unsigned char c
    cdef bint escaped = 0
    if i >= n:
        return SYNTAX
    c = p[i]
    if c == 34:
        return _string_end(p, i + 1, n, &escaped)
    if c == 123:
        if depth >= MAX_DEPTH:
            return TOO_DEEP
        i = _ws(p, i + 1, n)
        if i < n and p[i] == 125:
            return i + 1
        while True:
            if i >= n or p[i] != 34:
                return SYNTAX
            i = _string_end(p, i + 1, n, &escaped)
            if i < 0:
                return SYNTAX
            i = _ws(p, i, n)
            if i >= n or p[i] != 58:
                return SYNTAX
            i = _member_end(p, _ws(p, i + 1, n), n, depth + 1)
            if i < 0:
                return i
            i = _ws(p, i, n)
            if i >= n:
                return SYNTAX
            if p[i] == 125:
                return i + 1
            if p[i] != 44:
                return SYNTAX
            i = _ws(p, i + 1, n)
    if c == 91:
        if depth >= MAX_DEPTH:
            return TOO_DEEP
        i = _ws(p, i + 1, n)
        if i < n and p[i] == 93:
            return i + 1
        while True:
            i = _member_end(p, i, n, depth + 1)
            if i < 0:
                return i
            i = _ws(p, i, n)
            if i >= n:
                return SYNTAX
            if p[i] == 93:
                return i + 1
            if p[i] != 44:
                return SYNTAX
            i = _ws(p, i + 1, n)
    if c == 116:
        return i + 4 if i + 4 <= n and memcmp(p + i, b"true", 4) == 0 else SYNTAX
    if c == 102:
        return i + 5 if i + 5 <= n and memcmp(p + i, b"false", 5) == 0 else SYNTAX
    if c == 110:
        return i + 4 if i + 4 <= n and memcmp(p + i, b"null", 4) == 0 else SYNTAX
    return _number_end(p, i, n)


cdef inline Py_ssize_t _member_end(const unsigned char* p, Py_ssize_t i, Py_ssize_t n,
                                   int depth) noexcept:
    """``_skip`` of a member or an element, a string (most are) scanned without the call."""
    cdef bint escaped = 0
    if i < n and p[i] == 34:
        return _string_end(p, i + 1, n, &escaped)
    return _skip(p, i, n, depth)


cdef inline bint _lit(const unsigned char* p, Py_ssize_t n, const char* lit, Py_ssize_t litn) noexcept:
    return n == litn and memcmp(p, lit, n) == 0


cdef int _key_index(bytes body, const unsigned char* p, Py_ssize_t ks, Py_ssize_t ke,
                    bint escaped, bint response) except -2:
    """Which member this key names (K_*), or -1; ks..ke is the inside of the quotes."""
    cdef Py_ssize_t n = ke - ks
    cdef object key
    if escaped:
        key = json.loads(b'"' + _sub(body, ks, ke) + b'"')
        if key == "id":
            return K_ID
        if response:
            return K_RESULT if key == "result" else (K_ERROR if key == "error" else -1)
        if key == "jsonrpc":
            return K_JSONRPC
        if key == "method":
            return K_METHOD
        if key == "params":
            return K_PARAMS
        return -1
    if _lit(p + ks, n, b"id", 2):
        return K_ID
    if response:
        if _lit(p + ks, n, b"result", 6):
            return K_RESULT
        if _lit(p + ks, n, b"error", 5):
            return K_ERROR
        return -1
    if _lit(p + ks, n, b"jsonrpc", 7):
        return K_JSONRPC
    if _lit(p + ks, n, b"method", 6):
        return K_METHOD
    if _lit(p + ks, n, b"params", 6):
        return K_PARAMS
    return -1


cdef inline int _block_member(const unsigned char* p, Py_ssize_t ks, Py_ssize_t ke) noexcept:
    """1: the key ``number``, 2: ``blockNumber``, 0: another (ks..ke: inside the quotes)."""
    if ke - ks == 6 and memcmp(p + ks, b"number", 6) == 0:
        return 1
    if ke - ks == 11 and memcmp(p + ks, b"blockNumber", 11) == 0:
        return 2
    return 0


cdef long long _block_value(const unsigned char* p, Py_ssize_t* spans) noexcept:
    """The block named by an object's ``number`` (spans[0:2]) or else ``blockNumber``
    (spans[2:4]) values (-1: absent), each a string or null: ``number or blockNumber``, the
    first when it is a non-empty string; BLOCK_NONE when neither says, BLOCK_ASK when only
    the decoder can say (not 1 to 15 hex digits after 0x)."""
    cdef Py_ssize_t vs = spans[0], ve = spans[1], i
    cdef long long value = 0
    if vs < 0 or p[vs] != 34 or ve - vs == 2:
        vs, ve = spans[2], spans[3]
    if vs < 0 or p[vs] != 34:
        return BLOCK_NONE  # absent or null
    vs += 1  # inside the quotes
    ve -= 1
    if ve - vs < 2 or p[vs] != 48 or p[vs + 1] != 120:
        return BLOCK_NONE  # not 0x-prefixed
    vs += 2
    if not 1 <= ve - vs <= 15:
        return BLOCK_ASK
    for i in range(vs, ve):
        if not IS_HEX[p[i]]:
            return BLOCK_ASK
        value = value * 16 + (p[i] - 48 if p[i] <= 57 else (p[i] | 32) - 87)
    return value


cdef Py_ssize_t _block_object_end(const unsigned char* p, Py_ssize_t i, Py_ssize_t n, int depth,
                                  long long* block) noexcept:
    """``_skip`` of the object at ``i`` (p[i] is '{') that also reads the block it names into
    ``block`` (``_block_value``; BLOCK_ASK when ``number`` or ``blockNumber`` comes twice or
    is neither a string nor null).  Escapes are the caller's to look for: an escaped name is
    not matched here."""
    cdef Py_ssize_t spans[4]
    cdef Py_ssize_t ke, start, end
    cdef bint escaped = 0, odd = 0
    cdef int which
    if depth >= MAX_DEPTH:
        return TOO_DEEP
    spans[0] = spans[1] = spans[2] = spans[3] = -1
    i = _ws(p, i + 1, n)
    if i < n and p[i] == 125:
        block[0] = BLOCK_NONE
        return i + 1
    while True:
        if i >= n or p[i] != 34:
            return SYNTAX
        ke = _string_end(p, i + 1, n, &escaped)
        if ke < 0:
            return SYNTAX
        which = _block_member(p, i + 1, ke - 1)
        i = _ws(p, ke, n)
        if i >= n or p[i] != 58:
            return SYNTAX
        start = _ws(p, i + 1, n)
        end = _member_end(p, start, n, depth + 1)
        if end < 0:
            return end
        if which:
            which = 2 * (which - 1)
            if spans[which] >= 0 or not (p[start] == 34 or p[start] == 110):
                odd = 1  # twice, or neither string nor null
            spans[which] = start
            spans[which + 1] = end
        i = _ws(p, end, n)
        if i >= n:
            return SYNTAX
        if p[i] == 125:
            block[0] = BLOCK_ASK if odd else _block_value(p, spans)
            return i + 1
        if p[i] != 44:
            return SYNTAX
        i = _ws(p, i + 1, n)


cdef Py_ssize_t _result_end(const unsigned char* p, Py_ssize_t i, Py_ssize_t n, int depth,
                            long long* block) noexcept:
    """``_skip`` of a response's result, reading the block it names into ``block`` as
    ``result_block`` would answer (the response is valid UTF-8): an object's is read in the
    same pass (an escape in it: BLOCK_ASK), an array's is left to ``result_block``
    (BLOCK_ASK), any other value names none."""
    cdef Py_ssize_t end
    if i < n and p[i] == 123:
        end = _block_object_end(p, i, n, depth, block)
        if end >= 0 and block[0] != BLOCK_ASK and memchr(p + i, 92, end - i) != NULL:
            block[0] = BLOCK_ASK
        return end
    block[0] = BLOCK_ASK if i < n and p[i] == 91 else BLOCK_NONE
    return _skip(p, i, n, depth)


cdef Py_ssize_t _members(bytes body, const unsigned char* p, Py_ssize_t i, Py_ssize_t n,
                         int depth, bint response, Py_ssize_t* spans,
                         long long* block) except -3:
    """Scan the object at ``i``; record [start, end) of known members (last one wins).  Of a
    response, ``block``: the block its result names, as ``result_block`` reads it (BLOCK_*)."""
    cdef Py_ssize_t ks, ke, start, end
    cdef bint escaped
    cdef int k
    cdef long long found
    if depth >= MAX_DEPTH:
        return TOO_DEEP
    i = _ws(p, i + 1, n)
    if i < n and p[i] == 125:
        return i + 1
    while True:
        if i >= n or p[i] != 34:
            return SYNTAX
        escaped = 0
        ks = i + 1
        ke = _string_end(p, ks, n, &escaped)
        if ke < 0:
            return SYNTAX
        k = _key_index(body, p, ks, ke - 1, escaped, response)
        i = _ws(p, ke, n)
        if i >= n or p[i] != 58:
            return SYNTAX
        start = _ws(p, i + 1, n)
        if k == K_RESULT:
            end = _result_end(p, start, n, depth + 1, &found)
            block[0] = found
        else:
            end = _member_end(p, start, n, depth + 1)
        if end < 0:
            return end
        if k >= 0:
            spans[2 * k] = start
            spans[2 * k + 1] = end
        i = _ws(p, end, n)
        if i >= n:
            return SYNTAX
        if p[i] == 125:
            return i + 1
        if p[i] != 44:
            return SYNTAX
        i = _ws(p, i + 1, n)


cdef str _string_value(bytes body, const unsigned char* p, Py_ssize_t start, Py_ssize_t end):
    """Decode the inside of a validated JSON string body[start:end]."""
    cdef Py_ssize_t i
    for i in range(start, end):
        if p[i] == 92:
            return json.loads(b'"' + _sub(body, start, end) + b'"')
    return PyUnicode_DecodeUTF8(<const char*>(p + start), end - start, NULL)


# Method names as str objects, by their bytes: the same few dozen names come in every batch,
# and one object per name spares each call a decode and makes every later lookup by it (the
# method table, the name's JSON, the usage tally) an identity hit.  A slot holds the last
# name that hashed to it (a client sending names of its own only makes its own calls slower).
DEF NAME_SLOTS = 256
DEF NAME_MAX = 64
cdef list _NAMES = [None] * NAME_SLOTS


cdef str _method_name(bytes body, const unsigned char* p, Py_ssize_t start, Py_ssize_t end):
    """``_string_value`` of a call's method, from the slot its bytes hash to when it is there
    (a short ASCII name without escapes; anything else is decoded as before)."""
    cdef Py_ssize_t n = end - start, i
    cdef unsigned int h = 2166136261u
    cdef unsigned char c
    cdef object found
    if n <= 0 or n > NAME_MAX:
        return _string_value(body, p, start, end)
    for i in range(start, end):
        c = p[i]
        if c >= 128 or c == 92:
            return _string_value(body, p, start, end)
        h = (h ^ c) * 16777619u
    h = (h ^ (h >> 16)) % NAME_SLOTS
    found = _NAMES[h]
    if (found is not None and PyUnicode_GET_LENGTH(<str>found) == n
            and memcmp(PyUnicode_DATA(<str>found), p + start, n) == 0):
        return <str>found
    name = PyUnicode_DecodeUTF8(<const char*>(p + start), n, NULL)
    _NAMES[h] = name
    return name


# Call ids of two or three digits as one object each: a batch numbers its calls 1, 2, 3... (a
# single byte is one of CPython's own objects already).
cdef list _IDS = [None] * 1000


cdef bytes _id_bytes(bytes body, const unsigned char* p, Py_ssize_t start, Py_ssize_t end):
    """``body[start:end]`` of a call's (validated) id; a number from 10 to 999 is its one
    object."""
    cdef Py_ssize_t i
    cdef int value = 0
    if not 2 <= end - start <= 3 or p[start] == 48:
        return _sub(body, start, end)
    for i in range(start, end):
        if not _digit(p[i]):
            return _sub(body, start, end)
        value = value * 10 + (p[i] - 48)
    found = _IDS[value]
    if found is None:
        found = _IDS[value] = _sub(body, start, end)
    return <bytes>found


cdef Call _call(bytes body, const unsigned char* p, Py_ssize_t* spans):
    cdef object id_raw = None
    cdef object method = None
    cdef object params = None
    cdef object reply_id
    cdef Py_ssize_t s, e
    cdef unsigned char c
    if spans[2 * K_ID] >= 0:
        s = spans[2 * K_ID]
        c = p[s]
        if c == 116 or c == 102 or c == 123 or c == 91:
            return _new_call(b"null", None, None, INVALID_REQUEST, MSG_BAD_ID)
        id_raw = _id_bytes(body, p, s, spans[2 * K_ID + 1])
    reply_id = b"null" if id_raw is None else id_raw
    s = spans[2 * K_JSONRPC]
    if s < 0 or not _lit(p + s, spans[2 * K_JSONRPC + 1] - s, b'"2.0"', 5):
        return _new_call(reply_id, None, None, INVALID_REQUEST, MSG_BAD_VERSION)
    s = spans[2 * K_METHOD]
    if s < 0:
        return _new_call(reply_id, None, None, INVALID_REQUEST, MSG_NO_METHOD)
    e = spans[2 * K_METHOD + 1]
    if p[s] != 34:
        return _new_call(reply_id, None, None, INVALID_REQUEST, MSG_BAD_METHOD)
    method = _method_name(body, p, s + 1, e - 1)
    s = spans[2 * K_PARAMS]
    if s >= 0:
        if p[s] != 91 and p[s] != 123:
            return _new_call(reply_id, None, None, INVALID_REQUEST, MSG_BAD_PARAMS)
        params = _sub(body, s, spans[2 * K_PARAMS + 1])
    return _new_call(id_raw, method, params, 0, "")


cdef inline void _clear(Py_ssize_t* spans) noexcept:
    cdef int k
    for k in range(2 * K_COUNT):
        spans[k] = -1


cdef bint _valid_utf8(bytes body) except -1:
    """Same rule as the pure twin: ASCII passes, anything else must decode as UTF-8."""
    if not _any_high(<const unsigned char*>PyBytes_AS_STRING(body), PyBytes_GET_SIZE(body)):
        return 1
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return 0
    return 1


cdef inline str _scan_failure(Py_ssize_t code):
    return MSG_TOO_DEEP if code == TOO_DEEP else MSG_INVALID_JSON


def parse_request(bytes body, Py_ssize_t max_batch):
    """Split a request body into calls.  Never raises: every failure is a JSON-RPC error."""
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(body)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(body)
    cdef Py_ssize_t i, end, count
    cdef Py_ssize_t spans[2 * K_COUNT]
    cdef long long block
    cdef list calls
    if not _valid_utf8(body):
        return _parsed(0, [], PARSE_ERROR, MSG_BAD_UTF8)
    i = _ws(p, 0, n)
    if i >= n:
        return _parsed(0, [], PARSE_ERROR, MSG_INVALID_JSON)
    if p[i] == 123:
        _clear(spans)
        end = _members(body, p, i, n, 0, 0, spans, &block)
        if end < 0:
            return _parsed(0, [], PARSE_ERROR, _scan_failure(end))
        if _ws(p, end, n) != n:
            return _parsed(0, [], PARSE_ERROR, MSG_INVALID_JSON)
        return _parsed(0, [_call(body, p, spans)], 0, "")
    if p[i] == 91:
        calls = []
        count = 0
        i = _ws(p, i + 1, n)
        if i < n and p[i] == 93:
            if _ws(p, i + 1, n) != n:
                return _parsed(1, [], PARSE_ERROR, MSG_INVALID_JSON)
            return _parsed(1, [], INVALID_REQUEST, MSG_EMPTY_BATCH)
        while True:
            if i < n and p[i] == 123:
                _clear(spans)
                end = _members(body, p, i, n, 1, 0, spans, &block)
                if end < 0:
                    return _parsed(1, [], PARSE_ERROR, _scan_failure(end))
                count += 1
                if count <= max_batch:
                    calls.append(_call(body, p, spans))
            else:
                end = _skip(p, i, n, 1)
                if end < 0:
                    return _parsed(1, [], PARSE_ERROR, _scan_failure(end))
                count += 1
                if count <= max_batch:
                    calls.append(_new_call(b"null", None, None, INVALID_REQUEST, MSG_BATCH_ITEM))
            i = _ws(p, end, n)
            if i >= n:
                return _parsed(1, [], PARSE_ERROR, MSG_INVALID_JSON)
            if p[i] == 93:
                break
            if p[i] != 44:
                return _parsed(1, [], PARSE_ERROR, MSG_INVALID_JSON)
            i = _ws(p, i + 1, n)
        if _ws(p, i + 1, n) != n:
            return _parsed(1, [], PARSE_ERROR, MSG_INVALID_JSON)
        if count > max_batch:
            return _parsed(1, [], INVALID_REQUEST,
                           f"invalid request: batch of {count} calls exceeds the limit of {max_batch}")
        return _parsed(1, calls, 0, "")
    end = _skip(p, i, n, 0)
    if end < 0:
        return _parsed(0, [], PARSE_ERROR, _scan_failure(end))
    if _ws(p, end, n) != n:
        return _parsed(0, [], PARSE_ERROR, MSG_INVALID_JSON)
    return _parsed(0, [], INVALID_REQUEST, MSG_NOT_CALL)


cdef long long _decimal_span(const unsigned char* p, Py_ssize_t start, Py_ssize_t end) noexcept:
    """The number that 1 to 18 decimal digits at ``start`` spell, else -1."""
    cdef Py_ssize_t i
    cdef long long value = 0
    if not 1 <= end - start <= 18:
        return -1
    for i in range(start, end):
        if not _digit(p[i]):
            return -1
        value = value * 10 + (p[i] - 48)
    return value


cdef long long _decimal_id(object raw) noexcept:
    """``Reply._number`` of an id's raw JSON (bytes; anything else: -1)."""
    if type(raw) is not bytes:
        return -1
    return _decimal_span(<const unsigned char*>PyBytes_AS_STRING(raw), 0,
                         PyBytes_GET_SIZE(<bytes>raw))


cdef bytes _decimal_bytes(long long value):
    """The digits of ``value`` (>= 0) as bytes."""
    cdef bytes out = PyBytes_FromStringAndSize(NULL, int_width(value))
    write_int(PyBytes_AS_STRING(out), value)
    return out


cdef void _set_id(Reply reply, bytes body, const unsigned char* p, Py_ssize_t start,
                  Py_ssize_t end):
    """A scanned reply's id (``start`` < 0: none): a number of ours kept as a number, its
    bytes made only if someone asks (``Reply.id``)."""
    reply._number = -1 if start < 0 else _decimal_span(p, start, end)
    if reply._number >= 0:
        reply._lazy = True
    elif start >= 0:
        reply._id = _sub(body, start, end)


cdef Reply _reply(bytes body, const unsigned char* p, Py_ssize_t* spans, long long block):
    cdef Reply reply = Reply.__new__(Reply)
    reply._block = block
    _set_id(reply, body, p, spans[2 * K_ID], spans[2 * K_ID + 1])
    reply.result = _sub(body, spans[2 * K_RESULT], spans[2 * K_RESULT + 1]) if spans[2 * K_RESULT] >= 0 else None
    reply.error = _sub(body, spans[2 * K_ERROR], spans[2 * K_ERROR + 1]) if spans[2 * K_ERROR] >= 0 else None
    return reply


def parse_response(bytes body):
    """Split an upstream response into replies; None when it is not valid JSON-RPC framing."""
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(body)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(body)
    cdef Py_ssize_t i, end
    cdef Py_ssize_t spans[2 * K_COUNT]
    cdef long long block = BLOCK_ASK
    cdef list replies
    if not _valid_utf8(body):
        return None
    i = _ws(p, 0, n)
    if i >= n:
        return None
    if p[i] == 123:
        _clear(spans)
        end = _members(body, p, i, n, 0, 1, spans, &block)
        if end < 0 or _ws(p, end, n) != n:
            return None
        return ParsedResponse(0, [_reply(body, p, spans, block)])
    if p[i] != 91:
        return None
    replies = []
    i = _ws(p, i + 1, n)
    if i < n and p[i] == 93:
        return ParsedResponse(1, []) if _ws(p, i + 1, n) == n else None
    while True:
        if i >= n:
            return None
        if p[i] == 123:
            _clear(spans)
            block = BLOCK_ASK
            end = _members(body, p, i, n, 1, 1, spans, &block)
            if end < 0:
                return None
            replies.append(_reply(body, p, spans, block))
        else:
            end = _skip(p, i, n, 1)
            if end < 0:
                return None
            replies.append(Reply(None, None, None))
        i = _ws(p, end, n)
        if i >= n:
            return None
        if p[i] == 93:
            break
        if p[i] != 44:
            return None
        i = _ws(p, i + 1, n)
    if _ws(p, i + 1, n) != n:
        return None
    return ParsedResponse(1, replies)


def array_item(bytes raw, Py_ssize_t index):
    """Raw JSON of element ``index`` of the (already validated) array ``raw``, if present."""
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(raw)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(raw)
    cdef Py_ssize_t i = _ws(p, 0, n), end, k = 0
    if i >= n or p[i] != 91:
        return None
    i = _ws(p, i + 1, n)
    if i < n and p[i] == 93:
        return None
    while i < n:
        end = _skip(p, i, n, 1)
        if end < 0:
            return None
        if k == index:
            return _sub(raw, i, end)
        k += 1
        i = _ws(p, end, n)
        if i >= n or p[i] != 44:
            return None
        i = _ws(p, i + 1, n)
    return None


def result_reply(bytes id_raw, bytes result):
    return result_reply_of(id_raw, result)


def raw_error_reply(bytes id_raw, bytes error):
    return error_reply_of(id_raw, error)


def error_reply(bytes id_raw, int code, str message):
    return b'{"jsonrpc":"2.0","id":%s,"error":{"code":%d,"message":%s}}' % (
        id_raw,
        code,
        json.dumps(message).encode(),
    )


# JSON-encoded method names: the same few dozen names come back on every call.
cdef dict _METHOD_JSON = {}
cdef Py_ssize_t _METHOD_JSON_MAX = 4096


# And the last few by the very name object (a slot by its address; the slot holds the name, so
# the address is not reused while it is there): a call's method is one of the parser's name
# objects (``_method_name``), found here without hashing.
DEF JSON_SLOTS = 64
cdef list _JSON_NAMES = [None] * JSON_SLOTS
cdef list _JSON_ENCODED = [None] * JSON_SLOTS


cdef bytes _method_json(str method):
    cdef Py_ssize_t slot = (<Py_ssize_t><void*>method >> 4) & (JSON_SLOTS - 1)
    if _JSON_NAMES[slot] is method:
        return <bytes>_JSON_ENCODED[slot]
    cdef object encoded = _METHOD_JSON.get(method)
    if encoded is None:
        encoded = json.dumps(method).encode()
        if len(_METHOD_JSON) < _METHOD_JSON_MAX:
            _METHOD_JSON[method] = encoded
    _JSON_NAMES[slot] = method
    _JSON_ENCODED[slot] = encoded
    return <bytes>encoded


def upstream_request(long long request_id, str method, object params):
    """One call as sent to a node: our own id, the client's method and raw params."""
    cdef bytes name = _method_json(method)
    cdef bytes raw = b"[]" if params is None else <bytes>params
    cdef Py_ssize_t id_len = int_width(request_id)
    cdef Py_ssize_t name_len = PyBytes_GET_SIZE(name)
    cdef Py_ssize_t raw_len = PyBytes_GET_SIZE(raw)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, 22 + id_len + 10 + name_len + 10 + raw_len + 1)
    _write_call(PyBytes_AS_STRING(out), request_id, name, raw)
    return out


cdef inline char* _write_call(char* q, long long request_id, bytes name, bytes raw) noexcept:
    """Write ``{"jsonrpc":"2.0","id":…,"method":…,"params":…}`` at ``q``; the byte after it."""
    cdef Py_ssize_t name_len = PyBytes_GET_SIZE(name), raw_len = PyBytes_GET_SIZE(raw)
    memcpy(q, b'{"jsonrpc":"2.0","id":', 22)
    q += 22
    q += write_int(q, request_id)
    memcpy(q, b',"method":', 10)
    q += 10
    memcpy(q, PyBytes_AS_STRING(name), name_len)
    q += name_len
    memcpy(q, b',"params":', 10)
    q += 10
    memcpy(q, PyBytes_AS_STRING(raw), raw_len)
    q += raw_len
    q[0] = 125
    return q + 1


def upstream_batch(long long first_id, list calls):
    """Calls (anything with ``method`` and ``params``) as one upstream batch, ids from
    ``first_id`` on (see the pure twin): sized first, then written in one allocation."""
    cdef Py_ssize_t n = len(calls), i, total = 1
    cdef list names = [None] * n, raws = [None] * n
    cdef bytes name, raw, out
    cdef object params
    cdef char* q
    if n == 0:
        return b"[]"
    for i in range(n):
        call = calls[i]
        name = _method_json(call.method)
        params = call.params
        raw = b"[]" if params is None else params  # checked: raises unless bytes
        names[i] = name
        raws[i] = raw
        total += 22 + int_width(first_id + i) + 10 + PyBytes_GET_SIZE(name) + 10 \
            + PyBytes_GET_SIZE(raw) + 1 + 1
    out = PyBytes_FromStringAndSize(NULL, total)
    q = PyBytes_AS_STRING(out)
    q[0] = 91
    q += 1
    for i in range(n):
        q = _write_call(q, first_id + i, <bytes>names[i], <bytes>raws[i])
        q[0] = 44
        q += 1
    (q - 1)[0] = 93
    return out


def join_batch(list parts):
    """``[part,part,...]`` in one allocation, each part copied once."""
    cdef Py_ssize_t i
    if not parts:
        return b"[]"
    for i in range(len(parts)):
        part = parts[i]
        if type(part) is not bytes:
            raise TypeError(f"sequence item {i}: expected bytes, {type(part).__name__} found")
    return join_present(parts)


def result_block(bytes result):
    """The block a block/transaction/receipt result belongs to, when it says (see the pure
    twin).  A plain object — no escape anywhere, each of the two members at most once, a
    string or null, 0x and 1 to 15 hex digits — is read here in one scan; anything else is
    decoded by the pure twin, whose answer it must equal.  (An upstream reply's result was
    read so while its response was scanned: ``Reply.block``.)"""
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(result)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(result)
    cdef Py_ssize_t end
    cdef long long block = BLOCK_ASK
    if n == 0 or p[0] != 123 or memchr(p, 92, n) != NULL or not _valid_utf8(result):
        return _result_block_decoded(result)
    end = _block_object_end(p, 0, n, 0, &block)
    if end < 0 or _ws(p, end, n) != n or block == BLOCK_ASK:
        return _result_block_decoded(result)
    return None if block == BLOCK_NONE else block

# cython: language_level=3
"""The RPC fast lane: the compiled twin of ``chaingate/_pure/fastlane.py``.

The pure module is the specification (read its docstring first): this one answers every
request with the same bytes, counts the same things and hands off the same requests
(tests/test_fastlane.py feeds both the same requests).  It differs in how: typed objects
with C fields, the clock read with ``clock_gettime``, answers and access-log lines assembled
with one allocation each.
"""

import logging
import time as _time
from collections import OrderedDict, defaultdict

import msgspec

cimport cython

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.object cimport PyObject
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from libc.string cimport memcmp, memcpy, memset

from cformat cimport int_width, write_int
from cjson cimport json_ws as _ws, printable_run as _printable_run
from creply cimport error_reply_of, join_present, result_reply_of

from chaingate._native.jsonrpc cimport Call, ParsedRequest, Reply, upstream_id

log = logging.getLogger("chaingate.edge")

__all__ = [
    "DEFER",
    "HANDOFF",
    "IMPLEMENTATION",
    "AnswerBudget",
    "Flight",
    "KeyAdmission",
    "Lane",
    "LatencyMeter",
    "Ledger",
    "MethodStats",
    "OpenAdmission",
    "RequestIds",
    "ResponseCache",
    "Route",
    "log_filter_ends",
    "logs_limit",
    "logs_verdict",
    "presented_key",
    "split_path_key",
]

IMPLEMENTATION = "compiled"

# Bounds of a latency histogram the meter accepts (as the pure twin).
DEF MAX_BOUNDS = 31
MAX_LATENCY_BOUNDS = MAX_BOUNDS

HANDOFF = "handoff"
DEFER = "defer"

cdef Py_ssize_t REPLY_OVERHEAD = 34
cdef enum:
    FITS = 0
    TOO_LARGE = 1
    BUSY = 2

cdef enum:
    NO_CACHE = 0
    STATIC = 1
    FINALIZED = 2

from chaingate.framing_constants import ADMITTED as _ADMITTED
from chaingate.framing_constants import DAY_QUOTA as _DAY_QUOTA
from chaingate.framing_constants import JSON_HEADERS as _JSON_HEADERS
from chaingate.framing_constants import NO_READ_SCOPE as _NO_READ_SCOPE
from chaingate.framing_constants import NO_WRITE_SCOPE as _NO_WRITE_SCOPE
from chaingate.framing_constants import RATE as _RATE

# Why an admission was refused (one definition, in framing_constants).
cdef int ADMITTED = _ADMITTED
cdef int NO_READ_SCOPE = _NO_READ_SCOPE
cdef int NO_WRITE_SCOPE = _NO_WRITE_SCOPE
cdef int DAY_QUOTA = _DAY_QUOTA
cdef int RATE = _RATE

from chaingate.refusals import refusal_error

# ``seconds`` of a metering sample that carries no latency (``twintypes.metering.UNTIMED``).
DEF UNTIMED = -1.0

cdef int INVALID_PARAMS = -32602
cdef int METHOD_NOT_FOUND = -32601
cdef str BAD_TAG_MESSAGE = (
    "invalid params: the block tag must be latest, pending, safe, finalized, earliest, "
    "a hex number, a block hash or an EIP-1898 object"
)
cdef str BAD_SLOT_MESSAGE = "invalid params: the slot must be a non-negative integer"
cdef bytes UNSENT = b'{"code":-32603,"message":"internal error: the call was not sent; retry"}'
cdef str ANSWER_TOO_LARGE = "answer_too_large"
cdef str OVERLOADED = "overloaded"
cdef str INTERNAL_ERROR_MESSAGE = "internal error; retry with exponential backoff"
cdef double SECONDS_PER_DAY = 86400.0
cdef tuple KEY_SHAPES = (b"svc_live_", b"svc_test_")

cdef bytes JSON = _JSON_HEADERS
cdef bytes HIT = b"HIT"
cdef bytes MISS = b"MISS"
cdef bytes PARTIAL = b"PARTIAL"
cdef dict _CACHE_HEADERS = {
    cache: JSON + b"X-Cache: " + cache + b"\r\n" for cache in (HIT, MISS, PARTIAL)
}
cdef bytes X_REQUEST_ID = b"X-Request-Id: "
# The named tags: these four (``_is_current`` compares them in C) and "earliest".
cdef frozenset _CURRENT_TAGS = frozenset({b'"latest"', b'"pending"', b'"safe"', b'"finalized"'})

cdef bint ID_OK[256]
cdef bint HEX_OK[256]

# What becomes of an eth_getLogs block range (as the pure twin).
LOGS_FORWARD, LOGS_REFUSE, LOGS_SPLIT = 0, 1, 2
cdef enum:
    C_LOGS_FORWARD = 0
    C_LOGS_REFUSE = 1
    C_LOGS_SPLIT = 2


cdef inline bint _is_current(bytes tag) noexcept:
    """``tag in _CURRENT_TAGS``, by length and bytes (a batch reads several tags per call)."""
    cdef Py_ssize_t n = PyBytes_GET_SIZE(tag)
    cdef const char* p = PyBytes_AS_STRING(tag)
    if n == 8:
        return memcmp(p, b'"latest"', 8) == 0
    if n == 9:
        return memcmp(p, b'"pending"', 9) == 0
    if n == 6:
        return memcmp(p, b'"safe"', 6) == 0
    if n == 11:
        return memcmp(p, b'"finalized"', 11) == 0
    return False


cdef inline bint _current(object tag) except -1:
    """Is this block tag (raw JSON bytes, or None) a head tag (``_CURRENT_TAGS``)?"""
    if type(tag) is bytes:
        return _is_current(<bytes>tag)
    return tag is not None and tag in _CURRENT_TAGS


cdef inline long long _logs_limit(long long network_blocks, long long plan_blocks) noexcept:
    if plan_blocks and (not network_blocks or plan_blocks < network_blocks):
        return plan_blocks
    return network_blocks


cdef inline int _logs_verdict(long long low, long long high, long long limit_blocks,
                              long long upstream_blocks) noexcept:
    cdef long long span
    if high < low:
        return C_LOGS_FORWARD
    span = high - low + 1
    if limit_blocks and span > limit_blocks:
        return C_LOGS_REFUSE
    if not upstream_blocks or span <= upstream_blocks:
        return C_LOGS_FORWARD
    return C_LOGS_SPLIT


def logs_limit(long long network_blocks, long long plan_blocks):
    """The widest eth_getLogs range a caller may ask for (0: no limit; see the pure twin)."""
    return _logs_limit(network_blocks, plan_blocks)


def logs_verdict(long long low, long long high, long long limit_blocks,
                 long long upstream_blocks):
    """The range rule of eth_getLogs: LOGS_FORWARD, LOGS_REFUSE or LOGS_SPLIT (see the pure
    twin)."""
    return _logs_verdict(low, high, limit_blocks, upstream_blocks)


_LogFilter = msgspec.defstruct(
    "_LogFilter",
    [(name, msgspec.Raw, msgspec.Raw()) for name in ("fromBlock", "toBlock", "blockHash")],
)


_log_filter = msgspec.json.Decoder(tuple[_LogFilter])
cdef bytes _ABSENT = b""


cdef inline Py_ssize_t _plain_string_end(const unsigned char* p, Py_ssize_t i,
                                         Py_ssize_t n) noexcept:
    """After the string opening at ``i``: printable ASCII without escapes; else -1."""
    i = _printable_run(p, i + 1, n)
    return i + 1 if i < n and p[i] == 34 else -1


cdef Py_ssize_t _plain_value_end(const unsigned char* p, Py_ssize_t i, Py_ssize_t n,
                                 int depth) noexcept:
    """After the value at ``i``: a plain string, null, or an array of them (topics); -1 for
    anything else (numbers, objects, escapes...: the decoder reads those)."""
    cdef unsigned char c
    if i >= n:
        return -1
    c = p[i]
    if c == 34:
        return _plain_string_end(p, i, n)
    if c == 110:  # null
        if n - i >= 4 and p[i + 1] == 117 and p[i + 2] == 108 and p[i + 3] == 108:
            return i + 4
        return -1
    if c != 91 or depth >= 4:
        return -1
    i = _ws(p, i + 1, n)
    if i < n and p[i] == 93:
        return i + 1
    while True:
        i = _plain_value_end(p, i, n, depth + 1)
        if i < 0:
            return -1
        i = _ws(p, i, n)
        if i >= n:
            return -1
        if p[i] == 93:
            return i + 1
        if p[i] != 44:
            return -1
        i = _ws(p, i + 1, n)


cdef Py_ssize_t _flat_value_end(const unsigned char* p, Py_ssize_t i, Py_ssize_t n) noexcept:
    """After the value at ``i`` of a call's params (validated JSON): a plain string (printable
    ASCII, no escapes: ``_plain_string_end``), null, true, false, or an object of such strings
    and nulls (eth_call's transaction, an EIP-1898 tag); -1 for anything else (numbers, arrays,
    escapes, other bytes, nesting...: ``array_item`` reads those)."""
    cdef unsigned char c
    if i >= n:
        return -1
    c = p[i]
    if c == 34:
        return _plain_string_end(p, i, n)
    if c == 110:
        return i + 4 if n - i >= 4 and memcmp(p + i, b"null", 4) == 0 else -1
    if c == 116:
        return i + 4 if n - i >= 4 and memcmp(p + i, b"true", 4) == 0 else -1
    if c == 102:
        return i + 5 if n - i >= 5 and memcmp(p + i, b"false", 5) == 0 else -1
    if c != 123:
        return -1
    i = _ws(p, i + 1, n)
    if i < n and p[i] == 125:
        return i + 1
    while True:
        if i >= n or p[i] != 34:
            return -1
        i = _plain_string_end(p, i, n)
        if i < 0:
            return -1
        i = _ws(p, i, n)
        if i >= n or p[i] != 58:
            return -1
        i = _ws(p, i + 1, n)
        if i < n and p[i] == 34:
            i = _plain_string_end(p, i, n)
        elif n - i >= 4 and memcmp(p + i, b"null", 4) == 0:
            i += 4
        else:
            return -1
        if i < 0:
            return -1
        i = _ws(p, i, n)
        if i >= n:
            return -1
        if p[i] == 125:
            return i + 1
        if p[i] != 44:
            return -1
        i = _ws(p, i + 1, n)


cdef bint _plain_log_spans(const unsigned char* p, Py_ssize_t n, Py_ssize_t* spans) noexcept:
    """Where the raw JSON of fromBlock, toBlock and blockHash lie in ``[{...}]`` whose members
    are plain strings, nulls and arrays of them, none of the three twice: spans[0:2],
    spans[2:4], spans[4:6] (-1: absent).  False: anything else (the decoder reads it)."""
    cdef Py_ssize_t i, key, end, value
    cdef int seen = 0, which
    spans[0] = spans[1] = spans[2] = spans[3] = spans[4] = spans[5] = -1
    i = _ws(p, 0, n)
    if i >= n or p[i] != 91:
        return False
    i = _ws(p, i + 1, n)
    if i >= n or p[i] != 123:
        return False
    i = _ws(p, i + 1, n)
    if i < n and p[i] == 125:
        i += 1
    else:
        while True:
            if i >= n or p[i] != 34:
                return False
            key = i + 1
            end = _plain_string_end(p, i, n)
            if end < 0:
                return False
            i = _ws(p, end, n)
            if i >= n or p[i] != 58:
                return False
            value = _ws(p, i + 1, n)
            i = _plain_value_end(p, value, n, 0)
            if i < 0:
                return False
            which = 0
            if end - 1 - key == 9 and memcmp(p + key, b"fromBlock", 9) == 0:
                which = 1
            elif end - 1 - key == 7 and memcmp(p + key, b"toBlock", 7) == 0:
                which = 2
            elif end - 1 - key == 9 and memcmp(p + key, b"blockHash", 9) == 0:
                which = 4
            if which:
                if seen & which:
                    return False
                seen |= which
                which = 2 * (which >> 1)  # 1 -> 0, 2 -> 2, 4 -> 4
                spans[which] = value
                spans[which + 1] = i
            i = _ws(p, i, n)
            if i >= n:
                return False
            if p[i] == 125:
                i += 1
                break
            if p[i] != 44:
                return False
            i = _ws(p, i + 1, n)
    i = _ws(p, i, n)
    if i >= n or p[i] != 93:
        return False
    return _ws(p, i + 1, n) == n


cdef inline bytes _span_bytes(const unsigned char* p, Py_ssize_t* spans, int which):
    if spans[which] < 0:
        return _ABSENT
    return PyBytes_FromStringAndSize(<const char*>p + spans[which],
                                     spans[which + 1] - spans[which])


cdef object _plain_log_filter(bytes params):
    """(fromBlock, toBlock, blockHash) of a plain filter (``_plain_log_spans``); None: anything
    else (the decoder reads it)."""
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(params)
    cdef Py_ssize_t spans[6]
    if not _plain_log_spans(p, PyBytes_GET_SIZE(params), spans):
        return None
    return (_span_bytes(p, spans, 0), _span_bytes(p, spans, 2), _span_bytes(p, spans, 4))


def log_filter_ends(params):
    """The raw JSON of an eth_getLogs call's one filter's fromBlock, toBlock and blockHash
    (empty when absent), or None when the params are not one filter object (see the pure
    twin, whose answer this must equal): the usual filter in one scan, anything else decoded."""
    return _log_filter_ends(params)


cdef object _log_filter_ends(object params):
    if type(params) is bytes:
        ends = _plain_log_filter(<bytes>params)
        if ends is not None:
            return ends
    try:
        (query,) = _log_filter.decode(params)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return bytes(query.fromBlock), bytes(query.toBlock), bytes(query.blockHash)


cdef inline bint _head_tag(const unsigned char* p, Py_ssize_t n) noexcept:
    """Is this raw JSON a head tag: one of _CURRENT_TAGS, compared where it lies?"""
    if n == 8:
        return memcmp(p, b'"latest"', 8) == 0
    if n == 9:
        return memcmp(p, b'"pending"', 9) == 0
    if n == 6:
        return memcmp(p, b'"safe"', 6) == 0
    return n == 11 and memcmp(p, b'"finalized"', 11) == 0


# The named tags as one object each: a call's tag is nearly always one of them, and is then
# this object rather than a copy of its bytes.
cdef bytes _LATEST = b'"latest"'
cdef bytes _PENDING = b'"pending"'
cdef bytes _SAFE = b'"safe"'
cdef bytes _FINALIZED = b'"finalized"'
cdef bytes _EARLIEST = b'"earliest"'


cdef bytes _tag_bytes(const unsigned char* p, Py_ssize_t n):
    """The raw JSON tag of ``n`` bytes at ``p``, as bytes (a named tag: its one object)."""
    if n == 8 and memcmp(p, b'"latest"', 8) == 0:
        return _LATEST
    if n == 9 and memcmp(p, b'"pending"', 9) == 0:
        return _PENDING
    if n == 6 and memcmp(p, b'"safe"', 6) == 0:
        return _SAFE
    if n == 11 and memcmp(p, b'"finalized"', 11) == 0:
        return _FINALIZED
    if n == 10 and memcmp(p, b'"earliest"', 10) == 0:
        return _EARLIEST
    return PyBytes_FromStringAndSize(<const char*>p, n)


cdef inline bint _wants_head(const unsigned char* p, Py_ssize_t n) noexcept:
    """Is this end of a range the head (absent, or a head tag)?"""
    return n == 0 or _head_tag(p, n)


cdef long long _logs_bound(const unsigned char* p, Py_ssize_t n, object head) except -2:
    """The block one end of a range (its raw JSON, ``n`` bytes; none: absent) names, as the
    lane reads it; -1: the handler reads it (see the pure twin)."""
    cdef Py_ssize_t i
    cdef long long value = 0
    cdef unsigned char c
    if n == 0:
        return -1 if head is None else <long long>head
    if 4 < n <= 19 and p[0] == 34 and p[1] == 48 and p[2] == 120 and p[n - 1] == 34:
        for i in range(3, n - 1):
            c = p[i]
            if not HEX_OK[c]:
                return -1
            value = value * 16 + (c - 48 if c <= 57 else (c | 32) - 87)
        return value
    if _head_tag(p, n):
        return -1 if head is None else <long long>head
    if n == 10 and memcmp(p, b'"earliest"', 10) == 0:
        return 0
    return -1


cdef void _init_tables():
    cdef int i
    for i in range(256):
        ID_OK[i] = (48 <= i <= 57) or (65 <= i <= 90) or (97 <= i <= 122) or i in (46, 95, 58, 45)
        HEX_OK[i] = (48 <= i <= 57) or (65 <= i <= 70) or (97 <= i <= 102)


_init_tables()


cdef extern from "time.h":
    ctypedef long time_t
    cdef struct timespec:
        time_t tv_sec
        long tv_nsec
    int clock_gettime(int clk_id, timespec *tp) nogil
    enum: CLOCK_MONOTONIC
    enum: CLOCK_REALTIME


cdef inline double _clock(int which) noexcept:
    cdef timespec ts
    clock_gettime(which, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef inline double monotonic() noexcept:
    """time.monotonic() and time.perf_counter() (the same clock on Linux)."""
    return _clock(CLOCK_MONOTONIC)


cdef inline double wall() noexcept:
    """time.time()."""
    return _clock(CLOCK_REALTIME)


cdef class Lane
cdef class Pending


cdef class MethodStats:
    """Call counters of one method on one network (read by /metrics)."""

    cdef public long long ok
    cdef public long long error
    cdef public long long cache_hits


cdef class AnswerBudget:
    """Reply bytes held by batches being assembled, all requests of the process together."""

    cdef public long long held
    cdef public long long limit
    cdef public long long refused

    def __init__(self, long long limit):
        self.limit = limit
        self.held = 0
        self.refused = 0

    @property
    def exhausted(self):
        return self.held >= self.limit

    cpdef bint take(self, long long size):
        if self.held + size > self.limit:
            self.refused += 1
            return False
        self.held += size
        return True

    cpdef give_back(self, long long size):
        self.held = self.held - size if self.held > size else 0


cdef Py_ssize_t _ENTRY_OVERHEAD = 160


cdef class ResponseCache:
    """A bounded LRU of results that can no longer change (see the pure twin)."""

    cdef object _entries
    cdef Py_ssize_t _max_entries
    cdef Py_ssize_t _max_bytes
    cdef public Py_ssize_t bytes
    cdef public long long hits
    cdef public long long misses
    cdef public long long evictions
    cdef object _move

    def __init__(self, Py_ssize_t max_entries, Py_ssize_t max_bytes):
        self._entries = OrderedDict()
        self._move = self._entries.move_to_end
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def __len__(self):
        return len(self._entries)

    cpdef object get(self, tuple key):
        return self.lookup(key, hash(key))

    cdef object lookup(self, tuple key, Py_hash_t key_hash):
        """``get``, the key's hash given (an OrderedDict keeps its items as a dict does)."""
        cdef PyObject* found
        if cg_dict_find_hashed(self._entries, key, key_hash, &found) == 0:
            self.misses += 1
            return None
        value = <object>found
        self._move(key)
        self.hits += 1
        return value

    cpdef put(self, tuple key, bytes value):
        cdef Py_ssize_t size = len(value) + len(<bytes>key[1]) + _ENTRY_OVERHEAD
        if size > self._max_bytes or self._max_entries <= 0:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= len(<bytes>old) + len(<bytes>key[1]) + _ENTRY_OVERHEAD
        self._entries[key] = value
        self.bytes += size
        while len(self._entries) > self._max_entries or self.bytes > self._max_bytes:
            old_key, old_value = self._entries.popitem(last=False)
            self.bytes -= len(<bytes>old_value) + len(<bytes>old_key[1]) + _ENTRY_OVERHEAD
            self.evictions += 1


cdef class RequestIds:
    """``X-Request-Id`` values: the client's own when sane, else ``<prefix>-<hex counter>``."""

    cdef bytes _prefix
    cdef unsigned long long _counter

    def __init__(self, bytes prefix):
        self._prefix = prefix
        self._counter = 0

    cpdef bytes take(self, object supplied):
        cdef Py_ssize_t n, i
        cdef const unsigned char* p
        if supplied is not None:
            n = PyBytes_GET_SIZE(supplied)
            if 0 < n <= 128:
                p = <const unsigned char*>PyBytes_AS_STRING(supplied)
                for i in range(n):
                    if not ID_OK[p[i]]:
                        break
                else:
                    return supplied
        self._counter += 1
        return _counted_id(self._prefix, self._counter)


cdef const char* HEX_DIGITS = b"0123456789abcdef"


cdef bytes _counted_id(bytes prefix, unsigned long long counter):
    """``b"%s-%x" % (prefix, counter)``, written in one allocation."""
    cdef Py_ssize_t prefix_len = PyBytes_GET_SIZE(prefix), digits = 1, i
    cdef unsigned long long rest = counter >> 4
    while rest:
        digits += 1
        rest >>= 4
    cdef bytes out = PyBytes_FromStringAndSize(NULL, prefix_len + 1 + digits)
    cdef char* q = _put(PyBytes_AS_STRING(out), PyBytes_AS_STRING(prefix), prefix_len)
    q[0] = 45  # "-"
    for i in range(digits, 0, -1):
        q[i] = HEX_DIGITS[counter & 15]
        counter >>= 4
    return out


cdef bint valid_block_tag(bytes tag, bint solana):
    cdef Py_ssize_t n = PyBytes_GET_SIZE(tag), i
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(tag)
    if solana:
        if n == 0:
            return False
        for i in range(n):
            if not (48 <= p[i] <= 57):
                return False
        return True
    if _is_current(tag) or (n == 10 and memcmp(p, b'"earliest"', 10) == 0) or (
            n > 0 and p[0] == 123):
        return True
    if n < 5 or p[0] != 34 or p[1] != 48 or p[2] != 120 or p[n - 1] != 34:
        return False
    if n - 4 > 64:
        return False
    for i in range(3, n - 1):
        if not HEX_OK[p[i]]:
            return False
    return True


cdef inline object _presented_key(request, object path_key):
    cdef object raw = request.api_key, authorization
    if raw is None:
        authorization = request.authorization
        if authorization is not None and (<bytes>authorization)[:7].lower() == b"bearer ":
            raw = (<bytes>authorization)[7:].strip()
    if path_key is None:
        return raw
    if raw is not None and raw != path_key:
        return None
    return path_key


cdef inline tuple _split_path_key(bytes path):
    head, _, key = path.rpartition(b"/")
    if (<bytes>key).startswith(KEY_SHAPES) and not (<bytes>head).endswith(b"/"):
        return head, key
    return path, None


def split_path_key(bytes path):
    """(endpoint path, key) of a path whose last segment is key-shaped, else (path, None)
    (see the pure twin)."""
    return _split_path_key(path)


def presented_key(request, path_key=None):
    """The API key a request presents: X-API-Key, else Authorization: Bearer, else the key in
    its path, which a header's key must equal (see the pure twin)."""
    return _presented_key(request, path_key)


cdef class Method:
    """One row of the method table as the lane reads it (built from ``MethodSpec``)."""

    cdef readonly object spec
    cdef readonly str name
    cdef readonly bytes name_json  # the name as a JSON string (access log)
    cdef readonly long long cu
    cdef readonly long long tcu
    cdef long long cu_historical  # -1: no historical price
    cdef Py_ssize_t block_param  # -1: no block parameter
    cdef int cache
    cdef readonly bint retry
    cdef readonly bint write
    cdef readonly bint coalescible
    cdef readonly MethodStats stats
    cdef readonly bint special
    cdef readonly bint commitment  # a Solana row cached once final (see the pure twin)
    # Its name (its key in the route's table) is one of the route's sticky methods, of its
    # watched ones.
    cdef bint sticky
    cdef bint watched

    def __init__(self, spec, MethodStats stats, bint special, bint solana=False):
        self.spec = spec
        self.name = spec.name
        self.name_json = msgspec.json.encode(spec.name)
        self.cu = spec.cu
        self.tcu = spec.tcu
        self.cu_historical = -1 if spec.cu_historical is None else spec.cu_historical
        self.block_param = -1 if spec.block_param is None else spec.block_param
        self.cache = {"none": NO_CACHE, "static": STATIC, "finalized": FINALIZED}[spec.cache]
        self.retry = spec.retry
        self.write = spec.scope == "rpc:write"
        self.coalescible = self.retry and not self.write
        self.stats = stats
        self.special = special
        self.commitment = solana and self.cache == FINALIZED

    def price(self, tag):
        """(billed, throughput) units; a historical block tag scales both alike."""
        cdef long long cu = 0, tcu = 0
        self.charge(tag, &cu, &tcu)
        return cu, tcu

    def may_be_cached(self, tag, params=None):
        """Could the cache hold this call's answer?  (A 'latest' answer never enters it, nor
        on Solana one read at a commitment short of finalized.)"""
        return self.cacheable(tag, params)

    cdef inline void charge(self, object tag, long long* cu, long long* tcu):
        if self.cu_historical >= 0 and tag is not None and not _current(tag):
            cu[0] = self.cu_historical
            tcu[0] = self.tcu * self.cu_historical // (self.cu if self.cu > 1 else 1)
        else:
            cu[0] = self.cu
            tcu[0] = self.tcu

    cdef inline bint cacheable(self, object tag, object params):
        if self.cache == STATIC:
            return True
        if self.cache == NO_CACHE:
            return False
        if (self.commitment and params is not None and b'"commitment"' in <bytes>params
                and b'"finalized"' not in <bytes>params):
            return False
        return self.block_param < 0 or (tag is not None and not _current(tag))


# The flights table by a key's hash computed once, when the flight is made: a flight is
# looked up, listed, found again and delisted by the same key, and a (method, params) tuple's
# hash is not kept by the tuple (CPython's own calls, which the plain ones make after hashing).
cdef extern from *:
    """
    #if PY_VERSION_HEX < 0x030D0000
    #define cg_dict_get_hashed(d, k, h) _PyDict_GetItem_KnownHash(d, k, h)
    #define cg_dict_set_hashed(d, k, v, h) _PyDict_SetItem_KnownHash(d, k, v, h)
    #define cg_dict_del_hashed(d, k, h) _PyDict_DelItem_KnownHash(d, k, h)
    #else
    #define cg_dict_get_hashed(d, k, h) PyDict_GetItemWithError(d, k)
    #define cg_dict_set_hashed(d, k, v, h) PyDict_SetItem(d, k, v)
    #define cg_dict_del_hashed(d, k, h) PyDict_DelItem(d, k)
    #endif
    /* The value under k (borrowed) in *out: 1, or 0 when there is none, -1 on an error. */
    static int cg_dict_find_hashed(PyObject* d, PyObject* k, Py_hash_t h, PyObject** out) {
        *out = cg_dict_get_hashed(d, k, h);
        if (*out != NULL)
            return 1;
        return PyErr_Occurred() ? -1 : 0;
    }
    """
    int cg_dict_find_hashed(object d, object k, Py_hash_t h, PyObject** out) except -1
    int cg_dict_set_hashed(object d, object k, object v, Py_hash_t h) except -1
    int cg_dict_del_hashed(object d, object k, Py_hash_t h) except -1


cdef inline Flight _listed(dict flights, tuple key, Py_hash_t key_hash):
    """``flights.get(key)``, the key's hash given."""
    cdef PyObject* found
    if cg_dict_find_hashed(flights, key, key_hash, &found) == 0:
        return None
    return <Flight><object>found


cdef inline int _delist(dict flights, Flight flight) except -1:
    """``if flights.get(flight.key) is flight: del flights[flight.key]``."""
    cdef PyObject* found
    if (cg_dict_find_hashed(flights, flight.key, flight.key_hash, &found) == 1
            and found == <PyObject*>flight):
        cg_dict_del_hashed(flights, flight.key, flight.key_hash)
    return 0


@cython.freelist(64)  # one per call of a batch: their memory taken and given back in turn
cdef class Flight:
    """One upstream call in flight, and every answer waiting for it."""

    cdef readonly tuple key
    cdef Py_hash_t key_hash
    cdef readonly str method
    cdef readonly object params
    cdef readonly Method spec
    cdef readonly object tag
    cdef public bint done
    cdef public object result
    cdef public object error
    # Each waiter's answer and position: the first in fields (most flights have one), the
    # others in ``waiters`` (pending, index, pending, index...; None: none).
    cdef Pending first
    cdef Py_ssize_t first_index
    cdef list waiters
    cdef public object future
    # Is its method one of its route's watched ones?  Known when the route opens it; -1: not
    # known (a flight made by its constructor: looked up as it lands).
    cdef signed char watched

    def __init__(self, tuple key, object params, Method spec, object tag):
        self.key = key
        self.key_hash = hash(key)
        self.method = key[0]
        self.params = params
        self.spec = spec
        self.tag = tag
        self.done = False
        self.result = None
        self.error = None
        self.future = None
        self.watched = -1


cdef inline Flight _new_flight(tuple key, Py_hash_t key_hash, object params, Method spec,
                               object tag):
    """``Flight(key, params, spec, tag)`` without a Python-level call (the key's hash given)."""
    cdef Flight flight = Flight.__new__(Flight)
    flight.key = key
    flight.key_hash = key_hash
    flight.method = key[0]
    flight.params = params
    flight.spec = spec
    flight.tag = tag
    return flight


cdef inline tuple _call_key(Call call):
    """A call's key in the cache and the flights table: (method, raw params; b"": none)."""
    params = call.params
    return (call.method, params if params is not None else b"")


cdef class Route:
    """One ``/v1/rpc/{chain}/{network}`` endpoint: its table, cache, flights and counters."""

    cdef readonly str label
    cdef readonly str family
    cdef bint solana
    cdef readonly bint testnet
    cdef readonly ResponseCache cache
    cdef readonly object jsonrpc
    cdef object _parse
    cdef object _error_reply
    cdef object _array_item
    cdef readonly Py_ssize_t max_batch
    cdef readonly Py_ssize_t max_answer
    cdef readonly Py_ssize_t max_single
    cdef readonly bint coalesce
    cdef readonly Py_ssize_t upstream_batch
    cdef readonly dict refusals
    cdef readonly object stats
    cdef readonly MethodStats invalid
    cdef readonly MethodStats unknown
    cdef readonly dict methods
    cdef readonly Method passthrough
    cdef readonly object sticky
    cdef readonly frozenset sticky_methods
    cdef readonly dict flights
    cdef list held
    cdef readonly frozenset watched
    cdef public long long coalesced
    cdef readonly dict refused
    cdef public AnswerBudget budget
    cdef public object dispatch
    cdef readonly Method logs_method
    cdef readonly long long logs_blocks
    cdef readonly long long logs_upstream
    cdef public object logs_head
    # Set by the RPC service: the highest block known final (-1: none yet), and the family's
    # reader of the block a result belongs to; a receipt above it skips the service (_land_reply).
    cdef public long long finalized
    cdef public object reply_block

    def __init__(
        self,
        str label,
        str family,
        bint testnet,
        dict methods,
        passthrough,
        ResponseCache cache,
        jsonrpc,
        *,
        Py_ssize_t max_batch,
        Py_ssize_t max_answer,
        bint coalesce,
        Py_ssize_t upstream_batch,
        dict refusals,
        frozenset python_methods=frozenset(),
        sticky=None,
        frozenset sticky_methods=frozenset(),
        tuple logs=None,
        frozenset watched=frozenset(),
    ):
        self.label = label
        self.family = family
        self.solana = family == "solana"
        self.testnet = testnet
        self.cache = cache
        self.jsonrpc = jsonrpc
        self._parse = jsonrpc.parse_request
        self._error_reply = jsonrpc.error_reply
        self._array_item = jsonrpc.array_item
        self.max_batch = max_batch
        self.max_answer = max_answer
        self.max_single = max_answer - REPLY_OVERHEAD
        self.coalesce = coalesce
        self.upstream_batch = upstream_batch if upstream_batch > 1 else 1
        self.refusals = refusals
        self.stats = defaultdict(MethodStats)
        self.invalid = self.stats["invalid"]
        self.unknown = self.stats["unknown"]
        self.methods = {
            name: Method(spec, self.stats[spec.name], name in python_methods, self.solana)
            for name, spec in methods.items()
        }
        cdef Method row
        for name, row in self.methods.items():
            row.sticky = name in sticky_methods
            row.watched = name in watched
        self.passthrough = (
            Method(passthrough, self.stats[passthrough.name], False)
            if passthrough is not None
            else None
        )
        self.sticky = sticky
        self.sticky_methods = sticky_methods
        self.flights = {}
        self.held = []
        self.watched = watched
        self.coalesced = 0
        self.refused = {ANSWER_TOO_LARGE: 0, OVERLOADED: 0}
        self.budget = AnswerBudget(1 << 62)
        self.dispatch = None
        self.logs_method = self.methods.get("eth_getLogs") if logs is not None else None
        self.logs_blocks, self.logs_upstream = logs or (0, 0)
        self.logs_head = _no_head
        self.finalized = -1
        self.reply_block = None

    cpdef Flight open_flight(self, tuple key, object params, Method spec, object tag):
        cdef Flight flight = self._open(key, hash(key), params, spec, tag)
        flight.watched = key[0] in self.watched
        return flight

    cdef Flight _open(self, tuple key, Py_hash_t key_hash, object params, Method spec,
                      object tag):
        """A new flight of a call whose row is ``spec``, found in the table by the call's
        method (``key[0]``), else the passthrough."""
        cdef Flight flight = _new_flight(key, key_hash, params, spec, tag)
        flight.watched = spec.watched if spec is not self.passthrough else key[0] in self.watched
        if self.coalesce and spec.coalescible:
            cg_dict_set_hashed(self.flights, key, flight, key_hash)
        return flight

    cpdef land(self, Flight flight, object result, object error):
        """A flight's outcome: every answer waiting for it gets its reply."""
        if flight.done:
            return
        flight.done = True
        flight.result = result
        flight.error = error
        _delist(self.flights, flight)
        if flight.future is not None:
            flight.future.set_result((result, error))
        cdef Pending first = flight.first
        cdef list waiters = flight.waiters
        cdef Py_ssize_t at
        flight.first = None
        flight.waiters = None
        if first is not None:
            _place(first, flight.first_index, result, error)
        if waiters is not None:
            for at in range(0, len(waiters), 2):
                _place(<Pending>waiters[at], waiters[at + 1], result, error)

    cpdef land_replies(self, list flights, long long first_id, replies, look, bad,
                       bytes missing):
        """Land a group's upstream answer, each reply on the flight its id names (see the
        pure twin)."""
        cdef Py_ssize_t count = len(flights)
        cdef long long index
        cdef Flight flight
        cdef Reply reply
        if count == 1 and len(replies) == 1:
            self._land_reply(<Flight>flights[0], replies[0], look, bad)
        else:
            for reply in replies:
                index = upstream_id(reply) - first_id
                if 0 <= index < count:
                    self._land_reply(<Flight>flights[index], reply, look, bad)
        for flight in flights:
            if not flight.done:
                self.land(flight, None, missing)

    cdef int _land_reply(self, Flight flight, Reply reply, look, bad) except -1:
        cdef Method spec
        if flight.done:
            return 0
        result = reply.result
        error = reply.error
        if error is not None or result is None:
            if error is not None and PyBytes_GET_SIZE(error) and (<bytes>error)[0] == 123:
                self.land(flight, None, error)
            else:
                self.land(flight, None, bad())
            return 0
        spec = flight.spec
        if (
            spec.cache != NO_CACHE and result != b"null"
            and spec.cacheable(flight.tag, flight.params)
            and self._may_be_final(spec, reply)
        ) or self._watched(flight):
            look(flight, result)
        self.land(flight, result, None)
        return 0

    cdef inline bint _watched(self, Flight flight) except -1:
        """Is this flight's method one of the watched ones (``Flight.watched``)?"""
        if flight.watched >= 0:
            return flight.watched
        return flight.method in self.watched

    cdef bint _may_be_final(self, Method spec, reply) except -1:
        """May the service find this cacheable result final?  No when it is about a block
        above the last final one: a receipt of a recent transaction does not go the service's
        way (``RpcService._maybe_cache``, which decides) only to be refused there."""
        if spec.cache == STATIC or spec.block_param >= 0 or self.reply_block is None:
            return True
        number = self.reply_block(reply)
        return number is not None and number <= self.finalized

    cpdef bint wants(self, list flights, Py_ssize_t length) except -1:
        """Does anyone still want the answer of this group of flights, whose body of
        ``length`` bytes (-1: not declared) starts arriving?  A batch that holds replies
        already and could not take the whole body is over its bound: it gives up its reads
        here, before the body is read.  Wanted by nobody, the flights leave the table (no
        call joins them any more) and the body is dropped unread."""
        cdef Flight flight
        for flight in flights:
            if not flight.done and (
                flight.future is not None
                or (flight.spec.cache != NO_CACHE
                    and flight.spec.cacheable(flight.tag, flight.params))
            ):
                return True
        cdef Py_ssize_t at
        cdef list waiters
        for flight in flights:
            if flight.first is not None and self._still_wanted(
                    flight.first, flight.first_index, length):
                return True
            waiters = flight.waiters
            if waiters is None:
                continue
            for at in range(0, len(waiters), 2):
                if self._still_wanted(<Pending>waiters[at], waiters[at + 1], length):
                    return True
        for flight in flights:
            _delist(self.flights, flight)
        return False

    cdef bint _still_wanted(self, Pending pending, Py_ssize_t index,
                            Py_ssize_t length) except -1:
        """Does this waiter still wait for its call, once an answer of ``length`` bytes over
        its batch's bound made it give up its reads (``wants``)?"""
        if pending.methods[index] is None:
            return False
        if pending.batch and pending.used and pending.used + length > self.max_answer:
            pending.over = True
            pending.give_up_reads()
            if pending.left == 0:
                pending.lane.finish(pending)
        return pending.methods[index] is not None  # a write is never given up

    cdef void _send(self, list safe, list unsafe) except *:
        cdef Py_ssize_t size = self.upstream_batch, start
        cdef Flight flight
        for flights in (safe, unsafe):
            for start in range(0, len(flights), size):
                group = flights[start:start + size]
                try:
                    self.dispatch(group)
                except Exception:
                    log.exception("unhandled error sending calls upstream")
                    for flight in group:
                        self.land(flight, None, UNSENT)

    cpdef bytes refuse(self, str reason, bint executed, long long calls=1):
        self.refused[reason] += calls
        if reason == OVERLOADED:
            return self.refusals["busy_write" if executed else "busy"]
        return self.refusals["too_large_write" if executed else "too_large"]

    def classify(self, call):
        """(method row, raw block tag, tag valid) of a well-formed call (see the pure twin)."""
        return self.classify_call(call)

    cdef tuple classify_call(self, Call call):
        return self._classify(call, self.methods.get(call.method))

    cdef tuple _classify(self, Call call, object row):
        """``classify_call`` of a call whose row in the method table is known (None: none)."""
        cdef Method method = self._row(row)
        if method is None:
            return None, None, True
        tag = self._tag(method, call)
        return method, tag, self._tag_valid(tag)

    # The three steps of ``_classify``, which a batch takes one by one (no tuple per call).
    cdef inline Method _row(self, object row):
        """The row serving a call whose row in the table is ``row`` (None: none): it, else
        the passthrough (None: neither)."""
        return <Method>row if row is not None else self.passthrough

    cdef inline object _tag(self, Method method, Call call):
        """The raw block tag of a call of this row (None: none)."""
        params = call.params
        if method.block_param >= 0 and params is not None:
            return self._block_tag(<bytes>params, method.block_param)
        return None

    cdef inline bint _tag_valid(self, object tag) except -1:
        return tag is None or valid_block_tag(tag, self.solana)

    cdef object _block_tag(self, bytes params, Py_ssize_t index):
        """``array_item(params, index)`` of a call's (validated) params: the usual ones, whose
        items up to the tag are flat (``_flat_value_end``), in one scan here; anything else by
        jsonrpc's ``array_item``, whose answer this must equal."""
        cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(params)
        cdef Py_ssize_t n = PyBytes_GET_SIZE(params), k = 0, end
        cdef Py_ssize_t i = _ws(p, 0, n)
        if i >= n or p[i] != 91:
            return None
        i = _ws(p, i + 1, n)
        if i < n and p[i] == 93:
            return None
        while True:
            end = _flat_value_end(p, i, n)
            if end < 0:
                return self._array_item(params, index)
            if k == index:
                return _tag_bytes(p + i, end - i)
            k += 1
            i = _ws(p, end, n)
            if i >= n or p[i] != 44:
                return None
            i = _ws(p, i + 1, n)

    cpdef bint logs_fit(self, object params, object principal) except -1:
        """Does this eth_getLogs go upstream as it is (see the pure twin)?  The usual filter is
        read where it lies (``_plain_log_spans``), nothing allocated; anything else decoded."""
        cdef const unsigned char* p
        cdef Py_ssize_t spans[6]
        cdef const unsigned char* ends[2]
        cdef Py_ssize_t sizes[2]
        cdef bytes first, last, block_hash
        cdef long long low, high
        cdef int k
        if params is None:
            return False
        if type(params) is bytes and _plain_log_spans(
                <const unsigned char*>PyBytes_AS_STRING(params), PyBytes_GET_SIZE(params), spans):
            if spans[4] >= 0:
                return False  # a blockHash (even null)
            p = <const unsigned char*>PyBytes_AS_STRING(params)
            for k in range(2):
                ends[k] = p + spans[2 * k] if spans[2 * k] >= 0 else p
                sizes[k] = spans[2 * k + 1] - spans[2 * k] if spans[2 * k] >= 0 else 0
        else:
            found = _log_filter_ends(params)
            if found is None:
                return False
            first, last, block_hash = <tuple>found
            if len(block_hash):
                return False
            ends[0] = <const unsigned char*>PyBytes_AS_STRING(first)
            sizes[0] = PyBytes_GET_SIZE(first)
            ends[1] = <const unsigned char*>PyBytes_AS_STRING(last)
            sizes[1] = PyBytes_GET_SIZE(last)
        head = None
        if _wants_head(ends[0], sizes[0]) or _wants_head(ends[1], sizes[1]):
            head = self.logs_head()
        low = _logs_bound(ends[0], sizes[0], head)
        high = _logs_bound(ends[1], sizes[1], head)
        if low < 0 or high < 0:
            return False
        return _logs_verdict(
            low, high, _logs_limit(self.logs_blocks, principal.logs_range),
            self.logs_upstream,
        ) == C_LOGS_FORWARD

    cpdef object not_found(self, call):
        if call.id is None:
            return None
        cdef str method = call.method
        return self._error_reply(call.id, METHOD_NOT_FOUND, f"method not found: {method[:64]}")

    cpdef object bad_tag(self, call):
        if call.id is None:
            return None
        return self._error_reply(
            call.id, INVALID_PARAMS, BAD_SLOT_MESSAGE if self.solana else BAD_TAG_MESSAGE
        )


cdef inline void _place(Pending pending, Py_ssize_t index, object result,
                        object error) except *:
    """``pending.place``; a bug of ours costs that request a 500, never the other waiters."""
    try:
        pending.place(index, result, error)
    except Exception:
        log.exception("unhandled error in the fast lane")
        pending.fail()


cdef class OpenAdmission:
    """No keys, no limits: everyone is the anonymous principal (see the pure twin)."""

    cdef public object anonymous
    cdef public object shared

    def __init__(self, anonymous):
        self.anonymous = anonymous
        self.shared = None

    cpdef object principal(self, request, str group, bint testnet, object key=None):
        return self.anonymous

    cpdef object admit(self, principal, bint reads, bint writes, long long requests,
                       long long cu, long long tcu):
        return None

    cpdef record(self, principal, str network, str method, long long requests,
                 long long cu, long long errors, double seconds):
        return None

    cpdef bytes headers(self, principal):
        return b""


cdef class KeyAdmission(OpenAdmission):
    """API keys on the fast lane: the cache-hit path of ``KeyGate.authenticate`` and the
    admission rule of ``KeyGate.admit`` (see the pure twin)."""

    cdef object gate
    cdef object recent
    cdef object failures
    cdef set used
    cdef object meter
    cdef object _meter_record
    cdef LatencyMeter latency

    def __init__(self, gate, recent, failures, set used):
        OpenAdmission.__init__(self, None)
        self.gate = gate
        self.recent = recent
        self.failures = failures
        self.used = used
        self.meter = gate.meter
        self._meter_record = self.meter.record
        self.latency = gate.latency

    cpdef object principal(self, request, str group, bint testnet, object key=None):
        cdef object raw, principal, bucket
        failures = self.failures
        if failures:
            bucket = failures.get(group)
            if bucket is not None and bucket.remaining(monotonic()) < 1:
                return None
        raw = _presented_key(request, key)
        if raw is None:
            return None
        principal = self.recent.get(raw)
        if principal is None or principal.revoked:
            return None
        if not testnet and principal.environment == "test":
            return None
        self.used.add(principal.key_id)
        return principal

    cdef int _take(self, principal, bint reads, bint writes, long long requests,
                   long long tcu, double* wait_out) except -1:
        cdef double epoch = wall()
        cdef object scopes = principal.scopes
        wait_out[0] = 0.0
        if reads and "rpc:read" not in scopes:
            return NO_READ_SCOPE
        if writes and "rpc:write" not in scopes:
            return NO_WRITE_SCOPE
        cdef long long day = <long long>(epoch // SECONDS_PER_DAY)
        cdef double wait = principal.limiter.admit(monotonic(), day, requests, tcu, principal.quota)
        wait_out[0] = wait
        if wait < 0:
            shared = self.shared
            if shared is not None:
                shared.note(principal)  # a starved process keeps asking for units
            return DAY_QUOTA
        if wait:
            return RATE
        shared = self.shared
        if shared is not None:
            # Once per sync, not per request: see the pure twin.
            if not principal.pending_requests:
                shared.note(principal)
            principal.pending_requests += requests
            principal.pending_units += tcu
        return ADMITTED

    cpdef object admit(self, principal, bint reads, bint writes, long long requests,
                       long long cu, long long tcu):
        cdef double wait
        cdef int why = self._take(principal, reads, writes, requests, tcu, &wait)
        if why == ADMITTED:
            return None
        return self.gate.rejection(why, wait, wall())

    cpdef record(self, principal, str network, str method, long long requests,
                 long long cu, long long errors, double seconds):
        """One metering sample, both meters in the same minute (see the pure twin)."""
        cdef long long minute = <long long>(wall() // 60.0)
        if requests or cu or errors:
            self._meter_record(
                principal.key_id,
                principal.account_id,
                network,
                method,
                minute,
                requests,
                cu,
                errors,
            )
        if seconds >= 0.0:
            self.latency.observe(principal.account_id, network, method, minute, seconds)

    cpdef bytes headers(self, principal):
        return principal.limiter.headers(monotonic(), wall(), principal.limits_rps)


cdef class _Histogram:
    """One (account, network, method)'s counts in its current minute (a C array: a sample
    allocates nothing)."""
    cdef long long minute
    cdef int size
    cdef long long counts[MAX_BOUNDS + 1]

    def __cinit__(self, long long minute, int size):
        self.minute = minute
        self.size = size
        memset(self.counts, 0, sizeof(self.counts))

    cdef list as_list(self):
        return [self.counts[i] for i in range(self.size)]


cdef class LatencyMeter:
    """Answered requests' latencies per (account, network, method, minute): see the pure twin."""

    cdef dict _current  # account -> network -> method -> _Histogram
    cdef list _closed  # (account, network, method, minute, counts) of minutes gone by
    cdef double _bounds[MAX_BOUNDS]
    cdef int _nbounds
    # The last histogram used, and the very strings it was found by: a key's requests to one
    # method come in runs, and the lane passes the same objects each time (the principal's
    # account id, the route's label, the method's name), so a run skips the three lookups.
    cdef object _last_account
    cdef object _last_network
    cdef object _last_method
    cdef _Histogram _last

    def __init__(self, tuple bounds):
        if len(bounds) > MAX_BOUNDS or list(bounds) != sorted(bounds):
            raise ValueError(f"at most {MAX_BOUNDS} ascending latency bounds")
        self._current = {}
        self._closed = []
        self._nbounds = len(bounds)
        for i, bound in enumerate(bounds):
            self._bounds[i] = bound

    cpdef observe(self, str account_id, str network, str method, long long minute,
                  double seconds):
        cdef _Histogram histogram = self._last
        if (
            histogram is None
            or account_id is not self._last_account
            or network is not self._last_network
            or method is not self._last_method
            or histogram.minute != minute
        ):
            histogram = self._find(account_id, network, method, minute)
            self._last = histogram
            self._last_account = account_id
            self._last_network = network
            self._last_method = method
        # bisect_left, as the pure twin: the first bound not below the sample.
        cdef int i = 0
        while i < self._nbounds and self._bounds[i] < seconds:
            i += 1
        histogram.counts[i] += 1

    cdef _Histogram _find(self, str account_id, str network, str method, long long minute):
        """The histogram of (account, network, method) at ``minute`` (an earlier minute's
        counts closed first)."""
        cdef object found = self._current.get(account_id)
        if found is None:
            found = self._current[account_id] = {}
        cdef dict by_network = <dict>found
        found = by_network.get(network)
        if found is None:
            found = by_network[network] = {}
        cdef dict by_method = <dict>found
        found = by_method.get(method)
        cdef _Histogram histogram
        if found is None:
            histogram = _Histogram(minute, self._nbounds + 1)
            by_method[method] = histogram
        else:
            histogram = <_Histogram>found
            if histogram.minute != minute:
                self._closed.append(
                    (account_id, network, method, histogram.minute, histogram.as_list())
                )
                histogram.minute = minute
                memset(histogram.counts, 0, sizeof(histogram.counts))
        return histogram

    def add(self, str account_id, str network, str method, long long minute, counts):
        if len(counts) != self._nbounds + 1:
            raise ValueError(f"{self._nbounds + 1} bucket counts expected")
        self._closed.append((account_id, network, method, minute, list(counts)))

    def drain(self):
        cdef dict merged = {}
        cdef dict current = self._current
        cdef list closed = self._closed
        self._current = {}
        self._closed = []
        self._last = None
        self._last_account = self._last_network = self._last_method = None
        for account_id, by_network in current.items():
            for network, by_method in by_network.items():
                for method, histogram in by_method.items():
                    closed.append((account_id, network, method, (<_Histogram>histogram).minute,
                                   (<_Histogram>histogram).as_list()))
        for account_id, network, method, minute, counts in closed:
            key = (account_id, network, method, minute)
            slot = merged.get(key)
            if slot is None:
                merged[key] = list(counts)
            else:
                for i, count in enumerate(counts):
                    slot[i] += count
        return sorted([(*key, tuple(counts)) for key, counts in merged.items()])


cdef class Ledger:
    """What every answered request leaves behind: its status count, its latency sample and
    its access-log line (formatted here exactly as ``AccessLog.write`` would)."""

    cdef readonly dict statuses
    cdef readonly dict latency
    cdef readonly object access_log
    cdef bytearray _buffer  # the access log's: each line is written into it
    cdef Py_ssize_t _flush_bytes
    cdef object _flush
    cdef long long _second
    cdef bytes _second_text
    cdef dict _json
    # The HTTP method logged last and its JSON (POST, nearly always): not decoded and looked
    # up again for every line.
    cdef bytes _method
    cdef bytes _method_json
    # Likewise the path and the label logged last and their JSON, by the very objects (the
    # lane keeps one path object per endpoint, and a label is a method row's name).
    cdef str _path
    cdef bytes _path_json
    cdef str _label
    cdef bytes _label_json
    # The route noted last ("rpc", nearly always) and its latency series and status counts.
    cdef object _route
    cdef object _series
    cdef tuple _buckets
    cdef list _counts
    cdef object _route_statuses  # a defaultdict: indexed as an object

    def __init__(self, dict statuses, dict latency, access_log):
        self.statuses = statuses
        self.latency = latency
        self.access_log = access_log
        self._buffer = access_log.buffer
        self._flush_bytes = access_log.FLUSH_BYTES
        self._flush = access_log.flush
        self._second = -1
        self._second_text = b""
        self._json = {}
        self._method = None
        self._method_json = b""

    cdef bytes _encoded(self, str text):
        """``text`` as a JSON string; peers, paths and labels repeat, so the short ones are
        kept (a client cannot grow the table with long ones)."""
        encoded = self._json.get(text)
        if encoded is None:
            encoded = msgspec.json.encode(text)
            if len(self._json) < 4096 and len(text) <= 256:
                self._json[text] = encoded
        return encoded

    cpdef double note(self, str route, int status, bytes request_id, str peer, bytes method,
                      str path, double started, Py_ssize_t size, str label,
                      bytes cache) except? -1.0:
        cdef double now = monotonic()
        cdef double elapsed = now - started
        if route is not self._route:
            self._series = self.latency[route]
            self._buckets = self._series.buckets
            self._counts = self._series.counts
            self._route_statuses = self.statuses[route]
            self._route = route
        series = self._series
        cdef tuple buckets = self._buckets
        cdef list counts = self._counts
        cdef Py_ssize_t i = 0, n = len(buckets)
        while i < n and <double>buckets[i] < elapsed:
            i += 1
        counts[i] += 1
        series.sum += elapsed
        self._route_statuses[status] += 1
        if self.access_log.enabled:
            self._line(status, request_id, peer, method, path, elapsed, size, label, cache)
        return elapsed

    cdef void _line(self, int status, bytes request_id, str peer, bytes method, str path,
                    double elapsed, Py_ssize_t size, str label, bytes cache) except *:
        cdef double epoch = wall()
        cdef long long second = <long long>epoch
        cdef int millis = <int>((epoch - second) * 1000)
        if second != self._second:
            self._second = second
            self._second_text = _time.strftime(
                "%Y-%m-%dT%H:%M:%S", _time.gmtime(second)
            ).encode()
        # Each text field JSON-encoded once per distinct value (peers, paths, labels repeat);
        # request_id is the client's (checked: letters, digits, . _ : -) or ours: never escaped.
        cdef bytes ts = self._second_text
        cdef bytes peer_json = self._encoded(peer)
        if method != self._method:
            self._method_json = self._encoded(method.decode("latin-1"))
            self._method = method
        cdef bytes method_json = self._method_json
        if path is not self._path:
            self._path_json = self._encoded(path)
            self._path = path
        cdef bytes path_json = self._path_json
        cdef bytes label_json = b""
        if label:
            if label is not self._label:
                self._label_json = self._encoded(label)
                self._label = label
            label_json = self._label_json
        cdef long long duration = <long long>(elapsed * 1000000)
        cdef Py_ssize_t n = (
            LINE_FIXED + PyBytes_GET_SIZE(ts) + PyBytes_GET_SIZE(request_id)
            + PyBytes_GET_SIZE(peer_json) + PyBytes_GET_SIZE(method_json)
            + PyBytes_GET_SIZE(path_json)
            + int_width(status) + int_width(duration) + int_width(size)
        )
        if label:
            n += 7 + PyBytes_GET_SIZE(label_json)
        if cache:
            n += 11 + PyBytes_GET_SIZE(cache)
        # Written in place at the end of the log's buffer (as ``AccessLog.write`` encodes).
        cdef bytearray buffer = self._buffer
        cdef Py_ssize_t at = PyByteArray_GET_SIZE(buffer)
        PyByteArray_Resize(buffer, at + n)
        cdef char* q = PyByteArray_AS_STRING(buffer) + at
        q = _put(q, b'{"ts":"', 7)
        q = _put_bytes(q, ts)
        q[0] = 46  # "."
        q[1] = 48 + millis // 100
        q[2] = 48 + (millis // 10) % 10
        q[3] = 48 + millis % 10
        q += 4
        q = _put(q, b'Z","level":"info","msg":"request","request_id":"', 48)
        q = _put_bytes(q, request_id)
        q = _put(q, b'","peer":', 9)
        q = _put_bytes(q, peer_json)
        q = _put(q, b',"method":', 10)
        q = _put_bytes(q, method_json)
        q = _put(q, b',"path":', 8)
        q = _put_bytes(q, path_json)
        q = _put(q, b',"status":', 10)
        q += write_int(q, status)
        q = _put(q, b',"duration_us":', 15)
        q += write_int(q, duration)
        q = _put(q, b',"bytes":', 9)
        q += write_int(q, size)
        if label:
            q = _put(q, b',"rpc":', 7)
            q = _put_bytes(q, label_json)
        if cache:
            q = _put(q, b',"cache":"', 10)
            q = _put_bytes(q, cache)
            q[0] = 34
            q += 1
        q = _put(q, b"}\n", 2)
        if at + n >= self._flush_bytes:
            self._flush()


# Bytes of an access-log line besides its fields: the names, quotes, commas, braces, ".mmm".
cdef Py_ssize_t LINE_FIXED = 7 + 4 + 48 + 9 + 10 + 8 + 10 + 15 + 9 + 2


cdef inline char* _put(char* q, const char* text, Py_ssize_t n) noexcept:
    memcpy(q, text, n)
    return q + n


cdef inline char* _put_bytes(char* q, bytes data) noexcept:
    cdef Py_ssize_t n = PyBytes_GET_SIZE(data)
    memcpy(q, PyBytes_AS_STRING(data), n)
    return q + n


@cython.final
@cython.no_gc  # a str and numbers: never part of a cycle
@cython.freelist(16)
cdef class _Tally:
    """One method's usage in a batch so far (``Pending.book``)."""

    cdef str name
    cdef long long calls
    cdef long long units
    cdef long long errors


cdef _Tally _tally_of(list tallies, str name):
    """The tally of this method name in ``tallies``, added when there is none."""
    cdef _Tally tally
    for tally in tallies:
        if tally.name is name:
            return tally
    for tally in tallies:
        if tally.name == name:
            return tally
    tally = _Tally.__new__(_Tally)
    tally.name = name
    tallies.append(tally)
    return tally


@cython.freelist(16)
cdef class Pending:
    """One request's answer while flights it waits for are in the air."""

    cdef Lane lane
    cdef object conn
    cdef object request
    cdef str peer
    cdef Route route
    cdef object principal
    cdef bytes request_id
    cdef double started
    cdef list calls
    cdef bint batch
    cdef list replies
    # Per position: the Method of a call still waiting (else None), and its billed units
    # (``units[index]``, read while it waits): a C array, ``one`` for a single call.
    cdef list methods
    cdef long long* units
    cdef long long one
    cdef Py_ssize_t left
    cdef Py_ssize_t hits
    cdef Py_ssize_t used
    cdef Py_ssize_t taken
    cdef bint over
    cdef str path
    cdef str label
    # A single call's usage, booked with the answer's latency as one sample.
    cdef long long requests
    cdef long long cu
    cdef long long errors
    # A batch's usage so far, one _Tally per method name in the order first booked (``book``);
    # None: none.
    cdef list tally
    # A batch's positions whose reply is a node's bare result, wrapped with the call's id as
    # the answer is joined (``_join_batch``): one copy of it, not two.  None: no such position.
    cdef bytearray bare

    cdef int admit_reply(self, Py_ssize_t size):
        if self.over or self.used + size > self.route.max_answer:
            self.over = True
            return TOO_LARGE
        if not self.route.budget.take(size):
            return BUSY
        self.used += size
        self.taken += size
        return FITS

    def __dealloc__(self):
        if self.units != &self.one:
            PyMem_Free(self.units)

    cdef int size_units(self, Py_ssize_t count) except -1:
        """Room for ``count`` positions' methods and units."""
        self.methods = [None] * count
        if count <= 1:
            self.units = &self.one
        else:
            self.units = <long long*>PyMem_Malloc(count * sizeof(long long))
            if self.units == NULL:
                raise MemoryError()
        return 0

    cdef void wait_for(self, Flight flight, Py_ssize_t index, Method method,
                       long long units) except *:
        self.methods[index] = method
        self.units[index] = units
        self.left += 1
        if flight.first is None:
            flight.first = self
            flight.first_index = index
            return
        if flight.waiters is None:
            flight.waiters = [self, index]
        else:
            flight.waiters.append(self)
            flight.waiters.append(index)

    cdef void place(self, Py_ssize_t index, object result, object error) except *:
        waiting = self.methods[index]
        if waiting is None:
            return
        self.methods[index] = None
        cdef Method method = <Method>waiting
        cdef long long units = self.units[index]
        cdef Call call = self.calls[index]
        cdef Route route = self.route
        cdef Py_ssize_t size
        cdef int fits
        call_id = call.id
        if call_id is not None:
            size = PyBytes_GET_SIZE(result) if result is not None else (
                PyBytes_GET_SIZE(error) if error is not None else 0)
            if self.batch:
                fits = self.admit_reply(size + PyBytes_GET_SIZE(call_id) + REPLY_OVERHEAD)
                if fits != FITS:
                    result = None
                    error = route.refuse(OVERLOADED if fits == BUSY else ANSWER_TOO_LARGE,
                                         method.write)
            elif size + PyBytes_GET_SIZE(call_id) > route.max_single:
                result = None
                error = route.refuse(ANSWER_TOO_LARGE, method.write)
            if result is None:
                self.replies[index] = error_reply_of(call_id, error)
            elif self.batch:
                if self.bare is None:
                    self.bare = bytearray(len(self.calls))
                PyByteArray_AS_STRING(self.bare)[index] = 1
                self.replies[index] = result
            else:
                self.replies[index] = result_reply_of(call_id, result)
        self.book(method, units, error is not None)
        self.left -= 1
        if self.over:
            self.give_up_reads()
        if self.left == 0:
            self.lane.finish(self)

    cdef void book(self, Method method, long long units, bint failed) except *:
        """One call answered: counted under its method, and its usage metered (a single
        call's with the answer's latency, a batch's summed per method and metered once its
        answer is decided, ``meter_batch``; see the pure twin)."""
        if failed:
            method.stats.error += 1
        else:
            method.stats.ok += 1
        cdef _Tally tally
        if self.batch:
            if self.tally is None:
                self.tally = []
            # A batch names a few methods: found by a look down the list, counted in C (by
            # the very name object first: a row's name is one object).
            tally = _tally_of(self.tally, method.name)
            tally.calls += 1
            tally.units += units
            if failed:
                tally.errors += 1
        else:
            self.requests = 1
            self.cu = units
            self.errors = failed

    cdef void meter_batch(self) except *:
        """The usage of a batch's calls booked so far: one sample per method."""
        cdef list tallies = self.tally
        cdef _Tally tally
        if tallies is None:
            return
        self.tally = None
        for tally in tallies:
            self.meter(tally.name, tally.calls, tally.units, tally.errors, UNTIMED)

    cdef inline void meter(self, str method, long long requests, long long cu,
                           long long errors, double seconds) except *:
        """The lane's one call into the meters: a sample (``twintypes.metering``)."""
        self.lane.admission.record(self.principal, self.route.label, method, requests, cu,
                                   errors, seconds)

    cdef void fail(self) except *:
        self.meter_batch()  # what was answered before is usage all the same
        self.methods = [None] * len(self.methods)
        self.left = 0
        self.route.budget.give_back(self.taken)
        self.taken = 0
        self.request.keep_alive = False
        body = self.lane.error_body(500, INTERNAL_ERROR_MESSAGE, None)
        headers = X_REQUEST_ID + self.request_id + b"\r\n" + JSON
        self.lane.sink.deliver(self.conn, self.request, 500, headers, body)

    cdef void give_up_reads(self) except *:
        cdef Route route = self.route
        cdef Method method
        cdef Call call
        cdef Py_ssize_t index
        for index in range(len(self.methods)):
            waiting = self.methods[index]
            if waiting is None:
                continue
            method = <Method>waiting
            if not method.retry:
                continue
            self.methods[index] = None
            call = self.calls[index]
            if call.id is not None:
                self.replies[index] = error_reply_of(
                    call.id, route.refuse(ANSWER_TOO_LARGE, False))
            self.book(method, self.units[index], True)
            self.left -= 1


cdef class Lane:
    """Every JSON-RPC endpoint's fast path: ``serve`` one request at a time."""

    cdef readonly dict routes
    cdef public OpenAdmission admission
    cdef readonly Ledger ledger
    cdef readonly RequestIds ids
    cdef readonly object cors
    cdef readonly object error_body
    cdef readonly object log_path
    cdef public object sink
    cdef public long long served
    cdef dict _log_paths
    cdef bint _holding
    cdef list _held

    def __init__(self, dict routes, OpenAdmission admission, Ledger ledger, RequestIds ids,
                 cors, error_body, log_path):
        self.routes = routes
        self.admission = admission
        self.ledger = ledger
        self.ids = ids
        self.cors = cors
        self.error_body = error_body
        self.log_path = log_path
        self.sink = None
        self.served = 0
        self._log_paths = {}
        self._holding = False
        self._held = []

    cpdef hold(self):
        """Until ``release``, new retry-safe flights (single calls' and batches') wait (see the
        pure twin)."""
        self._holding = True

    cpdef release(self):
        """Send the flights held since ``hold``."""
        cdef Route route
        self._holding = False
        held = self._held
        self._held = []
        for route in held:
            flights = route.held
            route.held = []
            route._send(flights, [])

    cpdef object serve(self, conn, request, str peer, str group):
        """(status, headers, body) now, DEFER (the sink gets it later) or HANDOFF."""
        cdef bytes path = request.path
        cdef Route route = self.routes.get(path)
        cdef Method method
        cdef Pending pending
        cdef ParsedRequest parsed
        cdef Call call
        key = None
        if route is None:
            head, key = _split_path_key(path)
            if key is not None:
                route = self.routes.get(head)
        if route is None or request.method != b"POST":
            return HANDOFF
        principal = self.admission.principal(request, group, route.testnet, key)
        if principal is None:
            return HANDOFF
        allow = principal.allow
        if allow is not None and not allow.admits(request.origin, peer):
            return HANDOFF
        cdef double started = monotonic()
        parsed = route._parse(request.body, route.max_batch)
        calls = parsed.calls
        cdef int parse_error = parsed.error
        cdef Py_ssize_t index
        # A batch's rows, as found here: _batch classifies by them (one lookup per call).
        cdef list rows = None
        if not parse_error:
            if parsed.batch:
                rows = [None] * len(calls)
            for index in range(len(calls)):
                call = calls[index]
                if not call.error:
                    if allow is not None and allow.call_refusal(call.method, call.params):
                        return HANDOFF
                    method = route.methods.get(call.method)
                    if method is None:
                        continue
                    if rows is not None:
                        rows[index] = method
                    if method.special or _sticky(route, method):
                        return HANDOFF
                    if method is route.logs_method and not route.logs_fit(
                        call.params, principal
                    ):
                        return HANDOFF
        self.served += 1
        pending = Pending.__new__(Pending)
        pending.lane = self
        pending.conn = conn
        pending.request = request
        pending.peer = peer
        pending.route = route
        pending.principal = principal
        pending.request_id = self.ids.take(request.request_id)
        pending.started = started
        pending.calls = calls
        pending.batch = parsed.batch
        pending.replies = [None] * len(calls)
        pending.size_units(len(calls))
        pending.label = "batch" if pending.batch else ""
        shown = self._log_paths.get(path)
        if shown is None:
            shown = self.log_path(path)
            if len(self._log_paths) < 1024 and PyBytes_GET_SIZE(path) <= 256:
                self._log_paths[path] = shown
        pending.path = shown
        if parse_error:
            route.invalid.error += 1
            body = route._error_reply(b"null", parse_error, parsed.message)
            return self._answer(pending, 200, body, MISS, "invalid", None, False)
        if pending.batch:
            return self._batch(pending, rows)
        return self._single(pending)

    cdef object _single(self, Pending pending):
        cdef Route route = pending.route
        cdef Method method
        cdef long long cu = 0, tcu = 0
        cdef Call call = pending.calls[0]
        if call.error:
            route.invalid.error += 1
            body = route._error_reply(call.id, call.error, call.message)
            return self._answer(pending, 200, body, MISS, "invalid", None, False)
        method_obj, tag, valid = route.classify_call(call)
        if method_obj is None:
            route.unknown.error += 1
            return self._answer(pending, 200, route.not_found(call), MISS, "unknown", None, False)
        method = <Method>method_obj
        if not valid:
            route.invalid.error += 1
            return self._answer(pending, 200, route.bad_tag(call), MISS, method.name, None,
                                False)
        method.charge(tag, &cu, &tcu)
        cdef bint writes = method.write
        cdef OpenAdmission admission = self.admission
        rejection = admission.admit(pending.principal, not writes, writes, 1, cu, tcu)
        call_id = call.id
        if rejection is not None:
            error = refusal_error(rejection.status, rejection.code, rejection.message)
            body = error_reply_of(call_id or b"null", error)
            return self._answer(pending, rejection.status, body, b"", method.name, rejection)
        cdef MethodStats stats = method.stats
        params = call.params
        cdef tuple key = _call_key(call)
        cdef Py_hash_t key_hash = hash(key)
        if method.cache != NO_CACHE and method.cacheable(tag, params):
            hit = route.cache.lookup(key, key_hash)
            if hit is not None:
                if call_id is not None and (
                        PyBytes_GET_SIZE(hit) + PyBytes_GET_SIZE(call_id) > route.max_single):
                    pending.book(method, cu, True)
                    body = error_reply_of(call_id, route.refuse(ANSWER_TOO_LARGE, False))
                    return self._answer(pending, 200, body, MISS, method.name, None)
                stats.cache_hits += 1
                pending.book(method, cu, False)
                body = None if call_id is None else result_reply_of(call_id, hit)
                pending.hits = 1
                return self._answer(pending, 200, body, HIT, method.name, None)
        pending.label = method.name
        cdef Flight flight = _listed(route.flights, key, key_hash)
        if flight is not None:
            route.coalesced += 1
            pending.wait_for(flight, 0, method, cu)
            return DEFER
        flight = route._open(key, key_hash, params, method, tag)
        pending.wait_for(flight, 0, method, cu)
        if not method.retry:
            route._send([], [flight])
        elif self._holding and route.upstream_batch > 1:
            self._held_by(route).append(flight)
        else:
            route._send([flight], [])
        return DEFER

    cdef void _hold(self, Route route, list flights) except *:
        """Keep new retry-safe flights until ``release``."""
        self._held_by(route).extend(flights)

    cdef inline list _held_by(self, Route route):
        """The flights ``route`` holds until ``release`` (noted as holding some)."""
        if not route.held:
            self._held.append(route)
        return route.held

    cdef object _batch(self, Pending pending, list rows):
        """``rows``: each call's row in the method table, as ``serve`` found it (None: none);
        from here on, per position, the row of a call still to answer (None: answered)."""
        cdef Route route = pending.route
        cdef list calls = pending.calls
        cdef list replies = pending.replies
        cdef Py_ssize_t count = len(calls), admitted = 0, index
        cdef list tags = [None] * count
        cdef long long cu = 0, tcu = 0, units = 0, weight = 0
        cdef bint reads = False, writes = False
        cdef Method method
        cdef Call call
        for index in range(count):
            call = calls[index]
            if call.error:
                route.invalid.error += 1
                replies[index] = route._error_reply(call.id, call.error, call.message)
                continue
            method = route._row(rows[index])
            if method is None:
                route.unknown.error += 1
                replies[index] = route.not_found(call)
                continue
            tag = route._tag(method, call)
            if not route._tag_valid(tag):
                rows[index] = None
                route.invalid.error += 1
                replies[index] = route.bad_tag(call)
                continue
            method.charge(tag, &units, &weight)
            cu += units
            tcu += weight
            if method.write:
                writes = True
            else:
                reads = True
            rows[index] = method
            tags[index] = tag
            admitted += 1
        cdef OpenAdmission admission = self.admission
        if admitted:
            rejection = admission.admit(pending.principal, reads, writes, admitted, cu, tcu)
            if rejection is not None:
                return self._refused_batch(pending, rejection, rows)
        cdef ResponseCache cache = route.cache
        cdef int fits
        cdef MethodStats stats
        cdef tuple key
        cdef list keys = None  # per position, the key of a call looked for in the cache
        for index in range(count):
            found = rows[index]
            if found is None:
                continue
            method = <Method>found
            call = calls[index]
            tag = tags[index]
            if method.cache != NO_CACHE and method.cacheable(tag, call.params):
                key = _call_key(call)
                hit = cache.lookup(key, hash(key))
                if hit is None:
                    if keys is None:
                        keys = [None] * count
                    keys[index] = key
                else:
                    rows[index] = None
                    method.charge(tag, &units, &weight)
                    stats = method.stats
                    call_id = call.id
                    if call_id is not None:
                        fits = pending.admit_reply(
                            PyBytes_GET_SIZE(hit) + PyBytes_GET_SIZE(call_id) + REPLY_OVERHEAD)
                        if fits != FITS:
                            replies[index] = error_reply_of(call_id, route.refuse(
                                OVERLOADED if fits == BUSY else ANSWER_TOO_LARGE, False))
                            pending.book(method, units, True)
                            continue
                        replies[index] = result_reply_of(call_id, hit)
                    pending.hits += 1
                    stats.cache_hits += 1
                    pending.book(method, units, False)
                    continue
        if pending.over:
            for index in range(count):
                found = rows[index]
                if found is None:
                    continue
                method = <Method>found
                call = calls[index]
                method.charge(tags[index], &units, &weight)
                if call.id is not None:
                    replies[index] = error_reply_of(
                        call.id, route.refuse(ANSWER_TOO_LARGE, False))
                pending.book(method, units, True)
            return self._batch_answer(pending)
        cdef list safe = [], unsafe = []
        cdef dict flights = route.flights
        cdef Flight flight
        cdef Py_hash_t key_hash
        for index in range(count):
            found = rows[index]
            if found is None:
                continue
            method = <Method>found
            call = calls[index]
            tag = tags[index]
            params = call.params
            key = <tuple>keys[index] if keys is not None and keys[index] is not None else (
                _call_key(call))
            key_hash = hash(key)
            flight = _listed(flights, key, key_hash)
            if flight is not None:
                route.coalesced += 1
            else:
                flight = route._open(key, key_hash, params, method, tag)
                if method.retry:
                    safe.append(flight)
                else:
                    unsafe.append(flight)
            method.charge(tag, &units, &weight)
            pending.wait_for(flight, index, method, units)
        # Decided before sending: a group may land at once (see the pure twin).
        cdef bint waiting = pending.left > 0
        if safe and self._holding and route.upstream_batch > 1:
            # Held like single calls' reads (see the pure twin).
            self._hold(route, safe)
            safe = []
        if safe or unsafe:
            route._send(safe, unsafe)
        if waiting:
            return DEFER
        # A batch with nothing admitted (every call malformed, unknown or a bad tag) is
        # answered, not timed: none of it is usage.
        return self._batch_answer(pending, admitted > 0)

    cdef tuple _refused_batch(self, Pending pending, rejection, list rows):
        cdef Call call
        cdef Py_ssize_t index
        replies = pending.replies
        error = refusal_error(rejection.status, rejection.code, rejection.message)
        for index in range(len(rows)):
            if rows[index] is None:
                continue
            call = pending.calls[index]
            if call.id is not None:
                replies[index] = error_reply_of(call.id, error)
        answered = [reply for reply in replies if reply is not None]
        body = b"[" + b",".join(answered) + b"]" if answered else None
        return self._answer(pending, rejection.status, body, b"", "batch", rejection)

    cdef tuple _batch_answer(self, Pending pending, bint timed=True):
        # One pass over the replies (a notification's position holds none), one allocation.
        body = _join_batch(pending.replies, pending.calls, pending.bare)
        pending.bare = None
        # Flights given up on still hold this Pending until they land: not its replies.
        pending.replies = []
        cdef Py_ssize_t hits = pending.hits, count = len(pending.calls)
        cache = HIT if hits == count else (MISS if hits == 0 else PARTIAL)
        pending.route.budget.give_back(pending.taken)
        pending.taken = 0
        pending.meter_batch()
        return self._answer(pending, 200, body, cache, "batch", None, timed)

    cdef void finish(self, Pending pending) except *:
        if pending.batch:
            answer = self._batch_answer(pending)
        else:
            answer = self._answer(pending, 200, pending.replies[0], MISS, pending.label, None)
        self.sink.deliver(pending.conn, pending.request, answer[0], answer[1], answer[2])

    cdef tuple _answer(self, Pending pending, int status, object body, bytes cache, str label,
                       object rejection, bint timed=True):
        request = pending.request
        cdef bytes rate = self.admission.headers(pending.principal)
        cdef bytes first, second, cors = _ABSENT
        if rejection is not None:
            if rejection.close:
                request.keep_alive = False
            first = JSON
            second = rejection.headers
            if body is None:
                body = self.error_body(rejection.status, rejection.message, rejection.code)
        else:
            first = <bytes>_CACHE_HEADERS[cache]
            second = _ABSENT
            if body is None:
                status = 204
                body = b""
        origin = request.origin
        if origin is not None and (rejection is None or rejection.cors):
            cors = self.cors(origin)
        cdef double elapsed = self.ledger.note(
            "rpc", status, pending.request_id, pending.peer, request.method, pending.path,
            pending.started, PyBytes_GET_SIZE(body), label, cache)
        if timed and rejection is None:
            pending.meter(label, pending.requests, pending.cu, pending.errors, elapsed)
        return status, _head_lines(pending.request_id, first, second, rate, cors), body


cdef object _join_batch(list replies, list calls, bytearray bare):
    """``join_present`` of a batch's replies, a bare result (``Pending.bare``) written as
    ``result_reply_of`` its call's id would write it: the same bytes, in one allocation."""
    if bare is None:
        return join_present(replies)
    cdef const char* flags = PyByteArray_AS_STRING(bare)
    cdef Py_ssize_t total = 1, count = 0, index, size, id_len
    cdef object part
    cdef bytes call_id
    for index in range(len(replies)):
        part = replies[index]
        if part is not None:
            total += PyBytes_GET_SIZE(<bytes>part) + 1
            if flags[index]:
                total += REPLY_OVERHEAD - 1 + PyBytes_GET_SIZE(<bytes>(<Call>calls[index]).id)
            count += 1
    if count == 0:
        return None
    cdef bytes out = PyBytes_FromStringAndSize(NULL, total)
    cdef char* q = PyBytes_AS_STRING(out)
    q[0] = 91
    q += 1
    for index in range(len(replies)):
        part = replies[index]
        if part is None:
            continue
        if flags[index]:
            call_id = (<Call>calls[index]).id
            q = _put(q, b'{"jsonrpc":"2.0","id":', 22)
            q = _put_bytes(q, call_id)
            q = _put(q, b',"result":', 10)
            q = _put_bytes(q, <bytes>part)
            q[0] = 125
            q += 1
        else:
            q = _put_bytes(q, <bytes>part)
        q[0] = 44
        q += 1
    (q - 1)[0] = 93
    return out


cdef bytes _head_lines(bytes request_id, bytes first, bytes second, bytes rate, bytes cors):
    """An answer's header lines: its X-Request-Id, then the rest in order, in one allocation."""
    cdef Py_ssize_t id_len = PyBytes_GET_SIZE(request_id)
    cdef bytes out = PyBytes_FromStringAndSize(
        NULL, 14 + id_len + 2 + PyBytes_GET_SIZE(first) + PyBytes_GET_SIZE(second)
        + PyBytes_GET_SIZE(rate) + PyBytes_GET_SIZE(cors))
    cdef char* q = _put(PyBytes_AS_STRING(out), b"X-Request-Id: ", 14)
    q = _put(_put(q, PyBytes_AS_STRING(request_id), id_len), b"\r\n", 2)
    q = _put_bytes(_put_bytes(_put_bytes(_put_bytes(q, first), second), rate), cors)
    return out


def _no_head():
    return None


cdef inline bint _sticky(Route route, Method row):
    """Does a call of this row (found in the table by the call's method) go to the handler
    while the route remembers a write (``method in route.sticky_methods``, read as a flag)?"""
    sticky = route.sticky
    return sticky is not None and row.sticky and len(sticky) > 0

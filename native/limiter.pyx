# cython: language_level=3
"""Rate limiting and metering: the compiled twin of ``chaingate/_pure/limiter.py``.

Same contract as the pure module (the specification): token buckets with C doubles, a day
quota, a usage meter and the rate-limit header lines.  Every admitted request passes through
``KeyLimiter.take`` and ``rate_headers``, so they are kept free of Python-level arithmetic.
"""

cimport cython
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.math cimport ceil, floor
from libc.string cimport memcpy

from cformat cimport write_int

__all__ = [
    "IMPLEMENTATION",
    "DayQuota",
    "KeyLimiter",
    "UsageMeter",
    "rate_headers",
]

IMPLEMENTATION = "compiled"

# What the rate-limit headers report for an unlimited plan.
UNLIMITED = 2**31 - 1


cdef class DayQuota:
    cdef long long _limit
    cdef long long _day
    cdef long long _count

    def __init__(self, long long limit, long long day, long long used=0):
        self._limit = limit
        self._day = day
        self._count = used

    @property
    def used(self):
        return self._count

    @property
    def limit(self):
        return self._limit

    def set_limit(self, long long limit):
        self._limit = limit

    cpdef long long room(self, long long day):
        if self._limit <= 0:
            return -1
        cdef long long used = self._count if day == self._day else 0
        return self._limit - used if self._limit > used else 0

    cpdef bint take(self, long long day, long long requests):
        if day != self._day:
            self._day = day
            self._count = 0
        if self._limit > 0 and self._count + requests > self._limit:
            return False
        self._count += requests
        return True

    def add(self, long long day, long long requests):
        if day != self._day:
            self._day = day
            self._count = 0
        self._count += requests


cdef class KeyLimiter:
    cdef double _rps
    cdef double _cu_rate
    cdef double _requests
    cdef double _cu
    cdef double _last

    def __init__(self, double rps, double cu_rate, double now):
        self._rps = rps
        self._cu_rate = cu_rate
        self._requests = rps
        self._cu = cu_rate
        self._last = now

    @property
    def rps(self):
        return self._rps

    @property
    def cu_rate(self):
        return self._cu_rate

    def set_rates(self, double rps, double cu_rate):
        self._rps = rps
        self._cu_rate = cu_rate
        if self._requests > rps:
            self._requests = rps
        if self._cu > cu_rate:
            self._cu = cu_rate

    cdef inline void _refill(self, double now) noexcept:
        cdef double elapsed = now - self._last
        if elapsed > 0:
            self._requests = self._requests + elapsed * self._rps
            if self._requests > self._rps:
                self._requests = self._rps
            self._cu = self._cu + elapsed * self._cu_rate
            if self._cu > self._cu_rate:
                self._cu = self._cu_rate
            self._last = now

    def take(self, double now, long long requests, long long cu):
        return self._take(now, requests, cu)

    cdef double _take(self, double now, long long requests, long long cu) noexcept:
        cdef double wait = 0.0
        cdef double need, cu_wait
        self._refill(now)
        if self._rps > 0:
            need = <double>requests if <double>requests < self._rps else self._rps
            if self._requests < need:
                wait = (need - self._requests) / self._rps
        if self._cu_rate > 0:
            need = <double>cu if <double>cu < self._cu_rate else self._cu_rate
            if self._cu < need:
                cu_wait = (need - self._cu) / self._cu_rate
                if cu_wait > wait:
                    wait = cu_wait
        if wait > 0:
            return wait
        if self._rps > 0:
            self._requests -= requests
        if self._cu_rate > 0:
            self._cu -= cu
        return 0.0

    def admit(self, double now, long long day, long long requests, long long cu, DayQuota quota):
        cdef long long room = quota.room(day)
        if 0 <= room < requests:
            return -1.0
        cdef double wait = self._take(now, requests, cu)
        if wait == 0.0:
            quota.take(day, requests)
        return wait

    def headers(self, double now, double epoch, long long limit):
        if limit <= 0:
            return _unlimited_headers(<long long>epoch)
        self._refill(now)
        return _rate_headers(limit, self._remaining(), <long long>ceil(epoch + self._full_in()))

    def absorb(self, double now, double requests, double cu):
        self._refill(now)
        if self._rps > 0:
            self._requests = self._requests - requests
            if self._requests < -self._rps:
                self._requests = -self._rps
        if self._cu_rate > 0:
            self._cu = self._cu - cu
            if self._cu < -self._cu_rate:
                self._cu = -self._cu_rate

    cdef inline long long _remaining(self) noexcept:
        if self._rps <= 0:
            return 0
        cdef double whole = floor(self._requests)
        return <long long>whole if whole > 0 else 0

    cdef inline double _full_in(self) noexcept:
        if self._rps <= 0:
            return 0.0
        cdef double seconds = (self._rps - self._requests) / self._rps
        return seconds if seconds > 0 else 0.0

    def remaining(self, double now):
        self._refill(now)
        return self._remaining()

    def full_in(self, double now):
        self._refill(now)
        return self._full_in()


@cython.no_gc  # numbers only
cdef class _Usage:
    """One slot's counts, kept in C (a slot is counted many times a minute)."""

    cdef long long requests
    cdef long long cu
    cdef long long errors


cdef class UsageMeter:
    cdef dict _counts
    # The slot counted last: a key's requests come in runs, so most samples are its again
    # (the same str objects: the principal's and the lane's), found without a tuple or hash.
    cdef object _key_id
    cdef object _account_id
    cdef object _network
    cdef object _method
    cdef long long _minute
    cdef _Usage _last

    def __init__(self):
        self._counts = {}
        self._last = None

    def __len__(self):
        return len(self._counts)

    def record(self, str key_id, str account_id, str network, str method, long long minute,
               long long requests, long long cu, long long errors):
        cdef _Usage usage = self._last
        if not (usage is not None and minute == self._minute and key_id is self._key_id
                and method is self._method and network is self._network
                and account_id is self._account_id):
            slot = (key_id, account_id, network, method, minute)
            found = self._counts.get(slot)
            if found is None:
                usage = _Usage.__new__(_Usage)
                self._counts[slot] = usage
            else:
                usage = <_Usage>found
            self._last = usage
            self._key_id = key_id
            self._account_id = account_id
            self._network = network
            self._method = method
            self._minute = minute
        usage.requests += requests
        usage.cu += cu
        usage.errors += errors

    def drain(self):
        cdef dict counts = self._counts
        cdef _Usage usage
        self._counts = {}
        self._last = None
        rows = []
        for slot, found in counts.items():
            usage = <_Usage>found
            rows.append((*slot, usage.requests, usage.cu, usage.errors))
        rows.sort()
        return rows


cdef bytes _rate_headers(long long limit, long long remaining, long long reset):
    cdef char buffer[160]
    cdef char* q = buffer
    memcpy(q, b"X-RateLimit-Limit: ", 19)
    q += 19
    q += write_int(q, limit)
    memcpy(q, b"\r\nX-RateLimit-Remaining: ", 25)
    q += 25
    q += write_int(q, remaining)
    memcpy(q, b"\r\nX-RateLimit-Reset: ", 21)
    q += 21
    q += write_int(q, reset)
    memcpy(q, b"\r\n", 2)
    q += 2
    return PyBytes_FromStringAndSize(buffer, q - buffer)


# An unlimited plan's lines change only with the second they name: written once a second, not
# on every answer.
cdef long long _unlimited_second = -1
cdef bytes _unlimited_lines = b""


cdef bytes _unlimited_headers(long long second):
    global _unlimited_second, _unlimited_lines
    if second != _unlimited_second:
        _unlimited_lines = _rate_headers(2147483647, 2147483647, second)
        _unlimited_second = second
    return _unlimited_lines


def rate_headers(long long limit, long long remaining, long long reset):
    return _rate_headers(limit, remaining, reset)

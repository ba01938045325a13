# cython: language_level=3
"""Decimal formatting shared by the compiled modules (inlined into each one that cimports it)."""


cdef inline Py_ssize_t write_int(char* q, long long value) noexcept:
    """Write ``value`` in decimal at ``q``; the number of bytes written (at most 20)."""
    cdef char tmp[24]
    cdef int k = 0
    cdef Py_ssize_t n = 0
    if value < 0:
        q[0] = 45
        q += 1
        n = 1
        value = -value
    while True:
        tmp[k] = 48 + value % 10
        value //= 10
        k += 1
        if value == 0:
            break
    while k > 0:
        k -= 1
        q[0] = tmp[k]
        q += 1
        n += 1
    return n


cdef inline Py_ssize_t int_width(long long value) noexcept:
    """Bytes ``write_int`` needs for ``value``."""
    cdef Py_ssize_t n = 1
    if value < 0:
        n += 1
        value = -value
    while value >= 10:
        value //= 10
        n += 1
    return n

# cython: language_level=3
"""JSON scanning shared by the compiled modules (inlined into each one that cimports it)."""


cdef inline Py_ssize_t json_ws(const unsigned char* p, Py_ssize_t i, Py_ssize_t n) noexcept:
    """The offset of the first byte at or after ``i`` that is not JSON whitespace."""
    # One compare for the usual answer (a token, not whitespace): every whitespace byte is
    # at most a space.
    while i < n and p[i] <= 32 and (p[i] == 32 or p[i] == 10 or p[i] == 13 or p[i] == 9):
        i += 1
    return i

# cython: language_level=3
"""The framing objects of ``native/jsonrpc.pyx``, declared here so the lane (fastlane.pyx)
reads their fields as C struct members, not by attribute lookups (the path mirrors the
module's name, ``chaingate._native.jsonrpc``, which is what a cimport imports at run time)."""


cdef class Call:
    cdef public object id
    cdef public object method
    cdef public object params
    cdef public int error
    cdef public str message


cdef class ParsedRequest:
    cdef public bint batch
    cdef public list calls
    cdef public int error
    cdef public str message


cdef class Reply:
    # The id (its raw JSON, ``id``): ``_id``, or while ``_lazy`` the digits of ``_number``,
    # made when asked for (the lane reads the number: ``upstream_id``).
    cdef object _id
    cdef bint _lazy
    cdef long long _number  # the id as ours are spelled (decimal digits, at most 18), else -1
    cdef readonly object result
    cdef public object error
    cdef long long _block  # read while the response was scanned (BLOCK_*, or the number)


cdef class ParsedResponse:
    cdef public bint batch
    cdef public list replies


cdef inline long long upstream_id(Reply reply) noexcept:
    """The id of an upstream reply as ours are spelled (decimal digits), else -1."""
    return reply._number

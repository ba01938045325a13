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
    cdef public object id
    cdef readonly object result
    cdef public object error
    cdef long long _block  # read while the response was scanned (BLOCK_*, or the number)


cdef class ParsedResponse:
    cdef public bint batch
    cdef public list replies

# cython: language_level=3
"""JSON-RPC replies as the compiled modules write them (inlined into each one that cimports it):
``{"jsonrpc":"2.0","id":<id>,"result":<result>}`` and its ``"error"`` twin, the raw JSON of the
id and of the result or error copied in, in one allocation."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.string cimport memcpy


cdef inline bytes _reply(bytes id_raw, const char* member, Py_ssize_t member_len, bytes value):
    cdef Py_ssize_t id_len = PyBytes_GET_SIZE(id_raw), value_len = PyBytes_GET_SIZE(value)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, 22 + id_len + member_len + value_len + 1)
    cdef char* q = PyBytes_AS_STRING(out)
    memcpy(q, b'{"jsonrpc":"2.0","id":', 22)
    q += 22
    memcpy(q, PyBytes_AS_STRING(id_raw), id_len)
    q += id_len
    memcpy(q, member, member_len)
    q += member_len
    memcpy(q, PyBytes_AS_STRING(value), value_len)
    q[value_len] = 125
    return out


cdef inline bytes result_reply_of(bytes id_raw, bytes result):
    return _reply(id_raw, b',"result":', 10, result)


cdef inline bytes error_reply_of(bytes id_raw, bytes error):
    return _reply(id_raw, b',"error":', 9, error)


cdef inline object join_present(list parts):
    """``[part,part,...]`` of the replies in ``parts`` (bytes, or None for a position with
    none: left out), each copied once into one allocation; None when there is none."""
    cdef Py_ssize_t total = 1, count = 0, size
    cdef object part
    cdef bytes out
    cdef char* q
    for part in parts:
        if part is not None:
            total += PyBytes_GET_SIZE(<bytes>part) + 1
            count += 1
    if count == 0:
        return None
    out = PyBytes_FromStringAndSize(NULL, total)
    q = PyBytes_AS_STRING(out)
    q[0] = 91
    q += 1
    for part in parts:
        if part is not None:
            size = PyBytes_GET_SIZE(<bytes>part)
            memcpy(q, PyBytes_AS_STRING(<bytes>part), size)
            q[size] = 44
            q += size + 1
    (q - 1)[0] = 93
    return out

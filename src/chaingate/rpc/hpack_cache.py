"""HPACK for the upstream HTTP/2 connection, without re-encoding or re-decoding the same headers.

Measured through nginx (docs/decisions/rpc.md, "Upstreams"): the pure-Python ``hpack`` library was
most of HTTP/2's cost per request — encoding our request's headers through the dynamic table,
and Huffman-decoding nginx's answer headers, which nginx sends as literals it never indexes.
Both sides are the same bytes request after request, so both are memoised:

* ``StaticEncoder`` never uses the dynamic table (RFC 7541 allows an encoder that never
  indexes): a header list always encodes to the same bytes, kept by list.  Its first block
  sets the table size to 0, so a server lowering SETTINGS_HEADER_TABLE_SIZE needs no update.
* ``MemoDecoder`` keeps the headers of a block that decoded without touching the dynamic
  table (empty before and after, same size limit): such a block means the same every time.
  A server that indexes its headers simply gets no memo.

Both caches are bounded (cleared when full): answers differ by ``date`` each second and by
``content-length``, so a handful of blocks are live at a time.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hpack import Decoder, Encoder, HeaderTuple
from hpack.table import HeaderTable

MEMO_ENTRIES = 512
MAX_MEMO_BLOCK = 2048  # bytes of a header block worth keeping

# (name, value) -> static index; name -> static index of its first entry.
_STATIC_PAIRS: dict[tuple[bytes, bytes], int] = {}
_STATIC_NAMES: dict[bytes, int] = {}
for _index, (_name, _value) in enumerate(HeaderTable.STATIC_TABLE, 1):
    _STATIC_PAIRS.setdefault((_name, _value), _index)
    _STATIC_NAMES.setdefault(_name, _index)


def _integer(value: int, prefix_bits: int, first: int) -> bytes:
    """RFC 7541 5.1: ``value`` with an N-bit prefix; ``first`` holds the bits above it."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(data: bytes) -> bytes:
    return _integer(len(data), 7, 0x00) + data  # no Huffman: bytes are cheaper than CPU here


def encode_field(name: bytes, value: bytes) -> bytes:
    """One header field, indexed from the static table or a literal never added to a table."""
    index = _STATIC_PAIRS.get((name, value))
    if index is not None:
        return _integer(index, 7, 0x80)
    index = _STATIC_NAMES.get(name)
    if index is not None:
        return _integer(index, 4, 0x00) + _string(value)  # literal without indexing
    return b"\x00" + _string(name) + _string(value)


class StaticEncoder(Encoder):
    """Stands in for ``hpack.Encoder`` in an ``h2`` connection (``conn.encoder``); h2 still
    sets ``header_table_size`` from the server's SETTINGS, which this one never uses."""

    def __init__(self) -> None:
        super().__init__()
        self._memo: dict[tuple[Any, ...], bytes] = {}
        self._size_update = _integer(0, 5, 0x20)  # once: "my dynamic table holds 0 bytes"

    def encode(self, headers: Iterable[Any], huffman: bool = True) -> bytes:
        key = tuple(headers)
        block = self._memo.get(key)
        if block is None:
            block = b"".join(encode_field(bytes(name), bytes(value)) for name, value in key)
            if len(self._memo) >= MEMO_ENTRIES:
                self._memo.clear()
            self._memo[key] = block
        if self._size_update:
            block, self._size_update = self._size_update + block, b""
        return block


class MemoDecoder(Decoder):
    """Stands in for ``hpack.Decoder`` in an ``h2`` connection (``conn.decoder``)."""

    def __init__(self, max_header_list_size: int) -> None:
        super().__init__(max_header_list_size=max_header_list_size)
        self._memo: dict[bytes, list[HeaderTuple]] = {}

    def decode(self, data: bytes, raw: bool = False) -> list[HeaderTuple]:
        table = self.header_table
        stateless = raw and not table.dynamic_entries
        if stateless:
            hit = self._memo.get(data)
            if hit is not None:
                return hit
        limit = table.maxsize
        headers = list(super().decode(data, raw))
        if (
            stateless
            and not table.dynamic_entries
            and table.maxsize == limit
            and len(data) <= MAX_MEMO_BLOCK
        ):
            if len(self._memo) >= MEMO_ENTRIES:
                self._memo.clear()
            self._memo[bytes(data)] = headers
        return headers

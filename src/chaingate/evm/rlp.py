"""RLP (the Ethereum yellow paper's appendix B): byte strings and lists of them, both ways.

Items are ``bytes`` or lists of items; integers are encoded by the caller as minimal big-endian
bytes (``int_bytes``).  Decoding is strict — non-canonical lengths, a short string encoded as a
long one, trailing bytes — because a transaction's hash is over the exact bytes sent, and two
encodings of one transaction must not both be accepted.
"""

from __future__ import annotations

from typing import TypeAlias

Item: TypeAlias = bytes | list["Item"]

MAX_DEPTH = 16


class RlpError(ValueError):
    pass


def int_bytes(value: int) -> bytes:
    """The minimal big-endian form RLP gives an integer (zero is the empty string)."""
    if value < 0:
        raise RlpError("RLP integers are unsigned")
    return value.to_bytes((value.bit_length() + 7) // 8, "big")


def bytes_int(data: bytes) -> int:
    if data[:1] == b"\x00":
        raise RlpError("an RLP integer has no leading zero byte")
    return int.from_bytes(data, "big")


def _length_prefix(length: int, short: int) -> bytes:
    if length < 56:
        return bytes([short + length])
    size = int_bytes(length)
    return bytes([short + 55 + len(size)]) + size


def encode(item: Item) -> bytes:
    if isinstance(item, (bytes, bytearray)):
        if len(item) == 1 and item[0] < 0x80:
            return bytes(item)
        return _length_prefix(len(item), 0x80) + bytes(item)
    payload = b"".join(encode(child) for child in item)
    return _length_prefix(len(payload), 0xC0) + payload


def _span(data: bytes, at: int) -> tuple[bool, int, int]:
    """(is_list, payload start, payload end) of the item at ``at``."""
    if at >= len(data):
        raise RlpError("truncated RLP")
    first = data[at]
    if first < 0x80:
        return False, at, at + 1
    is_list = first >= 0xC0
    base = 0xC0 if is_list else 0x80
    if first - base < 56:
        length = first - base
        start = at + 1
        if not is_list and length == 1 and start < len(data) and data[start] < 0x80:
            raise RlpError("a single byte below 0x80 is its own encoding")
    else:
        size = first - base - 55
        start = at + 1 + size
        if start > len(data):
            raise RlpError("truncated RLP length")
        length = int.from_bytes(data[at + 1 : start], "big")
        if data[at + 1] == 0 or length < 56:
            raise RlpError("non-canonical RLP length")
    end = start + length
    if end > len(data):
        raise RlpError("truncated RLP payload")
    return is_list, start, end


def _decode(data: bytes, at: int, depth: int) -> tuple[Item, int]:
    if depth > MAX_DEPTH:
        raise RlpError("RLP nested too deep")
    is_list, start, end = _span(data, at)
    if not is_list:
        return data[start:end], end
    items: list[Item] = []
    cursor = start
    while cursor < end:
        child, cursor = _decode(data, cursor, depth + 1)
        items.append(child)
    if cursor != end:
        raise RlpError("RLP list overruns its length")
    return items, end


def decode(data: bytes) -> Item:
    item, end = _decode(data, 0, 0)
    if end != len(data):
        raise RlpError("trailing bytes after RLP item")
    return item

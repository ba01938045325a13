"""Solidity ABI encoding and decoding — the subset chaingate's own calls need.

Types: ``uint<N>``/``int<N>`` (``uint``/``int`` mean 256), ``address``, ``bool``,
``bytes<N>``, ``bytes``, ``string``, arrays ``T[]``/``T[k]`` and tuples ``(T1,T2,...)``.
Python values: ``int``, ``str`` addresses (0x-hex in, EIP-55 out), ``bool``, ``bytes``, ``str``,
``list`` for arrays and ``tuple`` for tuples.  Written here rather than taking ``eth-abi``, which
brings eth-utils, eth-typing, eth-hash, parsimonious, cytoolz and pydantic for ~250 lines.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from chaingate.evm.addresses import address_bytes, checksum_address
from chaingate.evm.keccak import keccak256

_WORD = 32


class AbiError(ValueError):
    """A value does not fit its type, or data is not a valid encoding of the types."""


def _word(value: int) -> bytes:
    return value.to_bytes(_WORD, "big")


def _pad(raw: bytes) -> bytes:
    return raw + b"\x00" * (-len(raw) % _WORD)


class _Type:
    dynamic = False
    head_size = _WORD  # bytes this type takes in its enclosing sequence's head

    def encode(self, value: object) -> bytes:
        raise NotImplementedError

    def decode(self, data: bytes, offset: int) -> Any:
        raise NotImplementedError


def _read_word(data: bytes, offset: int) -> bytes:
    if offset < 0 or offset + _WORD > len(data):
        raise AbiError(f"data too short: need 32 bytes at {offset}, have {len(data)}")
    return data[offset : offset + _WORD]


def _read_length(data: bytes, offset: int) -> int:
    value = int.from_bytes(_read_word(data, offset), "big")
    if value > len(data):
        raise AbiError(f"length or offset {value} beyond the data")
    return value


class _Int(_Type):
    def __init__(self, bits: int, signed: bool) -> None:
        if not (8 <= bits <= 256 and bits % 8 == 0):
            raise AbiError(f"invalid integer size {bits}")
        self.bits = bits
        self.signed = signed

    def encode(self, value: object) -> bytes:
        if not isinstance(value, int) or isinstance(value, bool):
            raise AbiError(f"expected an int, got {type(value).__name__}")
        low, high = (
            (-(1 << (self.bits - 1)), 1 << (self.bits - 1)) if self.signed else (0, 1 << self.bits)
        )
        if not low <= value < high:
            raise AbiError(f"{value} does not fit {'int' if self.signed else 'uint'}{self.bits}")
        return _word(value % (1 << 256))

    def decode(self, data: bytes, offset: int) -> int:
        value = int.from_bytes(_read_word(data, offset), "big")
        if self.signed and value >= 1 << 255:
            value -= 1 << 256
        return value


class _Address(_Type):
    def encode(self, value: Any) -> bytes:  # str or bytes, as address_bytes takes
        return b"\x00" * 12 + address_bytes(value)

    def decode(self, data: bytes, offset: int) -> str:
        return checksum_address(_read_word(data, offset)[12:])


class _Bool(_Type):
    def encode(self, value: object) -> bytes:
        if not isinstance(value, bool):
            raise AbiError(f"expected a bool, got {type(value).__name__}")
        return _word(int(value))

    def decode(self, data: bytes, offset: int) -> bool:
        return int.from_bytes(_read_word(data, offset), "big") != 0


class _FixedBytes(_Type):
    def __init__(self, size: int) -> None:
        if not 1 <= size <= 32:
            raise AbiError(f"invalid bytes{size}")
        self.size = size

    def encode(self, value: object) -> bytes:
        if not isinstance(value, bytes) or len(value) != self.size:
            raise AbiError(f"expected {self.size} bytes")
        return _pad(value)

    def decode(self, data: bytes, offset: int) -> bytes:
        return _read_word(data, offset)[: self.size]


def _read_bytes(data: bytes, offset: int) -> bytes:
    length = _read_length(data, offset)
    if offset + _WORD + length > len(data):
        raise AbiError("bytes run past the data")
    return data[offset + _WORD : offset + _WORD + length]


class _Bytes(_Type):
    dynamic = True

    def encode(self, value: object) -> bytes:
        if not isinstance(value, bytes | bytearray):
            raise AbiError(f"expected bytes, got {type(value).__name__}")
        return _word(len(value)) + _pad(bytes(value))

    def decode(self, data: bytes, offset: int) -> bytes:
        return _read_bytes(data, offset)


class _String(_Type):
    dynamic = True

    def encode(self, value: object) -> bytes:
        if not isinstance(value, str):
            raise AbiError(f"expected a str, got {type(value).__name__}")
        raw = value.encode()
        return _word(len(raw)) + _pad(raw)

    def decode(self, data: bytes, offset: int) -> str:
        try:
            return _read_bytes(data, offset).decode()
        except UnicodeDecodeError:
            raise AbiError("string is not UTF-8") from None


def _encode_sequence(types: Sequence[_Type], values: Sequence[Any]) -> bytes:
    if len(types) != len(values):
        raise AbiError(f"expected {len(types)} values, got {len(values)}")
    heads: list[bytes] = []
    tails: list[bytes] = []
    tail_offset = sum(t.head_size for t in types)
    for kind, value in zip(types, values, strict=True):
        encoded = kind.encode(value)
        if kind.dynamic:
            heads.append(_word(tail_offset))
            tails.append(encoded)
            tail_offset += len(encoded)
        else:
            heads.append(encoded)
    return b"".join(heads + tails)


def _decode_sequence(types: Sequence[_Type], data: bytes, base: int) -> tuple[Any, ...]:
    values = []
    position = base
    for kind in types:
        if kind.dynamic:
            values.append(kind.decode(data, base + _read_length(data, position)))
        else:
            values.append(kind.decode(data, position))
        position += kind.head_size
    return tuple(values)


class _Tuple(_Type):
    def __init__(self, items: Sequence[_Type]) -> None:
        self.items = tuple(items)
        self.dynamic = any(item.dynamic for item in self.items)
        self.head_size = _WORD if self.dynamic else sum(item.head_size for item in self.items)

    def encode(self, value: object) -> bytes:
        if not isinstance(value, tuple | list):
            raise AbiError(f"expected a tuple, got {type(value).__name__}")
        return _encode_sequence(self.items, value)

    def decode(self, data: bytes, offset: int) -> tuple[Any, ...]:
        return _decode_sequence(self.items, data, offset)


class _Array(_Type):
    def __init__(self, item: _Type, length: int | None) -> None:
        self.item = item
        self.length = length
        self.dynamic = length is None or item.dynamic
        self.head_size = _WORD if self.dynamic else item.head_size * (length or 0)

    def encode(self, value: object) -> bytes:
        if not isinstance(value, list | tuple):
            raise AbiError(f"expected a list, got {type(value).__name__}")
        if self.length is not None and len(value) != self.length:
            raise AbiError(f"expected {self.length} items, got {len(value)}")
        body = _encode_sequence([self.item] * len(value), value)
        return body if self.length is not None else _word(len(value)) + body

    def decode(self, data: bytes, offset: int) -> list[Any]:
        if self.length is not None:
            return list(_decode_sequence([self.item] * self.length, data, offset))
        count = _read_length(data, offset)
        return list(_decode_sequence([self.item] * count, data, offset + _WORD))


def split_top_level(inner: str) -> list[str]:
    """The comma-separated parts of a type list, parentheses nesting."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, c in enumerate(inner):
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(inner[start:i])
            start = i + 1
    if inner:
        parts.append(inner[start:])
    return parts


@functools.lru_cache(maxsize=512)
def parse_type(text: str) -> _Type:
    text = text.strip()
    if text.endswith("]"):
        open_at = text.rindex("[")
        size = text[open_at + 1 : -1]
        return _Array(parse_type(text[:open_at]), int(size) if size else None)
    if text.startswith("(") and text.endswith(")"):
        return _Tuple([parse_type(part) for part in split_top_level(text[1:-1])])
    if text == "address":
        return _Address()
    if text == "bool":
        return _Bool()
    if text == "string":
        return _String()
    if text == "bytes":
        return _Bytes()
    for prefix, signed in (("uint", False), ("int", True)):
        if text.startswith(prefix) and (text[len(prefix) :].isdigit() or text == prefix):
            return _Int(int(text[len(prefix) :] or 256), signed)
    if text.startswith("bytes") and text[5:].isdigit():
        return _FixedBytes(int(text[5:]))
    raise AbiError(f"unsupported ABI type {text!r}")


def _parse_types(types: str | Sequence[str]) -> _Tuple:
    if isinstance(types, str):
        parsed = parse_type(types)
        if not isinstance(parsed, _Tuple):
            raise AbiError(f"give a sequence of types as a list or as '(t1,t2)', not {types!r}")
        return parsed
    return _Tuple([parse_type(t) for t in types])


def encode(types: str | Sequence[str], values: Sequence[Any]) -> bytes:
    """ABI-encode ``values`` as the sequence ``types`` (a list, or ``"(t1,t2)"``)."""
    return _parse_types(types).encode(values)


def decode(types: str | Sequence[str], data: bytes) -> tuple[Any, ...]:
    """Decode return data (or any ABI sequence) of ``types``."""
    return _parse_types(types).decode(data, 0)


# A contract's few signatures come back on every call (the bundler encodes several per
# operation); a keccak through pycryptodome costs ~15 us of object setup alone.
@functools.lru_cache(maxsize=1024)
def selector(signature: str) -> bytes:
    """The 4-byte selector of a canonical signature such as ``transfer(address,uint256)``."""
    return keccak256(signature.replace(" ", "").encode())[:4]


def event_topic(signature: str) -> str:
    """topic0 of an event, as 0x-hex: ``Transfer(address,address,uint256)``."""
    return "0x" + keccak256(signature.replace(" ", "").encode()).hex()


def encode_call(signature: str, *args: object) -> bytes:
    """Calldata for ``name(types...)`` with ``args``."""
    signature = signature.replace(" ", "")
    open_at = signature.index("(")
    return selector(signature) + encode(signature[open_at:], args)

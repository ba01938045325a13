"""Solidity ABI encoding and decoding — the subset chaingate's own calls need.

Types: ``uint<N>``/``int<N>`` (``uint``/``int`` mean 256), ``address``, ``bool``,
``bytes<N>``, ``bytes``, ``string``, arrays ``T[]``/``T[k]`` and tuples ``(T1,T2,...)``.
Python values: ``int``, ``str`` addresses (0x-hex in, EIP-55 out), ``bool``, ``bytes``, ``str``,
``list`` for arrays and ``tuple`` for tuples.  Written here rather than taking ``eth-abi``, which
brings eth-utils, eth-typing, eth-hash, parsimonious, cytoolz and pydantic for ~250 lines.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
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
    return _encoder(types if isinstance(types, str) else tuple(types))(values)


@functools.lru_cache(maxsize=512)
def _encoder(types: str | tuple[str, ...]) -> Callable[[Sequence[Any]], bytes]:
    """``types``' encoder: ``flat_encoder``'s for a flat sequence or one struct of one (a
    function taking a struct: ``simulateValidation``), else the generic one."""
    parsed = _parse_types(types)
    names = [_canonical(item) for item in parsed.items]
    if all(name is not None for name in names):
        return flat_encoder(tuple(n for n in names if n is not None))
    only = parsed.items[0] if len(parsed.items) == 1 else None
    if isinstance(only, _Tuple) and only.dynamic:
        fields = [_canonical(item) for item in only.items]
        if all(name is not None for name in fields):
            inner = flat_encoder(tuple(n for n in fields if n is not None))
            return functools.partial(_one_struct, inner)
    return parsed.encode


def _one_struct(inner: Callable[[Sequence[Any]], bytes], values: Sequence[Any]) -> bytes:
    """A sequence of one dynamic struct: its offset (one word), then the struct."""
    if not isinstance(values, tuple | list):
        raise AbiError(f"expected a tuple, got {type(values).__name__}")
    if len(values) != 1:
        raise AbiError(f"expected 1 values, got {len(values)}")
    return _word(_WORD) + inner(values[0])


def _canonical(kind: _Type) -> str | None:
    """The type's name for ``flat_encoder`` when it is one it encodes itself, else None."""
    if isinstance(kind, _Address):
        return "address"
    if isinstance(kind, _Int) and not kind.signed:
        return f"uint{kind.bits}"
    if isinstance(kind, _FixedBytes):
        return f"bytes{kind.size}"
    if isinstance(kind, _Bytes):
        return "bytes"
    return None


def decode(types: str | Sequence[str], data: bytes) -> tuple[Any, ...]:
    """Decode return data (or any ABI sequence) of ``types``."""
    decoded: tuple[Any, ...] = _decoder(types if isinstance(types, str) else tuple(types))(data, 0)
    return decoded


_Decode = Callable[[bytes, int], Any]


@functools.lru_cache(maxsize=512)
def _decoder(types: str | tuple[str, ...]) -> _Decode:
    return _compiled(_parse_types(types))


def _compiled(kind: _Type) -> _Decode:
    """``kind.decode`` as closures, a tuple's items' decoders, offsets and sizes resolved once
    (the bundler decodes a ValidationResult of ~20 fields per operation): same values, same
    AbiErrors.  Arrays (and any other type) keep their own ``decode``."""
    if isinstance(kind, _Int) and not kind.signed:

        def uint(data: bytes, offset: int) -> int:
            if offset < 0 or offset + _WORD > len(data):
                return kind.decode(data, offset)  # its AbiError
            return int.from_bytes(data[offset : offset + _WORD], "big")

        return uint
    if isinstance(kind, _Tuple):
        items = tuple((_compiled(item), item.dynamic, item.head_size) for item in kind.items)

        def sequence(data: bytes, base: int) -> tuple[Any, ...]:
            values = []
            position = base
            for item, dynamic, size in items:
                if dynamic:
                    values.append(item(data, base + _read_length(data, position)))
                else:
                    values.append(item(data, position))
                position += size
            return tuple(values)

        return sequence
    return kind.decode


# A flat sequence's fields as (kind, bound): what ``flat_encoder``'s closure does per field.
_ADDRESS, _UINT, _FIXED, _DYNAMIC = range(4)


@functools.lru_cache(maxsize=64)
def flat_encoder(types: tuple[str, ...]) -> Callable[[Sequence[Any]], bytes]:
    """``encode(types, values)`` as one closure, for a flat sequence of ``address``,
    ``uint<N>``, ``bytes<N>`` and ``bytes`` (anything else: the generic encoder).  The bundler
    encodes a few such sequences per operation (its packed struct, its hash's fields), where
    the generic encoder's per-type dispatch was most of the cost; same bytes, same refusals."""
    kinds = [parse_type(t) for t in types]
    plan: list[tuple[int, int]] = []
    for kind in kinds:
        if isinstance(kind, _Address):
            plan.append((_ADDRESS, 0))
        elif isinstance(kind, _Int) and not kind.signed:
            plan.append((_UINT, 1 << kind.bits))
        elif isinstance(kind, _FixedBytes):
            plan.append((_FIXED, kind.size))
        elif isinstance(kind, _Bytes):
            plan.append((_DYNAMIC, 0))
        else:
            return _Tuple(kinds).encode
    count, head_size = len(plan), _WORD * len(plan)
    zeros = bytes(_WORD)

    def encode_flat(values: Sequence[Any]) -> bytes:
        if not isinstance(values, tuple | list):
            raise AbiError(f"expected a tuple, got {type(values).__name__}")
        if len(values) != count:
            raise AbiError(f"expected {count} values, got {len(values)}")
        heads: list[bytes] = []
        tails: list[bytes] = []
        offset = head_size
        for (kind, bound), value in zip(plan, values, strict=True):
            if kind == _ADDRESS:
                heads.append(zeros[:12] + address_bytes(value))
            elif kind == _UINT:
                if not isinstance(value, int) or isinstance(value, bool):
                    raise AbiError(f"expected an int, got {type(value).__name__}")
                if not 0 <= value < bound:
                    raise AbiError(f"{value} does not fit uint{bound.bit_length() - 1}")
                heads.append(value.to_bytes(_WORD, "big"))
            elif kind == _FIXED:
                if not isinstance(value, bytes) or len(value) != bound:
                    raise AbiError(f"expected {bound} bytes")
                heads.append(value + zeros[bound:])
            else:
                if not isinstance(value, bytes | bytearray):
                    raise AbiError(f"expected bytes, got {type(value).__name__}")
                size = len(value)
                padding = -size % _WORD
                heads.append(offset.to_bytes(_WORD, "big"))
                tails += (size.to_bytes(_WORD, "big"), bytes(value), zeros[:padding])
                offset += _WORD + size + padding
        return b"".join(heads + tails)

    return encode_flat


def encode_dynamic_array(encoded: Sequence[bytes]) -> bytes:
    """A ``T[]`` of dynamic items given each item's own encoding (what ``encode([T], [v])``
    gives for one): its length, the items' offsets, the items."""
    heads = [len(encoded).to_bytes(_WORD, "big")]
    offset = _WORD * len(encoded)
    for item in encoded:
        heads.append(offset.to_bytes(_WORD, "big"))
        offset += len(item)
    return b"".join(heads) + b"".join(encoded)


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

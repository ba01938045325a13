"""Human-readable ABI signatures, and calls, logs and errors decoded by them into named values.

A signature is written the way Solidity declares it, names and ``indexed`` included:
``transfer(address to, uint256 value) returns (bool)``, ``Transfer(address indexed from,
address indexed to, uint256 value)``, ``InsufficientBalance(uint256 needed)``.  Tuple types are
written bare, ``(address,uint256,bytes)[]`` (their components are not named).  ``parse`` reads
one into a ``Signature``: its canonical form, selector and topic0, and its parameters.

Decoded values are JSON-ready: addresses EIP-55, integers as decimal strings (a uint256 does not
fit a JSON number), bytes as 0x-hex, booleans and strings as themselves, arrays and tuples as
lists.  An indexed parameter of a dynamic type is only its hash in the topic: it stays 0x-hex.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import msgspec

from chaingate.evm import abi

__all__ = ["Param", "Signature", "decoded_value", "parse"]

_STATIC_WORDS = ("address", "bool", "uint", "int", "bytes")  # one-word types (bytesN, not bytes)


class Param(msgspec.Struct, frozen=True):
    type: str
    name: str = ""
    indexed: bool = False

    @property
    def in_topic_as_hash(self) -> bool:
        """An indexed parameter that is not a one-word type: its topic is its keccak."""
        kind = self.type
        one_word = "[" not in kind and "(" not in kind and kind not in ("bytes", "string")
        return self.indexed and not (one_word and kind.startswith(_STATIC_WORDS))


class Signature(msgspec.Struct, frozen=True, dict=True):
    name: str
    params: tuple[Param, ...]
    outputs: tuple[Param, ...] = ()

    @functools.cached_property
    def canonical(self) -> str:
        return f"{self.name}({','.join(p.type for p in self.params)})"

    @functools.cached_property
    def selector(self) -> bytes:
        return abi.selector(self.canonical)

    @functools.cached_property
    def topic(self) -> str:
        return abi.event_topic(self.canonical)

    @property
    def indexed_count(self) -> int:
        return sum(1 for p in self.params if p.indexed)

    def decode_args(self, data: bytes) -> list[dict[str, Any]]:
        """Call data after the selector (or error data after it) as named values; AbiError
        when ``data`` is no encoding of the parameters."""
        values = abi.decode([p.type for p in self.params], data)
        return _named(self.params, values)

    def decode_outputs(self, data: bytes) -> list[dict[str, Any]]:
        values = abi.decode([p.type for p in self.outputs], data)
        return _named(self.outputs, values)

    def decode_log(self, topics: Sequence[str], data: bytes) -> list[dict[str, Any]]:
        """An event's parameters from its topics (after topic0) and data, in declaration
        order, each with ``indexed``; AbiError or ValueError when they do not fit."""
        if len(topics) != 1 + self.indexed_count:
            raise abi.AbiError("topic count does not match the event")
        unindexed = [p for p in self.params if not p.indexed]
        values = iter(abi.decode([p.type for p in unindexed], data))
        words = iter(topics[1:])
        out = []
        for param in self.params:
            if not param.indexed:
                value = decoded_value(param.type, next(values))
            elif param.in_topic_as_hash:
                value = next(words).lower()
            else:
                word = bytes.fromhex(next(words)[2:])
                value = decoded_value(param.type, abi.decode([param.type], word)[0])
            out.append(
                {"name": param.name, "type": param.type, "value": value, "indexed": param.indexed}
            )
        return out


def _named(params: Sequence[Param], values: Sequence[Any]) -> list[dict[str, Any]]:
    return [
        {"name": p.name, "type": p.type, "value": decoded_value(p.type, v)}
        for p, v in zip(params, values, strict=True)
    ]


def decoded_value(kind: str, value: object) -> object:
    """``value`` (as ``abi.decode`` gives it) in its JSON-ready form (see the module doc)."""
    if isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return str(value)
    if isinstance(value, bytes):
        return "0x" + value.hex()
    if isinstance(value, list | tuple):
        if kind.endswith("]"):
            item = kind[: kind.rindex("[")]
            return [decoded_value(item, v) for v in value]
        parts = abi.split_top_level(kind[1:-1])
        return [decoded_value(part, v) for part, v in zip(parts, value, strict=True)]
    return str(value)


def _params(text: str) -> tuple[Param, ...]:
    params = []
    for part in abi.split_top_level(text):
        words = part.split()
        if not words:
            raise ValueError(f"empty parameter in {text!r}")
        kind, rest = words[0], words[1:]
        indexed = "indexed" in rest
        names = [w for w in rest if w not in ("indexed", "memory", "calldata", "storage")]
        if len(names) > 1:
            raise ValueError(f"cannot read parameter {part.strip()!r}")
        abi.parse_type(kind)  # an unknown type is refused here, not at the first decode
        params.append(Param(kind, names[0] if names else "", indexed))
    return tuple(params)


@functools.cache
def parse(text: str) -> Signature:
    """``name(params) [returns (outputs)]``, a leading ``function``/``event``/``error``
    keyword allowed; ValueError (or AbiError, a ValueError) when it cannot be read."""
    text = text.strip()
    for keyword in ("function ", "event ", "error "):
        if text.startswith(keyword):
            text = text[len(keyword) :].strip()
    open_at = text.find("(")
    if open_at <= 0:
        raise ValueError(f"not a signature: {text!r}")
    name = text[:open_at].strip()
    depth = 0
    close_at = -1
    for i in range(open_at, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                close_at = i
                break
    if close_at < 0 or not name.isidentifier():
        raise ValueError(f"not a signature: {text!r}")
    outputs: tuple[Param, ...] = ()
    rest = text[close_at + 1 :].strip()
    if rest:
        if not rest.startswith("returns") or not rest.endswith(")"):
            raise ValueError(f"not a signature: {text!r}")
        inner = rest[len("returns") :].strip()
        outputs = _params(inner[1:-1])
    return Signature(name, _params(text[open_at + 1 : close_at]), outputs)

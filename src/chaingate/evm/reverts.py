"""Revert data, decoded: Solidity's ``Error(string)``, ``Panic(uint256)``, and custom errors.

A custom error is known by its selector; the caller says which ones it knows (a mapping of
selector to ``signatures.Signature``).  Anything else keeps its raw data: nothing is guessed.
A known error that wraps another revert in its last ``bytes`` argument (an EntryPoint's
``FailedOpWithRevert``, a v0.8 account's ``ExecuteError``) carries it decoded as ``inner``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import msgspec

from chaingate.evm import abi
from chaingate.evm.signatures import Signature

__all__ = ["ERROR_STRING", "PANIC", "PANIC_REASONS", "Revert", "decode_revert", "describe_revert"]

ERROR_STRING = abi.selector("Error(string)")
PANIC = abi.selector("Panic(uint256)")

# What the compiler means by each Panic code (Solidity docs, "Panic via assert and Error via
# require").
PANIC_REASONS: Mapping[int, str] = {
    0x00: "generic compiler panic",
    0x01: "assertion failed",
    0x11: "arithmetic overflow or underflow",
    0x12: "division or modulo by zero",
    0x21: "invalid enum value",
    0x22: "badly encoded storage byte array",
    0x31: "pop from an empty array",
    0x32: "array index out of bounds",
    0x41: "out of memory",
    0x51: "call to an uninitialized function",
}

Kind = Literal["Error", "Panic", "custom", "empty"]


class Revert(msgspec.Struct, frozen=True, omit_defaults=True):
    """What a revert said.  ``message`` reads on its own; the rest is for programs."""

    kind: Kind
    message: str
    reason: str | None = None  # Error's text, a Panic's meaning
    code: int | None = None  # a Panic's code
    selector: str | None = None  # a custom error's, 0x-hex
    name: str | None = None  # a known custom error's name
    args: list[dict[str, Any]] | None = None  # a known custom error's parameters
    inner: Revert | None = None  # the revert a known error wraps


_MAX_WRAPPED = 4  # wrappers unwrapped at most (each one is a known error)


def decode_revert(
    data: bytes, errors: Mapping[bytes, Signature] | None = None, _depth: int = 0
) -> Revert:
    """Revert data as a ``Revert``; ``errors``: the custom errors known by selector."""
    head = data[:4]
    try:
        if head == ERROR_STRING:
            text = str(abi.decode(["string"], data[4:])[0])
            return Revert("Error", text, reason=text)
        if head == PANIC:
            code = int(abi.decode(["uint256"], data[4:])[0])
            meaning = PANIC_REASONS.get(code, "unknown panic code")
            return Revert("Panic", f"panic 0x{code:02x} ({meaning})", reason=meaning, code=code)
    except abi.AbiError:
        pass
    if not data:
        return Revert("empty", "reverted without data")
    if len(data) < 4:
        return Revert("custom", "0x" + data.hex(), selector="0x" + data.hex())
    known = (errors or {}).get(head)
    if known is not None:
        try:
            args = known.decode_args(data[4:])
        except (abi.AbiError, ValueError):
            args = None
        if args is not None:
            shown = ", ".join(f"{a['name'] or a['type']}={a['value']}" for a in args)
            message = f"{known.name}({shown})"
            selector = "0x" + head.hex()
            inner = None
            if args and args[-1]["type"] == "bytes" and _depth < _MAX_WRAPPED:
                inner = decode_revert(bytes.fromhex(args[-1]["value"][2:]), errors, _depth + 1)
                message = f"{known.name}: {inner.message}"
            return Revert(
                "custom", message, selector=selector, name=known.name, args=args, inner=inner
            )
    return Revert("custom", "0x" + data.hex(), selector="0x" + head.hex())


def describe_revert(data: bytes) -> str:
    """Readable text of revert data: Error(string)'s text, a Panic, or the hex."""
    return decode_revert(data).message

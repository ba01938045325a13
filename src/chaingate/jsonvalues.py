"""Value types of JSON inputs: how a path, query or body value becomes a typed one.

msgspec decodes requests into Structs; the types below are the ones JSON has no word for.
Each knows how to check and normalise a client's text (``parse``, raising ValueError with a
message for the client) and what JSON Schema describes it in the OpenAPI document.

Addresses are accepted in lower case, upper case or EIP-55 mixed case; mixed case with a wrong
checksum is refused (it is how a mistyped address shows itself).  Every address chaingate
writes is EIP-55.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from chaingate.evm.addresses import checksum_address

_ADDRESS = re.compile(r"0x[0-9a-fA-F]{40}")
_DECIMAL = re.compile(r"(0|[1-9][0-9]{0,77})")
_HEX = re.compile(r"0x[0-9a-fA-F]{1,64}")
UINT256_MAX = (1 << 256) - 1


class Address(str):
    """An EIP-55 address (input: any case; a mixed-case one must carry a valid checksum)."""

    __slots__ = ()

    @classmethod
    def parse(cls, value: object) -> Address:
        if not isinstance(value, str) or not _ADDRESS.fullmatch(value):
            raise ValueError("expected an address: 0x followed by 40 hex digits")
        digits = value[2:]
        checksummed = checksum_address(value)
        mixed = digits != digits.lower() and digits != digits.upper()
        if mixed and value != checksummed:
            raise ValueError("mixed-case address with a wrong EIP-55 checksum")
        return cls(checksummed)

    @classmethod
    def of(cls, trusted: str | bytes) -> Address:
        """From a value chaingate itself stored (any case, known valid)."""
        return cls(checksum_address(trusted))


class Uint256(int):
    """A non-negative integer below 2**256, given as a decimal or 0x-hex string (or a JSON
    number); written back as a decimal string."""

    __slots__ = ()

    @classmethod
    def parse(cls, value: object) -> Uint256:
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        elif isinstance(value, str) and _DECIMAL.fullmatch(value):
            number = int(value)
        elif isinstance(value, str) and _HEX.fullmatch(value):
            number = int(value, 16)
        else:
            raise ValueError("expected a non-negative integer as a decimal or 0x-hex string")
        if not 0 <= number <= UINT256_MAX:
            raise ValueError("expected an integer between 0 and 2**256 - 1")
        return cls(number)


_HEX_DATA = re.compile(r"0x([0-9a-fA-F]{2})*")
MAX_HEX_DATA_BYTES = 24 * 1024  # several such fields still fit a 256 KiB body


class HexData(bytes):
    """Bytes given as 0x-hex (an even number of digits; "0x" is empty), at most 24 KiB."""

    @classmethod
    def parse(cls, value: object) -> HexData:
        if not isinstance(value, str) or len(value) > 2 + 2 * MAX_HEX_DATA_BYTES:
            raise ValueError(f"expected 0x-hex bytes, at most {MAX_HEX_DATA_BYTES} bytes")
        if not _HEX_DATA.fullmatch(value):
            raise ValueError("expected 0x followed by an even number of hex digits")
        return cls(bytes.fromhex(value[2:]))


# From the Unix epoch to the end of year 9999 (what ISO 8601 can name).
MAX_UNIX_SECONDS = 253_402_300_799
_TIME_PATTERN = (
    r"^([0-9]{1,12}(\.[0-9]{1,9})?|[0-9]{4}-[0-9]{2}-[0-9]{2}"
    r"([T ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]{1,6})?)?)?(Z|[+-][0-9]{2}:?[0-9]{2})?)$"
)


class UnixTime(int):
    """A moment given as ISO 8601 (UTC unless an offset is given) or Unix seconds; held as
    whole Unix seconds between the epoch and the end of year 9999."""

    __slots__ = ()

    @classmethod
    def parse(cls, value: object) -> UnixTime:
        problem = f"expected an ISO 8601 timestamp or Unix seconds between 0 and {MAX_UNIX_SECONDS}"
        if not isinstance(value, str) or len(value) > 64 or not re.match(_TIME_PATTERN, value):
            raise ValueError(problem)
        try:
            number = float(value)
        except ValueError:
            pass
        else:
            if not math.isfinite(number) or not 0 <= number <= MAX_UNIX_SECONDS:
                raise ValueError(problem)
            return cls(int(number))
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
            if parsed.tzinfo is None:
                parsed = parsed.replace(tzinfo=UTC)
            seconds = int(parsed.timestamp())
        except (OverflowError, ValueError):  # day 31 of February, year 1 minus an offset...
            raise ValueError(problem) from None
        if not 0 <= seconds <= MAX_UNIX_SECONDS:
            raise ValueError(problem)
        return cls(seconds)


# What each custom type decodes from, and the JSON Schema that says so.
_TYPES: dict[type, tuple[Callable[[object], Any], dict[str, Any]]] = {
    Address: (
        Address.parse,
        {
            "type": "string",
            "pattern": "^0x[0-9a-fA-F]{40}$",
            "description": "An address: lower case or EIP-55 (answers are always EIP-55).",
            "examples": ["0x5FF137D4b0FDCD49DcA30c7CF57E578a026d2789"],
        },
    ),
    UnixTime: (
        UnixTime.parse,
        {
            "type": "string",
            "pattern": _TIME_PATTERN,
            "maxLength": 64,
            "description": "ISO 8601 (UTC unless an offset is given) or Unix seconds.",
            "examples": ["2026-11-23T00:00:00Z", "1763856000"],
        },
    ),
    HexData: (
        HexData.parse,
        {
            "type": "string",
            "pattern": "^0x([0-9a-fA-F]{2})*$",
            "maxLength": 2 + 2 * MAX_HEX_DATA_BYTES,
            "description": "Bytes as 0x-hex.",
        },
    ),
    Uint256: (
        Uint256.parse,
        {
            "type": "string",
            "pattern": "^(0|[1-9][0-9]{0,77}|0x[0-9a-fA-F]{1,64})$",
            "description": "A uint256 as a decimal or 0x-hex string.",
        },
    ),
}


def dec_hook(kind: type, value: object) -> object:
    entry = _TYPES.get(kind)
    if entry is None:
        raise NotImplementedError(f"no decoder for {kind}")
    return entry[0](value)


def enc_hook(value: object) -> object:
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return str(value)  # Uint256 is written as a decimal string
    if isinstance(value, bytes):
        return "0x" + value.hex()  # HexData
    raise NotImplementedError(f"cannot encode {type(value).__name__}")


def schema_hook(kind: type) -> dict[str, Any]:
    entry = _TYPES.get(kind)
    if entry is None:
        raise NotImplementedError(f"no schema for {kind}")
    return dict(entry[1])

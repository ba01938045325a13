"""A simulation request's values, checked (sans-IO): transactions, a block, state overrides.

The JSON-RPC methods and ``POST /v1/simulate/{chain}`` take the same values; each is read here
once into what the node is sent, every size bounded.  A transaction is eth_call's object
(``from``, ``to``, ``gas``, ``gasPrice``, ``maxFeePerGas``, ``maxPriorityFeePerGas``,
``value``, ``data`` or ``input``, ``nonce``, ``accessList``; ``type`` and ``chainId`` accepted
and not needed); a block is a tag, a number, a hash or an EIP-1898 object (``latest`` when
absent); state overrides are geth's (``balance``, ``nonce``, ``code``, ``state`` or
``stateDiff`` per address).  Anything else is a ``BadParams`` naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chaingate.evm.addresses import checksum_address

__all__ = [
    "MAX_ACCESS_LIST",
    "MAX_CALL_DATA",
    "MAX_OVERRIDE_ACCOUNTS",
    "MAX_OVERRIDE_SLOTS",
    "BadParams",
    "block_param",
    "state_overrides",
    "transaction",
]

MAX_CALL_DATA = 128 * 1024  # bytes of a transaction's data: the most a node's pool takes
MAX_CODE = 256 * 1024  # bytes of an overriding code
MAX_OVERRIDE_ACCOUNTS = 64
MAX_OVERRIDE_SLOTS = 1024  # storage slots of one overridden account
MAX_ACCESS_LIST = 256  # entries (and storage keys per entry)

_HEX = frozenset("0123456789abcdefABCDEF")
_TAGS = frozenset({"latest", "pending", "safe", "finalized", "earliest"})
_QUANTITIES = ("gas", "gasPrice", "maxFeePerGas", "maxPriorityFeePerGas", "value", "nonce")
_IGNORED = ("type", "chainId")


class BadParams(ValueError):
    """A parameter the client got wrong (JSON-RPC -32602, REST 400)."""


def _digits(field: str, value: object, what: str) -> str:
    if not isinstance(value, str) or value[:2] not in ("0x", "0X"):
        raise BadParams(f"{field}: expected {what} as a 0x-hex string")
    digits = value[2:]
    if not _HEX.issuperset(digits):
        raise BadParams(f"{field}: not hex")
    return digits


def quantity(field: str, value: object, bits: int = 256) -> int:
    """A 0x-hex quantity (a JSON integer is taken too) that fits ``bits``."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        digits = _digits(field, value, "a quantity")
        if not digits or len(digits) > 64:
            raise BadParams(f"{field}: expected a quantity of 1 to 64 hex digits")
        number = int(digits, 16)
    if not 0 <= number < 1 << bits:
        raise BadParams(f"{field}: does not fit uint{bits}")
    return number


def data(field: str, value: object, limit: int) -> str:
    """0x-hex bytes, at most ``limit`` of them; returned lowercase."""
    if isinstance(value, str) and len(value) > 2 + 2 * limit:
        raise BadParams(f"{field}: longer than {limit} bytes")
    digits = _digits(field, value, "bytes")
    if len(digits) % 2:
        raise BadParams(f"{field}: odd number of hex digits")
    return "0x" + digits.lower()


def address(field: str, value: object) -> str:
    """An address, lowercase (a mixed-case one must carry a valid EIP-55 checksum)."""
    digits = _digits(field, value, "an address")
    if len(digits) != 40:
        raise BadParams(f"{field}: an address is 20 bytes")
    mixed = digits != digits.lower() and digits != digits.upper()
    if mixed and checksum_address("0x" + digits)[2:] != digits:
        raise BadParams(f"{field}: bad EIP-55 checksum")
    return "0x" + digits.lower()


def _word(field: str, value: object) -> str:
    digits = _digits(field, value, "a 32-byte word")
    if not digits or len(digits) > 64:
        raise BadParams(f"{field}: expected at most 32 bytes")
    return "0x" + digits.lower().rjust(64, "0")


def transaction(value: object, field: str = "transaction") -> dict[str, Any]:
    """An eth_call transaction object as the node is sent it."""
    if not isinstance(value, Mapping):
        raise BadParams(f"{field}: expected a transaction object")
    out: dict[str, Any] = {}
    for name, item in value.items():
        where = f"{field}.{name}"
        if item is None or name in _IGNORED:
            continue
        if name in ("from", "to"):
            out[name] = address(where, item)
        elif name in _QUANTITIES:
            out[name] = hex(quantity(where, item, 64 if name in ("gas", "nonce") else 256))
        elif name in ("data", "input"):
            given = data(where, item, MAX_CALL_DATA)
            if out.get("data", given) != given:
                raise BadParams(f"{field}: data and input differ")
            out["data"] = given
        elif name == "accessList":
            out[name] = _access_list(where, item)
        else:
            raise BadParams(f"{where[:96]}: unknown field")
    if "gasPrice" in out and ("maxFeePerGas" in out or "maxPriorityFeePerGas" in out):
        raise BadParams(f"{field}: gasPrice or maxFeePerGas/maxPriorityFeePerGas, not both")
    out.setdefault("from", "0x" + "00" * 20)
    return out


def _access_list(field: str, value: object) -> list[dict[str, Any]]:
    if not isinstance(value, list) or len(value) > MAX_ACCESS_LIST:
        raise BadParams(f"{field}: expected a list of at most {MAX_ACCESS_LIST} entries")
    entries = []
    for i, entry in enumerate(value):
        where = f"{field}[{i}]"
        keys = entry.get("storageKeys", []) if isinstance(entry, Mapping) else None
        if not isinstance(keys, list) or len(keys) > MAX_ACCESS_LIST:
            raise BadParams(f"{where}: expected {{address, storageKeys}}")
        assert isinstance(entry, Mapping)
        entries.append(
            {
                "address": address(f"{where}.address", entry.get("address")),
                "storageKeys": [_word(f"{where}.storageKeys", key) for key in keys],
            }
        )
    return entries


# A block reference as the node takes it: a tag or 0x-hex, or an EIP-1898 object.
BlockParam = str | dict[str, Any]


def block_param(value: object) -> BlockParam:
    """A block reference as the node takes it: a tag, 0x-hex number, 32-byte hash, or an
    EIP-1898 ``{blockNumber}``/``{blockHash}`` object."""
    if value is None:
        return "latest"
    if isinstance(value, int) and not isinstance(value, bool):
        return hex(quantity("block", value, 64))
    if isinstance(value, str):
        if value in _TAGS:
            return value
        digits = _digits("block", value, "a block tag, number or hash")
        if len(digits) == 64:
            return "0x" + digits.lower()
        return hex(quantity("block", value, 64))
    if isinstance(value, Mapping):
        if set(value) == {"blockHash"} or set(value) == {"blockHash", "requireCanonical"}:
            out: dict[str, Any] = {"blockHash": _word("block.blockHash", value["blockHash"])}
            if "requireCanonical" in value:
                if not isinstance(value["requireCanonical"], bool):
                    raise BadParams("block.requireCanonical: expected a boolean")
                out["requireCanonical"] = value["requireCanonical"]
            return out
        if set(value) == {"blockNumber"}:
            return {"blockNumber": hex(quantity("block.blockNumber", value["blockNumber"], 64))}
    raise BadParams("block: expected a tag, a number, a hash or {blockHash}/{blockNumber}")


def state_overrides(value: object) -> dict[str, dict[str, Any]]:
    """geth's state override set, checked and bounded."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or len(value) > MAX_OVERRIDE_ACCOUNTS:
        raise BadParams(
            f"stateOverrides: expected an object of at most {MAX_OVERRIDE_ACCOUNTS} addresses"
        )
    out: dict[str, dict[str, Any]] = {}
    for key, account in value.items():
        where = f"stateOverrides.{str(key)[:42]}"
        target = address(where, key)
        if not isinstance(account, Mapping):
            raise BadParams(f"{where}: expected an object")
        entry: dict[str, Any] = {}
        for name, item in account.items():
            if name == "balance":
                entry[name] = hex(quantity(f"{where}.balance", item))
            elif name == "nonce":
                entry[name] = hex(quantity(f"{where}.nonce", item, 64))
            elif name == "code":
                entry[name] = data(f"{where}.code", item, MAX_CODE)
            elif name in ("state", "stateDiff"):
                if not isinstance(item, Mapping) or len(item) > MAX_OVERRIDE_SLOTS:
                    raise BadParams(
                        f"{where}.{name}: expected an object of at most {MAX_OVERRIDE_SLOTS} slots"
                    )
                entry[name] = {
                    _word(f"{where}.{name}", slot): _word(f"{where}.{name}", word)
                    for slot, word in item.items()
                }
            else:
                raise BadParams(f"{where}.{str(name)[:32]}: unknown field")
        if "state" in entry and "stateDiff" in entry:
            raise BadParams(f"{where}: state or stateDiff, not both")
        out[target] = entry
    return out

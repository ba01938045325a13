"""The ERC-7769 RPC form of a UserOperation, strictly parsed per EntryPoint version, and back.

v0.6 takes the eleven fields of its struct (``initCode``, ``paymasterAndData``); v0.7 the
unpacked ones (``factory``/``factoryData``, ``paymaster``/``paymasterVerificationGasLimit``/
``paymasterPostOpGasLimit``/``paymasterData``); v0.8 those of v0.7, a ``factory`` that may be
the EIP-7702 marker (``0x7702``, or zero-padded to 20 bytes), and ``eip7702Auth`` — the sender's
EIP-7702 authorization ``{chainId, address, nonce, yParity, r, s}``. Anything else is refused
with -32602 naming the field: a missing required field, a field of the other version, an unknown
field, a value that is not a string, not 0x-hex, a quantity too large for its type, bytes over
the bound. Quantities may carry leading zeros (some clients pad them); null stands for an absent
optional field. ``partial=True`` is ``eth_estimateUserOperationGas``'s form: the gas limits,
fees and the signature may be left out (they are what is being estimated, or a stub).

(``wallets/erc7677.py`` has its own lenient parser for paymaster stubs; this one is the
bundler's.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chaingate.aa.userop import EIP7702_SHORT, UserOperation, Version, require_version
from chaingate.bundler.errors import INVALID_PARAMS, BundlerFault
from chaingate.evm.addresses import checksum_address
from chaingate.evm.eip7702 import Authorization, parse_authorization

__all__ = ["MAX_FIELD_BYTES", "encode_user_operation", "parse_user_operation"]

# No single bytes field can be larger than a transaction may be (128 KiB in geth's pool);
# sanity.SanityLimits bounds the whole operation tighter.
MAX_FIELD_BYTES = 128 * 1024

_U256 = 256
_U128 = 128

# field -> (kind, bits of a quantity, required in the full form, required in the partial form)
_COMMON: dict[str, tuple[str, int, bool, bool]] = {
    "sender": ("address", 0, True, True),
    "nonce": ("quantity", _U256, True, True),
    "callData": ("bytes", 0, True, True),
    "preVerificationGas": ("quantity", _U256, True, False),
    "signature": ("bytes", 0, True, False),
}
_PACKED: dict[str, tuple[str, int, bool, bool]] = {
    **_COMMON,
    # v0.7 and later pack these two to a bytes32 each: uint128.
    "callGasLimit": ("quantity", _U128, True, False),
    "verificationGasLimit": ("quantity", _U128, True, False),
    "maxFeePerGas": ("quantity", _U128, True, False),
    "maxPriorityFeePerGas": ("quantity", _U128, True, False),
    "factory": ("address", 0, False, False),
    "factoryData": ("bytes", 0, False, False),
    "paymaster": ("address", 0, False, False),
    "paymasterVerificationGasLimit": ("quantity", _U128, False, False),
    "paymasterPostOpGasLimit": ("quantity", _U128, False, False),
    "paymasterData": ("bytes", 0, False, False),
}
_FIELDS: dict[str, dict[str, tuple[str, int, bool, bool]]] = {
    "0.6": {
        **_COMMON,
        "initCode": ("bytes", 0, True, False),
        "callGasLimit": ("quantity", _U256, True, False),
        "verificationGasLimit": ("quantity", _U256, True, False),
        "maxFeePerGas": ("quantity", _U256, True, False),
        "maxPriorityFeePerGas": ("quantity", _U256, True, False),
        "paymasterAndData": ("bytes", 0, True, False),
    },
    "0.7": _PACKED,
    "0.8": {**_PACKED, "eip7702Auth": ("auth", 0, False, False)},
}
# Fields of another version: refused naming the version that takes them.
_OTHER_VERSION = {
    "0.6": {
        **dict.fromkeys(
            (
                "factory",
                "factoryData",
                "paymaster",
                "paymasterVerificationGasLimit",
                "paymasterPostOpGasLimit",
                "paymasterData",
            ),
            "0.7",
        ),
        "eip7702Auth": "0.8",
    },
    "0.7": {"initCode": "0.6", "paymasterAndData": "0.6", "eip7702Auth": "0.8"},
    "0.8": {"initCode": "0.6", "paymasterAndData": "0.6"},
}
_HEX = frozenset("0123456789abcdefABCDEF")


def _fault(field: str, why: str) -> BundlerFault:
    return BundlerFault(INVALID_PARAMS, f"userOp.{field}: {why}", {"field": field})


def _hex_digits(field: str, value: object, what: str) -> str:
    if not isinstance(value, str):
        raise _fault(field, f"expected {what} as a 0x-hex string, got {type(value).__name__}")
    if value[:2] != "0x":
        raise _fault(field, f"expected {what} as a 0x-hex string")
    digits = value[2:]
    if not _HEX.issuperset(digits):
        raise _fault(field, f"{value[:24]!r} is not hex")
    return digits


def _quantity(field: str, value: object, bits: int) -> int:
    digits = _hex_digits(field, value, "a quantity")
    if not digits:
        raise _fault(field, "an empty quantity (0x); zero is 0x0")
    if len(digits) > 64:  # padding included: no quantity here is wider than a word
        raise _fault(field, "longer than 32 bytes")
    number = int(digits, 16)
    if number >= 1 << bits:
        raise _fault(field, f"does not fit uint{bits}")
    return number


def _bytes(field: str, value: object) -> bytes:
    if isinstance(value, str) and len(value) > 2 + 2 * MAX_FIELD_BYTES:
        raise _fault(field, f"longer than {MAX_FIELD_BYTES} bytes")
    digits = _hex_digits(field, value, "bytes")
    if len(digits) % 2:
        raise _fault(field, "odd number of hex digits")
    return bytes.fromhex(digits)


def _address(field: str, value: object) -> str:
    digits = _hex_digits(field, value, "an address")
    if len(digits) != 40:
        raise _fault(field, f"an address is 20 bytes, got {len(digits) / 2:g}")
    address = checksum_address(bytes.fromhex(digits))
    # Mixed case claims an EIP-55 checksum: a wrong one is a mistyped address.
    if digits != digits.lower() and digits != digits.upper() and address[2:] != digits:
        raise _fault(field, "bad EIP-55 checksum")
    return address


def _factory(field: str, value: object) -> str:
    """v0.8's factory: an address, or the EIP-7702 marker as viem sends it (two bytes)."""
    if isinstance(value, str) and value.lower() == EIP7702_SHORT:
        return EIP7702_SHORT
    return _address(field, value)


def _authorization(value: object) -> Authorization:
    """``eip7702Auth`` as ERC-7769 (v0.8) gives it; its signature is checked by admission."""
    try:
        return parse_authorization(value)
    except ValueError as exc:
        field = str(exc).split(":", 1)[0]
        raise BundlerFault(INVALID_PARAMS, f"userOp.{exc}", {"field": field}) from None


def _read(obj: Mapping[str, Any], version: Version, partial: bool) -> dict[str, Any]:
    fields = _FIELDS[version]
    for name in obj:
        if name in fields:
            continue
        other = _OTHER_VERSION[version].get(name)
        if other is not None:
            raise _fault(name, f"a v{other} field; EntryPoint v{version} does not take it")
        raise _fault(str(name)[:64], "unknown field")
    values: dict[str, Any] = {}
    for name, (kind, bits, required, required_partial) in fields.items():
        value = obj.get(name)
        if value is None:
            if required if not partial else required_partial:
                raise _fault(name, "missing")
            continue
        if kind == "address":
            factory = name == "factory" and version == "0.8"
            values[name] = _factory(name, value) if factory else _address(name, value)
        elif kind == "auth":
            values[name] = _authorization(value)
        elif kind == "quantity":
            values[name] = _quantity(name, value, bits)
        else:
            values[name] = _bytes(name, value)
    return values


def parse_user_operation(obj: object, version: Version, *, partial: bool = False) -> UserOperation:
    """A UserOperation from its ERC-7769 RPC form for EntryPoint ``version``; -32602
    BundlerFault naming the field for anything wrong. ``partial``: estimation's form."""
    version = require_version(version)
    if not isinstance(obj, Mapping):
        raise BundlerFault(INVALID_PARAMS, "userOp: expected an object")
    v = _read(obj, version, partial)
    factory: str | None = None
    factory_data = b""
    pm: str | None = None
    pm_verification = pm_post_op = 0
    pm_data = b""
    if version == "0.6":
        init_code: bytes = v.get("initCode", b"")
        if init_code:
            if len(init_code) < 20:
                raise _fault("initCode", "shorter than a factory address (20 bytes)")
            factory, factory_data = checksum_address(init_code[:20]), init_code[20:]
        pm_and_data: bytes = v.get("paymasterAndData", b"")
        if pm_and_data:
            if len(pm_and_data) < 20:
                raise _fault("paymasterAndData", "shorter than a paymaster address (20 bytes)")
            pm, pm_data = checksum_address(pm_and_data[:20]), pm_and_data[20:]
    else:
        factory = v.get("factory")
        factory_data = v.get("factoryData", b"")
        if factory is None and factory_data:
            raise _fault("factoryData", "given without a factory")
        pm = v.get("paymaster")
        pm_verification = v.get("paymasterVerificationGasLimit", 0)
        pm_post_op = v.get("paymasterPostOpGasLimit", 0)
        pm_data = v.get("paymasterData", b"")
        if pm is None:
            # Zero-valued paymaster fields without a paymaster are what some clients send.
            for name, given in (
                ("paymasterVerificationGasLimit", pm_verification),
                ("paymasterPostOpGasLimit", pm_post_op),
                ("paymasterData", pm_data),
            ):
                if given:
                    raise _fault(name, "given without a paymaster")
        elif not partial:
            for name in ("paymasterVerificationGasLimit", "paymasterPostOpGasLimit"):
                if name not in v:
                    raise _fault(name, "missing (required with a paymaster)")
    return UserOperation(
        sender=v["sender"],
        nonce=v["nonce"],
        call_data=v["callData"],
        call_gas_limit=v.get("callGasLimit", 0),
        verification_gas_limit=v.get("verificationGasLimit", 0),
        pre_verification_gas=v.get("preVerificationGas", 0),
        max_fee_per_gas=v.get("maxFeePerGas", 0),
        max_priority_fee_per_gas=v.get("maxPriorityFeePerGas", 0),
        signature=v.get("signature", b""),
        factory=factory,
        factory_data=factory_data,
        paymaster=pm,
        paymaster_verification_gas_limit=pm_verification,
        paymaster_post_op_gas_limit=pm_post_op,
        paymaster_data=pm_data,
        eip7702_auth=v.get("eip7702Auth"),
    )


def _hex(data: bytes) -> str:
    return "0x" + data.hex()


def encode_user_operation(op: UserOperation, version: Version) -> dict[str, Any]:
    """The RPC form of ``op`` for ``version``, as eth_getUserOperationByHash answers it:
    quantities as 0x-hex without leading zeros, bytes as 0x-hex, addresses EIP-55. v0.7 leaves
    out the factory and paymaster fields when there is none (as the reference bundler does)."""
    version = require_version(version)
    common: dict[str, Any] = {
        "sender": checksum_address(op.sender),
        "nonce": hex(op.nonce),
    }
    gas = {
        "callGasLimit": hex(op.call_gas_limit),
        "verificationGasLimit": hex(op.verification_gas_limit),
        "preVerificationGas": hex(op.pre_verification_gas),
        "maxFeePerGas": hex(op.max_fee_per_gas),
        "maxPriorityFeePerGas": hex(op.max_priority_fee_per_gas),
    }
    if version == "0.6":
        return {
            **common,
            "initCode": _hex(op.init_code),
            "callData": _hex(op.call_data),
            **gas,
            "paymasterAndData": _hex(op.paymaster_and_data(version)),
            "signature": _hex(op.signature),
        }
    out = dict(common)
    if op.factory is not None:
        short = op.factory == EIP7702_SHORT
        out["factory"] = op.factory if short else checksum_address(op.factory)
        out["factoryData"] = _hex(op.factory_data)
    out["callData"] = _hex(op.call_data)
    out.update(gas)
    if op.paymaster is not None:
        out["paymaster"] = checksum_address(op.paymaster)
        out["paymasterVerificationGasLimit"] = hex(op.paymaster_verification_gas_limit)
        out["paymasterPostOpGasLimit"] = hex(op.paymaster_post_op_gas_limit)
        out["paymasterData"] = _hex(op.paymaster_data)
    out["signature"] = _hex(op.signature)
    auth = op.eip7702_auth
    if auth is not None:
        out["eip7702Auth"] = {
            "chainId": hex(auth.chain_id),
            "address": auth.address,
            "nonce": hex(auth.nonce),
            "yParity": hex(auth.y_parity),
            "r": hex(auth.r),
            "s": hex(auth.s),
        }
    return out


def address_param(value: object, name: str) -> str:
    """A parameter that must be an address, checksummed; -32602 naming it otherwise."""
    try:
        if not isinstance(value, str) or value[:2] not in ("0x", "0X") or len(value) != 42:
            raise ValueError
        return checksum_address(bytes.fromhex(value[2:]))
    except ValueError:
        raise BundlerFault(INVALID_PARAMS, f"{name}: expected an address") from None

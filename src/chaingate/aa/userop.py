"""ERC-4337 user operations: one version-neutral shape for EntryPoint v0.6, v0.7 and v0.8.

``UserOperation`` carries the unpacked ERC-7769 fields.  ``packed`` turns it into the struct
each EntryPoint's ``handleOps`` takes — v0.6's ``UserOperation``, or v0.7/v0.8's
``PackedUserOperation`` with two uint128 pairs in one bytes32 each and the paymaster's gas
limits inside ``paymasterAndData`` — and ``user_op_hash`` is what ``getUserOpHash`` returns,
the digest the account's owner signs.  The two EntryPoint events a bundler reads back decode
here too; they have the same signature in every version.

v0.8 packs as v0.7 but hashes as EIP-712 typed data (domain "ERC4337", version "1", the chain
and the EntryPoint), and an EOA sender may carry an EIP-7702 authorization beside the
operation (``eip7702_auth``): it delegates the EOA to its account code in the bundle's own
type-4 transaction.  An ``initCode`` that starts with the marker ``0x7702`` (zero-padded to 20
bytes) names no factory: the EntryPoint hashes the sender's delegate in its place (followed by
``initCode[20:]``, which it then calls on the sender to initialise it).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from chaingate.evm import abi
from chaingate.evm.addresses import address_bytes, checksum_address
from chaingate.evm.eip7702 import Authorization
from chaingate.evm.keccak import keccak256

if TYPE_CHECKING:
    from chaingate.config.manifest import Manifest

Version = Literal["0.6", "0.7", "0.8"]
VERSIONS: tuple[Version, ...] = ("0.6", "0.7", "0.8")
# Where EntryPoints live on every public chain (deployed by CREATE2 with their own salts), and
# the tag their names carry in a devnet manifest (``entry_point_v06``...).
CANONICAL_ENTRY_POINTS: dict[Version, str] = {
    "0.6": "0x5FF137D4b0FDCD49DcA30c7CF57E578a026d2789",
    "0.7": "0x0000000071727De22E5E9d8BAf0edAc6f37da032",
    "0.8": "0x4337084D9E255Ff0702461CF8895CE9E3b5Ff108",
}
MANIFEST_TAG: dict[Version, str] = {"0.6": "v06", "0.7": "v07", "0.8": "v08"}


def entry_point_address(
    configured: Mapping[str, str], manifest: Manifest | None, version: Version
) -> str:
    """The EntryPoint of ``version`` on a network: the configured one, else the devnet
    manifest's, else the canonical address (wallets and the bundler agree by using this)."""
    address = configured.get(version)
    name = f"entry_point_{MANIFEST_TAG[version]}"
    if not address and manifest is not None and name in manifest.contracts:
        address = manifest.address(name)
    return checksum_address(address or CANONICAL_ENTRY_POINTS[version])


# The struct handleOps takes, per version (IEntryPoint.sol's UserOperation / PackedUserOperation).
_PACKED_TUPLE = "(address,uint256,bytes,bytes,bytes32,uint256,bytes32,bytes,bytes)"
OP_TUPLE_TYPE: dict[Version, str] = {
    "0.6": "(address,uint256,bytes,bytes,uint256,uint256,uint256,uint256,uint256,bytes,bytes)",
    "0.7": _PACKED_TUPLE,
    "0.8": _PACKED_TUPLE,
}

_UINT128 = 1 << 128
# v0.8's EIP-712 typed hash (UserOperationLib.PACKED_USEROP_TYPEHASH, the EntryPoint's domain).
PACKED_USEROP_TYPEHASH = keccak256(
    b"PackedUserOperation(address sender,uint256 nonce,bytes initCode,bytes callData,"
    b"bytes32 accountGasLimits,uint256 preVerificationGas,bytes32 gasFees,"
    b"bytes paymasterAndData)"
)
_DOMAIN_TYPEHASH = keccak256(
    b"EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)"
)
_DOMAIN_NAME, _DOMAIN_VERSION = keccak256(b"ERC4337"), keccak256(b"1")
# initCode[:20] of an EIP-7702 sender (Eip7702Support.INITCODE_EIP7702_MARKER, zero-padded).
EIP7702_MARKER = bytes.fromhex("7702") + bytes(18)
EIP7702_FACTORY = checksum_address(EIP7702_MARKER)
EIP7702_SHORT = "0x7702"  # the marker as viem sends it: initCode of two bytes


def require_version(version: str) -> Version:
    """``version`` itself when it is an EntryPoint version this package knows, else ValueError."""
    for known in VERSIONS:
        if version == known:
            return known
    raise ValueError(f"unknown EntryPoint version {version!r} (expected '0.6', '0.7' or '0.8')")


def packs_gas(version: Version) -> bool:
    """Whether the version packs its gas fields (v0.7 and later: PackedUserOperation, the
    paymaster's own two gas limits in paymasterAndData)."""
    return require_version(version) != "0.6"


def uint128_bytes(value: int, name: str) -> bytes:
    """16 big-endian bytes: v0.7 packs its gas fields two to a word."""
    if not 0 <= value < _UINT128:
        raise ValueError(f"{name} {value} does not fit uint128")
    return value.to_bytes(16, "big")


class UserOperation(msgspec.Struct, frozen=True, kw_only=True):
    """Version-neutral, unpacked (the ERC-7769 RPC field set)."""

    sender: str
    nonce: int
    call_data: bytes
    call_gas_limit: int
    verification_gas_limit: int
    pre_verification_gas: int
    max_fee_per_gas: int
    max_priority_fee_per_gas: int
    signature: bytes = b""
    # v0.6: initCode[:20].  v0.8's EIP-7702 marker is kept as sent, "0x7702" (EIP7702_SHORT,
    # viem's form) or zero-padded (EIP7702_FACTORY), so initCode round-trips to the same bytes.
    factory: str | None = None
    factory_data: bytes = b""  # v0.6: initCode[20:]
    paymaster: str | None = None
    paymaster_verification_gas_limit: int = 0  # v0.7 and later
    paymaster_post_op_gas_limit: int = 0  # v0.7 and later
    paymaster_data: bytes = b""
    eip7702_auth: Authorization | None = None  # v0.8: the sender's delegation, beside the op

    @property
    def init_code(self) -> bytes:
        if self.factory is None:
            return b""
        if self.factory == EIP7702_SHORT:
            return EIP7702_MARKER[:2] + self.factory_data
        return address_bytes(self.factory) + self.factory_data

    @property
    def eip7702_init(self) -> bool:
        """initCode starts with the EIP-7702 marker: no factory, the sender is an EOA."""
        return self.factory in (EIP7702_SHORT, EIP7702_FACTORY)

    @property
    def deploys(self) -> bool:
        """The operation deploys its sender through a factory (not an EIP-7702 marker)."""
        return self.factory is not None and not self.eip7702_init

    def paymaster_and_data(self, version: Version) -> bytes:
        if self.paymaster is None:
            return b""
        head = address_bytes(self.paymaster)
        if packs_gas(version):
            head += uint128_bytes(
                self.paymaster_verification_gas_limit, "paymasterVerificationGasLimit"
            ) + uint128_bytes(self.paymaster_post_op_gas_limit, "paymasterPostOpGasLimit")
        return head + self.paymaster_data

    def with_(self, **changes: object) -> UserOperation:
        return msgspec.structs.replace(self, **changes)


def from_init_code(init_code: bytes) -> tuple[str | None, bytes]:
    """(factory, factoryData) of an ``initCode``; (None, b"") when it is empty.  The EIP-7702
    marker alone (``0x7702``, as viem sends it) reads as EIP7702_SHORT."""
    if not init_code:
        return None, b""
    if init_code == EIP7702_MARKER[:2]:
        return EIP7702_SHORT, b""
    if len(init_code) < 20:
        raise ValueError(f"initCode of {len(init_code)} bytes is shorter than a factory address")
    return checksum_address(init_code[:20]), init_code[20:]


def from_paymaster_and_data(data: bytes, version: Version) -> tuple[str | None, int, int, bytes]:
    """(paymaster, verification gas, postOp gas, paymasterData) of a packed ``paymasterAndData``;
    the gas limits are 0 for v0.6, which has none."""
    if not data:
        return None, 0, 0, b""
    head = 52 if packs_gas(version) else 20
    if len(data) < head:
        raise ValueError(f"paymasterAndData of {len(data)} bytes is shorter than its {head}")
    if head == 20:
        return checksum_address(data[:20]), 0, 0, data[20:]
    return (
        checksum_address(data[:20]),
        int.from_bytes(data[20:36], "big"),
        int.from_bytes(data[36:52], "big"),
        data[52:],
    )


def encoded_size(op: UserOperation, version: Version) -> int:
    """``len(abi.encode(OP_TUPLE_TYPE[version], packed(op, version)))`` without encoding it
    (sanity's size bound, on every operation): a word per field, and each of the four byte
    strings its length word and its bytes padded to words."""
    words = 11 if require_version(version) == "0.6" else 9
    dynamic = (op.init_code, op.call_data, op.paymaster_and_data(version), op.signature)
    return 32 * words + sum(32 + (len(b) + 31) // 32 * 32 for b in dynamic)


# OP_TUPLE_TYPE's fields, for ``abi.flat_encoder``.
_OP_FIELDS: dict[Version, tuple[str, ...]] = {
    v: tuple(abi.split_top_level(t[1:-1])) for v, t in OP_TUPLE_TYPE.items()
}


def encode_packed(op: UserOperation, version: Version) -> bytes:
    """``abi.encode(OP_TUPLE_TYPE[version], packed(op, version))``: the struct as calldata
    carries it (behind its offset), encoded by the flat encoder (validation, the
    preVerificationGas and every bundle encode it)."""
    version = require_version(version)
    return abi.flat_encoder(_OP_FIELDS[version])(packed(op, version))


def packed(op: UserOperation, version: Version) -> tuple[Any, ...]:
    """The struct ``handleOps`` takes, for ``abi.encode(OP_TUPLE_TYPE[version], ...)``."""
    if require_version(version) == "0.6":
        return (
            op.sender,
            op.nonce,
            op.init_code,
            op.call_data,
            op.call_gas_limit,
            op.verification_gas_limit,
            op.pre_verification_gas,
            op.max_fee_per_gas,
            op.max_priority_fee_per_gas,
            op.paymaster_and_data(version),
            op.signature,
        )
    return (
        op.sender,
        op.nonce,
        op.init_code,
        op.call_data,
        account_gas_limits(op),
        op.pre_verification_gas,
        gas_fees(op),
        op.paymaster_and_data(version),
        op.signature,
    )


def account_gas_limits(op: UserOperation) -> bytes:
    """v0.7's ``accountGasLimits``: verificationGasLimit (high 128 bits) ++ callGasLimit."""
    return uint128_bytes(op.verification_gas_limit, "verificationGasLimit") + uint128_bytes(
        op.call_gas_limit, "callGasLimit"
    )


def gas_fees(op: UserOperation) -> bytes:
    """v0.7's ``gasFees``: maxPriorityFeePerGas (high 128 bits) ++ maxFeePerGas."""
    return uint128_bytes(op.max_priority_fee_per_gas, "maxPriorityFeePerGas") + uint128_bytes(
        op.max_fee_per_gas, "maxFeePerGas"
    )


# v0.7's hashed fields, v0.8's after its type hash (initCode, callData, paymasterAndData hashed).
_PACKED_HASH_TYPES = (
    "address",
    "uint256",
    "bytes32",
    "bytes32",
    "bytes32",
    "uint256",
    "bytes32",
    "bytes32",
)
_V06_HASH_TYPES = (
    "address",
    "uint256",
    "bytes32",
    "bytes32",
    "uint256",
    "uint256",
    "uint256",
    "uint256",
    "uint256",
    "bytes32",
)
_OUTER_HASH_TYPES = ("bytes32", "address", "uint256")


def _op_hash(op: UserOperation, version: Version, init_code_hash: bytes | None = None) -> bytes:
    """UserOperationLib.hash: every field but the signature, bytes fields as their keccak
    (v0.8: typed — its type hash first —, with the EIP-7702 override of initCode's hash)."""
    if version == "0.6":
        return keccak256(
            abi.flat_encoder(_V06_HASH_TYPES)(
                [
                    op.sender,
                    op.nonce,
                    keccak256(op.init_code),
                    keccak256(op.call_data),
                    op.call_gas_limit,
                    op.verification_gas_limit,
                    op.pre_verification_gas,
                    op.max_fee_per_gas,
                    op.max_priority_fee_per_gas,
                    keccak256(op.paymaster_and_data(version)),
                ]
            )
        )
    values = [
        op.sender,
        op.nonce,
        init_code_hash or keccak256(op.init_code),
        keccak256(op.call_data),
        account_gas_limits(op),
        op.pre_verification_gas,
        gas_fees(op),
        keccak256(op.paymaster_and_data(version)),
    ]
    if version == "0.8":
        return keccak256(
            abi.flat_encoder(("bytes32", *_PACKED_HASH_TYPES))([PACKED_USEROP_TYPEHASH, *values])
        )
    return keccak256(abi.flat_encoder(_PACKED_HASH_TYPES)(values))


@functools.lru_cache(maxsize=64)  # a few EntryPoints and chains: every v0.8 hash needs it
def domain_separator(entry_point: str, chain_id: int) -> bytes:
    """The v0.8 EntryPoint's EIP-712 domain separator (getDomainSeparatorV4)."""
    return keccak256(
        abi.encode(
            ["bytes32", "bytes32", "bytes32", "uint256", "address"],
            [_DOMAIN_TYPEHASH, _DOMAIN_NAME, _DOMAIN_VERSION, chain_id, entry_point],
        )
    )


def eip7702_delegate(op: UserOperation) -> str | None:
    """The delegate an EIP-7702 initCode's hash stands for, when the operation carries its
    authorization; None otherwise (then it is the sender's code on chain)."""
    return op.eip7702_auth.address if op.eip7702_auth is not None else None


def user_op_hash(
    op: UserOperation,
    *,
    entry_point: str,
    chain_id: int,
    version: Version,
    delegate: str | None = None,
) -> bytes:
    """EntryPoint.getUserOpHash: the 32 bytes the account's owner signs.  ``delegate``: for a
    v0.8 operation whose initCode is the EIP-7702 marker and which carries no authorization,
    the sender's delegate on chain (with an authorization, the authorization's)."""
    version = require_version(version)
    if version == "0.8":
        override = None
        if op.eip7702_init:
            target = eip7702_delegate(op) or delegate
            if target is None:
                raise ValueError("an EIP-7702 initCode's hash needs the sender's delegate")
            override = keccak256(address_bytes(target) + op.factory_data)
        struct = _op_hash(op, version, override)
        return keccak256(b"\x19\x01" + domain_separator(entry_point, chain_id) + struct)
    inner = _op_hash(op, version)
    return keccak256(abi.flat_encoder(_OUTER_HASH_TYPES)([inner, entry_point, chain_id]))


def authorizations(ops: Sequence[UserOperation]) -> tuple[Authorization, ...]:
    """The EIP-7702 authorizations a bundle of ``ops`` carries in its type-4 transaction: each
    sender's, once, in the operations' order (none: a plain EIP-1559 bundle)."""
    found: dict[str, Authorization] = {}
    for op in ops:
        if op.eip7702_auth is not None:
            found.setdefault(op.sender.lower(), op.eip7702_auth)
    return tuple(found.values())


# The last handleOps calldata made, by its inputs: a bundle's is asked for three times (its
# simulation, its gas estimate, its transaction) for the same operations (the same objects).
_last_handle_ops: list[tuple[tuple[UserOperation, ...], str, str, bytes]] = []


def handle_ops_calldata(ops: Sequence[UserOperation], beneficiary: str, version: Version) -> bytes:
    """``handleOps(ops, beneficiary)`` calldata for the EntryPoint of ``version``."""
    version = require_version(version)
    for last_ops, last_beneficiary, last_version, calldata in _last_handle_ops:
        if (
            last_beneficiary == beneficiary
            and last_version == version
            and len(last_ops) == len(ops)
            and all(a is b for a, b in zip(last_ops, ops, strict=True))
        ):
            return calldata
    calldata = _handle_ops(ops, beneficiary, version)
    _last_handle_ops[:] = [(tuple(ops), beneficiary, version, calldata)]
    return calldata


def _handle_ops(ops: Sequence[UserOperation], beneficiary: str, version: Version) -> bytes:
    head = abi.flat_encoder(("uint256", "address"))([64, beneficiary])  # the array's offset
    return (
        abi.selector(f"handleOps({OP_TUPLE_TYPE[version]}[],address)")
        + head
        + abi.encode_dynamic_array([encode_packed(op, version) for op in ops])
    )


# --- events ----------------------------------------------------------------------------------

USER_OPERATION_EVENT = abi.event_topic(
    "UserOperationEvent(bytes32,address,address,uint256,bool,uint256,uint256)"
)
ACCOUNT_DEPLOYED = abi.event_topic("AccountDeployed(bytes32,address,address,address)")


class UserOperationEvent(msgspec.Struct, frozen=True, kw_only=True):
    user_op_hash: str  # 0x-hex
    sender: str
    paymaster: str  # the zero address when the account paid
    nonce: int
    success: bool
    actual_gas_cost: int
    actual_gas_used: int


class AccountDeployed(msgspec.Struct, frozen=True, kw_only=True):
    user_op_hash: str  # 0x-hex
    sender: str
    factory: str
    paymaster: str


def _topic_words(topics: Sequence[str], topic0: str, count: int, name: str) -> list[bytes]:
    if len(topics) != count:
        raise ValueError(f"{name} has {count} topics, got {len(topics)}")
    words = []
    for topic in topics:
        text = topic[2:] if topic[:2] in ("0x", "0X") else topic
        try:
            word = bytes.fromhex(text)
        except ValueError:
            raise ValueError(f"{name}: topic {topic!r} is not hex") from None
        if len(word) != 32:
            raise ValueError(f"{name}: topic {topic!r} is not 32 bytes")
        words.append(word)
    if "0x" + words[0].hex() != topic0:
        raise ValueError(f"not a {name} log (topic0 {topics[0]})")
    return words


def decode_user_operation_event(topics: Sequence[str], data: bytes) -> UserOperationEvent:
    words = _topic_words(topics, USER_OPERATION_EVENT, 4, "UserOperationEvent")
    nonce, success, cost, used = abi.decode(["uint256", "bool", "uint256", "uint256"], data)
    return UserOperationEvent(
        user_op_hash="0x" + words[1].hex(),
        sender=checksum_address(words[2][12:]),
        paymaster=checksum_address(words[3][12:]),
        nonce=nonce,
        success=success,
        actual_gas_cost=cost,
        actual_gas_used=used,
    )


def decode_account_deployed(topics: Sequence[str], data: bytes) -> AccountDeployed:
    words = _topic_words(topics, ACCOUNT_DEPLOYED, 3, "AccountDeployed")
    factory, paymaster = abi.decode(["address", "address"], data)
    return AccountDeployed(
        user_op_hash="0x" + words[1].hex(),
        sender=checksum_address(words[2][12:]),
        factory=factory,
        paymaster=paymaster,
    )

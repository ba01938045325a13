"""ERC-4337 user operations: one version-neutral shape for EntryPoint v0.6 and v0.7.

``UserOperation`` carries the unpacked ERC-7769 fields.  ``packed`` turns it into the struct
each EntryPoint's ``handleOps`` takes — v0.6's ``UserOperation``, or v0.7's
``PackedUserOperation`` with two uint128 pairs in one bytes32 each and the paymaster's gas
limits inside ``paymasterAndData`` — and ``user_op_hash`` is what ``getUserOpHash`` returns,
the digest the account's owner signs.  The two EntryPoint events a bundler reads back decode
here too; they have the same signature in both versions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from chaingate.evm import abi
from chaingate.evm.addresses import address_bytes, checksum_address
from chaingate.evm.keccak import keccak256

if TYPE_CHECKING:
    from chaingate.config.manifest import Manifest

Version = Literal["0.6", "0.7"]
VERSIONS: tuple[Version, ...] = ("0.6", "0.7")
# Where EntryPoints live on every public chain (deployed by CREATE2 with their own salts), and
# the tag their names carry in a devnet manifest (``entry_point_v06``...).
CANONICAL_ENTRY_POINTS: dict[Version, str] = {
    "0.6": "0x5FF137D4b0FDCD49DcA30c7CF57E578a026d2789",
    "0.7": "0x0000000071727De22E5E9d8BAf0edAc6f37da032",
}
MANIFEST_TAG: dict[Version, str] = {"0.6": "v06", "0.7": "v07"}


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
OP_TUPLE_TYPE: dict[Version, str] = {
    "0.6": "(address,uint256,bytes,bytes,uint256,uint256,uint256,uint256,uint256,bytes,bytes)",
    "0.7": "(address,uint256,bytes,bytes,bytes32,uint256,bytes32,bytes,bytes)",
}

_UINT128 = 1 << 128


def require_version(version: str) -> Version:
    """``version`` itself when it is an EntryPoint version this package knows, else ValueError."""
    if version == "0.6":
        return "0.6"
    if version == "0.7":
        return "0.7"
    raise ValueError(f"unknown EntryPoint version {version!r} (expected '0.6' or '0.7')")


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
    factory: str | None = None  # v0.6: initCode[:20]
    factory_data: bytes = b""  # v0.6: initCode[20:]
    paymaster: str | None = None
    paymaster_verification_gas_limit: int = 0  # v0.7 only
    paymaster_post_op_gas_limit: int = 0  # v0.7 only
    paymaster_data: bytes = b""

    @property
    def init_code(self) -> bytes:
        if self.factory is None:
            return b""
        return address_bytes(self.factory) + self.factory_data

    def paymaster_and_data(self, version: Version) -> bytes:
        if self.paymaster is None:
            return b""
        head = address_bytes(self.paymaster)
        if require_version(version) == "0.7":
            head += uint128_bytes(
                self.paymaster_verification_gas_limit, "paymasterVerificationGasLimit"
            ) + uint128_bytes(self.paymaster_post_op_gas_limit, "paymasterPostOpGasLimit")
        return head + self.paymaster_data

    def with_(self, **changes: Any) -> UserOperation:
        return msgspec.structs.replace(self, **changes)


def from_init_code(init_code: bytes) -> tuple[str | None, bytes]:
    """(factory, factoryData) of a v0.6 ``initCode``; (None, b"") when it is empty."""
    if not init_code:
        return None, b""
    if len(init_code) < 20:
        raise ValueError(f"initCode of {len(init_code)} bytes is shorter than a factory address")
    return checksum_address(init_code[:20]), init_code[20:]


def from_paymaster_and_data(data: bytes, version: Version) -> tuple[str | None, int, int, bytes]:
    """(paymaster, verification gas, postOp gas, paymasterData) of a packed ``paymasterAndData``;
    the gas limits are 0 for v0.6, which has none."""
    if not data:
        return None, 0, 0, b""
    head = 52 if require_version(version) == "0.7" else 20
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


def _op_hash(op: UserOperation, version: Version) -> bytes:
    """UserOperationLib.hash: every field but the signature, bytes fields as their keccak."""
    if version == "0.6":
        return keccak256(
            abi.encode(
                [
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
                ],
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
                ],
            )
        )
    return keccak256(
        abi.encode(
            [
                "address",
                "uint256",
                "bytes32",
                "bytes32",
                "bytes32",
                "uint256",
                "bytes32",
                "bytes32",
            ],
            [
                op.sender,
                op.nonce,
                keccak256(op.init_code),
                keccak256(op.call_data),
                account_gas_limits(op),
                op.pre_verification_gas,
                gas_fees(op),
                keccak256(op.paymaster_and_data(version)),
            ],
        )
    )


def user_op_hash(op: UserOperation, *, entry_point: str, chain_id: int, version: Version) -> bytes:
    """EntryPoint.getUserOpHash: the 32 bytes the account's owner signs."""
    inner = _op_hash(op, require_version(version))
    return keccak256(abi.encode(["bytes32", "address", "uint256"], [inner, entry_point, chain_id]))


def handle_ops_calldata(ops: Sequence[UserOperation], beneficiary: str, version: Version) -> bytes:
    """``handleOps(ops, beneficiary)`` calldata for the EntryPoint of ``version``."""
    return abi.encode_call(
        f"handleOps({OP_TUPLE_TYPE[require_version(version)]}[],address)",
        [packed(op, version) for op in ops],
        beneficiary,
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

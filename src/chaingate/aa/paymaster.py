"""The eth-infinitism VerifyingPaymaster of EntryPoint v0.6 and v0.7 (and chaingate's v0.8
one, which signs what v0.7's does): what its signer signs.

The paymaster pays for an operation when ``paymasterData`` carries ``abi.encode(uint48
validUntil, uint48 validAfter)`` and the signer's signature over ``getHash(userOp, validUntil,
validAfter)`` (as an EIP-191 personal message).  The two versions hash differently:

* v0.6 hashes the ABI calldata of the operation up to ``paymasterAndData`` — the head, with
  the offsets of ``paymasterAndData`` and ``signature`` in it, then initCode and callData — so
  the hash depends on the *length* of ``paymasterAndData``: it is signed over a stub of the
  final length.  It also covers the paymaster's ``senderNonce(sender)``, a counter it bumps on
  every sponsored operation of that sender (0 for a sender it has never sponsored).
* v0.7 (and v0.8) hashes the fields one by one, including the paymaster's two gas limits.
"""

from __future__ import annotations

from chaingate.aa.userop import (
    OP_TUPLE_TYPE,
    UserOperation,
    Version,
    account_gas_limits,
    gas_fees,
    packed,
    packs_gas,
    require_version,
    uint128_bytes,
)
from chaingate.evm import abi
from chaingate.evm.addresses import checksum_address
from chaingate.evm.keccak import keccak256
from chaingate.evm.keys import PrivateKey

_TIMESTAMPS = ["uint48", "uint48"]
_UINT48 = 1 << 48

# A signature that parses and recovers to some address, so simulation runs the same code path
# as with a real one (OpenZeppelin's ECDSA.recover reverts on one that recovers nothing).
_DUMMY_SIGNATURE = (
    bytes.fromhex("ff" * 15 + "f0")
    + bytes(16)  # r
    + bytes.fromhex("7a" + "aa" * 31)  # s, below n/2
    + b"\x1c"  # v
)


def _v06_pack(op: UserOperation) -> bytes:
    """VerifyingPaymaster.pack: the operation's calldata from its start to paymasterAndData's
    length word — as the EntryPoint's standard (in-order) ABI encoding lays it out."""
    encoded = abi.encode(OP_TUPLE_TYPE["0.6"], packed(op, "0.6"))
    paymaster_and_data_at = int.from_bytes(encoded[9 * 32 : 10 * 32], "big")
    return encoded[:paymaster_and_data_at]


def verifying_paymaster_hash(
    op: UserOperation,
    *,
    paymaster: str,
    chain_id: int,
    valid_until: int,
    valid_after: int,
    version: Version,
    sender_nonce: int = 0,
) -> bytes:
    """VerifyingPaymaster.getHash(op, validUntil, validAfter) of ``paymaster``.

    ``sender_nonce`` is v0.6's ``senderNonce(op.sender)`` on that paymaster (ignored for v0.7).
    """
    if require_version(version) == "0.6":
        return keccak256(
            abi.encode(
                ["bytes", "uint256", "address", "uint256", "uint48", "uint48"],
                [_v06_pack(op), chain_id, paymaster, sender_nonce, valid_until, valid_after],
            )
        )
    # v0.7 and v0.8 read the gas limits back out of paymasterAndData[20:52] as one uint256.
    paymaster_gas = uint128_bytes(
        op.paymaster_verification_gas_limit, "paymasterVerificationGasLimit"
    ) + uint128_bytes(op.paymaster_post_op_gas_limit, "paymasterPostOpGasLimit")
    return keccak256(
        abi.encode(
            [
                "address",
                "uint256",
                "bytes32",
                "bytes32",
                "bytes32",
                "bytes32",
                "uint256",
                "bytes32",
                "uint256",
                "address",
                "uint48",
                "uint48",
            ],
            [
                op.sender,
                op.nonce,
                keccak256(op.init_code),
                keccak256(op.call_data),
                account_gas_limits(op),
                paymaster_gas,
                op.pre_verification_gas,
                gas_fees(op),
                chain_id,
                paymaster,
                valid_until,
                valid_after,
            ],
        )
    )


def eth_signed_message_hash(digest: bytes) -> bytes:
    """EIP-191 personal-message hash of a 32-byte digest (ECDSA.toEthSignedMessageHash)."""
    if len(digest) != 32:
        raise ValueError("an Ethereum signed message hash wraps a 32-byte digest")
    return keccak256(b"\x19Ethereum Signed Message:\n32" + digest)


def paymaster_data_stub(valid_until: int, valid_after: int) -> bytes:
    """paymasterData of the final length with a dummy signature: for ERC-7677 stub data and
    gas estimation (it fails the signature check, never the parsing)."""
    return abi.encode(_TIMESTAMPS, [valid_until, valid_after]) + _DUMMY_SIGNATURE


def sponsor(
    op: UserOperation,
    key: PrivateKey,
    *,
    paymaster: str,
    chain_id: int,
    valid_until: int,
    valid_after: int,
    version: Version,
    sender_nonce: int = 0,
) -> UserOperation:
    """``op`` with ``paymaster`` and paymasterData signed by ``key`` (the paymaster's signer).

    For v0.7 and later ``op`` must already carry the paymaster gas limits: they are part of the
    hash. ``sender_nonce`` as in ``verifying_paymaster_hash`` (v0.6 only).
    """
    if packs_gas(version) and op.paymaster_verification_gas_limit <= 0:
        raise ValueError(
            f"set paymaster_verification_gas_limit before sponsoring a v{version} operation"
        )
    # The stub gives v0.6's hash the final paymasterAndData length.
    stubbed = op.with_(
        paymaster=checksum_address(paymaster),
        paymaster_data=paymaster_data_stub(valid_until, valid_after),
    )
    digest = verifying_paymaster_hash(
        stubbed,
        paymaster=paymaster,
        chain_id=chain_id,
        valid_until=valid_until,
        valid_after=valid_after,
        version=version,
        sender_nonce=sender_nonce,
    )
    signature = key.sign_digest(eth_signed_message_hash(digest))
    return stubbed.with_(
        paymaster_data=abi.encode(_TIMESTAMPS, [valid_until, valid_after]) + signature
    )


def decode_paymaster_data(data: bytes) -> tuple[int, int, bytes]:
    """(validUntil, validAfter, signature), as parsePaymasterAndData reads paymasterData; like
    Solidity's abi.decode it refuses a timestamp word with bits above uint48."""
    if len(data) < 64:
        raise ValueError(f"paymasterData of {len(data)} bytes is shorter than its two timestamps")
    valid_until = int.from_bytes(data[:32], "big")
    valid_after = int.from_bytes(data[32:64], "big")
    if valid_until >= _UINT48 or valid_after >= _UINT48:
        raise ValueError("paymasterData timestamps do not fit uint48")
    return valid_until, valid_after, data[64:]

"""SimpleAccount UserOperations for ``chaingate bench userops`` (no locust, no I/O).

Each load user owns one SimpleAccount (one owner key, its own salt) and sends its operations
one after another, nonce by nonce, each waiting for its receipt: an unstaked sender may have
one operation in a mempool, so concurrency is the number of accounts.  The first operation of
an account deploys it (factory and factoryData); each sends 1 wei to a fixed address.
"""

from __future__ import annotations

from dataclasses import dataclass

from chaingate.aa import paymaster, userop
from chaingate.aa.userop import UserOperation, Version
from chaingate.evm import abi
from chaingate.evm.keys import PrivateKey

RECIPIENT = "0x000000000000000000000000000000000000dEaD"
PRIORITY_FEE = 2 * 10**9
CALL_GAS = 100_000
VERIFICATION_GAS = 150_000  # a deployed SimpleAccount's validation (~40k) with room to spare
VERIFICATION_GAS_DEPLOY = 600_000  # ...and one that deploys the account first
PRE_VERIFICATION_GAS = 100_000  # above every bundler's calldata formula for these ops


@dataclass
class Account:
    address: str
    salt: int
    nonce: int = 0


@dataclass(frozen=True)
class Built:
    hash: str  # the userOpHash every bundler must answer with
    rpc: dict[str, str]  # ERC-7769's RPC form


def create_account_data(owner: str, salt: int) -> bytes:
    return abi.encode_call("createAccount(address,uint256)", owner, salt)


def build(
    account: Account,
    owner: PrivateKey,
    *,
    factory: str,
    entry_point: str,
    chain_id: int,
    version: Version,
    max_fee: int,
) -> Built:
    first = account.nonce == 0
    op = UserOperation(
        sender=account.address,
        nonce=account.nonce,
        call_data=abi.encode_call("execute(address,uint256,bytes)", RECIPIENT, 1, b""),
        call_gas_limit=CALL_GAS,
        verification_gas_limit=VERIFICATION_GAS_DEPLOY if first else VERIFICATION_GAS,
        pre_verification_gas=PRE_VERIFICATION_GAS,
        max_fee_per_gas=max_fee,
        max_priority_fee_per_gas=PRIORITY_FEE,
    )
    if first:
        op = op.with_(
            factory=factory, factory_data=create_account_data(owner.address, account.salt)
        )
    digest = userop.user_op_hash(op, entry_point=entry_point, chain_id=chain_id, version=version)
    op = op.with_(signature=owner.sign_digest(paymaster.eth_signed_message_hash(digest)))
    return Built("0x" + digest.hex(), rpc_form(op, version))


def rpc_form(op: UserOperation, version: Version) -> dict[str, str]:
    """v0.6 initCode/paymasterAndData; v0.7 the split fields, absent when unused (as viem)."""
    form = {"sender": op.sender, "nonce": hex(op.nonce)}
    if version == "0.6":
        form["initCode"] = "0x" + op.init_code.hex()
    elif op.factory is not None:
        form["factory"] = op.factory
        form["factoryData"] = "0x" + op.factory_data.hex()
    form.update(
        callData="0x" + op.call_data.hex(),
        callGasLimit=hex(op.call_gas_limit),
        verificationGasLimit=hex(op.verification_gas_limit),
        preVerificationGas=hex(op.pre_verification_gas),
        maxFeePerGas=hex(op.max_fee_per_gas),
        maxPriorityFeePerGas=hex(op.max_priority_fee_per_gas),
    )
    if version == "0.6":
        form["paymasterAndData"] = "0x"
    form["signature"] = "0x" + op.signature.hex()
    return form

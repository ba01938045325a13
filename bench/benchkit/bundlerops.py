"""Signed SimpleAccount UserOperations for the bundler bench, built with ``chaingate.aa``.

Every operation has its own sender (a SimpleAccount of one owner key, its own salt), so no
bundler limit per sender binds: what is measured is full validation of distinct operations.
By default the accounts are deployed first (``createAccount`` through the devnet's factory, in
blocks of ``DEPLOY_PER_BLOCK`` transactions) and each operation is the account's first
(nonce 0, no initCode); with ``deploy=True`` each operation deploys its own account
(factory + factoryData).  Every account is funded with ``anvil_setBalance``: it pays its own
prefund (no paymaster).  Each operation sends 1 wei to a fixed address.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import trio

from chaingate.aa import accounts, userop
from chaingate.aa.userop import UserOperation, Version
from chaingate.config.manifest import Manifest
from chaingate.devnet.rpc import DevnetRpc
from chaingate.evm import abi
from chaingate.evm.addresses import create_address
from chaingate.evm.keys import PrivateKey

TAGS: dict[Version, str] = {"0.6": "v06", "0.7": "v07", "0.8": "v08"}
DEPLOY_PER_BLOCK = 100  # createAccount costs ~200k gas: 100 fit a 30M-gas block
RECIPIENT = "0x000000000000000000000000000000000000dEaD"
GWEI = 10**9
PRIORITY_FEE = 2 * GWEI
ACCOUNT_BALANCE = 10**18
CALL_GAS = 100_000
VERIFICATION_GAS = 150_000  # a deployed SimpleAccount's validation (~40k) with room to spare
VERIFICATION_GAS_DEPLOY = 600_000  # ...and one that deploys the account first
PRE_VERIFICATION_GAS = 100_000  # above every bundler's calldata formula for these ops


@dataclass(frozen=True)
class BuiltOp:
    version: Version
    op: UserOperation
    hash: str  # 0x userOpHash, what eth_sendUserOperation must answer
    rpc: dict[str, str]  # the operation in its RPC form


class _Caller:
    """The async ``call`` ``learn_factory`` wants, over the devnet's sync client."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def call(self, method: str, params: Sequence[Any]) -> Any:
        with DevnetRpc(self.url) as rpc:
            return rpc.call(method, *params)


def learn_factory(url: str, manifest: Manifest, version: Version) -> accounts.AccountFactory:
    address = manifest.address(f"simple_account_factory_{TAGS[version]}")
    return trio.run(accounts.learn_factory, _Caller(url), address, version)


def _hex(value: int) -> str:
    return hex(value)


def _data(value: bytes) -> str:
    return "0x" + value.hex()


def rpc_form(op: UserOperation, version: Version) -> dict[str, str]:
    """ERC-7769's RPC form: v0.6 initCode/paymasterAndData, v0.7 the split fields (absent
    when there is no factory / paymaster, as viem sends them)."""
    form = {"sender": op.sender, "nonce": _hex(op.nonce)}
    if version == "0.6":
        form["initCode"] = _data(op.init_code)
    elif op.factory is not None:
        form["factory"] = op.factory
        form["factoryData"] = _data(op.factory_data)
    form.update(
        callData=_data(op.call_data),
        callGasLimit=_hex(op.call_gas_limit),
        verificationGasLimit=_hex(op.verification_gas_limit),
        preVerificationGas=_hex(op.pre_verification_gas),
        maxFeePerGas=_hex(op.max_fee_per_gas),
        maxPriorityFeePerGas=_hex(op.max_priority_fee_per_gas),
    )
    if version == "0.6":
        form["paymasterAndData"] = _data(op.paymaster_and_data(version))
    elif op.paymaster is not None:
        form.update(
            paymaster=op.paymaster,
            paymasterVerificationGasLimit=_hex(op.paymaster_verification_gas_limit),
            paymasterPostOpGasLimit=_hex(op.paymaster_post_op_gas_limit),
            paymasterData=_data(op.paymaster_data),
        )
    form["signature"] = _data(op.signature)
    return form


def deploy_accounts(
    url: str,
    factory: accounts.AccountFactory,
    owner: str,
    salts: Sequence[int],
    *,
    entry_point: str,
) -> None:
    """``createAccount(owner, salt)`` for every salt, from anvil's first account (v0.8's
    factory takes it from its EntryPoint's SenderCreator alone: from that, impersonated),
    mined in blocks of DEPLOY_PER_BLOCK; raises unless every account has code afterwards."""
    with DevnetRpc(url, timeout=120.0) as rpc:
        sender = rpc.call("eth_accounts")[0]
        if factory.version == "0.8":
            sender = create_address(entry_point, 1)  # the SenderCreator
            rpc.call("anvil_impersonateAccount", sender)
            rpc.call("anvil_setBalance", sender, _hex(10**20))
        rpc.call("evm_setAutomine", False)
        try:
            for start in range(0, len(salts), DEPLOY_PER_BLOCK):
                chunk = salts[start : start + DEPLOY_PER_BLOCK]
                rpc.batch(
                    [
                        (
                            "eth_sendTransaction",
                            [
                                {
                                    "from": sender,
                                    "to": factory.address,
                                    "input": _data(factory.factory_data(owner, salt)),
                                    "gas": _hex(400_000),
                                }
                            ],
                        )
                        for salt in chunk
                    ]
                )
                rpc.call("evm_mine")
        finally:
            rpc.call("evm_setAutomine", True)
        addresses = [factory.account_address(owner, salt) for salt in salts]
        codes = rpc.batch([("eth_getCode", [a, "latest"]) for a in addresses])
    missing = [a for a, code in zip(addresses, codes, strict=True) if code in ("0x", "")]
    if missing:
        raise RuntimeError(f"{len(missing)} accounts not deployed (first {missing[0]})")


def fund(url: str, addresses: Sequence[str]) -> None:
    with DevnetRpc(url) as rpc:
        for start in range(0, len(addresses), 200):
            rpc.batch(
                [
                    ("anvil_setBalance", [a, _hex(ACCOUNT_BALANCE)])
                    for a in addresses[start : start + 200]
                ]
            )


def base_fee(url: str) -> int:
    with DevnetRpc(url) as rpc:
        block = rpc.call("eth_getBlockByNumber", "latest", False)
    return int(block["baseFeePerGas"], 16)


def build_ops(
    url: str,
    manifest: Manifest,
    version: Version,
    owner: PrivateKey,
    salts: Sequence[int],
    *,
    deploy: bool,
    chain_id: int,
) -> list[BuiltOp]:
    """One signed operation per salt (its own account), ready to send.  The accounts are
    deployed first unless ``deploy`` (then each operation deploys its own), and funded."""
    factory = learn_factory(url, manifest, version)
    entry_point = manifest.address(f"entry_point_{TAGS[version]}")
    if not deploy:
        deploy_accounts(url, factory, owner.address, salts, entry_point=entry_point)
    senders = [factory.account_address(owner.address, salt) for salt in salts]
    fund(url, senders)
    # Twice the base fee: room for it to rise while the operations wait in a mempool.
    max_fee = 2 * base_fee(url) + PRIORITY_FEE
    call_data = abi.encode_call("execute(address,uint256,bytes)", RECIPIENT, 1, b"")
    built = []
    for salt, sender in zip(salts, senders, strict=True):
        op = UserOperation(
            sender=sender,
            nonce=0,
            call_data=call_data,
            call_gas_limit=CALL_GAS,
            verification_gas_limit=VERIFICATION_GAS_DEPLOY if deploy else VERIFICATION_GAS,
            pre_verification_gas=PRE_VERIFICATION_GAS,
            max_fee_per_gas=max_fee,
            max_priority_fee_per_gas=PRIORITY_FEE,
        )
        if deploy:
            op = op.with_(
                factory=factory.address, factory_data=factory.factory_data(owner.address, salt)
            )
        digest = userop.user_op_hash(
            op, entry_point=entry_point, chain_id=chain_id, version=version
        )
        op = op.with_(signature=owner.sign_digest(accounts.owner_digest(digest, version)))
        built.append(BuiltOp(version, op, "0x" + digest.hex(), rpc_form(op, version)))
    return built

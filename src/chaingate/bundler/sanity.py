"""The sanity checks of an operation before any simulation (ERC-4337 "client behavior upon
receiving a UserOperation", ERC-7562's first pass), cheapest first.

``check_static`` needs nothing but the operation: size, gas caps — the verificationGasLimit
cap answers the known DoS, an operation that makes every bundler simulate millions of gas
for nothing —, the minimum callGasLimit, preVerificationGas against the documented formula,
the priority-fee floor. ``check_state`` adds what the chain says (sender code XOR initCode,
factory and paymaster code, the paymaster's deposit against the prefund of this operation and
of its pending ones (EREP-010), the nonce, the base fee); ``check_authorization`` an EIP-7702
sender's authorization (v0.8: the chain's id or 0, signed by the sender, the sender's next
account nonce, a sender that is an EOA or already delegated); ``check`` fetches that state and
runs them. Every refusal is a BundlerFault naming the
field: -32602 for a malformed or under-priced operation (as the reference bundler answers),
-32508 for a paymaster deposit too small.
"""

from __future__ import annotations

from typing import Any

import msgspec

from chaingate.aa.userop import UserOperation, Version, encoded_size, require_version
from chaingate.bundler.errors import INVALID_PARAMS, PAYMASTER_BALANCE, BundlerFault
from chaingate.bundler.estimation import pre_verification_gas
from chaingate.bundler.simulation import NodeClient, node_batch
from chaingate.chain.client import RpcCallError
from chaingate.evm import abi
from chaingate.evm.eip7702 import delegate_of

__all__ = [
    "Checked",
    "SanityLimits",
    "check",
    "check_authorization",
    "check_state",
    "check_static",
    "required_prefund",
]


class SanityLimits(msgspec.Struct, frozen=True, kw_only=True):
    # The packed operation's ABI size (bytes): it is calldata every bundle carries.
    max_op_bytes: int = 64 * 1024
    # The DoS cap: validation gas a bundler simulates before it knows anything.
    max_verification_gas: int = 5_000_000
    max_call_gas: int = 20_000_000
    # ERC-4337: callGasLimit at least the cost of a CALL with non-zero value.
    min_call_gas: int = 9_100
    # All the operation's gas together (it must fit a bundle).
    max_total_gas: int = 30_000_000
    min_priority_fee: int = 0  # wei
    # maxFeePerGas must reach this percentage of the latest base fee (100: the base fee
    # itself; above 100 demands headroom for a rising base fee, below accepts ops that wait).
    base_fee_percent: int = 100
    check_paymaster_deposit: bool = True


class Checked(msgspec.Struct, frozen=True):
    """What ``check`` read that admission uses again: the paymaster's deposit (None without a
    paymaster; EREP-010 again in the mempool) and the latest block's number as the node sent
    it (the block the validation's traces are pinned at: one round trip fewer)."""

    paymaster_deposit: int | None
    block: str | None


def _fault(field: str, why: str, code: int = INVALID_PARAMS, reason: str = "") -> BundlerFault:
    return BundlerFault(code, f"userOp.{field}: {why}", {"field": field}, reason=reason)


def required_prefund(op: UserOperation, version: Version) -> int:
    """The EntryPoint's requiredPreFund: every gas limit at maxFeePerGas (v0.6 counts the
    verification limit three times with a paymaster: it also bounds postOp, twice)."""
    if require_version(version) == "0.6":
        multiplier = 3 if op.paymaster is not None else 1
        gas = op.call_gas_limit + op.verification_gas_limit * multiplier + op.pre_verification_gas
    else:
        gas = (
            op.verification_gas_limit
            + op.call_gas_limit
            + op.paymaster_verification_gas_limit
            + op.paymaster_post_op_gas_limit
            + op.pre_verification_gas
        )
    return gas * op.max_fee_per_gas


def check_static(op: UserOperation, version: Version, limits: SanityLimits) -> None:
    """The checks that need only the operation."""
    version = require_version(version)
    size = encoded_size(op, version)
    if size > limits.max_op_bytes:
        raise _fault("callData", f"the operation is {size} bytes; at most {limits.max_op_bytes}")
    if op.verification_gas_limit > limits.max_verification_gas:
        raise _fault(
            "verificationGasLimit",
            f"{op.verification_gas_limit} is above this bundler's cap "
            f"{limits.max_verification_gas}",
        )
    if op.paymaster_verification_gas_limit > limits.max_verification_gas:
        raise _fault(
            "paymasterVerificationGasLimit",
            f"{op.paymaster_verification_gas_limit} is above this bundler's cap "
            f"{limits.max_verification_gas}",
        )
    if op.call_gas_limit > limits.max_call_gas:
        raise _fault("callGasLimit", f"{op.call_gas_limit} is above the cap {limits.max_call_gas}")
    if op.paymaster_post_op_gas_limit > limits.max_call_gas:
        raise _fault(
            "paymasterPostOpGasLimit",
            f"{op.paymaster_post_op_gas_limit} is above the cap {limits.max_call_gas}",
        )
    if op.call_gas_limit < limits.min_call_gas:
        raise _fault(
            "callGasLimit",
            f"{op.call_gas_limit} is below {limits.min_call_gas}, the cost of a call with value",
        )
    multiplier = 3 if version == "0.6" and op.paymaster is not None else 1
    total = (
        op.pre_verification_gas
        + op.verification_gas_limit * multiplier
        + op.call_gas_limit
        + op.paymaster_verification_gas_limit
        + op.paymaster_post_op_gas_limit
    )
    if total > limits.max_total_gas:
        raise _fault(
            "verificationGasLimit",
            f"the operation's gas limits total {total}, above {limits.max_total_gas}",
        )
    expected = pre_verification_gas(op, version)
    if op.pre_verification_gas < expected:
        raise _fault(
            "preVerificationGas",
            f"{op.pre_verification_gas} is below {expected}, the calldata and overhead cost",
        )
    if op.max_priority_fee_per_gas < limits.min_priority_fee:
        raise _fault(
            "maxPriorityFeePerGas",
            f"{op.max_priority_fee_per_gas} is below this bundler's floor "
            f"{limits.min_priority_fee}",
        )
    if op.max_fee_per_gas < op.max_priority_fee_per_gas:
        raise _fault("maxFeePerGas", "below maxPriorityFeePerGas")
    if op.eip7702_init and op.factory_data:
        raise _fault(
            "factoryData",
            "EIP-7702 initialisation data (initCode past the 0x7702 marker) is not supported "
            "by this bundler: send the operation without it",
        )


def check_state(
    op: UserOperation,
    version: Version,
    limits: SanityLimits,
    *,
    base_fee: int,
    sender_has_code: bool,
    factory_has_code: bool | None,
    paymaster_has_code: bool | None,
    paymaster_deposit: int | None,
    on_chain_nonce: int | None,
    paymaster_pending: int = 0,
) -> None:
    """The checks against chain state (None: not known, not checked).
    ``paymaster_pending``: what the paymaster's operations in the mempool can cost at most."""
    version = require_version(version)
    if sender_has_code and op.deploys:
        field = "initCode" if version == "0.6" else "factory"
        raise _fault(field, f"sender {op.sender} is already deployed (AA10)", reason="AA10")
    if not sender_has_code and not op.deploys:
        raise _fault(
            "sender", f"{op.sender} has no code and the operation no factory (AA20)", reason="AA20"
        )
    if op.deploys and factory_has_code is False:
        field = "initCode" if version == "0.6" else "factory"
        raise _fault(field, f"no contract at the factory {op.factory}")
    if op.paymaster is not None:
        field = "paymasterAndData" if version == "0.6" else "paymaster"
        if paymaster_has_code is False:
            raise _fault(
                field, f"no contract at the paymaster {op.paymaster} (AA30)", reason="AA30"
            )
        prefund = required_prefund(op, version)
        if limits.check_paymaster_deposit and paymaster_deposit is not None:
            if paymaster_deposit < prefund:
                raise _fault(
                    field,
                    f"AA31 paymaster deposit too low: {paymaster_deposit} < prefund {prefund}",
                    PAYMASTER_BALANCE,
                    reason="AA31 paymaster deposit too low",
                )
            if paymaster_deposit < prefund + paymaster_pending:
                raise _fault(
                    field,
                    f"paymaster deposit too low for all its pending operations: "
                    f"{paymaster_deposit} < {prefund + paymaster_pending} [EREP-010]",
                    PAYMASTER_BALANCE,
                )
    if on_chain_nonce is not None and op.nonce < on_chain_nonce:
        raise _fault(
            "nonce",
            f"{op.nonce:#x} is below the sender's next nonce {on_chain_nonce:#x} (AA25)",
            reason="AA25",
        )
    floor = base_fee * limits.base_fee_percent // 100
    if op.max_fee_per_gas < floor:
        raise _fault(
            "maxFeePerGas",
            f"{op.max_fee_per_gas} is below the base fee {base_fee}"
            + (f" x {limits.base_fee_percent}%" if limits.base_fee_percent != 100 else ""),
        )


def check_authorization(
    op: UserOperation, *, chain_id: int, sender_code: bytes, sender_nonce: int, signed: bool = True
) -> None:
    """An EIP-7702 sender's authorization, as the bundle's type-4 transaction will apply it:
    for this chain (or any: 0), the sender's next nonce, and — ``signed`` (not for
    estimation, whose authorization is a stub) — signed by the sender.  The sender must be an
    EOA or already delegated: an authorization cannot give a contract another code.  An
    EIP-7702 initCode without an authorization needs the delegation on chain already."""
    auth = op.eip7702_auth
    if auth is None:
        if op.eip7702_init and delegate_of(sender_code) is None:
            raise _fault(
                "factory",
                f"the EIP-7702 marker needs a delegated sender: {op.sender} is not delegated "
                "and the operation carries no eip7702Auth",
                reason="AA20",
            )
        return
    if auth.chain_id not in (0, chain_id):
        raise _fault("eip7702Auth.chainId", f"{auth.chain_id:#x} is neither 0 nor {chain_id:#x}")
    if auth.nonce != sender_nonce:
        raise _fault(
            "eip7702Auth.nonce",
            f"{auth.nonce:#x} is not the sender's next account nonce {sender_nonce:#x}",
        )
    if sender_code and delegate_of(sender_code) is None:
        raise _fault(
            "eip7702Auth",
            f"sender {op.sender} is a contract: an EIP-7702 authorization only delegates an EOA",
        )
    if signed:
        try:
            authority = auth.authority()
        except ValueError as exc:
            raise _fault("eip7702Auth", str(exc)) from None
        if authority.lower() != op.sender.lower():
            raise _fault("eip7702Auth", f"signed by {authority}, not by the sender {op.sender}")


def _code(value: object) -> bytes:
    if isinstance(value, str) and value[:2] in ("0x", "0X"):
        return bytes.fromhex(value[2:])
    raise ValueError(f"expected 0x-hex code from the node, got {value!r}")


def _hex_int(value: object) -> int:
    if isinstance(value, str) and value[:2] in ("0x", "0X"):
        return int(value[2:] or "0", 16)
    raise ValueError(f"expected a 0x-hex quantity from the node, got {value!r}")


async def _read_state(
    client: NodeClient, reads: list[tuple[str, str, list[Any]]]
) -> dict[str, Any]:
    """The reads' results by name: one JSON-RPC batch with a client that has them (one round
    trip and one request for the node to parse, where a call each cost ~0.1 ms of our CPU
    apiece), else concurrent calls.  A read the node refused raises its RpcCallError."""
    results = await node_batch(client, [(method, params) for _, method, params in reads])
    for result in results:
        if isinstance(result, RpcCallError):
            raise result
    return {name: result for (name, _, _), result in zip(reads, results, strict=True)}


async def check(
    client: NodeClient,
    op: UserOperation,
    entry_point: str,
    version: Version,
    limits: SanityLimits,
    *,
    chain_id: int | None = None,
    paymaster_pending: int = 0,
) -> Checked:
    """``check_static``, then the chain state (``_read_state``), ``check_authorization``
    (against ``chain_id``, needed for an EIP-7702 sender) and ``check_state``.  Returns the
    paymaster's deposit as read and the block read."""
    version = require_version(version)
    check_static(op, version, limits)
    key = op.nonce >> 64
    nonce_call = abi.encode_call("getNonce(address,uint192)", op.sender, key)
    reads: list[tuple[str, str, list[Any]]] = [
        ("block", "eth_getBlockByNumber", ["latest", False]),
        ("sender", "eth_getCode", [op.sender, "latest"]),
        ("nonce", "eth_call", [{"to": entry_point, "data": "0x" + nonce_call.hex()}, "latest"]),
    ]
    if op.deploys:
        reads.append(("factory", "eth_getCode", [op.factory, "latest"]))
    if op.eip7702_auth is not None:
        reads.append(("account_nonce", "eth_getTransactionCount", [op.sender, "latest"]))
    if op.paymaster is not None:
        deposit_call = abi.encode_call("balanceOf(address)", op.paymaster)
        reads.append(("paymaster", "eth_getCode", [op.paymaster, "latest"]))
        reads.append(
            (
                "deposit",
                "eth_call",
                [{"to": entry_point, "data": "0x" + deposit_call.hex()}, "latest"],
            )
        )
    found = await _read_state(client, reads)
    block = found["block"] or {}
    deposit = _hex_int(found["deposit"]) if "deposit" in found else None
    sender_code = _code(found["sender"] or "0x")
    if op.eip7702_auth is not None or op.eip7702_init:
        if chain_id is None:
            raise RuntimeError("an EIP-7702 authorization is checked against the chain id")
        check_authorization(
            op,
            chain_id=chain_id,
            sender_code=sender_code,
            sender_nonce=_hex_int(found["account_nonce"]) if "account_nonce" in found else 0,
        )
    check_state(
        op,
        version,
        limits,
        base_fee=_hex_int(block.get("baseFeePerGas") or "0x0"),
        # An authorization gives the sender its code in the bundle's own transaction.
        sender_has_code=bool(sender_code) or op.eip7702_auth is not None,
        factory_has_code=found["factory"] not in ("0x", "0x0", None)
        if "factory" in found
        else None,
        paymaster_has_code=(
            found["paymaster"] not in ("0x", "0x0", None) if "paymaster" in found else None
        ),
        paymaster_deposit=deposit,
        on_chain_nonce=_hex_int(found["nonce"]),
        paymaster_pending=paymaster_pending,
    )
    number = block.get("number")
    return Checked(deposit, number if isinstance(number, str) else None)

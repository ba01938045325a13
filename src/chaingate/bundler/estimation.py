"""Gas estimation for ``eth_estimateUserOperationGas`` (EntryPoint v0.6, v0.7 and v0.8).

* ``preVerificationGas``: the reference bundler's ``calcPreVerificationGas`` (sdk
  ``DefaultGasOverheads``): the ABI encoding of the packed operation (its fields as a flat
  sequence, signature included) costs 16 gas per non-zero byte and 4 per zero byte, plus the
  transaction's fixed 21000 shared by the bundle (bundle size 1: all of it), 18300 per
  operation and 4 per 32-byte word of the encoding; ``Math.round`` of the sum; plus 25000
  for an EIP-7702 authorization (its cost in the bundle's intrinsic gas, PER_EMPTY_ACCOUNT_COST).
* ``verificationGasLimit`` (and v0.7's paymaster limits) and ``callGasLimit``: the
  EntryPoint's own ``simulateHandleOp`` (v0.6 on the EntryPoint, v0.7 and v0.8 on
  EntryPointSimulations by state override, an EIP-7702 sender's delegation overridden in place)
  at a gas price of 1 wei, so ``paid`` *is* the gas used, with the sender's balance overridden
  (an undeployed, unfunded account pays its prefund in the simulation). One run executes nothing
  but calls the sender with ``callData`` from the EntryPoint as the simulation's target — its
  success and revert data say whether the call reverts (-32521 with the reason); one run
  executes ``callData`` as the operation's call, and the difference in gas paid is the call's;
  then the estimated limits are run once more and raised until the EntryPoint takes them and the
  call uses no more gas than unconstrained (an out-of-gas call would burn its whole limit).
"""

from __future__ import annotations

from typing import Any

import msgspec

from chaingate.aa.userop import (
    OP_TUPLE_TYPE,
    UserOperation,
    Version,
    packed,
    packs_gas,
    require_version,
)
from chaingate.bundler.errors import EXECUTION_REVERTED, SIMULATION_REJECTED, BundlerFault
from chaingate.bundler.simulation import (
    NodeClient,
    decode_revert,
    decode_validation,
    eth_call,
    revert_fault,
    simulations_for,
    state_override,
    validation_call,
)
from chaingate.evm import abi
from chaingate.evm.addresses import checksum_address

__all__ = [
    "DUMMY_SIGNATURE",
    "GasEstimate",
    "Overheads",
    "estimate_gas",
    "pre_verification_gas",
]

# permissionless.js's SimpleAccount dummy signature: it recovers to some address, so the
# account runs the same code as with a real one (OpenZeppelin's recover reverts on garbage).
DUMMY_SIGNATURE = bytes.fromhex(
    "fffffffffffffffffffffffffffffff0000000000000000000000000000000007aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa1c"
)


class Overheads(msgspec.Struct, frozen=True, kw_only=True):
    """The reference bundler's DefaultGasOverheads."""

    fixed: int = 21_000
    per_user_op: int = 18_300
    per_user_op_word: int = 4
    zero_byte: int = 4
    non_zero_byte: int = 16
    bundle_size: int = 1


DEFAULT_OVERHEADS = Overheads()
# EIP-7702's PER_EMPTY_ACCOUNT_COST: what an authorization adds to the bundle's intrinsic gas.
AUTHORIZATION_GAS = 25_000


def pre_verification_gas(
    op: UserOperation, version: Version, overheads: Overheads = DEFAULT_OVERHEADS
) -> int:
    """calcPreVerificationGas of ``op`` as it is (its own signature and gas fields)."""
    version = require_version(version)
    # The struct's fields as a flat sequence (packUserOp(op, forSignature=false)).
    encoded = abi.encode(OP_TUPLE_TYPE[version], packed(op, version))
    zeros = encoded.count(0)
    cost = zeros * overheads.zero_byte + (len(encoded) - zeros) * overheads.non_zero_byte
    # Math.round(cost + fixed / bundleSize + perUserOp + perUserOpWord * (len + 31) / 32),
    # in integers: all over the denominator 32 * bundleSize, rounded half up.
    denominator = 32 * overheads.bundle_size
    numerator = (
        (cost + overheads.per_user_op) * denominator
        + overheads.fixed * 32
        + overheads.per_user_op_word * (len(encoded) + 31) * overheads.bundle_size
    )
    authorization = AUTHORIZATION_GAS if op.eip7702_auth is not None else 0
    return (2 * numerator + denominator) // (2 * denominator) + authorization


def pre_verification_gas_bound(
    op: UserOperation, version: Version, overheads: Overheads = DEFAULT_OVERHEADS
) -> int:
    """preVerificationGas for ``op`` once it is signed and priced: its signature and paymaster
    data (stubs now) counted as non-zero bytes of their length (65 at least for the
    signature), each fee as 8 non-zero bytes, preVerificationGas itself as 3, so the final
    operation never costs more calldata than estimated."""
    worst = op.with_(
        signature=b"\xff" * max(len(op.signature), 65),
        paymaster_data=b"\xff" * len(op.paymaster_data),
        max_fee_per_gas=max(op.max_fee_per_gas, (1 << 64) - 1),
        max_priority_fee_per_gas=max(op.max_priority_fee_per_gas, (1 << 64) - 1),
        pre_verification_gas=(1 << 24) - 1,
    )
    return pre_verification_gas(worst, version, overheads)


class GasEstimate(msgspec.Struct, frozen=True, kw_only=True):
    pre_verification_gas: int
    verification_gas_limit: int
    call_gas_limit: int
    paymaster_verification_gas_limit: int | None = None  # v0.7+ with a paymaster
    paymaster_post_op_gas_limit: int | None = None


class EstimationLimits(msgspec.Struct, frozen=True, kw_only=True):
    """The limits the simulations run with (the most an estimate can come to)."""

    verification_gas: int = 3_000_000
    call_gas: int = 10_000_000
    post_op_gas: int = 1_000_000
    simulation_gas: int = 25_000_000  # the eth_call's own gas: within a 30M block
    sender_balance: int = 10**24  # the sender's balance override (pays a 1-wei-price prefund)
    rounds: int = 4  # raises of a limit the EntryPoint refuses before giving up


DEFAULT_LIMITS = EstimationLimits()
MIN_CALL_GAS = 9_100  # ERC-4337: callGasLimit covers at least a CALL with value

_EXECUTION_RESULT_V06 = abi.selector("ExecutionResult(uint256,uint256,uint48,uint48,bool,bytes)")
_SIMULATE_HANDLE_OP: dict[Version, str] = {
    v: f"simulateHandleOp({t},address,bytes)" for v, t in OP_TUPLE_TYPE.items()
}
_ZERO = "0x" + "00" * 20
# FailedOp reasons a too-low limit causes: out of gas in creation, validation or postOp.
_OOG_REASONS = ("AA13", "AA23", "AA26", "AA33", "AA36", "AA40", "AA41", "AA51", "AA95")


class _Run(msgspec.Struct, frozen=True):
    pre_op_gas: int
    paid: int  # = gas, at a price of 1
    target_success: bool
    target_result: bytes


def _override(
    op: UserOperation,
    entry_point: str,
    version: Version,
    code: bytes | None,
    limits: EstimationLimits,
) -> dict[str, Any]:
    override: dict[str, Any] = state_override(op)
    if op.paymaster is None:
        sender = checksum_address(op.sender)
        override[sender] = {**override.get(sender, {}), "balance": hex(limits.sender_balance)}
    if packs_gas(version):
        override[entry_point] = {"code": "0x" + (code or b"").hex()}
    return override


async def _simulate_handle_op(
    client: NodeClient,
    op: UserOperation,
    entry_point: str,
    version: Version,
    code: bytes | None,
    limits: EstimationLimits,
    target: str = _ZERO,
    target_data: bytes = b"",
) -> _Run:
    calldata = abi.encode_call(
        _SIMULATE_HANDLE_OP[version], packed(op, version), target, target_data
    )
    tx = {"to": entry_point, "data": "0x" + calldata.hex(), "gas": hex(limits.simulation_gas)}
    data, reverted = await eth_call(client, tx, _override(op, entry_point, version, code, limits))
    try:
        if version == "0.6":
            if not reverted or data[:4] != _EXECUTION_RESULT_V06:
                raise revert_fault(data)
            pre, paid, _, _, success, result = abi.decode(
                ["uint256", "uint256", "uint48", "uint48", "bool", "bytes"], data[4:]
            )
        else:
            if reverted:
                raise revert_fault(data)
            ((pre, paid, _, _, success, result),) = abi.decode(
                "((uint256,uint256,uint256,uint256,bool,bytes))", data
            )
    except abi.AbiError:
        raise BundlerFault(
            SIMULATION_REJECTED, f"simulateHandleOp answered 0x{data[:68].hex()}..."
        ) from None
    return _Run(pre, paid, success, result)


V08_PENALTY_THRESHOLD = 40_000


def _execution_gas(run: _Run, op: UserOperation, version: Version) -> int:
    """Gas the execution phase used: what was paid past preOpGas, less v0.7's penalty of 10%
    of the unused execution limit (paid = used + (limit - used) // 10 when used < limit)."""
    paid = run.paid - run.pre_op_gas
    if version == "0.6":
        return paid
    limit = op.call_gas_limit + op.paymaster_post_op_gas_limit
    guess = (10 * paid - limit) // 9
    if version == "0.8":
        # v0.8 charges the penalty on the call's and postOp's unused gas apart, and only past
        # 40,000 unused: within a few gas of this (the margins cover them).
        return guess if guess >= 0 and limit - guess > V08_PENALTY_THRESHOLD else paid
    for used in range(guess - 2, guess + 3):
        if 0 <= used < limit and used + (limit - used) * 10 // 100 == paid:
            return used
    return paid  # used >= limit: no penalty


def _with_margin(gas: int, percent: int, extra: int) -> int:
    return gas + gas * percent // 100 + extra


async def estimate_gas(
    client: NodeClient,
    op: UserOperation,
    entry_point: str,
    version: Version,
    simulations_code: bytes | None,
    *,
    limits: EstimationLimits = DEFAULT_LIMITS,
    overheads: Overheads = DEFAULT_OVERHEADS,
) -> GasEstimate:
    """Limits with which ``op`` (once signed) passes validation and executes; see the module
    docstring. An empty signature is replaced by ``DUMMY_SIGNATURE``; the op's own gas
    fields and fees are ignored (the simulations run at a price of 1 wei). Refusals are
    BundlerFaults: the EntryPoint's FailedOp, or -32521 with the call's revert reason."""
    version = require_version(version)
    entry_point = checksum_address(entry_point)
    simulations_code = simulations_code or simulations_for(version)
    pm_limits = op.paymaster is not None and packs_gas(version)
    high = op.with_(
        signature=op.signature or DUMMY_SIGNATURE,
        pre_verification_gas=0,
        verification_gas_limit=limits.verification_gas,
        call_gas_limit=limits.call_gas,
        max_fee_per_gas=1,
        max_priority_fee_per_gas=1,
        paymaster_verification_gas_limit=limits.verification_gas if pm_limits else 0,
        paymaster_post_op_gas_limit=limits.post_op_gas if pm_limits else 0,
    )
    # 1. Validation alone: its gas, and whether the paymaster asks for a postOp.
    tx, sim_override = validation_call(
        high, entry_point, version, simulations_code, gas=limits.simulation_gas
    )
    override = _override(high, entry_point, version, simulations_code, limits)
    data, reverted = await eth_call(client, tx, {**(sim_override or {}), **override})
    validation = decode_validation(version, data, reverted)  # a failed dummy signature is fine
    # 2. Nothing executed, the call made as the simulation's target: does it revert?
    bare_op = high.with_(call_data=b"")
    bare = await _simulate_handle_op(
        client, bare_op, entry_point, version, simulations_code, limits, op.sender, op.call_data
    )
    if op.call_data and not bare.target_success:
        reason = decode_revert(bare.target_result)
        raise BundlerFault(
            EXECUTION_REVERTED,
            f"execution reverted: {reason}",
            {"revertData": "0x" + bare.target_result.hex(), "reason": reason},
        )
    # 3. The call executed as the operation's: its gas is the difference.
    full = await _simulate_handle_op(client, high, entry_point, version, simulations_code, limits)
    bare_exec = _execution_gas(bare, bare_op, version)
    full_exec = _execution_gas(full, high, version)
    call_used = max(0, full_exec - bare_exec)
    verification = _with_margin(validation.pre_op_gas, 20, 10_000)
    post_op = _with_margin(bare_exec, 20, 10_000) if validation.paymaster_context else 0
    if version == "0.6":
        verification = max(verification, post_op)  # v0.6's postOp runs under this limit
    # 64/63: what the account keeps back when it calls on with all but 1/64 of its gas.
    call_gas = max(_with_margin(call_used, 10, 5_000) * 64 // 63, MIN_CALL_GAS)
    # 4. Run the estimate; raise what the EntryPoint or the call found short.
    for _ in range(limits.rounds):
        trial = high.with_(
            verification_gas_limit=verification,
            call_gas_limit=call_gas,
            paymaster_verification_gas_limit=verification if pm_limits else 0,
            paymaster_post_op_gas_limit=post_op if pm_limits else 0,
        )
        try:
            run = await _simulate_handle_op(
                client, trial, entry_point, version, simulations_code, limits
            )
        except BundlerFault as fault:
            if fault.reason[:4] not in _OOG_REASONS:
                raise
            verification, post_op = verification * 3 // 2, post_op * 3 // 2
            continue
        if _execution_gas(run, trial, version) > full_exec + 2_000:
            call_gas = call_gas * 3 // 2  # out of gas: the call burnt its whole limit
            continue
        break
    else:
        raise BundlerFault(
            SIMULATION_REJECTED,
            f"no gas limits found within the simulation's caps (verification "
            f"{limits.verification_gas}, call {limits.call_gas})",
        )
    final = trial.with_(signature=op.signature, max_fee_per_gas=op.max_fee_per_gas)
    final = final.with_(max_priority_fee_per_gas=op.max_priority_fee_per_gas)
    return GasEstimate(
        pre_verification_gas=pre_verification_gas_bound(final, version, overheads),
        verification_gas_limit=verification,
        call_gas_limit=call_gas,
        paymaster_verification_gas_limit=verification if pm_limits else None,
        paymaster_post_op_gas_limit=post_op if pm_limits else None,
    )

"""A UserOperation as the EntryPoint would run it: ``simulateHandleOp`` under a state override.

The EntryPoint's own code is replaced, for the simulation only, by a version with a
``simulateHandleOp`` that *returns* (v0.7's ``ExecutionResult``), so validation (the account's
prefund payment included), execution and the paymaster's postOp run as ``handleOps`` runs them
and their logs stay in the answer:

* v0.7, v0.8: ``EntryPointSimulations`` from the pinned npm packages (the bundler's shipped
  copies, ``simulations_for``);
* v0.6: its EntryPoint's simulateHandleOp always reverts, which would undo every log; chaingate
  ships that EntryPoint compiled with the revert turned into a return
  (``python -m chaingate.devnet.shipped`` rebuilds and checks it).

An EIP-7702 sender (v0.8) is simulated delegated, as its authorization will make it in the
bundle's transaction (the bundler's ``state_override``).  Signatures are not required to be
valid (an operation is simulated before it is signed): the result says whether the account's
and the paymaster's checks passed.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import msgspec

from chaingate.aa.userop import OP_TUPLE_TYPE, UserOperation, Version, packed
from chaingate.bundler.simulation import (
    parse_validation_data,
    read_shipped_code,
    simulations_for,
    state_override,
)
from chaingate.evm import abi

__all__ = [
    "SIMULATIONS_V06",
    "HandleOpResult",
    "decode_result",
    "simulation_call",
    "simulation_code",
    "simulation_state",
]

# Shipped with the package, written and checked by ``python -m chaingate.devnet.shipped``.
SIMULATIONS_V06 = "artifacts/EntryPointSimulations-v06.json"
_RESULT = "(uint256,uint256,uint256,uint256,bool,bytes)"
_ZERO = "0x" + "00" * 20


@functools.cache
def _simulations_code_v06() -> bytes:
    data = (resources.files("chaingate.simulation") / SIMULATIONS_V06).read_bytes()
    return bytes.fromhex(read_shipped_code(data).deployedBytecode.removeprefix("0x"))


def simulation_code(version: Version) -> bytes:
    """The code put at the EntryPoint's address for a simulation."""
    return simulations_for(version) or _simulations_code_v06()


def simulation_state(op: UserOperation, entry_point: str, version: Version) -> dict[str, Any]:
    """What the simulation's state overrides add: the simulation code at the EntryPoint, an
    EIP-7702 sender's delegation."""
    state = {address.lower(): entry for address, entry in state_override(op).items()}
    state[entry_point.lower()] = {"code": "0x" + simulation_code(version).hex()}
    return state


def simulation_call(op: UserOperation, entry_point: str, version: Version) -> dict[str, Any]:
    """The eth_call transaction running ``op`` through ``simulateHandleOp`` (no target)."""
    data = abi.encode_call(
        f"simulateHandleOp({OP_TUPLE_TYPE[version]},address,bytes)",
        packed(op, version),
        _ZERO,
        b"",
    )
    return {"from": _ZERO, "to": entry_point.lower(), "data": "0x" + data.hex()}


class HandleOpResult(msgspec.Struct, frozen=True):
    pre_op_gas: int
    paid: int  # what the operation cost its payer, at the simulated block's prices
    account_sig_failed: bool
    paymaster_sig_failed: bool
    valid_after: int
    valid_until: int


def decode_result(output: bytes) -> HandleOpResult | None:
    """simulateHandleOp's returned ExecutionResult; None when it is not one."""
    try:
        ((pre_op_gas, paid, account, paymaster, _, _),) = abi.decode([_RESULT], output)
    except (abi.AbiError, ValueError):
        return None
    mine, theirs = parse_validation_data(account), parse_validation_data(paymaster)
    return HandleOpResult(
        pre_op_gas=pre_op_gas,
        paid=paid,
        account_sig_failed=mine.aggregator == 1,
        paymaster_sig_failed=theirs.aggregator == 1,
        valid_after=max(mine.valid_after, theirs.valid_after),
        valid_until=min(mine.valid_until, theirs.valid_until),
    )

"""The bundler's JSON-RPC error codes (ERC-7769), and the fault that carries one.

Each refusal names the rule it broke in its message; where the EntryPoint gave an ``AAxx``
reason (``FailedOp``), the message starts with it, as other bundlers answer, and ``data``
carries what a client needs to act (the entity, the reason, the time range).
"""

from __future__ import annotations

from typing import Any

from chaingate.rpc.local import INVALID_PARAMS, RpcFault

__all__ = [
    "BANNED_OPCODE",
    "EXECUTION_REVERTED",
    "INVALID_AGGREGATOR",
    "INVALID_PARAMS",
    "INVALID_SIGNATURE",
    "PAYMASTER_BALANCE",
    "PAYMASTER_REJECTED",
    "SIMULATION_REJECTED",
    "STAKE_TOO_LOW",
    "THROTTLED",
    "TIME_RANGE",
    "BundlerFault",
]

SIMULATION_REJECTED = -32500  # validateUserOp (or the factory) reverted / FailedOp AA1x, AA2x
PAYMASTER_REJECTED = -32501  # validatePaymasterUserOp reverted / FailedOp AA3x
BANNED_OPCODE = -32502  # an ERC-7562 opcode, storage, CREATE2 or gas rule
TIME_RANGE = -32503  # validUntil/validAfter out of range (or expiring too soon)
THROTTLED = -32504  # an entity throttled or banned by reputation, or a mempool limit
STAKE_TOO_LOW = -32505  # an entity that needs stake has too little or too short a delay
INVALID_AGGREGATOR = -32506  # aggregators are not supported
INVALID_SIGNATURE = -32507  # the account's or paymaster's signature check failed
PAYMASTER_BALANCE = -32508  # the paymaster's deposit does not cover the prefund
EXECUTION_REVERTED = -32521  # the operation's call reverted (estimation)


class BundlerFault(RpcFault):
    """A refusal with its ERC-7769 code; ``reason`` is the EntryPoint's ``AAxx`` text if any."""

    def __init__(self, code: int, message: str, data: Any = None, *, reason: str = "") -> None:
        super().__init__(code, message, data)
        self.reason = reason


def code_of_failed_op(reason: str) -> int:
    """The ERC-7769 code for a ``FailedOp`` reason: AA3x are the paymaster's, AA24/AA34 are
    signatures, AA22/AA32 time ranges, AA21/AA31 deposits, the rest simulation failures."""
    head = reason[:4]
    if head in ("AA24", "AA34"):
        return INVALID_SIGNATURE
    if head in ("AA22", "AA32"):
        return TIME_RANGE
    if head == "AA31":
        return PAYMASTER_BALANCE
    if head == "AA96" or head == "AA97":
        return INVALID_AGGREGATOR
    if head.startswith("AA3"):
        return PAYMASTER_REJECTED
    return SIMULATION_REJECTED

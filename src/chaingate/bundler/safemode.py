"""Safe-mode validation: the traced simulation, then the ERC-7562 rules, then the result checks.

The order is the reference bundler's: a FailedOp from the EntryPoint first (the op is invalid
whatever it touched), then the opcode/storage/stake rules, then signature and time range.

The trace comes from ``nativetrace`` (native tracers, ~10x cheaper) when it can be built soundly
and the rules accept it; otherwise — and for every refusal by the rules — from the exact JS
collector (``tracing.trace_validation``), whose verdict and message are authoritative.
"""

from __future__ import annotations

from collections.abc import Callable

from chaingate.aa.userop import UserOperation, Version, require_version
from chaingate.bundler import nativetrace
from chaingate.bundler.errors import BundlerFault
from chaingate.bundler.rules import Outcome, check_trace
from chaingate.bundler.simulation import (
    MIN_VALID_SECONDS,
    NodeClient,
    StakeInfo,
    ValidationResult,
    decode_validation,
    finish_validation,
)
from chaingate.bundler.tracecall import trace_validation

__all__ = ["FAST_PATH", "validate_safe"]

# How often validate_safe took each path: {"fast": n, "exact": n}; read by tests and benches.
FAST_PATH: dict[str, int] = {"fast": 0, "exact": 0}


async def validate_safe(
    client: NodeClient,
    op: UserOperation,
    entry_point: str,
    version: Version,
    simulations_code: bytes | None,
    *,
    now: int | None = None,
    min_valid_seconds: int = MIN_VALID_SECONDS,
    is_staked: Callable[[StakeInfo], bool] | None = None,
    fast_path: bool = True,
    block: str | None = None,
) -> tuple[ValidationResult, Outcome]:
    """The ValidationResult and the rules' outcome (code hashes), or a BundlerFault.

    ``fast_path=False`` always runs the exact JS-traced path.  ``block``: a recent block
    number (0x-hex) to pin the fast path's traces at, instead of asking the node for one."""
    version = require_version(version)
    outcome: Outcome | None = None
    if fast_path:
        fast = await nativetrace.fast_trace(
            client, op, entry_point, version, simulations_code, block=block
        )
        if isinstance(fast, nativetrace.FastTrace):
            # A FailedOp or other revert is the same data the exact path would decode.
            result = decode_validation(version, fast.data, fast.reverted)
            try:
                outcome = check_trace(
                    fast.trace,
                    result,
                    op,
                    entry_point=entry_point,
                    version=version,
                    is_staked=is_staked,
                )
            except BundlerFault:
                outcome = None  # the fast trace is stricter: let the exact one judge
    if outcome is None:
        FAST_PATH["exact"] += 1
        data, reverted, trace = await trace_validation(
            client, op, entry_point, version, simulations_code
        )
        result = decode_validation(version, data, reverted)
        outcome = check_trace(
            trace, result, op, entry_point=entry_point, version=version, is_staked=is_staked
        )
    else:
        FAST_PATH["fast"] += 1
    await finish_validation(
        client,
        op,
        entry_point,
        version,
        result,
        now=now,
        min_valid_seconds=min_valid_seconds,
    )
    return result, outcome

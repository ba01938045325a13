"""What every Solana method shares: its errors, its params and config objects, and the
``{"context", "value"}`` wrapper, shaped and numbered as a validator does."""

from __future__ import annotations

import enum
from typing import Any

from solders.pubkey import Pubkey

from chaingate.devnet.solana.ledger import COMMITMENTS, Commitment, Ledger
from chaingate.rpc.local import RpcFault

# The solana-core release whose RPC this node answers like (getVersion, apiVersion).
SOLANA_CORE_VERSION = "2.2.7"
FEATURE_SET = 3294202862


class Code(enum.IntEnum):
    """The node's JSON-RPC error codes (JSON-RPC 2.0's and solana-rpc-client-api's).  A class,
    not module constants: they are the devnet node's, not codes the gateway answers with
    (tests/docsgen/errors.py lists those)."""

    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    PARSE_ERROR = -32700
    INTERNAL_ERROR = -32603
    BLOCK_CLEANED_UP = -32001
    PREFLIGHT_FAILURE = -32002
    SIGNATURE_VERIFICATION_FAILURE = -32003
    BLOCK_NOT_AVAILABLE = -32004
    UNSUPPORTED_TRANSACTION_VERSION = -32015
    MIN_CONTEXT_SLOT_NOT_REACHED = -32016


def invalid(message: str) -> RpcFault:
    return RpcFault(Code.INVALID_PARAMS, message)


def arg(params: list[Any], index: int, kind: type, *, name: str, default: Any = ...) -> Any:
    """Positional param ``index``; missing → ``default`` or an invalid-params error."""
    if index >= len(params) or params[index] is None:
        if default is ...:
            raise invalid(f"Invalid params: missing {name}")
        return default
    value = params[index]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise invalid(f"Invalid params: {name} has the wrong type")
    return value


def config(params: list[Any], index: int) -> dict[str, Any]:
    """The config object at ``index``; a field sent as null is a field not sent (clients do)."""
    cfg = arg(params, index, dict, name="config", default={})
    return {key: value for key, value in cfg.items() if value is not None}


def pubkey(text: object, name: str = "pubkey") -> Pubkey:
    if not isinstance(text, str):
        raise invalid(f"Invalid params: {name} must be a base58 string")
    try:
        return Pubkey.from_string(text)
    except ValueError:
        raise invalid(f"Invalid param: Invalid {name}") from None


def commitment(ledger: Ledger, cfg: dict[str, Any], *, least: Commitment = "processed") -> int:
    """The slot ``cfg``'s commitment names (finalized by default), after minContextSlot."""
    name = cfg.get("commitment", "finalized")
    if name in ("recent", "single", "singleGossip"):
        name = "processed" if name == "recent" else "confirmed"
    elif name in ("max", "root"):
        name = "finalized"
    if name not in COMMITMENTS:
        raise invalid(f"Invalid params: unknown commitment {name!r}")
    if COMMITMENTS.index(name) < COMMITMENTS.index(least):
        raise invalid(f"Method does not support commitment below `{least}`")
    slot = ledger.slot(name)
    min_slot = cfg.get("minContextSlot")
    if min_slot is not None:
        if not isinstance(min_slot, int):
            raise invalid("Invalid params: minContextSlot must be an integer")
        if slot < min_slot:
            raise RpcFault(
                Code.MIN_CONTEXT_SLOT_NOT_REACHED,
                "Minimum context slot has not been reached",
                {"contextSlot": slot},
            )
    return slot


def with_context(slot: int, value: object) -> dict[str, Any]:
    return {"context": {"apiVersion": SOLANA_CORE_VERSION, "slot": slot}, "value": value}

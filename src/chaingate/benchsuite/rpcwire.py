"""JSON-RPC answers judged (sans-IO): ids, errors as outcomes, and equal results across targets.

A request pinned to a past block has one right answer whatever target gives it: the first
answer any target gives becomes the reference and every later one must agree.  What is compared
is a method's essence (a block's hash, not every field), since providers legitimately differ in
the extra fields they return.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from chaingate.benchsuite import outcomes


@dataclass(frozen=True)
class Call:
    method: str
    params: list[Any]
    comparable: bool  # pinned to the past: every target must give the same result

    @property
    def key(self) -> bytes:
        return msgspec.json.encode([self.method, self.params])


def _block_essence(result: object) -> object:
    return result.get("hash") if isinstance(result, dict) else result


def _receipt_essence(result: object) -> object:
    if not isinstance(result, dict):
        return result
    return [result.get(k) for k in ("transactionHash", "blockHash", "status", "gasUsed")]


def _logs_essence(result: object) -> object:
    if not isinstance(result, list):
        return result
    return [
        [log.get(k) for k in ("blockHash", "logIndex", "transactionHash")]
        if isinstance(log, dict)
        else log
        for log in result
    ]


def _solana_block_essence(result: object) -> object:
    return result.get("blockhash") if isinstance(result, dict) else result


def _solana_transaction_essence(result: object) -> object:
    if not isinstance(result, dict):
        return result
    transaction = result.get("transaction")
    signatures = transaction.get("signatures") if isinstance(transaction, dict) else None
    meta = result.get("meta")
    return [result.get("slot"), signatures, meta.get("err") if isinstance(meta, dict) else None]


def _solana_statuses_essence(result: object) -> object:
    if not isinstance(result, dict) or not isinstance(result.get("value"), list):
        return result
    return [
        [status.get("slot"), status.get("err")] if isinstance(status, dict) else status
        for status in result["value"]
    ]


ESSENCE: dict[str, Callable[[object], object]] = {
    "getBlock": _solana_block_essence,
    "getTransaction": _solana_transaction_essence,
    "getSignatureStatuses": _solana_statuses_essence,
    "eth_getBlockByNumber": _block_essence,
    "eth_getBlockByHash": _block_essence,
    "eth_getTransactionReceipt": _receipt_essence,
    "eth_getLogs": _logs_essence,
}


def essence(method: str, result: object) -> bytes:
    picked = ESSENCE.get(method, lambda r: r)(result)
    return hashlib.blake2b(msgspec.json.encode(picked), digest_size=16).digest()


class Oracle:
    """The reference answer of each comparable call, and which target gave it."""

    def __init__(self) -> None:
        self._answers: dict[bytes, tuple[bytes, str]] = {}

    def judge(self, call: Call, result: object, target: str) -> str | None:
        """None if ``result`` agrees with the reference (or becomes it); else what differs."""
        if not call.comparable:
            return None
        digest = essence(call.method, result)
        reference = self._answers.setdefault(call.key, (digest, target))
        if reference[0] == digest:
            return None
        return f"result differs from {reference[1]}'s for {call.method} {call.params}"[:300]


_ids = itertools.count(1)


def body(calls: list[Call], batch: bool) -> tuple[bytes, list[int]]:
    ids = [next(_ids) for _ in calls]
    items = [
        {"jsonrpc": "2.0", "id": i, "method": c.method, "params": c.params}
        for i, c in zip(ids, calls, strict=True)
    ]
    return msgspec.json.encode(items if batch else items[0]), ids


def judge(
    raw: bytes, calls: list[Call], ids: list[int], batch: bool, oracle: Oracle, target: str
) -> tuple[str, str]:
    """(outcome, detail) of a 2xx answer's body to ``calls`` sent with ``ids``."""
    try:
        decoded = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return outcomes.WRONG, f"not JSON: {raw[:80]!r}"
    if batch:
        if isinstance(decoded, dict) and "error" in decoded:  # a refusal of the whole batch
            return _error(decoded["error"])
        if not isinstance(decoded, list):
            return outcomes.WRONG, "a batch answered by a single object"
        by_id = {item.get("id"): item for item in decoded if isinstance(item, dict)}
        if sorted(by_id, key=str) != sorted(ids, key=str) or len(decoded) != len(ids):
            return outcomes.WRONG, f"batch ids {sorted(by_id, key=str)} for {ids}"
        answers = [by_id[i] for i in ids]
    else:
        if not isinstance(decoded, dict) or decoded.get("id") != ids[0]:
            got = decoded.get("id") if isinstance(decoded, dict) else type(decoded).__name__
            return outcomes.WRONG, f"id {got!r} for {ids[0]}"
        answers = [decoded]
    worst: tuple[str, str] = (outcomes.OK, "")
    for call, answer in zip(calls, answers, strict=True):
        if "error" in answer:
            found = _error(answer["error"], call.method)
        elif "result" not in answer:
            found = (outcomes.WRONG, f"{call.method}: neither result nor error")
        else:
            differs = oracle.judge(call, answer["result"], target)
            found = (outcomes.WRONG, differs) if differs else (outcomes.OK, "")
        if _SEVERITY[found[0]] > _SEVERITY[worst[0]]:
            worst = found
    return worst


# Which outcome a batch takes when its items differ: a wrong answer outweighs everything.
_SEVERITY = {
    outcomes.OK: 0,
    outcomes.RATE_LIMITED: 1,
    outcomes.REFUSED: 2,
    outcomes.ERROR: 3,
    outcomes.DROPPED: 3,
    outcomes.WRONG: 4,
}


def _error(error: object, method: str = "") -> tuple[str, str]:
    code = error.get("code") if isinstance(error, Mapping) else None
    message = error.get("message") if isinstance(error, Mapping) else error
    prefix = f"{method}: " if method else ""
    return outcomes.of_rpc_error(code), f"{prefix}JSON-RPC error {code}: {message}"[:300]

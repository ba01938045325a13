"""anvil's state dumps, cleaned down to the canonical chain before they are saved.

``anvil_loadState`` adds the dumped blocks to the node's own: loaded into a fresh anvil, a dump
leaves that node's genesis beside the dumped one, both at height 0, and the next dump carries
both.  Loading *that* makes block 0 whichever came last — so ``eth_getBlockByNumber(0)`` would
answer a block that is not block 1's parent, and a follower backfilling from 0 would see a
broken chain.  Blocks a revert or reorg left behind end up in dumps the same way.

``canonical_only`` keeps, at every height up to the best block, only the block the chain runs
through (found by walking parent hashes down from the head) and the transactions of those
blocks.  Dumped blocks carry no hash, so where a height holds more than one block the node is
asked for the canonical block by hash and the dumped header that matches it is kept.  Pure
data in, data out; the node is reached only through the ``block_by_hash`` callback.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable
from typing import Any

import msgspec

# Header fields compared to tell two dumped blocks of one height apart: together they pin the
# block (its parent, contents, state and time).
_MATCH_FIELDS = (
    "parentHash",
    "stateRoot",
    "transactionsRoot",
    "receiptsRoot",
    "timestamp",
    "mixHash",
)


class DumpError(RuntimeError):
    """A dump that cannot be read or reduced to one chain."""


def decode(state: str) -> dict[str, Any]:
    """``anvil_dumpState``'s answer (0x-hex of gzip'd JSON) as data."""
    try:
        raw = bytes.fromhex(state.removeprefix("0x"))
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        dump = msgspec.json.decode(raw)
    except (ValueError, OSError, EOFError, msgspec.DecodeError) as exc:
        raise DumpError(f"unreadable anvil state dump: {exc}") from None
    if not isinstance(dump, dict) or not isinstance(dump.get("blocks"), list):
        raise DumpError("an anvil state dump without blocks")
    return dump


def encode(dump: dict[str, Any]) -> str:
    """The form ``anvil_loadState`` takes."""
    return "0x" + gzip.compress(msgspec.json.encode(dump), compresslevel=6).hex()


def _number(value: str | int) -> int:
    return int(value, 16) if isinstance(value, str) else int(value)


def best_block(dump: dict[str, Any]) -> int:
    """The head's number (older anvils wrote only the block environment's)."""
    if dump.get("best_block_number") is not None:
        return _number(dump["best_block_number"])
    block = dump.get("block")
    if not isinstance(block, dict) or "number" not in block:
        raise DumpError("an anvil state dump without its best block number")
    return _number(block["number"])


def _same_header(dumped: dict[str, Any], served: dict[str, Any]) -> bool:
    return all(
        str(dumped.get(field, "")).lower() == str(served.get(field, "")).lower()
        for field in _MATCH_FIELDS
    )


def canonical_only(
    dump: dict[str, Any],
    head_hash: str,
    block_by_hash: Callable[[str], Any],
) -> tuple[dict[str, Any], dict[int, str]]:
    """The dump with only the canonical chain's blocks and transactions, and that chain's block
    hash by height.  ``head_hash`` is the hash of the best block (``best_block_number``)."""
    best = best_block(dump)
    by_number: dict[int, list[dict[str, Any]]] = {}
    for block in dump["blocks"]:
        number = _number(block["header"]["number"])
        if number <= best:  # above the best: left by a revert
            by_number.setdefault(number, []).append(block)
    kept: list[dict[str, Any]] = []
    hashes: dict[int, str] = {}
    expected = head_hash
    for number in range(best, -1, -1):
        candidates = by_number.get(number, [])
        if not candidates:
            raise DumpError(f"the dump holds no block {number} (best block {best})")
        if len(candidates) == 1:
            chosen = candidates[0]
        else:
            served = block_by_hash(expected)
            if not isinstance(served, dict):
                raise DumpError(f"the node does not know block {number} {expected}")
            matching = [c for c in candidates if _same_header(c["header"], served)]
            if len(matching) != 1:
                raise DumpError(f"cannot tell which dumped block {number} is {expected}")
            chosen = matching[0]
        hashes[number] = expected
        kept.append(chosen)
        expected = chosen["header"]["parentHash"]
    kept.reverse()
    transactions = [
        tx
        for tx in dump.get("transactions") or []
        if hashes.get(_number(tx.get("block_number", -1)), "").lower()
        == str(tx.get("block_hash", "")).lower()
    ]
    return {**dump, "blocks": kept, "transactions": transactions}, hashes

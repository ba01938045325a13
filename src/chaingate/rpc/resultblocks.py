"""Which block a result is about, and how a family's head is probed.  Sans-IO.

The proxy caches an answer without a block parameter (a block, a transaction, a receipt) only
once the block it names is final, so it reads that block from the result itself: an EVM
result's ``number`` or ``blockNumber``, a Solana result's ``slot``.  The pool probes each
upstream's head with its family's request and reads the answer with its family's parser
(``heads.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import msgspec

from chaingate.config.network import Family
from chaingate.rpc.heads import parse_evm_head, parse_solana_head


class _BlockRef(msgspec.Struct):
    number: str | None = None
    blockNumber: str | None = None


_block_ref_decoder = msgspec.json.Decoder(_BlockRef | list[_BlockRef])


def result_block_number(result: bytes) -> int | None:
    """The block a block/transaction/receipt result belongs to, when it says."""
    try:
        ref = _block_ref_decoder.decode(result)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if isinstance(ref, list):
        if not ref:
            return None
        ref = ref[0]
    value = ref.number or ref.blockNumber
    if value is None or not value.startswith("0x"):
        return None
    try:
        return int(value, 16)
    except ValueError:
        return None


class _SlotRef(msgspec.Struct):
    slot: int | None = None


_slot_ref_decoder = msgspec.json.Decoder(_SlotRef)


def result_slot(result: bytes) -> int | None:
    """The slot a Solana result names (getTransaction's ``slot``), when it does."""
    try:
        slot = _slot_ref_decoder.decode(result).slot
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return slot if slot is not None and slot >= 0 else None


class FamilyHeads(NamedTuple):
    """A family's head probe (the request), its answer's parser, and the block a result is
    about."""

    probe: bytes
    parse_head: Callable[[bytes], int | None]
    result_block: Callable[[bytes], int | None]


def family_heads(family: Family) -> FamilyHeads:
    if family == "solana":
        # getSlot at the node's default commitment: the finalized slot, so a slot at or below
        # the pool's head is final (finality_depth 0 is exact; more is caution).
        probe = b'{"jsonrpc":"2.0","id":0,"method":"getSlot","params":[]}'
        return FamilyHeads(probe, parse_solana_head, result_slot)
    probe = b'{"jsonrpc":"2.0","id":0,"method":"eth_blockNumber","params":[]}'
    return FamilyHeads(probe, parse_evm_head, result_block_number)

"""Which block a result is about, and how a family's head is probed.  Sans-IO.

The proxy caches an answer without a block parameter (a block, a transaction, a receipt) only
once the block it names is final, so it reads that block from the result itself: an EVM
result's ``number`` or ``blockNumber`` (the jsonrpc twins' ``result_block``: the compiled one
reads it without decoding a whole receipt, and an upstream reply's while it scans the response,
``Reply.block``), a Solana result's ``slot``.  The pool probes each
upstream's head with its family's request and reads the answer with its family's parser
(``heads.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import NamedTuple

import msgspec

from chaingate.config.network import Family
from chaingate.rpc.heads import parse_evm_head, parse_solana_head
from chaingate.twintypes.jsonrpc import Reply


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


def reply_slot(reply: Reply) -> int | None:
    """The slot a Solana reply's result names, when it does."""
    result = reply.result
    return None if result is None else result_slot(result)


# An EVM reply's block: read by the jsonrpc twin (``Reply.block``).
reply_evm_block: Callable[[Reply], int | None] = attrgetter("block")


class FamilyHeads(NamedTuple):
    """A family's head probe (the request), its answer's parser, and the block a result is
    about (of a result's bytes, and of an upstream reply's result)."""

    probe: bytes
    parse_head: Callable[[bytes], int | None]
    result_block: Callable[[bytes], int | None]
    reply_block: Callable[[Reply], int | None]


def family_heads(family: Family, evm_result_block: Callable[[bytes], int | None]) -> FamilyHeads:
    """``evm_result_block``: the jsonrpc twin's ``result_block`` (an EVM result's block)."""
    if family == "solana":
        # getSlot at the node's default commitment: the finalized slot, so a slot at or below
        # the pool's head is final (finality_depth 0 is exact; more is caution).
        probe = b'{"jsonrpc":"2.0","id":0,"method":"getSlot","params":[]}'
        return FamilyHeads(probe, parse_solana_head, result_slot, reply_slot)
    probe = b'{"jsonrpc":"2.0","id":0,"method":"eth_blockNumber","params":[]}'
    return FamilyHeads(probe, parse_evm_head, evm_result_block, reply_evm_block)

"""The node's own and its slots' methods: version, health, slots, blockhashes, epochs, fees."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

from solders.message import VersionedMessage, from_bytes_versioned

from chaingate.devnet.solana.ledger import LAMPORTS_PER_SIGNATURE, MAX_PROCESSING_AGE, Ledger
from chaingate.devnet.solana.params import (
    FEATURE_SET,
    SOLANA_CORE_VERSION,
    arg,
    commitment,
    config,
    invalid,
    with_context,
)

COMPUTE_BUDGET_PROGRAM = "ComputeBudget111111111111111111111111111111"


def get_version(ledger: Ledger, params: list[Any]) -> object:
    return {"feature-set": FEATURE_SET, "solana-core": SOLANA_CORE_VERSION}


def get_health(ledger: Ledger, params: list[Any]) -> object:
    return "ok"


def get_genesis_hash(ledger: Ledger, params: list[Any]) -> object:
    return ledger.genesis_hash


def get_identity(ledger: Ledger, params: list[Any]) -> object:
    return {"identity": str(ledger.identity)}


def get_slot(ledger: Ledger, params: list[Any]) -> object:
    return commitment(ledger, config(params, 0))


def get_block_height(ledger: Ledger, params: list[Any]) -> object:
    return ledger.blocks[commitment(ledger, config(params, 0))].block_height


def get_epoch_info(ledger: Ledger, params: list[Any]) -> object:
    slot = commitment(ledger, config(params, 0))
    schedule = ledger.svm.get_epoch_schedule()
    epoch, index = schedule.get_epoch_and_slot_index(slot)
    return {
        "absoluteSlot": slot,
        "blockHeight": ledger.blocks[slot].block_height,
        "epoch": epoch,
        "slotIndex": index,
        "slotsInEpoch": schedule.get_slots_in_epoch(epoch),
        "transactionCount": ledger.transaction_count,
    }


def get_transaction_count(ledger: Ledger, params: list[Any]) -> object:
    commitment(ledger, config(params, 0))
    return ledger.transaction_count


def get_slot_leader(ledger: Ledger, params: list[Any]) -> object:
    commitment(ledger, config(params, 0))
    return str(ledger.identity)  # the only validator there is


def get_epoch_schedule(ledger: Ledger, params: list[Any]) -> object:
    schedule = ledger.svm.get_epoch_schedule()
    return {
        "firstNormalEpoch": schedule.first_normal_epoch,
        "firstNormalSlot": schedule.first_normal_slot,
        "leaderScheduleSlotOffset": schedule.leader_schedule_slot_offset,
        "slotsPerEpoch": schedule.slots_per_epoch,
        "warmup": schedule.warmup,
    }


def get_latest_blockhash(ledger: Ledger, params: list[Any]) -> object:
    slot = commitment(ledger, config(params, 0))
    value = {
        "blockhash": ledger.blocks[slot].blockhash,
        "lastValidBlockHeight": ledger.last_valid_height(slot),
    }
    return with_context(slot, value)


def is_blockhash_valid(ledger: Ledger, params: list[Any]) -> object:
    blockhash = arg(params, 0, str, name="blockhash")
    slot = commitment(ledger, config(params, 1))
    return with_context(slot, ledger.blockhash_valid(blockhash))


def decode_message(text: str) -> VersionedMessage:
    try:
        return from_bytes_versioned(base64.b64decode(text, validate=True))
    except ValueError as exc:
        raise invalid(f"invalid message: {exc}") from None


def priority_fee(message: VersionedMessage) -> int:
    """Lamports a message's ComputeBudget instructions add: price (micro-lamports) times limit."""
    keys = [str(key) for key in message.account_keys]
    price, limit = 0, 200_000 * len(message.instructions)
    for ix in message.instructions:
        if keys[ix.program_id_index] != COMPUTE_BUDGET_PROGRAM:
            continue
        data = bytes(ix.data)
        if data[:1] == b"\x02" and len(data) >= 5:
            limit = int.from_bytes(data[1:5], "little")
        elif data[:1] == b"\x03" and len(data) >= 9:
            price = int.from_bytes(data[1:9], "little")
    return (price * limit + 999_999) // 1_000_000


def get_fee_for_message(ledger: Ledger, params: list[Any]) -> object:
    message = decode_message(arg(params, 0, str, name="message"))
    slot = commitment(ledger, config(params, 1))
    if not ledger.blockhash_valid(str(message.recent_blockhash)):
        return with_context(slot, None)
    fee = LAMPORTS_PER_SIGNATURE * message.header.num_required_signatures
    return with_context(slot, fee + priority_fee(message))


def get_recent_prioritization_fees(ledger: Ledger, params: list[Any]) -> object:
    wanted = {str(key) for key in arg(params, 0, list, name="addresses", default=[])}
    if len(wanted) > 128:
        raise invalid("Too many inputs provided; max 128")
    fees = []
    for slot in list(ledger.blocks)[-MAX_PROCESSING_AGE:]:
        paid = [
            priority_price(executed.tx.message)
            for executed in ledger.blocks[slot].transactions
            if not wanted or wanted & {str(key) for key in executed.tx.message.account_keys}
        ]
        fees.append({"prioritizationFee": min(paid, default=0), "slot": slot})
    return fees


def priority_price(message: VersionedMessage) -> int:
    keys = [str(key) for key in message.account_keys]
    for ix in message.instructions:
        data = bytes(ix.data)
        if keys[ix.program_id_index] == COMPUTE_BUDGET_PROGRAM and data[:1] == b"\x03":
            return int.from_bytes(data[1:9], "little")
    return 0


METHODS: dict[str, Callable[[Ledger, list[Any]], object]] = {
    "getVersion": get_version,
    "getHealth": get_health,
    "getGenesisHash": get_genesis_hash,
    "getIdentity": get_identity,
    "getSlot": get_slot,
    "getBlockHeight": get_block_height,
    "getEpochInfo": get_epoch_info,
    "getEpochSchedule": get_epoch_schedule,
    "getTransactionCount": get_transaction_count,
    "getSlotLeader": get_slot_leader,
    "getLatestBlockhash": get_latest_blockhash,
    "isBlockhashValid": is_blockhash_valid,
    "getFeeForMessage": get_fee_for_message,
    "getRecentPrioritizationFees": get_recent_prioritization_fees,
}

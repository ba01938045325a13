"""The Solana node's state in a file, so ``chaingate dev`` resumes where it stopped.

What is saved: every account a transaction ever named (``Ledger.known``; LiteSVM cannot list
its accounts), the slot, the faucet and identity keys, the genesis hash, and the bounded
history — blocks with their transactions, undo logs and blockhashes — so statuses, blocks,
signatures and blockhashes from before the restart still answer.  msgpack, written to a
temporary file and renamed over the old one (a crash mid-save leaves the previous save).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec
from solders.account import Account
from solders.keypair import Keypair
from solders.pubkey import Pubkey
from solders.transaction import VersionedTransaction

from chaingate.devnet.solana.ledger import Block, Executed, Ledger

FORMAT = 1


class SnapshotError(ValueError):
    """A file that is not a snapshot this node can read."""


def _executed(executed: Executed) -> dict[str, Any]:
    fields = dict(vars(executed))
    fields["tx"] = bytes(executed.tx)
    return fields


def _block(block: Block) -> dict[str, Any]:
    fields = dict(vars(block))
    fields["transactions"] = [_executed(executed) for executed in block.transactions]
    fields["undo"] = [[bytes(key), bytes(old) if old else None] for key, old in block.undo.items()]
    return fields


def dumps(ledger: Ledger) -> bytes:
    accounts = []
    for key in sorted(ledger.known, key=bytes):
        account = ledger.svm.get_account(key)
        if account is not None:
            accounts.append([bytes(key), bytes(account)])
    state = {
        "format": FORMAT,
        "settings": [ledger.confirmed_depth, ledger.finalized_depth, ledger.history],
        "head": ledger.head,
        "faucet": bytes(ledger.faucet),
        "identity": bytes(ledger.identity),
        "genesis_hash": ledger.genesis_hash,
        "transaction_count": ledger.transaction_count,
        "accounts": accounts,
        "blocks": [_block(block) for block in ledger.blocks.values()],
    }
    return msgspec.msgpack.encode(state)


def loads(data: bytes, *, now: float) -> Ledger:
    """A ledger as saved, its clock moved to ``now`` by opening the next slot."""
    try:
        state = msgspec.msgpack.decode(data)
        if state.get("format") != FORMAT:
            raise SnapshotError(f"snapshot format {state.get('format')!r}, not {FORMAT}")
        confirmed, finalized, history = state["settings"]
        ledger = Ledger(
            genesis_time=now,
            confirmed_depth=confirmed,
            finalized_depth=finalized,
            history=history,
        )
        _restore(ledger, state)
    except (msgspec.DecodeError, KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, SnapshotError):
            raise
        raise SnapshotError(f"not a Solana node snapshot: {exc}") from exc
    ledger.advance(now)
    return ledger


def _restore(ledger: Ledger, state: dict[str, Any]) -> None:
    ledger.faucet = Keypair.from_bytes(state["faucet"])
    ledger.identity = Pubkey.from_bytes(state["identity"])
    ledger.genesis_hash = state["genesis_hash"]
    ledger.transaction_count = state["transaction_count"]
    for raw_key, raw_account in state["accounts"]:
        key, account = Pubkey.from_bytes(raw_key), Account.from_bytes(raw_account)
        if ledger.svm.get_account(key) != account:  # a builtin program stays LiteSVM's own
            ledger.svm.set_account(key, account)
        ledger.known.add(key)
    ledger.blocks.clear()
    ledger.blockhash_heights.clear()
    for fields in state["blocks"]:
        block = _load_block(fields)
        ledger.blocks[block.slot] = block
        ledger.blockhash_heights[block.blockhash] = block.block_height
        for executed in block.transactions:
            ledger.signatures[executed.signature] = executed
            for key in dict.fromkeys(executed.tx.message.account_keys):
                ledger.by_address.setdefault(key, []).append(executed.signature)
    ledger.head = state["head"]
    ledger.svm.warp_to_slot(ledger.head)


def _load_block(fields: dict[str, Any]) -> Block:
    transactions = [
        Executed(**{**tx, "tx": VersionedTransaction.from_bytes(tx["tx"])})
        for tx in fields["transactions"]
    ]
    undo = {
        Pubkey.from_bytes(key): Account.from_bytes(old) if old is not None else None
        for key, old in fields["undo"]
    }
    return Block(**{**fields, "transactions": transactions, "undo": undo})


def save(ledger: Ledger, path: Path) -> None:
    """Owner-only (the faucet's and the identity's keys are in it), atomically."""
    temporary = path.with_name(path.name + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(dumps(ledger))
    os.replace(temporary, path)


def load(path: Path, *, now: float) -> Ledger:
    return loads(path.read_bytes(), now=now)

"""Parameters for the ``solana`` profile drawn from a Solana chain's recent finalized blocks:
slots, transaction signatures and the accounts those transactions touched.

Solana has no reads of past state, so balances and account data are read at the head and
checked for shape only; a finalized block, a transaction in one and its status cannot change,
and every target must give the same answer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from chaingate.benchsuite.chainsample import Rpc, SampleError
from chaingate.benchsuite.rpcprofile import SOLANA_KINDS as KINDS
from chaingate.benchsuite.rpcwire import Call

__all__ = ["KINDS", "UNPINNED", "Pool", "available", "make_call", "sample"]
UNPINNED = ("getSlot", "getLatestBlockhash")  # the head's: left out of batches
SYSTEM_PROGRAM = "11111111111111111111111111111111"  # an account every cluster holds
MAX_ADDRESSES = 200
MAX_MULTIPLE = 5  # accounts per getMultipleAccounts
FINALIZED = {"commitment": "finalized"}
BLOCK_OPTIONS = {
    "commitment": "finalized",
    "encoding": "json",
    "maxSupportedTransactionVersion": 0,
    "transactionDetails": "full",
    "rewards": False,
}


@dataclass
class Pool:
    head: int  # the finalized slot when drawn
    slots: list[int]  # finalized slots holding a block
    signatures: list[str] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)

    def describe(self) -> str:
        low, high = (self.slots[0], self.slots[-1]) if self.slots else (0, 0)
        return (
            f"finalized slots {low} to {high} (finalized head {self.head}): {len(self.slots)} "
            f"blocks, {len(self.signatures)} transactions, {len(self.addresses)} accounts"
        )


def sample(rpc: Rpc, blocks: int, lag: int) -> Pool:
    head = rpc("getSlot", [FINALIZED])
    if not isinstance(head, int):
        raise SampleError(f"getSlot answered {str(head)[:100]}")
    newest = max(head - lag, 0)
    slots = rpc("getBlocks", [max(newest - blocks + 1, 0), newest, FINALIZED])
    if not isinstance(slots, list) or not slots:
        raise SampleError(f"getBlocks answered {str(slots)[:100]}: no finalized block to draw")
    pool = Pool(head, [int(slot) for slot in slots])
    addresses: set[str] = set()
    for slot in pool.slots:
        block = rpc("getBlock", [slot, BLOCK_OPTIONS])
        if not isinstance(block, dict):
            raise SampleError(f"block {slot}: {str(block)[:100]}")
        for entry in block.get("transactions") or []:
            tx = entry.get("transaction") or {}
            signatures = tx.get("signatures") or []
            if signatures:
                pool.signatures.append(str(signatures[0]))
            keys = (tx.get("message") or {}).get("accountKeys") or []
            addresses.update(str(k) for k in keys if isinstance(k, str))
    pool.addresses = sorted(addresses)[:MAX_ADDRESSES] or [SYSTEM_PROGRAM]
    return pool


def make_call(kind: str, pool: Pool, rng: random.Random) -> Call:
    """One request of ``kind`` with parameters drawn from ``pool``."""
    if kind in UNPINNED:
        return Call(kind, [], comparable=False)  # the head moves: checked for shape only
    if kind == "getBalance":
        return Call(kind, [rng.choice(pool.addresses)], comparable=False)
    if kind == "getAccountInfo":
        return Call(kind, [rng.choice(pool.addresses), {"encoding": "base64"}], comparable=False)
    if kind == "getMultipleAccounts":
        picked = rng.sample(pool.addresses, min(MAX_MULTIPLE, len(pool.addresses)))
        return Call(kind, [picked, {"encoding": "base64"}], comparable=False)
    if kind == "getBlock":
        options = {**BLOCK_OPTIONS, "transactionDetails": "signatures"}
        return Call(kind, [rng.choice(pool.slots), options], comparable=True)
    if kind == "getTransaction":
        options = {"commitment": "finalized", "maxSupportedTransactionVersion": 0}
        return Call(kind, [rng.choice(pool.signatures), options], comparable=True)
    if kind == "getSignatureStatuses":
        search = {"searchTransactionHistory": True}
        return Call(kind, [[rng.choice(pool.signatures)], search], comparable=True)
    raise ValueError(f"unknown request kind {kind!r}")


def available(kind: str, pool: Pool) -> bool:
    """Whether the chain holds what ``kind`` needs: a transaction for the signature kinds."""
    if kind in ("getTransaction", "getSignatureStatuses"):
        return bool(pool.signatures)
    return True

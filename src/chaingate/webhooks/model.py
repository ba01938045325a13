"""What the webhook subsystem's parts hand each other, variant-neutral.

The match index (``matchindex.py``) turns a block into ``Match``es: facts about the chain in one
shape whatever the deployment's variant.  A variant (``variants.py``) renders a match into the
exact body its receivers get, and signs it.  Between the two stands the outbox (the store's
``webhook_events``): a rendered body, stored once, sent the same on every attempt.

Addresses and hashes are 0x + lowercase hex here; variants render addresses EIP-55.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Literal

import msgspec

# The kinds of event, whatever a variant calls them.  Variant A has the first five, variant B
# all but ``log`` (B's filters carry topics instead); ``test`` is the ping.
Kind = Literal[
    "address_activity",
    "token_transfer",
    "nft_transfer",
    "mined_transaction",
    "log",
    "internal_transfer",
    "new_block",
    "pending_transaction",
    "test",
]

Standard = Literal["native", "ERC20", "ERC721", "ERC1155"]


class BlockRef(msgspec.Struct, frozen=True):
    number: int
    hash: str
    timestamp: int  # seconds


class Token(msgspec.Struct, frozen=True):
    """What the index knows of a token contract (None: not known yet)."""

    symbol: str | None = None
    decimals: int | None = None
    name: str | None = None


class NftInfo(msgspec.Struct, frozen=True):
    """An NFT's metadata as the index holds it (variant B's NFT_ACTIVITY carries it)."""

    name: str | None = None
    description: str | None = None
    image_url: str | None = None
    token_uri: str | None = None
    status: str = "pending"  # the metadata row's status: ok | pending | failed ...


class TransferFact(msgspec.Struct, frozen=True):
    """One movement of value: a transaction's native value, or a token transfer log."""

    block: BlockRef
    tx_hash: str
    tx_index: int
    log_index: int | None  # None: native value (not a log)
    standard: Standard
    contract: str | None  # None: native
    sender: str
    receiver: str
    token_id: int | None  # ERC-721 and ERC-1155
    amount: int  # wei or raw units; 1 for ERC-721
    token: Token | None = None  # ERC-20 facts
    nft: NftInfo | None = None  # NFT metadata


class TransactionFact(msgspec.Struct, frozen=True):
    """A mined transaction (``mined_transaction``; contract interactions of
    ``address_activity``), or a pending one (``pending_transaction``: no block)."""

    block: BlockRef | None
    tx_hash: str
    tx_index: int | None
    sender: str
    receiver: str | None  # None: contract creation
    value: int
    nonce: int
    input: str  # 0x-hex calldata
    status: int | None = None  # 1 success, 0 reverted; None when pending
    gas_used: int | None = None
    contract_address: str | None = None  # a creation's new contract


class LogFact(msgspec.Struct, frozen=True):
    block: BlockRef
    tx_hash: str
    tx_index: int
    log_index: int
    address: str
    topics: tuple[str, ...]
    data: str


class InternalTransferFact(msgspec.Struct, frozen=True):
    """A native transfer inside a transaction (callTracer: a CALL with value below the top)."""

    block: BlockRef
    tx_hash: str
    sender: str
    receiver: str
    value: int
    call_type: str  # CALL | CREATE | CREATE2 | SELFDESTRUCT ...
    trace_address: tuple[int, ...]  # the call's path below the top call


class BlockFact(msgspec.Struct, frozen=True):
    block: BlockRef
    parent_hash: str
    gas_used: int
    gas_limit: int
    base_fee_per_gas: int | None
    transaction_count: int


Fact = TransferFact | TransactionFact | LogFact | InternalTransferFact | BlockFact


class Match(msgspec.Struct, frozen=True):
    """One event for one webhook: the fact, and for ``address_activity`` which of the
    webhook's addresses it involves (``direction`` as seen from that address)."""

    webhook_id: str
    kind: Kind
    fact: Fact
    watched: str | None = None
    direction: Literal["incoming", "outgoing"] | None = None

    @property
    def key(self) -> str:
        """What makes the event unique for its webhook: the same fact matched again (a
        replayed block, a restart) has the same key, so the same event id."""
        fact = self.fact
        block = fact.block.hash if fact.block is not None else "pending"
        parts = [self.kind, block, type(fact).__name__]
        if isinstance(fact, TransferFact | TransactionFact | LogFact | InternalTransferFact):
            parts.append(fact.tx_hash)
        if isinstance(fact, TransferFact | LogFact):
            parts.append(str(fact.log_index))
        if isinstance(fact, InternalTransferFact):
            parts.append(".".join(map(str, fact.trace_address)))
        if isinstance(fact, TransferFact) and fact.token_id is not None:
            parts.append(str(fact.token_id))  # an ERC-1155 batch: one event per id
        if self.watched is not None:
            parts.append(f"{self.watched}:{self.direction}")
        return "|".join(parts)


def event_id(webhook_id: str, key: str) -> str:
    """``evt_`` + 26 base32 characters derived from (webhook, key): stable across retries,
    restarts and replays, so receivers can de-duplicate on it."""
    digest = hashlib.sha256(f"{webhook_id}\x00{key}".encode()).digest()[:16]
    return "evt_" + base64.b32encode(digest).decode().rstrip("=").lower()


def removal_id(original_id: str) -> str:
    """The id of the event that takes ``original_id`` back after a reorg."""
    return event_id(original_id, "removed")

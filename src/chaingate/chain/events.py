"""What the chain follower hands its consumers: blocks with their logs, and three events.

This is the interface the indexer, webhooks, the WebSocket hub, the bundler and wallets plug
into.  Every consumer gets the same ordered stream (see ``Follower.subscribe``):

* ``Apply(block)`` — ``block`` joined the canonical chain.  Blocks are applied in order, each
  one's ``parent_hash`` equal to the previous applied block's ``hash``.
* ``Revert(block)`` — ``block`` left the canonical chain (a reorg).  Reverts come newest first,
  down to (not including) the common ancestor, and are followed by the ``Apply`` of each block
  of the new branch, oldest first.  A reverted block carries its logs, so a consumer can undo
  them (the WebSocket hub re-sends them with ``removed: true``).
* ``Finalized(header)`` — the block is ``finality_depth`` blocks below the head: it will not be
  reverted any more, and the follower forgets its logs.

Delivery is at least once: the follower records its cursor after every subscriber has taken
an event, so a crash in between replays the last block, and a consumer run in terms goes on
from the position it saved, which may be a little behind what it handled
(``chaingate.chain.feed``: within a term, every block once).  A consumer that persists what
it derives should key it by block hash (idempotent apply).

Hex quantities from the node are kept as the node sent them where clients get them back
verbatim (logs, header fields); numbers the follower reasons about are decoded to ``int``.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec


class Log(msgspec.Struct, frozen=True, rename="camel", omit_defaults=False):
    """One log exactly as ``eth_getLogs`` returns it; encodes back to the same JSON shape."""

    address: str
    topics: list[str]
    data: str
    block_number: str
    block_hash: str
    transaction_hash: str
    transaction_index: str
    log_index: str
    removed: bool = False


class BlockHeader(msgspec.Struct, frozen=True):
    number: int
    hash: str
    parent_hash: str
    timestamp: int
    gas_used: int
    gas_limit: int
    base_fee_per_gas: int | None
    transaction_count: int
    # The node's header object as sent (hex fields, camelCase keys), without the transaction
    # list: what a ``newHeads`` subscriber receives.
    fields: dict[str, Any]


class Block(msgspec.Struct, frozen=True):
    header: BlockHeader
    logs: list[Log]
    transactions: list[str]  # transaction hashes, in block order


class Apply(msgspec.Struct, frozen=True, tag="apply"):
    block: Block
    # False while backfilling history; True once the follower is at the chain's head, so
    # consumers that only care about "now" (gas prices, newHeads) can skip history.
    live: bool


class Revert(msgspec.Struct, frozen=True, tag="revert"):
    block: Block


class Finalized(msgspec.Struct, frozen=True, tag="finalized"):
    header: BlockHeader


ChainEvent = Apply | Revert | Finalized


def header_from_rpc(obj: dict[str, Any]) -> BlockHeader:
    """A BlockHeader from an ``eth_getBlockBy*`` result (transactions as hashes or objects)."""
    txs = obj.get("transactions") or []
    fields = {k: v for k, v in obj.items() if k not in ("transactions", "uncles")}
    base_fee = obj.get("baseFeePerGas")
    return BlockHeader(
        number=int(obj["number"], 16),
        hash=obj["hash"],
        parent_hash=obj["parentHash"],
        timestamp=int(obj["timestamp"], 16),
        gas_used=int(obj["gasUsed"], 16),
        gas_limit=int(obj["gasLimit"], 16),
        base_fee_per_gas=int(base_fee, 16) if base_fee is not None else None,
        transaction_count=len(txs),
        fields=fields,
    )


def transaction_hashes(obj: dict[str, Any]) -> list[str]:
    return [t if isinstance(t, str) else t["hash"] for t in obj.get("transactions") or []]


class EventStream(Protocol):
    """What a consumer with a batch reads: a follower's subscription, or a leadership term's
    feed of it (``chaingate.chain.feed.TermFeed``)."""

    async def receive(self) -> ChainEvent: ...

    def receive_nowait(self) -> ChainEvent: ...

    async def aclose(self) -> None: ...

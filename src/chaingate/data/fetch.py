"""The JSON-RPC reads the indexer makes itself, through the network's ``ChainClient``.

* **Native transfers**: the follower's blocks carry transaction hashes only, so for blocks that
  have transactions the indexer fetches them whole (``eth_getBlockByHash(hash, true)``, by hash
  so a reorg cannot mix branches) and the receipts of the value-carrying ones
  (``eth_getTransactionReceipt``, for the status), in JSON-RPC batches over many blocks.
* **Gaps**: blocks the index lacks below the first block the follower hands it (an index that
  starts before the follower, or is behind it after a crash) are fetched by range
  (``chaingate.chain.ranges``, shared with the webhook matcher).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from chaingate.chain.client import ChainClient, RpcCallError
from chaingate.chain.events import Block
from chaingate.chain.ranges import FetchError, RangeFetcher, canonical_hashes
from chaingate.data.nativetransfers import NativeDataError, native_transfers, value_transactions
from chaingate.data.transfers import NativeTransfer


class BlockUnavailable(FetchError):
    """The node does not know a block by this hash (reorganised away, or not seen yet)."""

    def __init__(self, block_hash: str) -> None:
        super().__init__(f"block {block_hash} is unknown to the node")
        self.block_hash = block_hash


async def fetch_natives(
    client: ChainClient, blocks: Sequence[Block]
) -> dict[str, list[NativeTransfer]]:
    """Native transfers of every block that has transactions, by block hash.

    Raises BlockUnavailable for the first block the node does not know, or whose
    transactions' receipts it does not place in that block."""
    wanted = [b for b in blocks if b.transactions]
    if not wanted:
        return {}
    bodies = await client.batch([("eth_getBlockByHash", [b.header.hash, True]) for b in wanted])
    carrying: dict[str, list[Mapping[str, Any]]] = {}
    for block, body in zip(wanted, bodies, strict=True):
        if isinstance(body, RpcCallError):
            raise FetchError(f"eth_getBlockByHash {block.header.hash}: {body}")
        if body is None:
            raise BlockUnavailable(block.header.hash)
        if not isinstance(body, dict) or body.get("hash") != block.header.hash:
            raise FetchError(f"eth_getBlockByHash {block.header.hash}: another block answered")
        try:
            carrying[block.header.hash] = value_transactions(body)
        except NativeDataError as exc:
            raise FetchError(str(exc)) from None
    # Receipts answer for the node's canonical chain: none, or one naming another block, means
    # the block was reorganised away (or this node has not caught up): BlockUnavailable, for
    # the caller to judge, never an error retried for ever.
    located = [(str(tx.get("hash")), h) for h, txs in carrying.items() for tx in txs]
    receipts: dict[str, Mapping[str, Any]] = {}
    if located:
        answers = await client.batch([("eth_getTransactionReceipt", [t]) for t, _ in located])
        for (tx_hash, block_hash), receipt in zip(located, answers, strict=True):
            if isinstance(receipt, RpcCallError):
                raise FetchError(f"eth_getTransactionReceipt {tx_hash}: {receipt}")
            if not isinstance(receipt, dict) or receipt.get("blockHash") != block_hash:
                raise BlockUnavailable(block_hash)
            receipts[tx_hash] = receipt
    out: dict[str, list[NativeTransfer]] = {}
    for block_hash, txs in carrying.items():
        try:
            out[block_hash] = native_transfers(txs, receipts)
        except NativeDataError as exc:
            raise FetchError(str(exc)) from None
    return out


__all__ = ["BlockUnavailable", "FetchError", "RangeFetcher", "canonical_hashes", "fetch_natives"]

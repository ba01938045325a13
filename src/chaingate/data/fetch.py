"""The JSON-RPC reads the indexer makes itself, through the network's ``ChainClient``.

* **Native transfers**: the follower's blocks carry transaction hashes only, so for blocks that
  have transactions the indexer fetches them whole (``eth_getBlockByHash(hash, true)``, by hash
  so a reorg cannot mix branches) and the receipts of the value-carrying ones
  (``eth_getTransactionReceipt``, for the status), in JSON-RPC batches over many blocks.
* **Gaps**: blocks the index lacks below the first block the follower hands it (an index that
  starts before the follower, or is behind it after a crash) are fetched like the follower's
  backfill: ``eth_getLogs`` over a block range (halved when a node refuses it, grown back after
  successes) plus the range's headers in batches, linkage checked.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from chaingate.chain.client import ChainClient, RpcCallError
from chaingate.chain.events import Block, BlockHeader, Log, header_from_rpc, transaction_hashes
from chaingate.data.native import NativeDataError, native_transfers, value_transactions
from chaingate.data.transfers import NativeTransfer
from chaingate.rpc.errors import BAD_RESPONSE, TIMEOUT, UpstreamError


class FetchError(Exception):
    """The node's answers cannot be used as they are (a reorg while reading, a malformed
    object, a block it does not know): retry later."""


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


class RangeFetcher:
    """Blocks (headers and logs) by number range, sized to what the node accepts."""

    def __init__(self, client: ChainClient, max_range: int) -> None:
        self._client = client
        self.max_range = max(1, max_range)
        self.span = self.max_range
        self.splits = 0

    async def next_blocks(self, first: int, last: int) -> list[Block]:
        """Blocks ``first..`` up to ``last`` — as many as one accepted range holds, at least
        one — linked to each other."""
        while True:
            span = min(self.span, last - first + 1)
            to = first + span - 1
            try:
                logs = await self._client.call(
                    "eth_getLogs", [{"fromBlock": hex(first), "toBlock": hex(to)}]
                )
            except RpcCallError:
                if span == 1:
                    raise
                self._shrink(span)
                continue
            except UpstreamError as exc:
                if span == 1 or exc.kind not in (TIMEOUT, BAD_RESPONSE):
                    raise
                self._shrink(span)
                continue
            if span == self.span:
                self.span = min(self.max_range, math.ceil(span * 1.25))
            return await self._assemble(first, to, logs)

    def _shrink(self, span: int) -> None:
        self.span = max(1, span // 2)
        self.splits += 1

    async def _assemble(self, first: int, last: int, raw_logs: Any) -> list[Block]:
        numbers = range(first, last + 1)
        results = await self._client.batch(
            [("eth_getBlockByNumber", [hex(n), False]) for n in numbers]
        )
        headers: list[tuple[BlockHeader, list[str]]] = []
        for number, result in zip(numbers, results, strict=True):
            if isinstance(result, RpcCallError):
                raise result
            if not isinstance(result, dict):
                raise FetchError(f"block {number} is not known to the node yet")
            try:
                headers.append((header_from_rpc(result), transaction_hashes(result)))
            except (KeyError, TypeError, ValueError) as exc:
                raise FetchError(f"malformed block {number}: {exc!r}") from None
        for (previous, _), (header, _) in itertools.pairwise(headers):
            if header.parent_hash != previous.hash:
                raise FetchError(f"block {header.number} does not extend {previous.number}")
        try:
            logs = msgspec.convert(raw_logs, list[Log])
        except msgspec.ValidationError as exc:
            raise FetchError(f"malformed logs: {exc}") from None
        by_number: dict[int, list[Log]] = {}
        for entry in logs:
            by_number.setdefault(int(entry.block_number, 16), []).append(entry)
        blocks = []
        for header, txs in headers:
            block_logs = by_number.pop(header.number, [])
            if any(entry.block_hash != header.hash for entry in block_logs):
                raise FetchError(f"logs of block {header.number} name another block")
            blocks.append(Block(header, block_logs, txs))
        if by_number:
            raise FetchError("eth_getLogs returned logs outside the range asked")
        return blocks


async def canonical_hashes(client: ChainClient, numbers: Sequence[int]) -> dict[int, str]:
    """The node's current block hash at each height (heights it does not have are left out)."""
    results = await client.batch([("eth_getBlockByNumber", [hex(n), False]) for n in numbers])
    found = {}
    for number, result in zip(numbers, results, strict=True):
        if isinstance(result, dict) and isinstance(result.get("hash"), str):
            found[number] = str(result["hash"])
    return found

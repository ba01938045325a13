"""Blocks of one network by number range, read through its ``ChainClient`` — what a consumer
of the follower that fell behind it fetches for itself (the indexer, the webhook matcher):
``eth_getLogs`` over a range (halved when a node refuses it, grown back after successes) plus
the range's headers in batches, linkage checked.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import msgspec

from chaingate.chain.client import ChainClient, RpcCallError
from chaingate.chain.events import Block, BlockHeader, Log, header_from_rpc, transaction_hashes
from chaingate.rpc.errors import BAD_RESPONSE, TIMEOUT, UpstreamError
from chaingate.rpc.spansizer import SpanSizer


class FetchError(Exception):
    """The node's answers cannot be used as they are (a reorg while reading, a malformed
    object, a block it does not know): retry later."""


class RangeFetcher(SpanSizer):
    """Blocks (headers and logs) by number range, sized to what the node accepts."""

    def __init__(self, client: ChainClient, max_range: int) -> None:
        super().__init__(max_range)
        self._client = client

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
                self.shrink(span)
                continue
            except UpstreamError as exc:
                if span == 1 or exc.kind not in (TIMEOUT, BAD_RESPONSE):
                    raise
                self.shrink(span)
                continue
            self.grow(span)
            return await self._assemble(first, to, logs)

    async def _assemble(self, first: int, last: int, raw_logs: object) -> list[Block]:
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

"""Bundle transactions the node still has after their operations were taken back.

A reorg that orphans a bundle's block leaves its transaction in one of two states, by node:
anvil (and others) drop it; many put it back into their pool and mine it again.  Bundling its
operations again while the node still has it makes a second bundle that reverts on chain
(gas, and the operations' entities blamed).  So a reverted operation stays ``submitted`` under
its transaction while the node knows it — pending, or mined again (the follower's receipts
then include it) — and goes back to pending only once it is gone: neither mined nor pending
for ``DROPPED_AFTER`` (the submitter's own rule for a copy it sent; upstreams may lag).
``OrphanWatch`` keeps those transactions and tells which are gone; the bundle loop asks it.
"""

from __future__ import annotations

from collections.abc import Iterable

import trio

from chaingate.bundler.submitter import DROPPED_AFTER
from chaingate.chain.client import ChainClient, RpcCallError
from chaingate.rpc.errors import UpstreamError


class OrphanWatch:
    def __init__(self, client: ChainClient) -> None:
        self._client = client
        # Transaction hash -> when the node was first seen without it (None: seen with it).
        self._absent_since: dict[str, float | None] = {}

    def __bool__(self) -> bool:
        return bool(self._absent_since)

    async def known(self, tx_hashes: Iterable[str]) -> set[str]:
        """Those of ``tx_hashes`` the node knows (pending or mined), or that it could not be
        asked about (the watch decides later), now watched; the others are gone."""
        found = set()
        for tx in {t.lower() for t in tx_hashes}:
            try:
                if not await self._client.call("eth_getTransactionByHash", [tx]):
                    continue
            except (RpcCallError, UpstreamError):
                pass
            self._absent_since.setdefault(tx, None)
            found.add(tx)
        return found

    def watch(self, tx_hash: str) -> None:
        self._absent_since.setdefault(tx_hash.lower(), None)

    async def gone(self) -> list[str]:
        """The watched transactions the node has gone without for ``DROPPED_AFTER``, no longer
        watched; one found mined is no longer watched either (its receipts are the follower's:
        a later reorg reverts them again)."""
        out = []
        for tx, since in list(self._absent_since.items()):
            try:
                found = await self._client.call("eth_getTransactionByHash", [tx])
            except (RpcCallError, UpstreamError):
                continue  # asked again next round
            now = trio.current_time()
            if isinstance(found, dict) and found.get("blockHash"):
                del self._absent_since[tx]
            elif found:
                self._absent_since[tx] = None
            elif since is None:
                self._absent_since[tx] = now
            elif now - since >= DROPPED_AFTER:
                del self._absent_since[tx]
                out.append(tx)
        return out

"""Pending transactions (variant B's ``PENDING_TRANSACTION``): the node's pending block, polled.

Only while some active webhook of the network wants them.  A transaction is announced once:
its hash is remembered (a bounded set, oldest forgotten first) for as long as it may still be
pending.  Its event id is derived from the hash, so a restart that announces it again
writes nothing new.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio

from chaingate.chain.client import ChainClient, RpcCallError
from chaingate.rpc.errors import UpstreamError
from chaingate.store.base import StoreError
from chaingate.webhooks.matchindex import MatchIndex

log = logging.getLogger("chaingate.webhooks")

MAX_REMEMBERED = 50_000


class PendingPoller:
    def __init__(
        self,
        label: str,
        client: ChainClient,
        index: Callable[[], Awaitable[MatchIndex]],
        write: Callable[[list[Any]], Any],
        *,
        interval: float,
    ) -> None:
        self._label = label
        self._client = client
        self._index = index
        self._write = write  # async: the matches to write as events
        self._interval = interval
        self._seen: OrderedDict[str, None] = OrderedDict()

    async def run(self) -> None:
        while True:
            await trio.sleep(self._interval)
            try:
                index = await self._index()
                if index.wants_pending:
                    await self.poll(index)
            except (RpcCallError, UpstreamError, StoreError, ValueError) as exc:
                log.warning(
                    "webhooks: pending transactions not read",
                    extra={"fields": {"network": self._label, "error": str(exc)[:300]}},
                )

    async def poll(self, index: MatchIndex) -> int:
        block = await self._client.call("eth_getBlockByNumber", ["pending", True])
        if not isinstance(block, Mapping):
            return 0
        fresh = []
        for tx in block.get("transactions") or []:
            if not isinstance(tx, Mapping) or not isinstance(tx.get("hash"), str):
                continue
            tx_hash = str(tx["hash"]).lower()
            if tx_hash in self._seen:
                continue
            self._seen[tx_hash] = None
            fresh.append(tx)
        while len(self._seen) > MAX_REMEMBERED:
            self._seen.popitem(last=False)
        if not fresh:
            return 0
        matches = index.match_pending(fresh)
        if matches:
            await self._write(matches)
        return len(matches)

"""The gas oracle of one EVM network: one estimate per new head, served from memory.

A consumer of the chain follower: on each live ``Apply`` it asks the node for
``eth_feeHistory`` up to that block and replaces its estimate (and the encoded response
body), so ``GET /v1/gas/{chain}/prices`` never waits on an upstream.  When several heads are
queued, only the newest is computed.  A failed refresh is logged and counted, and the
previous estimate stays served until a later head succeeds.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable

import msgspec
import trio

from chaingate.chain.client import ChainClient, RpcCallError
from chaingate.chain.events import Apply, ChainEvent, Revert
from chaingate.config import ConfigError, NetworkSettings
from chaingate.config.network import Network
from chaingate.gas import prices
from chaingate.rpc.errors import UpstreamError

log = logging.getLogger("chaingate.gas")

METHOD_NOT_FOUND = -32601
_encode = msgspec.json.Encoder().encode


class GasOracle:
    def __init__(
        self,
        chain: str,
        network: str,
        settings: NetworkSettings,
        client: ChainClient,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        gas = settings.gas
        try:
            prices.check_settings(gas.history_blocks, gas.percentiles)
        except ValueError as exc:
            raise ConfigError(f"chains.{chain}.{network}: {exc}") from None
        self.chain = chain
        self.network = network
        self.label = str(Network(chain, network))
        self.settings = settings
        self.client = client
        self._clock = clock
        self._block_count = hex(gas.history_blocks)
        self._percentiles = list(gas.percentiles)
        # A refresh that outlives several blocks is useless; the cap also keeps the follower's
        # buffer for this consumer from filling while a node hangs.
        self.refresh_timeout = max(5.0, 8 * settings.block_time)
        # The first attempt holds up start-up: bounded tighter, the next head retries anyway.
        self.startup_timeout = min(self.refresh_timeout, 10.0)
        self.latest: prices.GasEstimate | None = None
        self.body: bytes | None = None  # ``latest`` encoded once, sent as is
        self.updates = 0
        self.failures: Counter[str] = Counter()  # by reason

    async def run(
        self,
        events: trio.MemoryReceiveChannel[ChainEvent],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Refresh once now (ready whether or not it worked), then on every new live head."""
        async with events:
            with trio.move_on_after(self.startup_timeout) as scope:
                await self.refresh()
            if scope.cancelled_caught:
                self._failed("timeout", f"no estimate within {self.startup_timeout:g}s")
            task_status.started()
            async for event in events:
                head = _newest_head(event, events)
                if head is None:
                    continue
                with trio.move_on_after(self.refresh_timeout) as scope:
                    await self.refresh(head)
                if scope.cancelled_caught:
                    self._failed("timeout", f"no estimate within {self.refresh_timeout:g}s")

    async def refresh(self, block: int | None = None) -> bool:
        """Recompute at ``block`` (None: the node's latest); False if it failed."""
        try:
            fees = await self._fetch(block)
        except UpstreamError as exc:
            return self._failed(exc.kind, exc.message)
        except RpcCallError as exc:
            return self._failed("node_error", f"{exc.method}: {exc.code} {exc.message}")
        except ValueError as exc:  # a malformed answer (msgspec errors are ValueErrors)
            return self._failed("bad_response", str(exc))
        self.latest = prices.estimate(
            fees,
            chain=self.chain,
            network=self.network,
            block_time=self.settings.block_time,
            now=self._clock(),
        )
        self.body = _encode(self.latest)
        self.updates += 1
        return True

    async def _fetch(self, block: int | None) -> prices.Fees:
        newest = hex(block) if block is not None else "latest"
        try:
            result = await self.client.call(
                "eth_feeHistory", [self._block_count, newest, self._percentiles]
            )
        except RpcCallError as exc:
            if exc.code != METHOD_NOT_FOUND:
                raise
            return await self._legacy(block)  # a node from before eth_feeHistory
        history = prices.parse_fee_history(result)
        gas_price = None
        if prices.needs_gas_price(history):
            gas_price = prices.parse_quantity(await self.client.call("eth_gasPrice"))
        return prices.compute_fees(history, gas_price=gas_price)

    async def _legacy(self, block: int | None) -> prices.Fees:
        if block is None:
            block = prices.parse_quantity(await self.client.call("eth_blockNumber"))
        gas_price = prices.parse_quantity(await self.client.call("eth_gasPrice"))
        return prices.legacy_fees(block, gas_price)

    def _failed(self, reason: str, detail: str) -> bool:
        # ``detail`` comes from the pool (upstreams by display name, never their URL) or the
        # node's own error message: no secret of ours.
        self.failures[reason] += 1
        log.warning(
            "gas estimate not refreshed; the previous one is still served",
            extra={"fields": {"network": self.label, "reason": reason, "detail": detail[:200]}},
        )
        return False


def _newest_head(first: ChainEvent, events: trio.MemoryReceiveChannel[ChainEvent]) -> int | None:
    """The newest live head among ``first`` and every event already queued behind it.

    History (``live=False``) and finality are ignored; a revert cancels the heads before it
    (the new branch's blocks follow it).
    """
    head: int | None = None
    event = first
    while True:
        if isinstance(event, Apply):
            if event.live:
                head = event.block.header.number
        elif isinstance(event, Revert):
            head = None
        try:
            event = events.receive_nowait()
        except (trio.WouldBlock, trio.EndOfChannel):
            return head

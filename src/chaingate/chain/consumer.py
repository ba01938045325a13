"""The loop of a follower consumer that persists what it derives (wallets, the bundler), and
the position kept for it.

Each event is handled in order.  A store that fails is retried until it answers — the
follower waits meanwhile, so nothing is skipped — and a bug skips that one event, loudly,
rather than stop the follower (which waits for every consumer) or the gateway.

These consumers keep no cursor of their own (their writes are idempotent by block hash), so
``KeptPosition`` keeps one for them (``chain_consumers``): the last block handled, saved at
most every ``SAVE_EVERY`` seconds and when the loop ends, where their next term begins
(``chaingate.chain.catchup``).  Saved after the block's writes, so a term repeats a few
blocks at most and never skips one.

Having saved none, such a consumer begins where it was created (``begins_at``): on a
deployment's first start, at the network's origin, with the follower; enabled later on a
deployment that already followed the network, after the follower's stored cursor as its
process loaded it — claimed as its position at its first term, so every term and process
agrees — never replaying the network's history (docs/decisions/chain.md).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Awaitable, Callable

import trio

from chaingate.chain.events import Apply, ChainEvent, Revert
from chaingate.chain.store import ChainRows
from chaingate.store import Store
from chaingate.store.base import StoreError

RETRY_SECONDS = 1.0
SAVE_EVERY = 1.0  # seconds between saves of a kept position
FINAL_SAVE_WAIT = 2.0  # seconds the loop's last save may take as it ends

log = logging.getLogger("chaingate.follower")


# Where the follower was when this process began following (``Follower.started_at``): the
# stored cursor it loaded, None on a deployment's first start.
BeginsAt = Callable[[], Awaitable[tuple[int, str] | None]]


class KeptPosition:
    """The position of a consumer without a cursor of its own, in the chain's rows."""

    # No start block of its own: having saved nothing, its terms begin at ``begins_at``.
    start_block: int | None = None

    def __init__(
        self,
        store: Store,
        consumer: str,
        chain: str,
        network: str,
        stats: Counter[str],
        *,
        begins_at: BeginsAt | None = None,
    ) -> None:
        """``stats``: the consumer's counters; ``begins_at``: where it begins having saved
        nothing (None: at the network's origin)."""
        self._rows = ChainRows(store)
        self.consumer = consumer
        self.chain = chain
        self.network = network
        self.stats = stats
        self._begins_at = begins_at
        self._at: tuple[int, str] | None = None  # handled, not saved yet
        self._saved_at = -float("inf")

    async def resume_point(self) -> tuple[int, str] | None:
        """The last block handled, as saved; having saved none, the block before the one it
        begins at, claimed now (None: it begins at the network's origin)."""
        saved = await self._rows.consumer_position(self.consumer, self.chain, self.network)
        if saved is not None or self._begins_at is None:
            return saved
        begins_at = await self._begins_at()
        if begins_at is None:
            return None  # the deployment's first start: it follows from the origin too
        return await self._rows.claim_consumer_position(
            self.consumer, self.chain, self.network, begins_at
        )

    def handled(self, event: ChainEvent) -> None:
        if isinstance(event, Apply):
            self._at = (event.block.header.number, event.block.header.hash)
        elif isinstance(event, Revert):
            self._at = (event.block.header.number - 1, event.block.header.parent_hash)

    def due_in(self) -> float:
        """Seconds until the last block handled is due to be saved (inf: none to save)."""
        if self._at is None:
            return math.inf
        return max(0.0, self._saved_at + SAVE_EVERY - trio.current_time())

    async def save(self, *, now: bool = False) -> None:
        """Save the last block handled, if due (``now``: whenever there is one to save)."""
        at = self._at
        if at is None or (not now and trio.current_time() - self._saved_at < SAVE_EVERY):
            return
        self._saved_at = trio.current_time()
        try:
            await self._rows.save_consumer_position(self.consumer, self.chain, self.network, at)
        except StoreError as exc:
            log.warning(
                "a consumer's position was not saved; saved again later",
                extra={"fields": {"consumer": self.consumer, "error": str(exc)[:300]}},
            )
            return
        if self._at == at:
            self._at = None


async def consume(
    events: trio.abc.ReceiveChannel[ChainEvent],
    handle: Callable[[ChainEvent], Awaitable[None]],
    *,
    name: str,
    label: str,
    stats: Counter[str],
    log: logging.Logger,
    position: KeptPosition | None = None,
) -> None:
    fields = {"network": label}
    try:
        async with events:
            while True:
                event: ChainEvent | None = None
                # A quiet chain saves the position too: no later block may come to do it.
                with trio.move_on_after(position.due_in() if position is not None else math.inf):
                    try:
                        event = await events.receive()
                    except trio.EndOfChannel:
                        break
                if event is None:
                    if position is not None:
                        await position.save(now=True)
                    continue
                while True:
                    try:
                        await handle(event)
                        break
                    except StoreError as exc:
                        stats["store_errors"] += 1
                        log.warning(
                            f"{name}: store failed; retrying",
                            extra={"fields": {**fields, "error": str(exc)}},
                        )
                        await trio.sleep(RETRY_SECONDS)
                    except Exception:
                        stats["bugs"] += 1
                        log.exception(f"{name}: event skipped", extra={"fields": fields})
                        break
                if position is not None:
                    position.handled(event)
                    await position.save()
    finally:
        if position is not None:
            with trio.CancelScope(shield=True), trio.move_on_after(FINAL_SAVE_WAIT):
                await position.save(now=True)

"""The loop of a follower consumer that persists what it derives (wallets, the bundler).

Each event is handled in order.  A store that fails is retried until it answers — the
follower waits meanwhile, so nothing is skipped — and a bug skips that one event, loudly,
rather than stop the follower (which waits for every consumer) or the gateway.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable

import trio

from chaingate.chain.events import ChainEvent
from chaingate.store.base import StoreError

RETRY_SECONDS = 1.0


async def consume(
    events: trio.abc.ReceiveChannel[ChainEvent],
    handle: Callable[[ChainEvent], Awaitable[None]],
    *,
    name: str,
    label: str,
    stats: Counter[str],
    log: logging.Logger,
) -> None:
    fields = {"network": label}
    async with events:
        async for event in events:
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

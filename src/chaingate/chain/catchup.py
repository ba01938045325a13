"""Where a term of a follower consumer begins, and the blocks it is fed before the live stream.

The consumers that must see every block — the indexer, the webhook matcher, the wallets' and
the bundler's trackers — run in terms (``chaingate.cluster.rolestream``): while their role is led
here, from a leadership lock won, or for the whole process on SQLite.  A term begins right
after the last block the consumer holds (``resume_point``: its stored cursor).  Having stored
nothing, it begins at its start: its own configured start block where it has one
(``indexer.start_block``), else the network's origin (``Follower.origin``: the first block
this deployment followed — ``follower.start_block``, genesis for ``chaingate dev``, or the head
when the deployment first ran).  Never at whichever block the term happens to see first: a
term that begins late (a lock won after the follower passed blocks, a handover after a stall)
would skip what came before.

``below_window`` fetches a term's backlog below the follower's window from the node, a range
at a time; the term's feed (``chaingate.chain.feed``) takes the rest from the window, then
the follower's events.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Protocol

import trio

from chaingate.chain.client import RpcCallError
from chaingate.chain.events import Block
from chaingate.chain.follower import Follower
from chaingate.chain.ranges import FetchError, RangeFetcher
from chaingate.rpc.errors import UpstreamError

log = logging.getLogger("chaingate.follower")

MAX_BACKOFF = 5.0


class TermConsumer(Protocol):
    """A follower consumer run in terms: where it is, where it starts, and its counters (the
    blocks fetched for it count as its ``fetched_blocks``)."""

    stats: Counter[str]

    @property
    def start_block(self) -> int | None:
        """Its own first block when it has stored nothing (None: the network's origin)."""
        ...

    async def resume_point(self) -> tuple[int, str] | None:
        """The last block it holds (number, hash), as stored; None: nothing stored."""
        ...


async def term_start(follower: Follower, consumer: TermConsumer) -> tuple[int, str | None]:
    """The last block ``consumer`` holds as a term of it begins (number, hash), or the block
    before its start (hash None)."""
    held = await consumer.resume_point()
    if held is not None:
        return held
    if consumer.start_block is not None:
        return consumer.start_block - 1, None
    return await follower.origin() - 1, None


async def below_window(
    follower: Follower, fetcher: RangeFetcher, first: int, last: int, stats: Counter[str]
) -> list[Block]:
    """The next blocks ``first..`` up to ``last`` (below the follower's window), fetched from
    the node: one accepted range, retried until the node answers."""
    failures = 0
    while True:
        try:
            blocks = await fetcher.next_blocks(first, last)
            break
        except (FetchError, UpstreamError, RpcCallError) as exc:
            failures += 1
            stats["fetch_errors"] += 1
            if failures in (1, 10) or failures % 100 == 0:
                log.warning(
                    "catching a consumer up failed; retrying",
                    extra={"fields": {"network": follower.label, "error": str(exc)}},
                )
            await trio.sleep(min(MAX_BACKOFF, 0.1 * 2 ** min(failures, 16)))
    stats["fetched_blocks"] += len(blocks)
    return blocks

"""Where a term of a follower consumer begins, and the blocks it is fed before the live stream.

The consumers that must see every block — the indexer, the webhook matcher, the wallets' and
the bundler's trackers — run in terms (``chaingate.cluster.gates``): while their role is led
here, from a leadership lock won, or for the whole process on SQLite.  A term begins right
after the last block the consumer holds (``resume_point``: its stored cursor).  Having stored
nothing, it begins at its start: its own configured start block where it has one
(``indexer.start_block``), else the network's origin (``Follower.origin``: the first block
this deployment followed — ``follower.start_block``, genesis for ``chaingate dev``, or the head
when the deployment first ran).  Never at whichever block the term happens to see first: a
term that begins late (a lock won after the follower passed blocks, a handover after a stall)
would skip what came before.

``Catchup`` is one term's backlog: the blocks from there up to the follower's window, fetched
from the node a range at a time, then the window's own blocks from there on, taken at once
right before the term reads the live subscription — which buffered every event since the
term began, so nothing falls between the two (a block in both comes twice: every consumer
skips, or repeats idempotently, what it holds).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Protocol

import trio

from chaingate.chain.client import RpcCallError
from chaingate.chain.events import Apply, ChainEvent
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


async def catch_up(follower: Follower, consumer: TermConsumer) -> Catchup:
    """The backlog of a term of ``consumer`` that begins now."""
    held = await consumer.resume_point()
    if held is not None:
        first = held[0] + 1
    elif consumer.start_block is not None:
        first = consumer.start_block
    else:
        first = await follower.origin()
    return Catchup(follower, follower.range_fetcher(), first, consumer.stats)


class Catchup:
    """The blocks from ``first`` to the follower's window (``more``), then the window's
    blocks from there on (``rest``)."""

    def __init__(
        self, follower: Follower, fetcher: RangeFetcher, first: int, stats: Counter[str]
    ) -> None:
        self._follower = follower
        self._fetcher = fetcher
        self.first = first
        self._next = first
        self.stats = stats

    async def more(self) -> list[ChainEvent]:
        """The next blocks below the follower's window, fetched from the node; [] once the
        window holds every block from here on (then ``rest``)."""
        await self._follower.wait_tip()
        base = self._follower.window.base
        assert base is not None  # the window holds a block
        if self._next >= base:
            return []
        failures = 0
        while True:
            try:
                blocks = await self._fetcher.next_blocks(self._next, base - 1)
                break
            except (FetchError, UpstreamError, RpcCallError) as exc:
                failures += 1
                self.stats["fetch_errors"] += 1
                if failures in (1, 10) or failures % 100 == 0:
                    log.warning(
                        "catching a consumer up failed; retrying",
                        extra={"fields": {"network": self._follower.label, "error": str(exc)}},
                    )
                await trio.sleep(min(MAX_BACKOFF, 0.1 * 2 ** min(failures, 16)))
        self._next = blocks[-1].header.number + 1
        self.stats["fetched_blocks"] += len(blocks)
        return [Apply(block, False) for block in blocks]

    def rest(self) -> list[ChainEvent]:
        """The window's blocks from here on, as they are now (no await: the caller reads the
        live subscription next)."""
        window = self._follower.window
        return [Apply(block, False) for block in window if block.header.number >= self._next]

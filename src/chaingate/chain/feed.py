"""A term's feed of a follower: every block from the consumer's position, once, in order,
without ever holding the follower back.

A consumer run in terms (``chaingate.cluster.rolestream``) is fed through a ``Tap``: a queue of
``consumer_buffer`` events the follower offers each event to without waiting, in the same
step (no await between) as the event's change to its window — ``Apply`` right after the block
joins the window, ``Revert`` right after it leaves (``Finalized`` is not offered: no consumer
run in terms uses it).  So at any await, a tap that was attached holds exactly the window's
changes since it was attached.

``TermFeed`` reads it: first the backlog (``catching up``) — the blocks from the consumer's
position up to the follower's window, fetched from the node a range at a time, then the
window's blocks from there on, taken with no await before the tap is attached — then the tap.
When the consumer falls ``consumer_buffer`` events behind, the tap stops taking events (the
follower never waits) and, once the consumer has read what it holds, the feed catches up
again from the last block it delivered: from the window when that still holds it, else from
the node.  The feed remembers the blocks it delivered (a window's worth): a block it delivered
that the window no longer holds (a reorg while it was catching up) is reverted first, newest
first.  Every event of the tap is checked against the last block delivered — an ``Apply`` that
does not extend it, or a ``Revert`` of a block it did not deliver, means it missed something
(never expected; counted as ``feed_resyncs``) and catches up again rather than pass it on.
"""

from __future__ import annotations

import logging
from collections import Counter, deque

import trio

from chaingate.chain.catchup import below_window
from chaingate.chain.events import Apply, Block, ChainEvent, Revert
from chaingate.chain.follower import Follower
from chaingate.chain.tap import Tap

log = logging.getLogger("chaingate.follower")


class TermFeed(trio.abc.ReceiveChannel[ChainEvent]):
    """One term's events for a consumer whose last block is ``at`` (number, hash; the hash
    None when unknown: the block before its start)."""

    def __init__(
        self, follower: Follower, tap: Tap, at: tuple[int, str | None], stats: Counter[str]
    ) -> None:
        self._follower = follower
        self._tap = tap
        self._fetcher = follower.range_fetcher()
        self._at = at
        self._delivered: deque[Block] = deque(maxlen=follower.window.keep)
        self._queued: deque[ChainEvent] = deque()
        self._catching_up = True
        self.stats = stats
        tap.detach()

    async def receive(self) -> ChainEvent:
        while True:
            if self._queued:
                await trio.lowlevel.checkpoint()
                return self._queued.popleft()
            if self._catching_up:
                await self._catch_up()
                continue
            if self._take():
                continue
            if self._tap.closed:
                raise trio.EndOfChannel
            await self._tap.wait_offer()

    def receive_nowait(self) -> ChainEvent:
        while not self._queued:
            if self._catching_up:
                raise trio.WouldBlock  # fetched by ``receive``
            if not self._take():
                if self._tap.closed:
                    raise trio.EndOfChannel
                raise trio.WouldBlock
        return self._queued.popleft()

    async def aclose(self) -> None:
        self.close()
        await trio.lowlevel.checkpoint()

    def close(self) -> None:
        """The term is over: the follower offers this consumer nothing more."""
        self._tap.detach()

    # --- the tap ---------------------------------------------------------------------------

    def _take(self) -> bool:
        """One event from the tap into the queue, or skipped; False when it has none (having
        overflowed, the feed catches up next)."""
        event = self._tap.take()
        if event is None:
            if not self._tap.overflowed:
                return False
            self.stats["feed_overflows"] += 1
            self._catching_up = True
            return True
        if isinstance(event, Apply):
            self._take_apply(event)
        elif isinstance(event, Revert):
            self._take_revert(event.block)
        return True

    def _take_apply(self, event: Apply) -> None:
        header = event.block.header
        number, hash_ = self._at
        if header.number == number + 1 and hash_ in (None, header.parent_hash):
            self._deliver(event)
        elif header.number > number or self._delivered_at(header.number) not in (
            None,
            header.hash,
        ):
            self._resync(f"block {header.number} does not extend {number}")
        else:
            # Held by the consumer before the term (a follower that resumed from a cursor
            # below the consumer's position applies them again): not passed on.
            self.stats["feed_skipped"] += 1

    def _take_revert(self, block: Block) -> None:
        number, hash_ = self._at
        header = block.header
        if header.number == number and hash_ in (None, header.hash):
            self._revert(block)
        elif header.number <= number and self._delivered_at(header.number) is not None:
            self._resync(f"revert of block {header.number} it did not deliver")
        # else: a block it never delivered (above its last), or held before the term.

    def _resync(self, why: str) -> None:
        self.stats["feed_resyncs"] += 1
        log.warning(
            "a consumer's feed missed an event; catching it up again",
            extra={"fields": {"network": self._follower.label, "why": why}},
        )
        self._tap.detach()
        self._catching_up = True

    # --- delivering ------------------------------------------------------------------------

    def _delivered_at(self, number: int) -> str | None:
        if not self._delivered or number < self._delivered[0].header.number:
            return None
        index = number - self._delivered[0].header.number
        if index >= len(self._delivered):
            return None
        return self._delivered[index].header.hash

    def _deliver(self, event: Apply) -> None:
        header = event.block.header
        if self._delivered and self._delivered[-1].header.number != header.number - 1:
            self._delivered.clear()  # a gap (an unlinked backlog): only what follows counts
        self._delivered.append(event.block)
        self._at = (header.number, header.hash)
        self._queued.append(event)

    def _revert(self, block: Block) -> None:
        """``block``, the last one delivered (or held before the term), reverted."""
        if self._delivered and self._delivered[-1].header.hash == block.header.hash:
            self._delivered.pop()
        self._queued.append(Revert(block))
        self._at = (block.header.number - 1, block.header.parent_hash)

    # --- catching up -----------------------------------------------------------------------

    async def _catch_up(self) -> None:
        """The next part of the backlog into the queue: a range fetched from the node, or —
        once the window holds every block from here on — the window's blocks, and the tap
        attached (no await between)."""
        follower = self._follower
        await follower.wait_tip()
        self._unwind()
        window = follower.window
        base = window.base
        assert base is not None  # the window holds a block
        first = self._at[0] + 1
        if first >= base:
            for block in window:
                if block.header.number >= first:
                    self._deliver_backlog(block)
            self._tap.attach()
            self._catching_up = False
            return
        for block in await below_window(follower, self._fetcher, first, base - 1, self.stats):
            self._deliver_backlog(block)

    def _deliver_backlog(self, block: Block) -> None:
        number, hash_ = self._at
        header = block.header
        if header.number != number + 1:
            return
        if hash_ is not None and header.parent_hash != hash_:
            # Below what it remembers, or before the term: the consumer reconciles by hash.
            self.stats["feed_unlinked"] += 1
        self._deliver(Apply(block, False))

    def _unwind(self) -> None:
        """Revert, newest first, the blocks it delivered that the window replaced or dropped
        (a reorg while it was not reading the tap); those below the window are final."""
        window = self._follower.window
        base, tip = window.base, window.tip
        assert base is not None
        assert tip is not None
        while self._delivered:
            header = self._delivered[-1].header
            if header.number < base or (
                header.number <= tip.header.number and window.holds(header)
            ):
                return
            self._revert(self._delivered[-1])

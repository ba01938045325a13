"""A consumer run in terms (``chaingate.chain.feed``) on a real follower and anvil: it never
holds the follower — nor so its other consumers — back, whether it stops reading while live
or while catching up, and it still gets every block from its start once, in order, reorgs
included (what its events apply, in order, is anvil's canonical chain).
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Callable

import pytest
import trio

from chaingate.chain.consumer import KeptPosition, consume
from chaingate.chain.events import Apply, ChainEvent, Revert
from chaingate.chain.feed import TermFeed
from chaingate.chain.store import ChainRows
from chaingate.cluster.leases import LocalLeadership
from chaingate.cluster.rolestream import follower_terms
from chaingate.devnet.anvil import AnvilProcess
from tests.test_follower import (
    Run,
    Starter,
    canonical_hashes,
    check_order,
    emit_logs,
    follow,
    node,
    node_call,
)

__all__ = ["follow", "node"]  # fixtures


class Slow:
    """A term consumer that stops inside its handler, after taking an event, while ``gate``
    is set (until it is)."""

    def __init__(self, start: int) -> None:
        self.stats: Counter[str] = Counter()
        self.start_block: int | None = start
        self.events: list[ChainEvent] = []
        self.gate: trio.Event | None = None
        self.stuck = trio.Event()

    async def resume_point(self) -> tuple[int, str] | None:
        return None

    async def run(self, events: TermFeed) -> None:
        async with events:
            async for event in events:
                self.events.append(event)
                if self.gate is not None:
                    self.stuck.set()
                    await self.gate.wait()

    def release(self) -> None:
        assert self.gate is not None
        self.gate.set()
        self.gate = None

    def chain(self) -> dict[int, str]:
        """What its events apply, in order: number -> hash."""
        chain: dict[int, str] = {}
        for event in self.events:
            if isinstance(event, Apply):
                chain[event.block.header.number] = event.block.header.hash
            elif isinstance(event, Revert):
                del chain[event.block.header.number]
        return chain


async def until(condition: Callable[[], bool], limit: float = 60) -> None:
    with trio.fail_after(limit):
        while not condition():
            await trio.sleep(0.01)


async def start_term(run: Run, nursery: trio.Nursery, slow: Slow) -> None:
    follower = run.follower
    stream = follower_terms(
        LocalLeadership(), "slow", follower, follower.tap("slow"), slow.run, slow
    )
    await nursery.start(stream.run)


async def head_number(url: str) -> int:
    return int(await node_call(url, "eth_blockNumber"), 16)


async def assert_has_every_block_once(slow: Slow, url: str, first: int) -> None:
    head = await head_number(url)
    canonical = await canonical_hashes(url, first, head)
    await until(lambda: slow.chain() == canonical)
    check_order(slow.events)  # each Apply extends the last: no block twice, none skipped
    applied = [e.block.header.number for e in slow.events if isinstance(e, Apply)]
    assert applied[0] == first


async def test_a_live_consumer_that_stops_reading_holds_back_nobody_then_gets_every_block(
    follow: Starter, node: AnvilProcess, nursery: trio.Nursery, store_url: str
) -> None:
    """It stops inside its handler; the follower (and its other consumer, the fixture's) goes
    on past its buffer of 4 events, and a reorg replaces blocks it was offered before it
    stopped.  Once it reads again: those blocks, their reverts, the new branch."""
    await emit_logs(node.url, 3)
    run = await follow(node.url, store_url=store_url, keep_blocks=16, consumer_buffer=4)
    await run.wait_for_head(node.url)
    first = await head_number(node.url) - 1
    slow = Slow(first)
    await start_term(run, nursery, slow)
    await until(lambda: max(slow.chain(), default=0) == first + 1)
    slow.gate = trio.Event()
    await emit_logs(node.url, 1)
    with trio.fail_after(60):
        await slow.stuck.wait()
    await emit_logs(node.url, 8)
    # Before the feed, the follower waited here for the consumer's full buffer, for ever.
    await run.wait_for_head(node.url, limit=60)
    # Replace every block after the one it is handling (some of them already in its buffer).
    await node_call(node.url, "anvil_reorg", [8, []])
    await run.wait_for_head(node.url, limit=60)
    slow.release()
    await assert_has_every_block_once(slow, node.url, first)
    assert slow.stats["feed_overflows"] >= 1
    assert any(isinstance(e, Revert) for e in slow.events)
    assert slow.stats["feed_resyncs"] == 0
    # Still attached and live: a new block comes through the tap.
    await emit_logs(node.url, 1)
    await assert_has_every_block_once(slow, node.url, first)


async def test_a_term_catching_up_from_far_behind_holds_back_nobody(
    follow: Starter, node: AnvilProcess, nursery: trio.Nursery
) -> None:
    """A term beginning 40 blocks below a window of 8 reads its backlog from the node; it
    stops at its first block, and the follower still follows the head."""
    await emit_logs(node.url, 40)
    run = await follow(node.url, keep_blocks=8, consumer_buffer=4, max_log_range=5, start_block=1)
    await run.wait_for_head(node.url, limit=60)
    slow = Slow(1)
    slow.gate = trio.Event()
    await start_term(run, nursery, slow)
    with trio.fail_after(60):
        await slow.stuck.wait()
    await emit_logs(node.url, 10)
    # Before the feed, the term's subscription filled while it read its backlog: a stall.
    await run.wait_for_head(node.url, limit=60)
    slow.release()
    await assert_has_every_block_once(slow, node.url, 1)
    assert slow.stats["fetched_blocks"] >= 30
    assert slow.stats["feed_resyncs"] == 0


@pytest.mark.parametrize("behind", [False, True], ids=["live", "catching_up"])
async def test_a_term_ends_and_the_next_goes_on_from_the_consumer_s_position(
    follow: Starter, node: AnvilProcess, nursery: trio.Nursery, behind: bool
) -> None:
    """Between terms the follower offers the consumer nothing; the next term begins where the
    consumer says it is (here: after the last block it got), with nothing skipped or
    repeated, though blocks came meanwhile."""
    await emit_logs(node.url, 12)
    run = await follow(node.url, keep_blocks=8, consumer_buffer=4, start_block=1)
    await run.wait_for_head(node.url, limit=60)
    slow = Slow(2)
    leadership = LocalLeadership()
    follower = run.follower
    tap = follower.tap("slow")

    async def resume_point() -> tuple[int, str] | None:
        chain = slow.chain()
        if not chain:
            return None
        last = max(chain)
        return last, chain[last]

    slow.resume_point = resume_point  # type: ignore[method-assign]
    stream = follower_terms(leadership, "slow", follower, tap, slow.run, slow)
    await nursery.start(functools.partial(stream.run, own_terms=False))  # terms: below
    first = trio.CancelScope()

    async def term(scope: trio.CancelScope) -> None:
        with scope:
            await stream.term()

    nursery.start_soon(term, first)
    head = await head_number(node.url)
    await until(lambda: max(slow.chain(), default=0) == head)
    first.cancel()
    await until(lambda: not tap.attached)
    await emit_logs(node.url, 12 if behind else 2)  # past the window of 8, or within it
    await run.wait_for_head(node.url, limit=60)
    nursery.start_soon(term, trio.CancelScope())
    await assert_has_every_block_once(slow, node.url, 2)


class Kept:
    """A consumer with a kept position, as the wallets' and bundler's trackers run."""

    def __init__(self, position: KeptPosition) -> None:
        self.position = position
        self.events: list[ChainEvent] = []

    async def handle(self, event: ChainEvent) -> None:
        self.events.append(event)

    async def run(self, events: TermFeed) -> None:
        await consume(
            events,
            self.handle,
            name="test",
            label="ethereum/devnet",
            stats=self.position.stats,
            log=logging.getLogger("test"),
            position=self.position,
        )

    def applied(self) -> list[int]:
        return [e.block.header.number for e in self.events if isinstance(e, Apply)]


async def run_kept(run: Run, nursery: trio.Nursery, name: str) -> Kept:
    follower = run.follower
    position = KeptPosition(
        run.gateway.store,
        name,
        follower.chain,
        follower.network,
        Counter(),
        begins_at=follower.started_at,
    )
    kept = Kept(position)
    stream = follower_terms(
        LocalLeadership(), name, follower, follower.tap(name), kept.run, position
    )
    await nursery.start(stream.run)
    return kept


async def test_a_kept_position_consumer_begins_where_it_was_created_not_at_the_origin(
    follow: Starter, node: AnvilProcess, nursery: trio.Nursery, store_url: str
) -> None:
    """On a deployment's first start, at the origin with the follower; enabled on a
    deployment that followed the network before, after the follower's stored cursor (its
    history is not replayed), claimed as its position at once."""
    await emit_logs(node.url, 5)
    first = await follow(node.url, store_url=store_url, start_block=1)
    await first.wait_for_head(node.url)
    assert await first.follower.started_at() is None
    early = await run_kept(first, nursery, "early")
    head = await head_number(node.url)
    await until(lambda: early.applied()[-1:] == [head])
    assert early.applied() == list(range(1, head + 1))  # the origin: follower.start_block
    rows = ChainRows(first.gateway.store)
    stored = await rows.chain_cursor("ethereum", "devnet")
    assert stored is not None and stored[0] == head  # saved live, before the stop
    first.scope.cancel()
    await emit_logs(node.url, 4)  # the chain moves on while chaingate is down

    second = await follow(node.url, store_url=store_url, start_block=1)
    await second.wait_for_head(node.url)
    assert await second.follower.started_at() == stored
    late = await run_kept(second, nursery, "late")
    new_head = await head_number(node.url)
    await until(lambda: late.applied()[-1:] == [new_head])
    assert late.applied() == list(range(head + 1, new_head + 1))
    rows = ChainRows(second.gateway.store)
    saved = await rows.consumer_position("late", "ethereum", "devnet")
    assert saved is not None and saved[0] >= head
    # One that saved a position goes on from it (here: "early", from before the stop).
    again = await run_kept(second, nursery, "early")
    await until(lambda: again.applied()[-1:] == [new_head])
    assert again.applied()[0] <= head + 1

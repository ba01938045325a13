"""``RoleStream``: a single consumer reads the follower's subscription only during its terms —
the backlog first (what is fetched, then the window), then every event in order, none lost
when a term starts or ends, and what comes between terms dropped (the follower is never held
back)."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable

import trio

from chaingate.cluster.gates import RoleStream
from chaingate.cluster.leases import LocalLeadership
from chaingate.cluster.roles import RoleKey

KEY = RoleKey("indexer", "ethereum", "devnet")


class Recorder:
    def __init__(self) -> None:
        self.seen: list[int] = []
        self.closed = 0

    async def consume(self, events: trio.abc.ReceiveChannel[int]) -> None:
        async with events:
            async for event in events:
                self.seen.append(event)
        self.closed += 1


class Window:
    """A backlog with nothing to fetch: the window as ``rest``."""

    def __init__(self, rest: Callable[[], list[int]]) -> None:
        self.rest = rest

    async def more(self) -> list[int]:
        await trio.lowlevel.checkpoint()
        return []


async def until(condition: object) -> None:
    with trio.fail_after(5):
        while not condition():  # type: ignore[operator]
            await trio.lowlevel.checkpoint()


async def test_terms_read_the_replay_then_the_subscription_and_drop_between() -> None:
    send, receive = trio.open_memory_channel[int](4)
    recorder = Recorder()
    window = [1, 2]

    async def backlog() -> Window:
        return Window(lambda: list(window))

    stream = RoleStream(LocalLeadership(), KEY, receive, recorder.consume, backlog=backlog)
    async with trio.open_nursery() as nursery:
        await nursery.start(functools.partial(stream.run, own_terms=False))
        for n in range(10):  # no term: dropped, and the sender never waits for long
            with trio.fail_after(1):
                await send.send(n)
        await until(lambda: stream.dropped == 10)
        term = trio.CancelScope()
        nursery.start_soon(_run_in, term, stream.term)
        await until(lambda: recorder.seen == [1, 2])
        for n in range(3, 60):  # more than the buffer: the consumer keeps up
            await send.send(n)
        await until(lambda: recorder.seen[-1:] == [59])
        term.cancel()
        assert recorder.seen == list(range(1, 60))
        await trio.sleep(0.01)
        dropped = stream.dropped
        await send.send(60)  # between terms again
        await until(lambda: stream.dropped == dropped + 1)
        window[:] = [60]
        second = trio.CancelScope()
        nursery.start_soon(_run_in, second, stream.term)
        await until(lambda: recorder.seen[-1:] == [60])
        await send.send(61)
        await until(lambda: recorder.seen[-1:] == [61])
        second.cancel()
        await send.aclose()  # the follower leaves: run() returns
    assert recorder.seen == [*range(1, 60), 60, 61]


async def test_an_event_racing_the_start_of_a_term_is_in_the_replay_or_the_feed() -> None:
    """A term starting while events pour in: every event from the first one the term's
    window names onwards reaches the consumer, in order (duplicates allowed, no gaps)."""
    send, receive = trio.open_memory_channel[int](0)
    recorder = Recorder()
    sent: list[int] = []

    async def backlog() -> Window:
        return Window(lambda: sent[-3:])  # the follower's window: the last blocks it applied

    stream = RoleStream(LocalLeadership(), KEY, receive, recorder.consume, backlog=backlog)
    async with trio.open_nursery() as nursery:
        await nursery.start(functools.partial(stream.run, own_terms=False))

        async def pour() -> None:
            for n in range(1, 2001):
                sent.append(n)  # applied to the window first, then emitted
                await send.send(n)
            await send.aclose()

        nursery.start_soon(pour)
        await until(lambda: len(sent) > 500)
        term = trio.CancelScope()
        nursery.start_soon(_run_in, term, stream.term)
        await until(lambda: recorder.seen[-1:] == [2000])
        term.cancel()
    first = recorder.seen[0]
    assert first > 400
    assert sorted(set(recorder.seen)) == list(range(first, 2001))
    deduped = list(dict.fromkeys(recorder.seen))
    assert deduped == list(range(first, 2001))


async def _run_in(scope: trio.CancelScope, work: Callable[[], Awaitable[None]]) -> None:
    with scope:
        await work()

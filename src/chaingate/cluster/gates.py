"""A follower's stream for a consumer that must be single: read only while its role is led.

Every worker follows its networks (the WebSocket feed needs every block in every worker), but
only the leader of ``indexer:ethereum/devnet`` may index it.  ``RoleStream`` takes the
consumer's subscription: while the role is not led here, events are dropped (so the follower is
never held back); each time it is led, a term runs the consumer afresh (it reloads its own
stored state).  A term reads, first, its backlog (``chaingate.chain.catchup``): the blocks
from the consumer's own position — its stored cursor, or its start when it has stored nothing
— up to the follower's window, then the window; then the subscription itself, read by the
consumer directly (no relaying task between: a backfill's every event would pay a task switch
per consumer).  The subscription is kept from the moment the term begins, so the backlog and
it meet with nothing between, on a quiet chain too (no new block needed to show the gap):
a new leader neither skips a block nor begins at whichever one it happens to see first.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar

import trio

from chaingate.chain.catchup import TermConsumer, catch_up
from chaingate.chain.events import ChainEvent
from chaingate.chain.follower import Follower
from chaingate.cluster.leases import Leadership
from chaingate.cluster.roles import RoleKey

E = TypeVar("E")

Consumer = Callable[["TermFeed[E]"], Awaitable[object]]


class Backlog(Protocol[E]):
    """What a term reads before the subscription (``chaingate.chain.catchup.Catchup``)."""

    async def more(self) -> list[E]:
        """The next events below what ``rest`` holds; [] once ``rest`` holds the others."""
        ...

    def rest(self) -> list[E]:
        """The last events before the subscription's, taken without an await."""
        ...


class TermFeed(trio.abc.ReceiveChannel[E]):
    """One term's view of a subscription: the backlog, then the subscription.  Closing it
    leaves the subscription open for the next term."""

    def __init__(self, backlog: Backlog[E] | None, events: trio.MemoryReceiveChannel[E]) -> None:
        self._backlog = backlog
        self._queued: deque[E] = deque()
        self._events = events

    async def receive(self) -> E:
        while not self._queued and self._backlog is not None:
            chunk = await self._backlog.more()
            if chunk:
                self._queued.extend(chunk)
            else:
                # The subscription has kept every event since the term began: from here on
                # it has what ``rest`` does not.
                self._queued.extend(self._backlog.rest())
                self._backlog = None
        if self._queued:
            await trio.lowlevel.checkpoint()
            return self._queued.popleft()
        return await self._events.receive()

    def receive_nowait(self) -> E:
        if self._queued:
            return self._queued.popleft()
        if self._backlog is not None:
            raise trio.WouldBlock  # the backlog's next part is fetched by ``receive``
        return self._events.receive_nowait()

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


class RoleStream(Generic[E]):
    def __init__(
        self,
        leadership: Leadership,
        key: RoleKey,
        events: trio.MemoryReceiveChannel[E],
        consume: Consumer[E],
        *,
        backlog: Callable[[], Awaitable[Backlog[E]]] | None = None,
    ) -> None:
        self.leadership = leadership
        self.key = key
        self._events = events
        self._consume = consume
        self._backlog = backlog
        self._in_term = False
        self._term_over = trio.Event()
        self._dropping: trio.CancelScope | None = None
        self.dropped = 0

    async def run(
        self,
        *,
        own_terms: bool = True,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Until cancelled or the follower closes the stream.  ``own_terms``: each leadership
        term runs the consumer; False leaves that to the owner, whose own term for the role
        awaits ``term()`` once it is ready for the consumer (the bundler loads its mempool
        first)."""
        async with trio.open_nursery() as nursery:
            if own_terms:
                nursery.start_soon(self.leadership.lead, self.key, self.term)
            task_status.started()
            async with self._events:
                await self._drop_between_terms()
            nursery.cancel_scope.cancel()

    async def term(self) -> None:
        """One leadership term: the consumer on its backlog and the subscription, until
        cancelled."""
        if self._in_term:
            raise RuntimeError(f"{self.key.label}: a term is running already")
        self._in_term = True
        self._term_over = trio.Event()
        if self._dropping is not None:
            # Its receive is cancelled without taking an event; one it took already was in
            # the follower's window before, so the backlog's ``rest`` has it.
            self._dropping.cancel()
        try:
            backlog = await self._backlog() if self._backlog is not None else None
            await self._consume(TermFeed(backlog, self._events))
        finally:
            self._in_term = False
            self._term_over.set()

    async def _drop_between_terms(self) -> None:
        """Drop what comes while no term runs; returns when the follower closes the stream."""
        while True:
            if self._in_term:
                await self._term_over.wait()
                continue
            with trio.CancelScope() as scope:
                self._dropping = scope
                try:
                    async for _ in self._events:
                        self.dropped += 1
                    return
                finally:
                    self._dropping = None


def follower_terms(
    leadership: Leadership,
    role: str,
    follower: Follower,
    events: trio.MemoryReceiveChannel[ChainEvent],
    consume: Consumer[ChainEvent],
    consumer: TermConsumer,
) -> RoleStream[ChainEvent]:
    """``consume`` on ``follower``'s subscription ``events`` in the terms of ``role`` on its
    network, each from ``consumer``'s own position (``chaingate.chain.catchup``)."""
    return RoleStream(
        leadership,
        RoleKey(role, follower.chain, follower.network),
        events,
        consume,
        backlog=functools.partial(catch_up, follower, consumer),
    )

"""A follower's stream for a consumer that must be single: read only while its role is led.

Every worker follows its networks (the WebSocket feed needs every block in every worker), but
only the leader of ``indexer:ethereum/devnet`` may index it.  ``RoleStream`` takes the
consumer's subscription: while the role is not led here, events are dropped (so the follower is
never held back); each time it is led, the consumer runs and resumes from its own stored
cursor.  Each term begins with ``replay``, the follower's window of recent blocks, then the
subscription itself, read by the consumer directly (no relaying task between: a backfill's
every event would pay a task switch per consumer): the indexer and the webhook matcher skip
what their cursor holds and fetch what lies between it and the window themselves — on a quiet
chain too, where no new block would come to show them the gap — so a new leader neither skips
nor repeats a block; the wallets' and the bundler's trackers, which have no cursor (their
writes are idempotent by block hash), get from it the blocks a handover takes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Generic, TypeVar

import trio

from chaingate.cluster.leases import Leadership
from chaingate.cluster.roles import RoleKey

E = TypeVar("E")

Consumer = Callable[["TermFeed[E]"], Awaitable[object]]


class TermFeed(trio.abc.ReceiveChannel[E]):
    """One term's view of a subscription: the replayed backlog, then the subscription.
    Closing it leaves the subscription open for the next term."""

    def __init__(self, backlog: Iterable[E], events: trio.MemoryReceiveChannel[E]) -> None:
        self._backlog = deque(backlog)
        self._events = events

    async def receive(self) -> E:
        if self._backlog:
            await trio.lowlevel.checkpoint()
            return self._backlog.popleft()
        return await self._events.receive()

    def receive_nowait(self) -> E:
        if self._backlog:
            return self._backlog.popleft()
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
        replay: Callable[[], Awaitable[list[E]]] | None = None,
    ) -> None:
        self.leadership = leadership
        self.key = key
        self._events = events
        self._consume = consume
        self._replay = replay
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
        """One leadership term: the consumer on the replay and the subscription, until
        cancelled."""
        if self._in_term:
            raise RuntimeError(f"{self.key.label}: a term is running already")
        self._in_term = True
        self._term_over = trio.Event()
        if self._dropping is not None:
            # Its receive is cancelled without taking an event; one it took already was in
            # the follower's window before, so the replay below has it.
            self._dropping.cancel()
        try:
            # The snapshot comes after ``replay``'s last await: anything the follower applies
            # from here on is in the subscription too (an event in both comes twice; these
            # consumers are idempotent), nothing falls in between.
            backlog = await self._replay() if self._replay is not None else []
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

"""A follower's stream for a consumer that must be single: relayed only while its role is led.

Every worker follows its networks (the WebSocket feed needs every block in every worker), but
only the leader of ``indexer:ethereum/devnet`` may index it.  ``RoleStream`` takes the
consumer's subscription: while the role is not led here, events are dropped (so the follower is
never held back); each time it is led, the consumer runs on a fresh stream and resumes from its
own stored cursor.  Each term begins with ``replay``, the follower's window of recent blocks
(live events wait until it is in): the indexer and the webhook matcher skip what their cursor
holds and fetch what lies between it and the window themselves — on a quiet chain too, where
no new block would come to show them the gap — so a new leader neither skips nor repeats a
block; the wallets' and the bundler's trackers, which have no cursor (their writes are
idempotent by block hash), get from it the blocks a handover takes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import trio

from chaingate.cluster.leases import Leadership
from chaingate.cluster.roles import RoleKey

E = TypeVar("E")

Consumer = Callable[[trio.MemoryReceiveChannel[E]], Awaitable[object]]


class RoleStream(Generic[E]):
    def __init__(
        self,
        leadership: Leadership,
        key: RoleKey,
        events: trio.MemoryReceiveChannel[E],
        consume: Consumer[E],
        *,
        buffer: int = 16,
        replay: Callable[[], Awaitable[list[E]]] | None = None,
    ) -> None:
        self.leadership = leadership
        self.key = key
        self._events = events
        self._consume = consume
        self._buffer = buffer
        self._current: trio.MemorySendChannel[E] | None = None
        self._replay = replay
        self._replayed = trio.Event()
        self.dropped = 0

    async def run(
        self,
        *,
        own_terms: bool = True,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Relay until cancelled.  ``own_terms``: each leadership term runs the consumer;
        False leaves that to the owner, whose own term for the role awaits ``term()`` once
        it is ready for the consumer (the bundler loads its mempool first)."""
        async with trio.open_nursery() as nursery:
            if own_terms:
                nursery.start_soon(self.leadership.lead, self.key, self.term)
            task_status.started()
            await self._relay()
            nursery.cancel_scope.cancel()

    async def term(self) -> None:
        """One leadership term: the consumer on a stream of its own until cancelled."""
        send, receive = trio.open_memory_channel[E](self._buffer)
        replayed = self._replayed = trio.Event()
        # The snapshot and the switch with no checkpoint between (``replay`` takes it after
        # its last await): nothing falls in between (an event both in the window and live
        # comes twice; these consumers are idempotent).
        backlog = await self._replay() if self._replay is not None else []
        self._current = send
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._consume, receive)
                for event in backlog:
                    await send.send(event)
                replayed.set()
        finally:
            replayed.set()
            self._current = None
            send.close()
            receive.close()

    async def _relay(self) -> None:
        async with self._events:
            async for event in self._events:
                send = self._current
                if send is None:
                    self.dropped += 1
                    continue
                if not self._replayed.is_set():
                    await self._replayed.wait()
                try:
                    await send.send(event)  # the follower waits for a leading consumer
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self.dropped += 1

"""A follower's queue for one consumer run in terms (``chaingate.chain.feed``): offered every
event without the follower ever waiting.

Attached, it takes events until it holds ``size``; the next one finds it full: it stops taking
any (``overflowed``) until its reader attaches it again, having caught up from the last block
it delivered.  Detached (no term running, or the term catching up), it takes nothing.
"""

from __future__ import annotations

from collections import deque

import trio

from chaingate.chain.events import ChainEvent


class Tap:
    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.size = max(1, size)
        self._queue: deque[ChainEvent] = deque()
        self._offered = trio.Event()  # set (and replaced) when an event or the end comes
        self._ended = trio.Event()
        self.attached = False
        self.overflowed = False
        self.overflows = 0

    # --- the follower's side ----------------------------------------------------------------

    def offer(self, event: ChainEvent) -> None:
        """Never waits: taken, or (full) the tap overflows and takes nothing more."""
        if not self.attached:
            return
        if len(self._queue) >= self.size:
            self.attached = False
            self.overflowed = True
            self.overflows += 1
        else:
            self._queue.append(event)
        self._wake()

    def end(self) -> None:
        """The follower stopped: nothing more will come."""
        self.attached = False
        self._ended.set()
        self._wake()

    # --- the reader's side -------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._ended.is_set()

    async def wait_closed(self) -> None:
        await self._ended.wait()

    def attach(self) -> None:
        """Take every event from now on (what it held before is dropped)."""
        self._queue.clear()
        self.overflowed = False
        self.attached = not self.closed

    def detach(self) -> None:
        self._queue.clear()
        self.overflowed = False
        self.attached = False

    def take(self) -> ChainEvent | None:
        return self._queue.popleft() if self._queue else None

    async def wait_offer(self) -> None:
        """Until an event is offered, the tap overflows or the follower stops."""
        if self._queue or self.overflowed or self.closed:
            await trio.lowlevel.checkpoint()
            return
        await self._offered.wait()

    def _wake(self) -> None:
        self._offered.set()
        self._offered = trio.Event()

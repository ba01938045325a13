"""A follower consumer that must be single: run only while its role is led here.

Every worker follows its networks (the WebSocket feed needs every block in every worker), but
only the leader of ``indexer:ethereum/devnet`` may index it.  ``RoleStream`` runs the
consumer in the role's terms: each time the role is led, a term runs the consumer afresh (it
reloads its own stored state) on a feed of its own (``TermSource.feed``).  For a follower
consumer that is ``chaingate.chain.feed.TermFeed``: the blocks from the consumer's own
position — its stored cursor, or its start when it has stored nothing — then the follower's
events, each once, in order, read by the consumer directly (no relaying task between: a
backfill's every event would pay a task switch per consumer).  Between terms the follower
offers this consumer nothing (its tap is detached), so it is never held back; within a term
neither (a consumer that falls behind catches up from the node and the window): a new leader
neither skips a block nor begins at whichever one it happens to see first.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar

import trio

from chaingate.chain.catchup import TermConsumer, term_start
from chaingate.chain.feed import TermFeed
from chaingate.chain.follower import Follower
from chaingate.chain.tap import Tap
from chaingate.cluster.leases import Leadership
from chaingate.cluster.roles import RoleKey

F = TypeVar("F", bound=trio.abc.AsyncResource)  # a term's feed
F_co = TypeVar("F_co", bound=trio.abc.AsyncResource, covariant=True)

Consumer = Callable[[F], Awaitable[object]]


class TermSource(Protocol[F_co]):
    """What a role's terms read: a feed per term, until the source ends."""

    async def feed(self) -> F_co:
        """A new term's events; closing it ends the term's reading."""
        ...

    async def wait_closed(self) -> None:
        """Returns once the source has ended (the follower stopped)."""
        ...


class RoleStream(Generic[F]):
    def __init__(
        self, leadership: Leadership, key: RoleKey, source: TermSource[F], consume: Consumer[F]
    ) -> None:
        self.leadership = leadership
        self.key = key
        self._source = source
        self._consume = consume
        self._in_term = False

    async def run(
        self,
        *,
        own_terms: bool = True,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Until cancelled or the source ends.  ``own_terms``: each leadership term runs the
        consumer; False leaves that to the owner, whose own term for the role awaits
        ``term()`` once it is ready for the consumer (the bundler loads its mempool first)."""
        async with trio.open_nursery() as nursery:
            if own_terms:
                nursery.start_soon(self.leadership.lead, self.key, self.term)
            task_status.started()
            await self._source.wait_closed()
            nursery.cancel_scope.cancel()

    async def term(self) -> None:
        """One leadership term: the consumer on its own feed, until cancelled."""
        if self._in_term:
            raise RuntimeError(f"{self.key.label}: a term is running already")
        self._in_term = True
        try:
            feed = await self._source.feed()
            try:
                await self._consume(feed)
            finally:
                with trio.CancelScope(shield=True):
                    await feed.aclose()
        finally:
            self._in_term = False


class FollowerSource:
    """A follower consumer's terms: each fed from the consumer's own position."""

    def __init__(self, follower: Follower, tap: Tap, consumer: TermConsumer) -> None:
        self._follower = follower
        self._tap = tap
        self._consumer = consumer

    async def feed(self) -> TermFeed:
        at = await term_start(self._follower, self._consumer)
        return TermFeed(self._follower, self._tap, at, self._consumer.stats)

    async def wait_closed(self) -> None:
        await self._tap.wait_closed()


def follower_terms(
    leadership: Leadership,
    role: str,
    follower: Follower,
    tap: Tap,
    consume: Consumer[TermFeed],
    consumer: TermConsumer,
) -> RoleStream[TermFeed]:
    """``consume`` on ``follower``'s events (through ``tap``) in the terms of ``role`` on its
    network, each from ``consumer``'s own position (``chaingate.chain.catchup``)."""
    return RoleStream(
        leadership,
        RoleKey(role, follower.chain, follower.network),
        FollowerSource(follower, tap, consumer),
        consume,
    )

"""Accepted operations written to the store in groups: one commit for those that wait together.

An accepted operation is answered only once its row (and the reputation it changed) is
committed, and a commit is an fsync (~2 ms on a plain disk), taken under the network's mempool
lock.  One commit per operation made the fsync the ceiling of admission (~500 operations a
second, whatever the CPU).  Here an operation validated while a commit is in flight waits for
the lock; the next holder adds every waiting operation to the mempool in arrival order and
writes them all in one transaction: each is still answered after its own row is durable, the
mempool still changes one operation at a time under the lock, and a failed write undoes the
whole group (``Mempool.forget`` in reverse order: the pool as it was before the group).

One case is kept out of a group: an operation whose admission replaced or evicted an operation
added earlier in the same group (the undo of a group restores only what was committed).  It
is undone at once and waits for the next group.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import trio

from chaingate.bundler.mempool import Added, Entry, Mempool
from chaingate.bundler.reputation import Reputation, ReputationChanges
from chaingate.store.base import StoreError

Save = Callable[[Sequence[Entry], ReputationChanges], Awaitable[object]]


@dataclass(eq=False)
class _Waiting:
    entry: Entry
    paymaster_deposit: int | None
    added: Added | None = None
    error: Exception | None = None
    done: bool = False


class GroupCommit:
    """``admit``: add a validated operation's entry to ``mempool`` and have it saved by
    ``save``, under ``lock``, grouped with the operations waiting beside it."""

    def __init__(
        self, lock: trio.Lock, mempool: Mempool, reputation: Reputation, save: Save
    ) -> None:
        self._lock = lock
        self._mempool = mempool
        self._reputation = reputation
        self._save = save
        self._queue: list[_Waiting] = []
        self.groups = 0  # commits made (tests, and the ratio operations/commits)

    async def admit(self, entry: Entry, *, paymaster_deposit: int | None = None) -> Added:
        """The operation's ``Added`` once its row is committed; its BundlerFault (the mempool
        refused it) or the store's failure otherwise.  ``paymaster_deposit``: as
        ``Mempool.add`` takes it."""
        me = _Waiting(entry, paymaster_deposit)
        self._queue.append(me)
        try:
            async with self._lock:
                while not me.done:  # an operation put back waits for the next group
                    group, self._queue = self._queue, []
                    await self._commit(group)
        except BaseException:
            if not me.done and me in self._queue:  # cancelled before any group took it
                self._queue.remove(me)
            raise
        if me.error is not None:
            raise me.error
        assert me.added is not None
        return me.added

    async def _commit(self, group: list[_Waiting]) -> None:
        added: list[_Waiting] = []
        hashes: set[str] = set()
        slots: set[tuple[str, int]] = set()
        later: list[_Waiting] = []
        for waiting in group:
            slot = (waiting.entry.sender, waiting.entry.nonce)
            if slot in slots:  # would replace an operation of this group: the next one
                later.append(waiting)
                continue
            try:
                result = self._mempool.add(
                    waiting.entry, paymaster_deposit=waiting.paymaster_deposit
                )
            except Exception as exc:  # BundlerFault: refused, answered to its sender alone
                waiting.error, waiting.done = exc, True
                continue
            undone = (result.replaced, *result.evicted)
            if any(e is not None and e.hash in hashes for e in undone):
                self._mempool.forget(result)  # evicted one of this group: undone, next group
                later.append(waiting)
                continue
            waiting.added = result
            added.append(waiting)
            hashes.add(result.entry.hash)
            slots.add(slot)
        self._queue[:0] = later  # first in the next group, in their order
        if not added:
            return
        changed: dict[str, Entry] = {}
        for waiting in added:
            assert waiting.added is not None
            for entry in (waiting.added.entry, *waiting.added.evicted, waiting.added.replaced):
                if entry is not None:
                    changed.pop(entry.hash, None)
                    changed[entry.hash] = entry  # the latest state of each, in order
        reputation = self._reputation.changes()
        try:
            # Shielded: one waiter's cancellation (its client gone) is not the group's failure.
            with trio.CancelScope(shield=True):
                await self._save(list(changed.values()), reputation)
        except BaseException as exc:
            for waiting in reversed(added):
                assert waiting.added is not None
                self._mempool.forget(waiting.added)  # not kept: not accepted
                waiting.added, waiting.done = None, True
                waiting.error = StoreError(f"the mempool's write failed: {exc!r}")
            self._reputation.untake(reputation)
            raise
        self.groups += 1
        for waiting in added:
            waiting.done = True

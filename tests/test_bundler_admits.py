"""Accepted operations committed in groups (``chaingate.bundler.admits``), on SQLite and
PostgreSQL: operations waiting while a commit holds the mempool lock are written together in
one transaction; each is answered only once its row is kept; a refusal is its sender's alone;
a failed write undoes its whole group; a replacement of an operation of the same group waits
for the next one."""

from __future__ import annotations

from collections.abc import Sequence

import trio
import trio.testing

from chaingate.bundler.admits import GroupCommit
from chaingate.bundler.errors import BundlerFault
from chaingate.bundler.mempool import Added, Entry, Mempool
from chaingate.bundler.reputation import Reputation, ReputationChanges, ReputationEntry
from chaingate.bundler.store import BundlerRows
from chaingate.store import Store
from chaingate.store.base import StoreError
from tests.test_bundler_store import NET, T0, addr, assert_mirrors, entry


class Saves:
    """The service's save (``save_bundler_entries`` with the reputation), counting calls."""

    def __init__(self, store: Store) -> None:
        self.rows = BundlerRows(store)
        self.calls: list[list[str]] = []

    async def __call__(self, entries: Sequence[Entry], reputation: ReputationChanges) -> None:
        self.calls.append([e.hash for e in entries])
        await self.rows.save_bundler_entries(*NET, entries, reputation=reputation)


def parts(store: Store) -> tuple[trio.Lock, Mempool, Reputation, Saves, GroupCommit]:
    lock = trio.Lock()
    reputation = Reputation(min_stake=10**18, clock=lambda: 1000.0)
    pool = Mempool(reputation, clock=lambda: T0)
    saves = Saves(store)
    return lock, pool, reputation, saves, GroupCommit(lock, pool, reputation, saves)


async def admit_all(
    lock: trio.Lock, group: GroupCommit, entries: Sequence[Entry]
) -> list[Added | Exception]:
    """``entries`` admitted concurrently, all queued while ``lock`` is held (a commit in
    flight), in their order; each task's answer."""
    answers: list[Added | Exception] = [ValueError("unanswered")] * len(entries)

    async def one(i: int, e: Entry) -> None:
        try:
            answers[i] = await group.admit(e)
        except (BundlerFault, StoreError) as exc:
            answers[i] = exc

    async with trio.open_nursery() as nursery:
        await lock.acquire()
        for i, e in enumerate(entries):
            nursery.start_soon(one, i, e)
            await trio.testing.wait_all_tasks_blocked()  # queued in this order
        lock.release()
    return answers


async def test_operations_waiting_together_are_one_commit(store: Store) -> None:
    lock, pool, reputation, saves, group = parts(store)
    first = await group.admit(entry(1))  # alone: one commit
    assert saves.calls == [[first.entry.hash]]
    many = [entry(n, at=T0 + n) for n in range(2, 10)]
    answers = await admit_all(lock, group, many)
    assert [a.entry.hash for a in answers if isinstance(a, Added)] == [e.hash for e in many]
    assert group.groups == 2 and len(saves.calls) == 2  # the eight in one transaction
    assert sorted(saves.calls[1]) == sorted(e.hash for e in many)
    await assert_mirrors(store, pool)
    # The reputation the nine changed was written with them: the paymaster seen 9 times,
    # the factory (odd senders) 5.  (Nine: an unstaked paymaster may hold ten.)
    rows, _ = await BundlerRows(store).bundler_load_reputation(*NET)
    assert rows == [ReputationEntry(addr(0xBB), 9, 0), ReputationEntry(addr(0xFA), 5, 0)]
    assert rows == [reputation.entry(addr(0xBB)), reputation.entry(addr(0xFA))]


async def test_a_refusal_is_its_senders_alone(store: Store) -> None:
    lock, pool, _, saves, group = parts(store)
    kept = entry(1)
    # Same sender and nonce, fees not bumped: the mempool refuses it; the others are kept.
    answers = await admit_all(lock, group, [kept, entry(1, at=T0 + 1), entry(2, at=T0 + 2)])
    assert isinstance(answers[0], Added) and isinstance(answers[2], Added)
    assert isinstance(answers[1], BundlerFault)
    assert len(saves.calls) == 1
    await assert_mirrors(store, pool)
    assert {e.hash for e in pool.entries()} == {kept.hash, entry(2, at=T0 + 2).hash}


async def test_a_replacement_of_the_same_group_waits_for_the_next(store: Store) -> None:
    lock, pool, _, saves, group = parts(store)
    old = entry(1)
    new = entry(1, tip=2 * 10**9, fee=40 * 10**9, at=T0 + 1)
    other = entry(2, at=T0 + 2)
    answers = await admit_all(lock, group, [old, new, other])
    assert all(isinstance(a, Added) for a in answers), answers
    replacing = answers[1]
    assert isinstance(replacing, Added) and replacing.replaced is not None
    assert replacing.replaced.hash == old.hash
    # old and other together; the replacement in a group of its own, after.
    assert [set(c) for c in saves.calls] == [{old.hash, other.hash}, {new.hash, old.hash}]
    await assert_mirrors(store, pool)
    dropped = await BundlerRows(store).bundler_get(*NET, old.hash)
    assert dropped is not None
    assert (dropped.status, dropped.reason) == ("dropped", f"replaced by {new.hash}")


async def test_a_failed_write_undoes_the_whole_group(store: Store) -> None:
    lock, pool, reputation, saves, group = parts(store)
    before = await group.admit(entry(1))
    # A row the database refuses (NOT NULL version) in the group: the transaction fails.
    refused = entry(7).with_(hash="0x" + "ff" * 32, version=None)
    answers = await admit_all(lock, group, [entry(2, at=T0 + 2), refused, entry(3, at=T0 + 3)])
    assert all(isinstance(a, StoreError) for a in answers), answers
    assert [e.hash for e in pool.entries()] == [before.entry.hash]  # the pool as it was
    await assert_mirrors(store, pool)
    assert reputation.entry(addr(0xBB)).ops_seen == 1  # the group's counts taken back
    # What the group changed in the reputation is written with the next commit.
    after = await group.admit(entry(4, at=T0 + 4))
    assert [e.hash for e in pool.entries()] == [before.entry.hash, after.entry.hash]
    await assert_mirrors(store, pool)
    rows, _ = await BundlerRows(store).bundler_load_reputation(*NET)
    assert rows == [reputation.entry(addr(0xBB)), reputation.entry(addr(0xFA))]

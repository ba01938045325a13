"""The bundler's mempool and reputation rows on SQLite and PostgreSQL, written as the service
writes them: what Mempool calls returned, through ``save_bundler_entries``.  A restart (a new
store object over the same database) loads exactly the live operations the old one kept; an
admission is one transaction; lifecycle moves, reorgs, pruning and the reputation table."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaingate.aa.userop import UserOperation, user_op_hash
from chaingate.bundler.mempool import Added, Entry, Mempool, MempoolLimits, Stake, new_entry
from chaingate.bundler.reputation import Reputation, ReputationEntry
from chaingate.bundler.store import BundlerRows
from chaingate.store import Store, open_store
from chaingate.store.base import StoreError

NET = ("ethereum", "devnet")
OTHER = ("ethereum", "sepolia")
EP = "0x5FF137D4b0FDCD49DcA30c7CF57E578a026d2789"
TX = "0x" + "ab" * 32
BLOCK = "0x" + "cd" * 32
T0 = 1_700_000_000_000


def addr(n: int) -> str:
    return "0x" + f"{n:040x}"


def entry(
    sender: int,
    nonce: int = 0,
    *,
    tip: int = 10**9,
    fee: int = 30 * 10**9,
    at: int = T0,
    **extra: object,
) -> Entry:
    op = UserOperation(
        sender=addr(sender),
        nonce=nonce,
        call_data=b"\x00\xff" * 40,
        call_gas_limit=100_000,
        verification_gas_limit=200_000,
        pre_verification_gas=50_000,
        max_fee_per_gas=fee,
        max_priority_fee_per_gas=tip,
        signature=b"\x11" * 65,
        factory=addr(0xFA) if sender % 2 else None,
        factory_data=b"\x01\x02" if sender % 2 else b"",
        paymaster=addr(0xBB),
        paymaster_data=b"\x99",
    )
    digest = user_op_hash(op, entry_point=EP, chain_id=31337, version="0.6")
    return new_entry(
        op,
        user_op_hash=digest,
        entry_point=EP,
        version="0.6",
        now_ms=at,
        **extra,
    )


class Clock:
    """The Mempool's injected clock (epoch ms), moved by hand."""

    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def pool_of(clock: Clock, **limits: int) -> Mempool:
    reputation = Reputation(min_stake=10**18, clock=lambda: clock.now / 1000)
    return Mempool(reputation, MempoolLimits(**limits), clock=clock)


def admitted(added: Added) -> list[Entry]:
    """What the service saves for one admission: the entry, those it evicted, the one it
    replaced (now dropped)."""
    return [added.entry, *added.evicted, *([added.replaced] if added.replaced else [])]


async def assert_mirrors(store: Store, pool: Mempool, network: tuple[str, str] = NET) -> None:
    """The store's live rows are the pool's live entries, state for state."""
    live = await BundlerRows(store).bundler_live(*network)
    assert {e.hash: e for e in live} == {e.hash: e for e in pool.entries()}


async def test_restart_loads_the_same_live_entries(store_url: str, tmp_path: Path) -> None:
    big_nonce = (2**192 - 1) << 64 | 7  # a uint256 nonce key survives the round trip
    clock = Clock()
    pool, other_pool = pool_of(clock), pool_of(clock)
    candidates = [
        entry(1, at=T0, sender_stake=Stake(10**18, 86400), valid_until=2_000_000_000),
        entry(2, big_nonce, at=T0 + 1, code_hashes=((addr(5), "0x" + "77" * 32),)),
        entry(3, at=T0 + 2, accepted_block=12, valid_after=5, prefund=10**17),
        entry(4, at=T0 + 3),
    ]
    first = open_store(store_url, tmp_path)
    async with first:
        await first.migrate()
        kept = []
        for e in candidates:
            added = pool.add(e)
            await BundlerRows(first).save_bundler_entries(*NET, admitted(added))
            kept.append(added.entry)
        gone = kept.pop()
        clock.now = T0 + 10
        [sub] = pool.mark_submitted([kept[1].hash], TX)
        await BundlerRows(first).save_bundler_entries(*NET, [sub])
        done, stale = pool.mark_included(gone.hash, block_number=3, block_hash=BLOCK, tx_hash=TX)
        assert done is not None and stale == []
        await BundlerRows(first).save_bundler_entries(*NET, [done])
        await BundlerRows(first).save_bundler_entries(*OTHER, admitted(other_pool.add(entry(9))))
    second = open_store(store_url, tmp_path)  # the restart: a new store over the same data
    async with second:
        live = await BundlerRows(second).bundler_live(*NET)
        assert live == [kept[0], sub, kept[2]] == pool.entries()
        assert live[1].nonce == big_nonce and live[1].op.nonce == big_nonce
        assert live[1].status == "submitted" and live[1].bundle_tx == TX
        restarted = pool_of(clock)
        assert restarted.load(live) == 3
        assert restarted.entries() == live
        included = await BundlerRows(second).bundler_get(
            *NET, gone.hash.upper().replace("0X", "0x")
        )
        assert included == done
        assert (included.block_number, included.block_hash, included.bundle_tx) == (3, BLOCK, TX)
        assert await BundlerRows(second).bundler_get(*NET, "0x" + "00" * 32) is None
        assert len(await BundlerRows(second).bundler_live(*OTHER)) == 1


async def test_an_admission_is_written_in_one_transaction(store: Store) -> None:
    clock = Clock()
    pool = pool_of(clock, max_size=2)
    old = pool.add(entry(1, tip=10**9)).entry
    victim = pool.add(entry(2, tip=10**9, at=T0 + 1)).entry
    await BundlerRows(store).save_bundler_entries(*NET, [old, victim])
    clock.now = T0 + 5
    replacing = pool.add(entry(1, tip=2 * 10**9, fee=40 * 10**9, at=T0 + 5))
    assert replacing.replaced is not None and replacing.replaced.hash == old.hash
    # A row the database refuses (NOT NULL version), sorted after the others so they are
    # written first: the whole call fails and none of it stays.
    refused = entry(7).with_(hash="0x" + "ff" * 32, version=None)
    with pytest.raises(StoreError):
        await BundlerRows(store).save_bundler_entries(*NET, [*admitted(replacing), refused])
    assert await BundlerRows(store).bundler_get(*NET, replacing.entry.hash) is None
    assert await BundlerRows(store).bundler_get(*NET, old.hash) == old
    pool.forget(replacing)  # what the service does when the store could not keep it
    # (forget keeps the dropped copy's updated_at, so compare what the pool holds, not when)
    live = await BundlerRows(store).bundler_live(*NET)
    assert [(e.hash, e.status) for e in live] == [(e.hash, e.status) for e in pool.entries()]
    # Again, kept: the new operation live, the old one's row dropped beside it.
    replacing = pool.add(entry(1, tip=2 * 10**9, fee=40 * 10**9, at=T0 + 5))
    await BundlerRows(store).save_bundler_entries(*NET, admitted(replacing))
    replaced = await BundlerRows(store).bundler_get(*NET, old.hash)
    assert replaced is not None and replaced == replacing.replaced
    assert (replaced.status, replaced.reason) == ("dropped", f"replaced by {replacing.entry.hash}")
    # The pool is full: a richer operation evicts the cheapest, in the same write.
    richer = pool.add(entry(3, tip=3 * 10**9, fee=50 * 10**9, at=T0 + 6))
    assert [e.hash for e in richer.evicted] == [victim.hash]
    await BundlerRows(store).save_bundler_entries(*NET, admitted(richer))
    evicted = await BundlerRows(store).bundler_get(*NET, victim.hash)
    assert evicted == richer.evicted[0] and evicted.status == "dropped"
    await assert_mirrors(store, pool)
    assert [e.hash for e in await BundlerRows(store).bundler_live(*NET)] == [
        replacing.entry.hash,
        richer.entry.hash,
    ]


async def test_an_admission_writes_its_reputation_in_the_same_transaction(store: Store) -> None:
    """One commit per accepted operation: its rows and the reputation it changed together,
    both or neither; changes the store did not keep are taken again with the next ones."""
    rep = Reputation(min_stake=10**18, clock=lambda: 1000.0)
    pool = Mempool(rep, clock=lambda: T0)
    first = pool.add(entry(1))  # a factory and a paymaster: both seen once
    changes = rep.changes()
    assert [e.address for e in changes.upserts] == [addr(0xBB), addr(0xFA)]
    refused = entry(7).with_(hash="0x" + "ff" * 32, version=None)  # NOT NULL version
    with pytest.raises(StoreError):
        await BundlerRows(store).save_bundler_entries(
            *NET, [*admitted(first), refused], reputation=changes
        )
    assert await BundlerRows(store).bundler_load_reputation(*NET) == ([], None)
    rep.untake(changes)
    again = rep.changes()
    assert again == changes
    await BundlerRows(store).save_bundler_entries(*NET, admitted(first), reputation=again)
    assert await BundlerRows(store).bundler_get(*NET, first.entry.hash) == first.entry
    entries, decayed = await BundlerRows(store).bundler_load_reputation(*NET)
    assert entries == [ReputationEntry(addr(0xBB), 1, 0), ReputationEntry(addr(0xFA), 1, 0)]
    assert decayed == 1_000_000
    assert not rep.changes()  # nothing left to write


async def test_a_known_row_takes_only_the_lifecycle_state(store: Store) -> None:
    first = entry(1)
    await BundlerRows(store).save_bundler_entries(*NET, [first])
    # Saving it again with other accepted fields moves the state; the JSON stays as accepted.
    again = first.with_(prefund=999, status="submitted", bundle_tx=TX, updated_at=T0 + 1)
    await BundlerRows(store).save_bundler_entries(*NET, [again, again])
    got = await BundlerRows(store).bundler_get(*NET, first.hash)
    assert got == first.with_(status="submitted", bundle_tx=TX, updated_at=T0 + 1)


async def test_lifecycle_moves_follow_the_mempool(store: Store) -> None:
    clock = Clock()
    pool = pool_of(clock)
    a, b, c = (pool.add(e).entry for e in (entry(1), entry(2, at=T0 + 1), entry(1, 1, at=T0 + 2)))
    await BundlerRows(store).save_bundler_entries(*NET, [a, b, c])
    clock.now = T0 + 10
    submitted = pool.mark_submitted([a.hash, b.hash], TX)
    await BundlerRows(store).save_bundler_entries(*NET, submitted)  # a bundle's operations together
    await assert_mirrors(store, pool)
    assert {e.status for e in await BundlerRows(store).bundler_live(*NET)} == {
        "submitted",
        "pending",
    }
    clock.now = T0 + 20
    done, stale = pool.mark_included(a.hash, block_number=8, block_hash=BLOCK, tx_hash=TX)
    assert done is not None and stale == []
    back = pool.requeue([b.hash], "bundle dropped")
    await BundlerRows(store).save_bundler_entries(*NET, [done, *back])
    await assert_mirrors(store, pool)
    assert await BundlerRows(store).bundler_get(*NET, a.hash) == done
    got = await BundlerRows(store).bundler_get(*NET, b.hash)
    assert got is not None and (got.status, got.reason, got.bundle_tx) == (
        "pending",
        "bundle dropped",
        None,
    )
    # A reorg orphans a's block: included -> pending again, its block forgotten.
    clock.now = T0 + 30
    reverted = pool.revert_inclusion(a.hash)
    assert reverted is not None
    await BundlerRows(store).save_bundler_entries(*NET, [reverted])
    await assert_mirrors(store, pool)
    again = await BundlerRows(store).bundler_get(*NET, a.hash)
    assert again is not None and (again.status, again.reason) == ("pending", "reorged")
    assert (again.block_number, again.block_hash, again.bundle_tx) == (None, None, None)
    failed = pool.mark_failed(c.hash, "AA23 reverted")
    assert failed is not None
    await BundlerRows(store).save_bundler_entries(*NET, [failed])
    await assert_mirrors(store, pool)
    assert await BundlerRows(store).bundler_get(*NET, c.hash) == failed


async def test_prune_deletes_only_old_finished_rows(store: Store) -> None:
    clock = Clock()
    pool, other_pool = pool_of(clock), pool_of(clock)
    rows = [pool.add(entry(i, at=T0 + i)).entry for i in range(1, 6)]
    await BundlerRows(store).save_bundler_entries(*NET, rows)
    other = other_pool.add(entry(1)).entry
    await BundlerRows(store).save_bundler_entries(*OTHER, [other])
    clock.now = T0 + 100
    done, _ = pool.mark_included(rows[0].hash, block_number=1, block_hash=BLOCK, tx_hash=TX)
    failed = pool.mark_failed(rows[1].hash, "AA23")
    submitted = pool.mark_submitted([rows[3].hash], TX)
    assert done is not None and failed is not None
    await BundlerRows(store).save_bundler_entries(*NET, [done, failed, *submitted])
    clock.now = T0 + 300
    dropped = pool.drop(rows[2].hash, "expired")
    assert dropped is not None
    await BundlerRows(store).save_bundler_entries(*NET, [dropped])
    clock.now = T0
    other_dropped = other_pool.drop(other.hash, "cleared")
    assert other_dropped is not None
    await BundlerRows(store).save_bundler_entries(*OTHER, [other_dropped])
    assert await BundlerRows(store).bundler_prune(*NET, T0 + 200, limit=1) == 1
    assert await BundlerRows(store).bundler_prune(*NET, T0 + 200) == 1
    assert await BundlerRows(store).bundler_prune(*NET, T0 + 200) == 0
    await assert_mirrors(store, pool)
    assert {e.hash for e in await BundlerRows(store).bundler_live(*NET)} == {
        rows[3].hash,
        rows[4].hash,
    }
    assert await BundlerRows(store).bundler_get(*NET, rows[0].hash) is None
    assert await BundlerRows(store).bundler_get(*NET, rows[1].hash) is None
    assert await BundlerRows(store).bundler_get(*NET, rows[2].hash) == dropped  # too recent
    assert (
        await BundlerRows(store).bundler_get(*OTHER, other.hash) == other_dropped
    )  # another network


async def test_reputation_rows_round_trip(store: Store) -> None:
    clock_s = [1000.0]
    rep = Reputation(min_stake=10**18, clock=lambda: clock_s[0])
    pm, fac = addr(0xBB), addr(0xFA)
    for _ in range(30):
        rep.seen(pm)
    rep.included(pm)
    rep.crashed_handle_ops(fac)
    upserts, deletes = rep.take_changes()
    await BundlerRows(store).bundler_save_reputation(
        *NET, upserts, deletes, int(rep.decayed_at * 1000)
    )
    entries, decayed = await BundlerRows(store).bundler_load_reputation(*NET)
    assert entries == [ReputationEntry(pm, 30, 1), ReputationEntry(fac, 10000, 0)]
    assert decayed == 1_000_000
    # A restart: the hours missed while down are applied by the first tick.
    clock_s[0] = 1000.0 + 2 * 3600
    again = Reputation(min_stake=10**18, clock=lambda: clock_s[0])
    again.load(entries, None if decayed is None else decayed / 1000)
    assert again.entry(fac).ops_seen == 10000  # as loaded, before the missed hours apply
    assert again.status(fac) == "banned"  # ticks first: 2 hours applied
    assert again.tick() == 0
    assert again.entry(pm) == ReputationEntry(pm, 30 * 23 // 24 * 23 // 24, 0)
    upserts, deletes = again.take_changes()
    await BundlerRows(store).bundler_save_reputation(
        *NET, upserts, deletes, int(again.decayed_at * 1000)
    )
    entries, decayed = await BundlerRows(store).bundler_load_reputation(*NET)
    assert decayed == (1000 + 2 * 3600) * 1000
    assert ReputationEntry(pm, 30 * 23 // 24 * 23 // 24, 0) in entries
    again.clear()
    upserts, deletes = again.take_changes()
    await BundlerRows(store).bundler_save_reputation(
        *NET, upserts, deletes, int(again.decayed_at * 1000)
    )
    assert await BundlerRows(store).bundler_load_reputation(*NET) == ([], None)
    await BundlerRows(store).bundler_save_reputation(*NET, [ReputationEntry(pm, 1, 1)], [], 5)
    assert await BundlerRows(store).bundler_clear_reputation(*NET) == 1


async def test_a_new_chain_empties_the_bundler_rows(store: Store) -> None:
    await BundlerRows(store).save_bundler_entries(*NET, [entry(1)])
    await BundlerRows(store).bundler_save_reputation(*NET, [ReputationEntry(addr(1), 1, 0)], [], 0)
    await BundlerRows(store).save_bundler_entries(*OTHER, [entry(1)])
    deleted = await store.reset_network(*NET)
    assert deleted["bundler_ops"] == 1 and deleted["bundler_reputation"] == 1
    assert await BundlerRows(store).bundler_live(*NET) == []
    assert await BundlerRows(store).bundler_load_reputation(*NET) == ([], None)
    assert len(await BundlerRows(store).bundler_live(*OTHER)) == 1


async def test_save_entries_writes_what_the_mempool_returned(store: Store) -> None:
    """The service's path: every Mempool result saved as is, then loaded after a restart."""
    pool = Mempool(Reputation(min_stake=10**18, clock=lambda: 0.0), clock=lambda: T0)
    first = pool.add(entry(1, tip=10**9)).entry
    await BundlerRows(store).save_bundler_entries(*NET, [first])
    other = pool.add(entry(2)).entry
    added = pool.add(entry(1, tip=2 * 10**9, fee=40 * 10**9, at=T0 + 1))
    assert added.replaced is not None
    await BundlerRows(store).save_bundler_entries(*NET, [added.entry, added.replaced, other])
    submitted = pool.mark_submitted([other.hash], TX)
    await BundlerRows(store).save_bundler_entries(*NET, submitted)
    done, stale = pool.mark_included(other.hash, block_number=4, block_hash=BLOCK, tx_hash=TX)
    assert done is not None
    await BundlerRows(store).save_bundler_entries(*NET, [done, *stale])
    await BundlerRows(store).save_bundler_entries(*NET, [])
    replaced = await BundlerRows(store).bundler_get(*NET, first.hash)
    assert replaced is not None and replaced.status == "dropped"
    assert replaced.reason == f"replaced by {added.entry.hash}"
    assert await BundlerRows(store).bundler_get(*NET, other.hash) == done
    assert await BundlerRows(store).bundler_live(*NET) == pool.entries() == [added.entry]


async def test_reputation_decay_time_round_trips_in_milliseconds(store: Store) -> None:
    assert await BundlerRows(store).bundler_load_reputation(*NET) == ([], None)
    rep = Reputation(min_stake=10**18, clock=lambda: 1234.5)
    rep.seen(addr(7))
    await BundlerRows(store).bundler_save_reputation(
        *NET, *rep.take_changes(), int(rep.decayed_at * 1000)
    )
    assert await BundlerRows(store).bundler_load_reputation(*NET) == (
        [ReputationEntry(addr(7), 1, 0)],
        1234500,
    )

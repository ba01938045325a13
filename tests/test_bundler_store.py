"""The bundler's mempool and reputation rows on SQLite and PostgreSQL: a restart (a new store
object over the same database) loads exactly the live operations the old one kept; a
replacement is one transaction; lifecycle moves, reorgs, pruning and the reputation table."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from chaingate.aa.userop import UserOperation, user_op_hash
from chaingate.bundler.mempool import Entry, Mempool, Stake, new_entry
from chaingate.bundler.reputation import Reputation, ReputationEntry
from chaingate.store import Store, open_store
from chaingate.store.bundlerrows import OpChange

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


@pytest.fixture
async def store(store_url: str, tmp_path: Path) -> AsyncIterator[Store]:
    store = open_store(store_url, tmp_path)
    await store.open()
    try:
        await store.migrate()
        yield store
    finally:
        await store.aclose()


async def test_restart_loads_the_same_live_entries(store_url: str, tmp_path: Path) -> None:
    big_nonce = (2**192 - 1) << 64 | 7  # a uint256 nonce key survives the round trip
    kept = [
        entry(1, at=T0, sender_stake=Stake(10**18, 86400), valid_until=2_000_000_000),
        entry(2, big_nonce, at=T0 + 1, code_hashes=((addr(5), "0x" + "77" * 32),)),
        entry(3, at=T0 + 2, accepted_block=12, valid_after=5, prefund=10**17),
    ]
    first = open_store(store_url, tmp_path)
    async with first:
        await first.migrate()
        for e in kept:
            assert await first.bundler_insert(*NET, e)
        gone = entry(4, at=T0 + 3)
        await first.bundler_insert(*NET, gone)
        sub = kept[1].with_(status="submitted", bundle_tx=TX, updated_at=T0 + 10)
        assert await first.bundler_update(*NET, [OpChange.of(sub)]) == 1
        done = gone.with_(status="included", bundle_tx=TX, block_number=3, block_hash=BLOCK)
        assert await first.bundler_update(*NET, [OpChange.of(done)]) == 1
        await first.bundler_insert(*OTHER, entry(9))
    second = open_store(store_url, tmp_path)  # the restart: a new store over the same data
    async with second:
        live = await second.bundler_live(*NET)
        assert live == [kept[0], sub, kept[2]]
        assert live[1].nonce == big_nonce and live[1].op.nonce == big_nonce
        pool = Mempool(Reputation(min_stake=10**18, clock=lambda: 0.0))
        assert pool.load(live) == 3
        assert [e.hash for e in pool.entries()] == [e.hash for e in live]
        included = await second.bundler_get(*NET, gone.hash.upper().replace("0X", "0x"))
        assert included is not None and included.status == "included"
        assert (included.block_number, included.block_hash, included.bundle_tx) == (3, BLOCK, TX)
        assert await second.bundler_get(*NET, "0x" + "00" * 32) is None


async def test_replacement_and_eviction_are_one_transaction(store: Store) -> None:
    old = entry(1, tip=10**9)
    victim = entry(2)
    await store.bundler_insert(*NET, old)
    await store.bundler_insert(*NET, victim)
    new = entry(1, tip=2 * 10**9, at=T0 + 5)
    evicted = victim.with_(status="dropped", reason="evicted", updated_at=T0 + 5)
    assert await store.bundler_insert(*NET, new, replaces=old.hash, evicted=[evicted])
    assert await store.bundler_get(*NET, old.hash) is None
    assert await store.bundler_get(*NET, victim.hash) == evicted
    assert await store.bundler_live(*NET) == [new]
    # The same hash twice writes nothing, and does not touch what it claimed to replace.
    assert not await store.bundler_insert(*NET, new, replaces=victim.hash)
    assert await store.bundler_get(*NET, victim.hash) == evicted


async def test_lifecycle_moves_guards_and_lookups(store: Store) -> None:
    a, b, c = entry(1), entry(2, at=T0 + 1), entry(1, 1, at=T0 + 2)
    for e in (a, b, c):
        await store.bundler_insert(*NET, e)
    submitted = [
        OpChange(hash=e.hash, status="submitted", bundle_tx=TX, from_status=("pending",))
        for e in (a, b)
    ]
    assert await store.bundler_update(*NET, submitted) == 2
    assert await store.bundler_update(*NET, submitted) == 0  # no longer pending
    assert {
        e.hash for e in await store.bundler_in_bundle(*NET, TX.upper().replace("0X", "0x"))
    } == {
        a.hash,
        b.hash,
    }
    assert await store.bundler_record_inclusion(
        *NET, a.hash, block_number=8, block_hash=BLOCK, tx_hash=TX
    )
    assert not await store.bundler_record_inclusion(
        *NET, "0x" + "ee" * 32, block_number=8, block_hash=BLOCK, tx_hash=TX
    )
    back = OpChange(
        hash=b.hash, status="pending", reason="bundle dropped", from_status=("submitted",)
    )
    assert await store.bundler_update(*NET, [back]) == 1
    mine = await store.bundler_by_sender(*NET, addr(1).upper().replace("0X", "0x"))
    assert [e.hash for e in mine] == [c.hash]  # live only; a is included
    everything = await store.bundler_by_sender(*NET, addr(1), live_only=False)
    assert [e.hash for e in everything] == [a.hash, c.hash]  # by nonce
    got = await store.bundler_get(*NET, b.hash)
    assert got is not None and (got.status, got.reason, got.bundle_tx) == (
        "pending",
        "bundle dropped",
        None,
    )


async def test_reorg_puts_included_operations_back(store: Store) -> None:
    a, b = entry(1), entry(2)
    for e in (a, b):
        await store.bundler_insert(*NET, e)
    await store.bundler_record_inclusion(*NET, a.hash, block_number=5, block_hash=BLOCK, tx_hash=TX)
    await store.bundler_record_inclusion(
        *NET, b.hash, block_number=6, block_hash="0x" + "ef" * 32, tx_hash=TX
    )
    assert await store.bundler_revert_block(*NET, BLOCK.upper().replace("0X", "0x")) == [a.hash]
    back = await store.bundler_get(*NET, a.hash)
    assert back is not None and back.status == "pending" and back.block_hash is None
    assert [e.hash for e in await store.bundler_live(*NET)] == [a.hash]
    assert await store.bundler_revert_block(*NET, BLOCK) == []


async def test_prune_deletes_only_old_finished_rows(store: Store) -> None:
    rows = [entry(i, at=T0 + i) for i in range(1, 6)]
    for e in rows:
        await store.bundler_insert(*NET, e)
    changes = [
        OpChange(hash=rows[0].hash, status="included", updated_at=T0 + 100),
        OpChange(hash=rows[1].hash, status="failed", reason="AA23", updated_at=T0 + 100),
        OpChange(hash=rows[2].hash, status="dropped", updated_at=T0 + 300),
        OpChange(hash=rows[3].hash, status="submitted", bundle_tx=TX, updated_at=T0 + 100),
    ]
    await store.bundler_update(*NET, changes)
    await store.bundler_insert(*OTHER, rows[0].with_(status="dropped", updated_at=T0))
    assert await store.bundler_prune(*NET, T0 + 200, limit=1) == 1
    assert await store.bundler_prune(*NET, T0 + 200) == 1
    assert await store.bundler_prune(*NET, T0 + 200) == 0
    left = {e.hash for e in await store.bundler_live(*NET)}
    assert left == {rows[3].hash, rows[4].hash}
    assert await store.bundler_get(*NET, rows[2].hash) is not None  # too recent
    assert await store.bundler_get(*OTHER, rows[0].hash) is not None  # another network


async def test_reputation_rows_round_trip(store: Store) -> None:
    clock_s = [1000.0]
    rep = Reputation(min_stake=10**18, clock=lambda: clock_s[0])
    pm, fac = addr(0xBB), addr(0xFA)
    for _ in range(30):
        rep.seen(pm)
    rep.included(pm)
    rep.crashed_handle_ops(fac)
    upserts, deletes = rep.take_changes()
    await store.bundler_save_reputation(*NET, upserts, deletes, int(rep.decayed_at * 1000))
    entries, decayed = await store.bundler_load_reputation(*NET)
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
    await store.bundler_save_reputation(*NET, upserts, deletes, int(again.decayed_at * 1000))
    entries, decayed = await store.bundler_load_reputation(*NET)
    assert decayed == (1000 + 2 * 3600) * 1000
    assert ReputationEntry(pm, 30 * 23 // 24 * 23 // 24, 0) in entries
    again.clear()
    upserts, deletes = again.take_changes()
    await store.bundler_save_reputation(*NET, upserts, deletes, int(again.decayed_at * 1000))
    assert await store.bundler_load_reputation(*NET) == ([], None)
    await store.bundler_save_reputation(*NET, [ReputationEntry(pm, 1, 1)], [], 5)
    assert await store.bundler_clear_reputation(*NET) == 1


async def test_a_new_chain_empties_the_bundler_rows(store: Store) -> None:
    await store.bundler_insert(*NET, entry(1))
    await store.bundler_save_reputation(*NET, [ReputationEntry(addr(1), 1, 0)], [], 0)
    await store.bundler_insert(*OTHER, entry(1))
    deleted = await store.reset_network(*NET)
    assert deleted["bundler_ops"] == 1 and deleted["bundler_reputation"] == 1
    assert await store.bundler_live(*NET) == []
    assert len(await store.bundler_live(*OTHER)) == 1


async def test_save_entries_writes_what_the_mempool_returned(store: Store) -> None:
    """The service's path: every Mempool result saved as is, then loaded after a restart."""
    pool = Mempool(Reputation(min_stake=10**18, clock=lambda: 0.0), clock=lambda: T0)
    first = pool.add(entry(1, tip=10**9)).entry
    await store.save_bundler_entries(*NET, [first])
    other = pool.add(entry(2)).entry
    added = pool.add(entry(1, tip=2 * 10**9, fee=40 * 10**9, at=T0 + 1))
    assert added.replaced is not None
    await store.save_bundler_entries(*NET, [added.entry, added.replaced, other])
    submitted = pool.mark_submitted([other.hash], TX)
    await store.save_bundler_entries(*NET, submitted)
    done, stale = pool.mark_included(other.hash, block_number=4, block_hash=BLOCK, tx_hash=TX)
    assert done is not None
    await store.save_bundler_entries(*NET, [done, *stale])
    await store.save_bundler_entries(*NET, [])
    replaced = await store.bundler_get(*NET, first.hash)
    assert replaced is not None and replaced.status == "dropped"
    assert replaced.reason == f"replaced by {added.entry.hash}"
    assert await store.bundler_get(*NET, other.hash) == done
    assert await store.bundler_live(*NET) == pool.entries() == [added.entry]


async def test_reputation_decay_time_round_trips_in_milliseconds(store: Store) -> None:
    assert await store.bundler_load_reputation(*NET) == ([], None)
    rep = Reputation(min_stake=10**18, clock=lambda: 1234.5)
    rep.seen(addr(7))
    await store.bundler_save_reputation(*NET, *rep.take_changes(), int(rep.decayed_at * 1000))
    assert await store.bundler_load_reputation(*NET) == ([ReputationEntry(addr(7), 1, 0)], 1234500)

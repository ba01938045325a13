"""The metadata rows (migration 0005, metadata/store.py) on SQLite and on PostgreSQL.

The queue semantics live in SQL, so they are tested on both engines: due rows claimed under a
lease (never twice), clients' rows first, a refresh or an ERC-4906 event during a fetch not
lost, the refresh cool-down (each account's own, the document's origin asked at most once
per cool-down), ERC-4906 ranges over hex token ids (text order must be numeric
order under PostgreSQL's collation too), hints that make a contract due again.
"""

from __future__ import annotations

import msgspec
import pytest
import trio

from chaingate.metadata.store import MetaRows, NftRow, RefreshGrant, TokenRow
from chaingate.metadata.uris import token_id_hex
from chaingate.store import Store

C1 = "0x" + "11" * 20
C2 = "0x" + "22" * 20
NET = ("ethereum", "devnet")


def rows_of(store: Store) -> MetaRows:
    return MetaRows(store)


def key(contract: str, token_id: int | None) -> tuple[str, str]:
    return (contract, "" if token_id is None else token_id_hex(token_id))


async def test_token_rows_notes_hints_and_due(store: Store) -> None:
    rows = rows_of(store)
    due = await rows.note_token_contracts(*NET, [(C1, "ERC20"), (C2, None)], now=1000)
    assert sorted(due) == [C1, C2]
    assert sorted(await rows.due_token_contracts(*NET, now=1000, limit=10)) == [C1, C2]
    assert await rows.due_token_contracts(*NET, now=999, limit=10) == []
    # Probed: saved with a hint of None, which keeps the stored one.
    await rows.save_token_rows(
        *NET,
        [
            TokenRow(
                contract=C1,
                standard="ERC20",
                name="One",
                decimals=6,
                total_supply=str(2**255),
                status="ok",
                fetched_at=1000,
                next_retry_at=5000,
                updated_at=1000,
            )
        ],
    )
    loaded = await rows.load_token_rows(*NET, [C1, C2, "0x" + "33" * 20])
    assert set(loaded) == {C1, C2}
    assert (loaded[C1].standard_hint, loaded[C1].total_supply, loaded[C1].decimals) == (
        "ERC20",
        str(2**255),
        6,
    )
    assert await rows.due_token_contracts(*NET, now=1000, limit=10) == [C2]
    # The same hint again changes nothing; a new hint makes the contract due for a probe.
    assert await rows.note_token_contracts(*NET, [(C1, "ERC20")], now=2000) == []
    assert await rows.note_token_contracts(*NET, [(C1, "ERC721")], now=2000) == [C1]
    assert C1 in await rows.due_token_contracts(*NET, now=2000, limit=10)


async def test_due_rows_are_claimed_once_under_a_lease_clients_first(store: Store) -> None:
    rows = rows_of(store)
    await rows.ensure_nft_rows(*NET, [key(C1, 1), key(C1, 2)], now=100, priority=0)
    await rows.ensure_nft_rows(*NET, [key(C2, 9)], now=200, priority=1)  # a client waits
    # Existing rows are untouched by ensure.
    await rows.ensure_nft_rows(*NET, [key(C1, 1)], now=300, priority=1)
    claimed = await rows.claim_nft_rows(*NET, now=300, lease_until=10_000, limit=2)
    assert [(r.contract, int(r.token_id, 16)) for r in claimed] == [(C2, 9), (C1, 1)]
    assert claimed[1].updated_at == 100  # the version a fetch saves against
    rest = await rows.claim_nft_rows(*NET, now=300, lease_until=10_000, limit=10)
    assert [(r.contract, int(r.token_id, 16)) for r in rest] == [(C1, 2)]
    assert await rows.claim_nft_rows(*NET, now=9_999, lease_until=20_000, limit=10) == []
    # A lease that ran out (the process died): due again — unless the caller is on it.
    busy = frozenset({key(C2, 9)})
    again = await rows.claim_nft_rows(*NET, now=10_000, lease_until=20_000, limit=10, busy=busy)
    assert sorted((r.contract, int(r.token_id, 16)) for r in again) == [(C1, 1), (C1, 2)]


async def test_a_refresh_during_a_fetch_is_not_lost(store: Store) -> None:
    rows = rows_of(store)
    await rows.ensure_nft_rows(*NET, [key(C1, 7)], now=100, priority=0)
    (claimed,) = await rows.claim_nft_rows(*NET, now=100, lease_until=5000, limit=1)
    # While the fetch runs: an ERC-4906 event for the token arrives.
    assert await rows.mark_nfts_due(*NET, C1, token_id_hex(7), token_id_hex(7), now=150) == 1
    outcome = msgspec.structs.replace(
        claimed, status="ok", name="old", fetched_at=200, next_retry_at=None, updated_at=200
    )
    await rows.save_nft_row(*NET, outcome, version=claimed.updated_at)
    saved = (await rows.load_nft_rows(*NET, [key(C1, 7)]))[key(C1, 7)]
    assert (saved.name, saved.status, saved.next_retry_at) == ("old", "stale", 150)
    # Fetched again: now nothing touched the row in between, so the outcome stands.
    (claimed,) = await rows.claim_nft_rows(*NET, now=300, lease_until=5000, limit=1)
    fresh = msgspec.structs.replace(
        claimed, status="ok", name="new", fetched_at=400, next_retry_at=None, updated_at=400
    )
    await rows.save_nft_row(*NET, fresh, version=claimed.updated_at)
    saved = (await rows.load_nft_rows(*NET, [key(C1, 7)]))[key(C1, 7)]
    assert (saved.name, saved.status, saved.next_retry_at) == ("new", "ok", None)


async def test_refresh_requests_have_a_cool_down(store: Store) -> None:
    rows = rows_of(store)
    cool = 300_000
    grant = await rows.request_nft_refresh(*NET, key(C1, 3), now=1000, cooldown_ms=cool)
    assert grant == RefreshGrant(due_at=1000)
    loaded = (await rows.load_nft_rows(*NET, [key(C1, 3)]))[key(C1, 3)]
    assert (loaded.status, loaded.priority, loaded.next_retry_at) == ("pending", 1, 1000)
    await fetched(rows, loaded, at=2000)
    grant = await rows.request_nft_refresh(*NET, key(C1, 3), now=61_000, cooldown_ms=cool)
    assert grant == RefreshGrant(left_ms=240_000)
    grant = await rows.request_nft_refresh(*NET, key(C1, 3), now=301_000, cooldown_ms=cool)
    assert grant == RefreshGrant(due_at=301_000)
    loaded = (await rows.load_nft_rows(*NET, [key(C1, 3)]))[key(C1, 3)]
    assert (loaded.status, loaded.next_retry_at, loaded.refresh_requested_at) == (
        "stale",
        301_000,
        301_000,
    )


async def fetched(rows: MetaRows, row: NftRow, at: int) -> None:
    """The row claimed and fetched fine at ``at``."""
    (claimed,) = await rows.claim_nft_rows(*NET, now=at, lease_until=at + 10_000, limit=1)
    assert (claimed.contract, claimed.token_id) == (row.contract, row.token_id)
    done = msgspec.structs.replace(
        claimed, status="ok", fetched_at=at, next_retry_at=None, priority=0, updated_at=at
    )
    await rows.save_nft_row(*NET, done, version=claimed.updated_at)


async def test_each_account_has_its_own_refresh_allowance(store: Store) -> None:
    # Issue 25, item 7: A's refresh never refuses B; the document's origin still sees at
    # most one refresh per cool-down (B's is fetched where A's cools down).
    rows = rows_of(store)
    cool, doc = 300_000, key(C1, 9)

    async def ask(account: str, now: int) -> RefreshGrant:
        return await rows.request_nft_refresh(*NET, doc, now, cool, account)

    assert await ask("a", 1000) == RefreshGrant(due_at=1000)
    # Not fetched yet: B joins A's fetch, which starts after B asked.
    assert await ask("b", 1500) == RefreshGrant(due_at=1500)
    assert await ask("b", 1600) == RefreshGrant(left_ms=299_900)  # B's own allowance
    await fetched(rows, (await rows.load_nft_rows(*NET, [doc]))[doc], at=2000)
    # Fetched since: C's refresh is scheduled where A's cool-down ends, not refused.
    assert await ask("c", 60_000) == RefreshGrant(due_at=301_000)
    assert await ask("a", 90_000) == RefreshGrant(left_ms=211_000)
    # Nothing is due before then: the origin is not asked again within the cool-down.
    assert await rows.claim_nft_rows(*NET, now=300_999, lease_until=400_000, limit=5) == []
    assert await ask("d", 200_000) == RefreshGrant(due_at=301_000)  # joins the scheduled one
    (claimed,) = await rows.claim_nft_rows(*NET, now=301_000, lease_until=400_000, limit=5)
    assert (claimed.token_id, claimed.priority) == (doc[1], 1)
    # A's allowance is back after its own cool-down; the document's window moved on with
    # the scheduled refresh (a fetch under way keeps the schedule made meanwhile).
    assert await ask("a", 301_000) == RefreshGrant(due_at=601_000)
    done = msgspec.structs.replace(
        claimed, status="ok", fetched_at=302_000, next_retry_at=None, updated_at=302_000
    )
    await rows.save_nft_row(*NET, done, version=claimed.updated_at)
    saved = (await rows.load_nft_rows(*NET, [doc]))[doc]
    assert (saved.status, saved.next_retry_at, saved.priority) == ("stale", 601_000, 1)
    # Who asked when is forgotten after the cool-down.
    assert await rows.prune_nft_refresh_requests(*NET, before=301_000 - 1) == 3  # b, c, d
    assert await ask("b", 400_000) == RefreshGrant(due_at=601_000)


async def test_concurrent_refreshes_of_one_account_take_its_allowance_once(store: Store) -> None:
    rows = rows_of(store)
    grants: list[RefreshGrant] = []

    async def ask(account: str) -> None:
        grants.append(await rows.request_nft_refresh(*NET, key(C2, 4), 5000, 300_000, account))

    async with trio.open_nursery() as nursery:
        for account in ["a"] * 20 + ["b"] * 20:
            nursery.start_soon(ask, account)
    accepted = [g for g in grants if not g.left_ms]
    assert len(accepted) == 2 and {g.due_at for g in accepted} == {5000}, grants
    assert all(g.left_ms == 300_000 for g in grants if g.left_ms), grants


async def test_erc4906_ranges_follow_numeric_order_of_hex_ids(store: Store) -> None:
    rows = rows_of(store)
    ids = [0, 1, 2, 9, 10, 15, 16, 255, 256, 2**64, 2**255, 2**256 - 1]
    keys = [key(C1, i) for i in ids] + [key(C1, None), key(C2, 10)]
    await rows.ensure_nft_rows(*NET, keys, now=1, priority=0)
    for k in keys:  # all fetched fine, nothing due
        await rows.save_nft_row(
            *NET, NftRow(contract=k[0], token_id=k[1], status="ok", updated_at=2), version=1
        )
    marked = await rows.mark_nfts_due(*NET, C1, token_id_hex(2), token_id_hex(256), now=50)
    assert marked == 7
    due = await rows.claim_nft_rows(*NET, now=50, lease_until=60, limit=100)
    assert [(r.contract, int(r.token_id, 16), r.status) for r in due] == [
        (C1, i, "stale") for i in (2, 9, 10, 15, 16, 255, 256)
    ]
    # BatchMetadataUpdate(0, 2**256 - 1): every token of the contract, never its own document.
    everything = await rows.mark_nfts_due(
        *NET, C1, token_id_hex(0), token_id_hex(2**256 - 1), now=70
    )
    assert everything == len(ids)
    untouched = await rows.load_nft_rows(*NET, [key(C1, None), key(C2, 10)])
    assert {k: r.status for k, r in untouched.items()} == {
        key(C1, None): "ok",
        key(C2, 10): "ok",
    }


async def test_failed_rows_wake_only_when_idle(store: Store) -> None:
    rows = rows_of(store)
    await rows.ensure_nft_rows(*NET, [key(C1, 1), key(C1, 2)], now=1, priority=0)
    for token_id, status in ((1, "failed"), (2, "ok")):
        await rows.save_nft_row(
            *NET,
            NftRow(
                contract=C1,
                token_id=token_id_hex(token_id),
                status=status,
                attempts=10,
                next_retry_at=None,
                updated_at=1000,
            ),
            version=1,
        )
    both = [key(C1, 1), key(C1, 2)]
    assert await rows.wake_nft_rows(*NET, both, now=2000, idle_before=1000, priority=1) == 0
    assert await rows.wake_nft_rows(*NET, both, now=2000, idle_before=1001, priority=1) == 1
    woken = (await rows.load_nft_rows(*NET, [key(C1, 1)]))[key(C1, 1)]
    assert (woken.next_retry_at, woken.priority, woken.attempts) == (2000, 1, 0)


async def test_reset_network_clears_metadata_rows(store: Store) -> None:
    rows = rows_of(store)  # registers the tables for the reset
    if not hasattr(store, "reset_network"):
        pytest.skip("Store.reset_network is not in this checkout yet")
    await rows.note_token_contracts(*NET, [(C1, None)], now=1)
    await rows.ensure_nft_rows(*NET, [key(C1, 1)], now=1, priority=0)
    await rows.ensure_nft_rows("ethereum", "mainnet", [key(C1, 1)], now=1, priority=0)
    deleted = await store.reset_network(*NET)
    assert deleted.get("token_metadata") == 1 and deleted.get("nft_metadata") == 1
    assert await rows.load_nft_rows("ethereum", "mainnet", [key(C1, 1)])

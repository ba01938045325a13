"""The index's rows on both stores: migration, batched I/O (COPY on PostgreSQL, statements on
SQLite), 256-bit and negative amounts, the cursor's compare-and-set, rewinds, reset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chaingate.data.store import (
    INDEX_TABLES,
    IndexConflict,
    IndexCursor,
    IndexRows,
)
from chaingate.data.transfers import ZERO_ADDRESS, DecodedBlock, Transfer
from chaingate.metadata.store import META_TABLES, MetaRows, TokenRow
from chaingate.store import Store
from chaingate.store.base import network_tables
from chaingate.store.indexbulk import Table, bulk_for
from chaingate.store.migrate import apply_pending, load_migrations
from tests.test_indexer_oracle import open_index_store

TOKEN, NFT = "0x" + "11" * 20, "0x" + "22" * 20
A, B = "0x" + "aa" * 20, "0x" + "bb" * 20
BIG = 2**256 - 1


def block(number: int, transfers: list[Transfer], tag: str = "") -> DecodedBlock:
    return DecodedBlock(
        number,
        f"0x{number:062x}{tag or '00'}",
        f"0x{number - 1:062x}00",
        1_700_000_000 + number,
        transfers,
        [],
        len(transfers),
        0,
    )


def erc20(number: int, seq: int, sender: str, receiver: str, amount: int) -> Transfer:
    return Transfer(
        number, seq, "0x" + "cc" * 32, 0, seq, "ERC20", TOKEN, sender, receiver, None, amount
    )


def nft(number: int, seq: int, sender: str, receiver: str, token_id: int) -> Transfer:
    return Transfer(
        number, seq, "0x" + "cc" * 32, 0, seq, "ERC721", NFT, sender, receiver, token_id, 1
    )


async def test_commits_rewinds_and_conflicts(store: Store) -> None:
    rows = IndexRows(store)
    assert (await rows.load_index("ethereum", "devnet")).cursor is None
    one = block(1, [erc20(1, 0, ZERO_ADDRESS, A, BIG), nft(1, 1, ZERO_ADDRESS, A, BIG)])
    c1 = IndexCursor(1, one.hash)
    new = await rows.commit_index("ethereum", "devnet", expect=None, cursor=c1, blocks=[one])
    assert {c.contract for c in new} == {TOKEN, NFT}
    # 256-bit amounts and ids round-trip; a balance may exceed them and go negative.
    two = block(2, [erc20(2, 0, A, B, BIG), erc20(2, 1, B, A, BIG), erc20(2, 2, A, B, 5)])
    c2 = IndexCursor(2, two.hash)
    await rows.commit_index("ethereum", "devnet", expect=c1, cursor=c2, blocks=[two])
    _, contract = await rows.index_contract("ethereum", "devnet", TOKEN)
    assert contract is not None and (contract.holders, contract.supply) == (2, BIG)
    three = block(3, [erc20(3, 0, B, A, 10)])  # B goes to -5
    c3 = IndexCursor(3, three.hash)
    await rows.commit_index("ethereum", "devnet", expect=c2, cursor=c3, blocks=[three])
    _, total, balances = await rows.index_balances("ethereum", "devnet", B, 0, 10)
    assert (total, balances) == (0, [])  # negative: not listed
    _, total, balances = await rows.index_balances("ethereum", "devnet", A, 0, 10)
    assert balances == [(TOKEN, BIG + 5)]  # beyond 256 bits: a broken token's sums are kept
    _, total, owned = await rows.index_nfts_owned("ethereum", "devnet", A, 0, 10)
    assert [(c, t, q) for c, t, q, _ in owned] == [(NFT, BIG, 1)]
    # A stale expectation is refused and changes nothing.
    with pytest.raises(IndexConflict):
        await rows.commit_index("ethereum", "devnet", expect=c2, cursor=c3, blocks=[three])
    with pytest.raises(IndexConflict):
        await rows.commit_index("ethereum", "devnet", expect=None, cursor=c1, blocks=[one])
    assert (await rows.load_index("ethereum", "devnet")).cursor == c3
    # Rewind to block 1 and apply another block 2: exactly as if 2 and 3 never were.
    other = block(2, [erc20(2, 0, A, B, 1)], tag="ff")
    c2b = IndexCursor(2, other.hash)
    await rows.commit_index(
        "ethereum", "devnet", expect=c3, cursor=c2b, blocks=[other], undo_above=1
    )
    _, _, balances = await rows.index_balances("ethereum", "devnet", A, 0, 10)
    assert balances == [(TOKEN, BIG - 1)]
    _, _, balances = await rows.index_balances("ethereum", "devnet", B, 0, 10)
    assert balances == [(TOKEN, 1)]
    state = await rows.load_index("ethereum", "devnet")
    assert state.cursor == c2b and state.recent == {1: one.hash, 2: other.hash}
    _, transfers = await rows.index_transfers("ethereum", "devnet", A, limit=10)
    assert [(t.block_number, t.seq, t.block_hash) for t in transfers] == [
        (2, 0, other.hash),
        (1, 1, one.hash),
        (1, 0, one.hash),
    ]
    # Another network is untouched by all of it.
    assert (await rows.load_index("ethereum", "other")).cursor is None
    # Undo everything: every row of the network is gone, the cursor stays.
    await rows.commit_index(
        "ethereum", "devnet", expect=c2b, cursor=IndexCursor(0, "0x0"), undo_above=0
    )

    def count(tx: Any) -> dict[str, int]:
        return {t: int(tx.query(f"SELECT COUNT(*) FROM {t}")[0][0]) for t in INDEX_TABLES}

    assert await store.run_transaction(count, write=False) == {
        **dict.fromkeys(INDEX_TABLES, 0),
        "idx_cursors": 1,
    }


async def test_bulk_rows_survive_any_text(store: Store) -> None:
    """Values are data to both engines, whatever characters they hold (COPY's separators,
    quotes, a backslash) — the row I/O is not a way to inject anything."""
    table = Table("idx_balances", ("holder", "contract"), ("balance",))
    odd = ["a\tb", "c\nd", "e\\f", "g'h", 'i"j', "\\N", "k;l", "m\rn"]

    def roundtrip(tx: Any) -> Any:
        bulk = bulk_for(tx, ("ethereum", "odd"))
        bulk.upsert(table, [(h, "c", str(i)) for i, h in enumerate(odd)])
        bulk.upsert(table, [(odd[0], "c", "99")])
        found = bulk.lookup(table, [(h, "c") for h in odd] + [("absent", "c")])
        bulk.delete(table, [(odd[1], "c"), (odd[2], "c")])
        left = tx.query(
            "SELECT holder, balance FROM idx_balances WHERE chain = 'ethereum' AND network = 'odd'"
        )
        return found, left

    found, left = await store.run_transaction(roundtrip)
    expected = {h: str(i) for i, h in enumerate(odd)} | {odd[0]: "99"}
    assert {h: b for h, _, b in found} == expected
    del expected[odd[1]], expected[odd[2]]
    assert dict(left) == expected


async def test_migration_0019_seeds_the_verdicts_stored_before_it(
    store_url: str, tmp_path: Path
) -> None:
    """Contracts already read as no ERC-20 leave balance lists from the upgrade on."""
    s = open_index_store(store_url, tmp_path)
    async with s:
        migrations = load_migrations()
        assert [m.name for m in migrations if m.version == 19] == ["idx_not_erc20"]
        await apply_pending(s, [m for m in migrations if m.version <= 18])
        c, d = "0x" + "cc" * 20, "0x" + "dd" * 20
        facts = [
            TokenRow(contract=TOKEN, standard="ERC20", status="ok"),
            TokenRow(contract=NFT, standard="ERC721", status="ok"),
            TokenRow(contract=A, standard=None, status="ok"),  # read: no token at all
            TokenRow(contract=B, status="pending"),  # not read yet: listed meanwhile
            TokenRow(contract=c, status="failed"),
        ]
        await MetaRows(s).save_token_rows("ethereum", "mainnet", facts)
        await MetaRows(s).save_token_rows("ethereum", "other", [facts[0], facts[2]])
        await MetaRows(s).save_token_rows("ethereum", "mainnet", [TokenRow(contract=d)])
        assert 19 in await s.migrate()
        seeded = await s.run_transaction(
            lambda tx: tx.query("SELECT chain, network, contract FROM idx_not_erc20"),
            write=False,
        )
        assert sorted(seeded) == [
            ("ethereum", "mainnet", NFT),
            ("ethereum", "mainnet", A),
            ("ethereum", "other", A),
        ]


def test_index_and_metadata_tables_are_reset_with_their_network() -> None:
    tables = network_tables()
    assert set(INDEX_TABLES) <= set(tables) and set(META_TABLES) <= set(tables)
    assert len(tables) == len(set(tables))


async def test_a_batch_that_does_not_extend_the_cursor_is_refused_whole(store: Store) -> None:
    # A batch whose predecessor was lost (a commit cancelled at shutdown) must not move the
    # cursor past transfers never applied.
    one = block(1, [erc20(1, 0, ZERO_ADDRESS, A, 10)])
    c1 = IndexCursor(1, one.hash)
    await IndexRows(store).commit_index("ethereum", "devnet", expect=None, cursor=c1, blocks=[one])
    two, three, four = block(2, []), block(3, [erc20(3, 0, A, B, 4)]), block(4, [])
    with pytest.raises(IndexConflict):  # skips block 2
        await IndexRows(store).commit_index(
            "ethereum", "devnet", expect=c1, cursor=IndexCursor(4, four.hash), blocks=[three, four]
        )
    with pytest.raises(IndexConflict):  # the cursor is not the last block's
        await IndexRows(store).commit_index(
            "ethereum", "devnet", expect=c1, cursor=IndexCursor(3, three.hash), blocks=[two]
        )
    with pytest.raises(IndexConflict):  # a gap inside the batch
        await IndexRows(store).commit_index(
            "ethereum", "devnet", expect=c1, cursor=IndexCursor(4, four.hash), blocks=[two, four]
        )
    state = await IndexRows(store).load_index("ethereum", "devnet")
    assert state.cursor == c1  # nothing moved
    assert await IndexRows(store).index_balances("ethereum", "devnet", B.lower(), 0, 10) == (
        c1,
        0,
        [],
    )

"""PostgreSQL's set-based merge (``chaingate.data.pgmerge``) against the Python ledger.

Random transfers (every standard, mints, burns, self-transfers, zero and 100-bit amounts,
balances going negative) are committed block by block through ``commit_index`` on PostgreSQL,
a later part is undone (a rewind) and replaced, and finally everything is undone; after each
step the tables must hold exactly what ``ledger.plan`` over dicts holds (``DictState``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings

from chaingate.data.ledger import ContractRow, TokenRow
from chaingate.data.store import IndexCursor, IndexRows
from chaingate.data.transfers import DecodedBlock, Transfer
from chaingate.store import Store, open_store
from tests.conftest import pg_schema
from tests.test_indexer_units import DictState, transfers

_networks = itertools.count()


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    with pg_schema() as url:
        yield url


def blocks_of(all_transfers: list[Transfer], first: int, last: int) -> list[DecodedBlock]:
    out = []
    for number in range(first, last + 1):
        out.append(
            DecodedBlock(
                number,
                f"0x{number:064x}",
                f"0x{number - 1:064x}",
                number,
                [t for t in all_transfers if t.block_number == number],
                [],
                0,
                0,
            )
        )
    return out


async def image(store: Store, network: str) -> tuple[Any, ...]:
    """The tables in ``DictState.image``'s shape."""

    def read(tx: Any) -> tuple[Any, ...]:
        def rows(sql: str) -> list[tuple[Any, ...]]:
            return list(tx.query(sql + " WHERE chain = 'ethereum' AND network = ?", (network,)))

        balances = {
            (h, c): int(b) for h, c, b in rows("SELECT holder, contract, balance FROM idx_balances")
        }
        holdings = {
            (h, c, int(t, 16)): int(q)
            for h, c, t, q in rows(
                "SELECT holder, contract, token_id, quantity FROM idx_nft_holdings"
            )
        }
        tokens = {
            (c, int(t, 16)): TokenRow(int(s), int(n))
            for c, t, s, n in rows("SELECT contract, token_id, supply, holders FROM idx_nft_tokens")
        }
        owners = {
            (c, h): int(n)
            for c, h, n in rows("SELECT contract, holder, tokens FROM idx_nft_owners")
        }
        contracts = {
            r[0]: (r[0], r[1], int(r[2]), *map(int, r[3:7]), int(r[7]), *map(int, r[8:]))
            for r in rows(
                "SELECT contract, standard, first_block, erc20_transfers, erc721_transfers,"
                " erc1155_transfers, holders, supply, tokens, owners FROM idx_contracts"
            )
        }
        return balances, holdings, tokens, owners, contracts

    result: tuple[Any, ...] = await store.run_transaction(read, write=False)
    return result


def expected(state: DictState) -> tuple[Any, ...]:
    balances, holdings, tokens, owners, contracts = state.image()
    return balances, holdings, tokens, owners, {a: tuple(v) for a, v in contracts.items()}


async def scenario(url: str, first: list[Transfer], second: list[Transfer]) -> None:
    network = f"n{next(_networks)}"
    head = 9
    store = open_store(url, Path("/nonexistent"))  # a URL needs no data dir
    async with store:
        await store.migrate()
        rows = IndexRows(store)
        state = DictState()
        cursor = None
        # Blocks 1..6 in two batches, then 7..9 as single blocks (the live path).
        chain = blocks_of(first + second, 1, head)
        for batch in (chain[:3], chain[3:6], *([b] for b in chain[6:])):
            new = IndexCursor(batch[-1].number, batch[-1].hash)
            made = await rows.commit_index(
                "ethereum", network, expect=cursor, cursor=new, blocks=batch
            )
            before = set(state.contract)
            state.apply([t for b in batch for t in b.transfers])
            assert {c.contract for c in made} == set(state.contract) - before
            assert all(isinstance(c, ContractRow) for c in made)
            cursor = new
            assert await image(store, network) == expected(state)
        # A rewind to block 6 with another block 7 (empty): blocks 7..9 undone exactly.
        other = DecodedBlock(7, "0x" + "ee" * 32, chain[5].hash, 7, [], [], 0, 0)
        new = IndexCursor(7, other.hash)
        await rows.commit_index(
            "ethereum", network, expect=cursor, cursor=new, blocks=[other], undo_above=6
        )
        state.apply(second, -1, drop_above=6)
        assert await image(store, network) == expected(state)
        # Everything undone: nothing left.
        await rows.commit_index(
            "ethereum", network, expect=new, cursor=IndexCursor(0, "0x0"), undo_above=0
        )
        assert await image(store, network) == ({}, {}, {}, {}, {})


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(transfers(), transfers(block_range=(7, 9)))
def test_the_merge_equals_the_python_ledger(
    pg_url: str, first: list[Transfer], second: list[Transfer]
) -> None:
    trio.run(scenario, pg_url, first, second)

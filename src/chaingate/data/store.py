"""The indexer's rows (migration 0004): every SQL statement of ``chaingate.data``, portable.

Writes happen in ``commit_index``, one transaction per call: the cursor moves first, by
compare-and-set (another process indexing the same network, or a reset, makes it fail with
``IndexConflict`` before anything else is written), then undone blocks' transfers are read back
and applied negated, then new blocks' transfers are inserted and applied, then the recent block
hashes are trimmed.  Balances and counters are read-modify-written **in batches**: the old
values of every key a batch touches are read at once, new values computed by
``chaingate.data.ledger`` and written back as upserts, with deletes for rows that became zero;
transfers are inserted in bulk.  How rows travel is ``chaingate.store.indexbulk``'s job: COPY
and staging tables on PostgreSQL, multi-row statements on SQLite.  No statement is issued per
log.

Amounts are stored as signed decimal text and token ids as 64 hex digits (see the migration).
Reads of several statements run under one snapshot (REPEATABLE READ on PostgreSQL; SQLite's
read transaction is one already), so a page, its total and the block it is at agree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import pairwise
from typing import Any, Literal

import msgspec

from chaingate.config.network import Network
from chaingate.data import ledger, pgmerge
from chaingate.data.ledger import BalanceKey, ContractRow, HoldingKey, OwnerKey, TokenKey, TokenRow
from chaingate.data.transfers import DecodedBlock, Transfer
from chaingate.store.base import register_network_table
from chaingate.store.indexbulk import Bulk, Table, bulk_for
from chaingate.store.rows import Rows
from chaingate.store.tx import T, Tx

# Every table of the index: rows derived from one chain/network (Store.reset_network clears them).
INDEX_TABLES = (
    "idx_cursors",
    "idx_blocks",
    "idx_transfers",
    "idx_contracts",
    "idx_balances",
    "idx_nft_holdings",
    "idx_nft_owners",
    "idx_nft_tokens",
    "idx_not_erc20",
)
# Bound on the parameters of one IN (...) list.
_CHUNK = 400

Direction = Literal["in", "out", "any"]


class IndexConflict(Exception):
    """The stored cursor is not the one this writer expected: another writer moved it, or the
    network's rows were reset.  Nothing was written; reload and carry on from the store."""


class IndexCursor(msgspec.Struct, frozen=True):
    number: int
    hash: str


class IndexState(msgspec.Struct, frozen=True):
    cursor: IndexCursor | None
    recent: dict[int, str]  # number -> hash of the last blocks indexed


class TransferRow(msgspec.Struct, frozen=True):
    """A stored transfer with its block (what the transfers endpoint lists)."""

    block_number: int
    seq: int
    block_hash: str
    block_time: int
    tx_hash: str
    tx_index: int
    log_index: int | None
    standard: str
    contract: str | None
    sender: str
    receiver: str
    token_id: int | None
    amount: int


def token_hex(token_id: int) -> str:
    return format(token_id, "064x")


def _amount(text: str) -> int:
    return int(text)


BALANCES = Table("idx_balances", ("holder", "contract"), ("balance",))
HOLDINGS = Table("idx_nft_holdings", ("holder", "contract", "token_id"), ("quantity",))
TOKENS = Table("idx_nft_tokens", ("contract", "token_id"), ("supply", "holders"))
OWNERS = Table("idx_nft_owners", ("contract", "holder"), ("tokens",))
CONTRACTS = Table(
    "idx_contracts",
    ("contract",),
    (
        "standard",
        "first_block",
        "erc20_transfers",
        "erc721_transfers",
        "erc1155_transfers",
        "holders",
        "supply",
        "tokens",
        "owners",
    ),
)


class _TxState:
    """ledger.StateReader over one open transaction."""

    def __init__(self, bulk: Bulk) -> None:
        self.bulk = bulk

    def balances(self, keys: Sequence[BalanceKey]) -> dict[BalanceKey, int]:
        return {(h, c): _amount(b) for h, c, b in self.bulk.lookup(BALANCES, keys)}

    def holdings(self, keys: Sequence[HoldingKey]) -> dict[HoldingKey, int]:
        rows = self.bulk.lookup(HOLDINGS, [(h, c, token_hex(i)) for h, c, i in keys])
        return {(h, c, int(i, 16)): _amount(q) for h, c, i, q in rows}

    def tokens(self, keys: Sequence[TokenKey]) -> dict[TokenKey, TokenRow]:
        rows = self.bulk.lookup(TOKENS, [(c, token_hex(i)) for c, i in keys])
        return {(c, int(i, 16)): TokenRow(_amount(s), int(n)) for c, i, s, n in rows}

    def owners(self, keys: Sequence[OwnerKey]) -> dict[OwnerKey, int]:
        return {(c, h): int(n) for c, h, n in self.bulk.lookup(OWNERS, keys)}

    def contracts(self, addresses: Sequence[str]) -> dict[str, ContractRow]:
        rows = self.bulk.lookup(CONTRACTS, [(a,) for a in addresses])
        return {row[0]: _contract(row) for row in rows}


_CONTRACT_COLUMNS = (
    "contract, standard, first_block, erc20_transfers, erc721_transfers, erc1155_transfers,"
    " holders, supply, tokens, owners"
)
_CONTRACT_COLUMNS_T = ", ".join(f"t.{c.strip()}" for c in _CONTRACT_COLUMNS.split(","))
_TRANSFER_COLUMNS = (
    "block_number, seq, block_hash, block_time, tx_hash, tx_index, log_index, standard,"
    " contract, sender, receiver, token_id, amount"
)
_TRANSFER_INSERT = ("chain", "network", *(c.strip() for c in _TRANSFER_COLUMNS.split(",")))


def _contract(row: Sequence[Any]) -> ContractRow:
    c, standard, first, t20, t721, t1155, holders, supply, tokens, owners = row
    return ContractRow(
        c,
        standard,
        int(first),
        int(t20),
        int(t721),
        int(t1155),
        int(holders),
        _amount(supply),
        int(tokens),
        int(owners),
    )


def _transfer_row(row: Sequence[Any]) -> TransferRow:
    number, seq, bhash, btime, txh, txi, logi, std, contract, sender, receiver, tid, amount = row
    return TransferRow(
        int(number),
        int(seq),
        bhash,
        int(btime),
        txh,
        int(txi),
        None if logi is None else int(logi),
        std,
        contract,
        sender,
        receiver,
        None if tid is None else int(tid, 16),
        _amount(amount),
    )


def _write(bulk: Bulk, writes: ledger.Writes) -> None:
    """Upsert the rows that hold a value, delete the ones that became zero."""
    bulk.upsert(BALANCES, [(h, c, str(v)) for (h, c), v in writes.balances.items() if v != 0])
    bulk.delete(BALANCES, [key for key, v in writes.balances.items() if v == 0])
    bulk.upsert(
        HOLDINGS,
        [(h, c, token_hex(i), str(v)) for (h, c, i), v in writes.holdings.items() if v != 0],
    )
    bulk.delete(
        HOLDINGS, [(h, c, token_hex(i)) for (h, c, i), v in writes.holdings.items() if v == 0]
    )
    bulk.upsert(
        TOKENS,
        [
            (c, token_hex(i), str(row.supply), row.holders)
            for (c, i), row in writes.tokens.items()
            if row.supply != 0 or row.holders != 0
        ],
    )
    bulk.delete(
        TOKENS,
        [
            (c, token_hex(i))
            for (c, i), row in writes.tokens.items()
            if row.supply == 0 and row.holders == 0
        ],
    )
    bulk.upsert(OWNERS, [(c, h, n) for (c, h), n in writes.owners.items() if n != 0])
    bulk.delete(OWNERS, [key for key, n in writes.owners.items() if n == 0])
    bulk.upsert(
        CONTRACTS,
        [
            (
                r.contract,
                r.standard,
                r.first_block,
                r.erc20_transfers,
                r.erc721_transfers,
                r.erc1155_transfers,
                r.holders,
                str(r.supply),
                r.tokens,
                r.owners,
            )
            for r in writes.contracts.values()
            if r is not None
        ],
    )
    bulk.delete(CONTRACTS, [(a,) for a, r in writes.contracts.items() if r is None])


def _transfer_values(chain: str, network: str, block: DecodedBlock) -> Iterable[tuple[object, ...]]:
    for t in block.transfers:
        yield (
            chain,
            network,
            t.block_number,
            t.seq,
            block.hash,
            block.timestamp,
            t.tx_hash,
            t.tx_index,
            t.log_index,
            t.standard,
            t.contract,
            t.sender,
            t.receiver,
            None if t.token_id is None else token_hex(t.token_id),
            str(t.amount),
        )


def _move_cursor(
    tx: Tx,
    where: tuple[str, str],
    expect: IndexCursor | None,
    cursor: IndexCursor,
    now: int,
) -> None:
    chain, network = where
    if expect is None:
        if tx.query("SELECT 1 FROM idx_cursors WHERE chain = ? AND network = ?", where):
            raise IndexConflict(f"{Network(chain, network)}: an index cursor exists already")
        tx.execute(
            "INSERT INTO idx_cursors (chain, network, number, hash, updated_at)"
            " VALUES (?, ?, ?, ?, ?)",
            (chain, network, cursor.number, cursor.hash, now),
        )
        return
    changed = tx.execute(
        "UPDATE idx_cursors SET number = ?, hash = ?, updated_at = ?"
        " WHERE chain = ? AND network = ? AND number = ? AND hash = ?",
        (cursor.number, cursor.hash, now, chain, network, expect.number, expect.hash),
    )
    if changed != 1:
        raise IndexConflict(f"{Network(chain, network)}: the index cursor moved under this writer")


def _undo_above(tx: Tx, bulk: Bulk, where: tuple[str, str], number: int) -> int:
    """Undo every stored transfer above block ``number``; return how many there were."""
    rows = tx.query(
        f"SELECT {_TRANSFER_COLUMNS} FROM idx_transfers"  # noqa: S608 - constants only
        " WHERE chain = ? AND network = ? AND block_number > ?",
        (*where, number),
    )
    transfers = [
        Transfer(
            r.block_number,
            r.seq,
            r.tx_hash,
            r.tx_index,
            r.log_index,
            r.standard,  # type: ignore[arg-type]  # written from a Standard
            r.contract,
            r.sender,
            r.receiver,
            r.token_id,
            r.amount,
        )
        for r in map(_transfer_row, rows)
    ]
    writes = ledger.plan(ledger.effects(transfers, -1), _TxState(bulk), drop_above=number)
    _write(bulk, writes)
    _delete_above(tx, where, number)
    return len(transfers)


def _delete_above(tx: Tx, where: tuple[str, str], number: int) -> None:
    """The undone blocks' transfers and hashes, and the contracts first seen in them."""
    for table, column in (
        ("idx_transfers", "block_number"),
        ("idx_blocks", "number"),
        ("idx_contracts", "first_block"),
    ):
        tx.execute(
            f"DELETE FROM {table} WHERE chain = ? AND network = ? AND {column} > ?",  # noqa: S608
            (*where, number),
        )


class IndexRows(Rows):
    """The index's rows (its state and the read model) over the store engine."""

    # --- the indexer's state -------------------------------------------------------------

    async def load_index(self, chain: str, network: str) -> IndexState:
        """The cursor (None before the first commit) and the recent block hashes."""

        def select(tx: Tx) -> IndexState:
            rows = tx.query(
                "SELECT number, hash FROM idx_cursors WHERE chain = ? AND network = ?",
                (chain, network),
            )
            cursor = IndexCursor(int(rows[0][0]), rows[0][1]) if rows else None
            blocks = tx.query(
                "SELECT number, hash FROM idx_blocks WHERE chain = ? AND network = ?",
                (chain, network),
            )
            return IndexState(cursor, {int(n): h for n, h in blocks})

        result: IndexState = await self.run_transaction(select, write=False)
        return result

    async def commit_index(
        self,
        chain: str,
        network: str,
        *,
        expect: IndexCursor | None,
        cursor: IndexCursor,
        blocks: Sequence[DecodedBlock] = (),
        undo_above: int | None = None,
        keep_from: int = 0,
    ) -> list[ContractRow]:
        """In one transaction: move the cursor from ``expect`` to ``cursor`` (else
        IndexConflict), undo every block above ``undo_above``, apply ``blocks`` (in order,
        above ``undo_above`` or the old cursor), keep recent hashes from ``keep_from`` up.
        Returns the contracts seen for the first time."""
        _check_chain(expect, cursor, blocks, undo_above)
        where = (chain, network)
        now = self.clock()

        merged = self.backend == "postgres"

        def commit(tx: Tx) -> list[ContractRow]:
            if merged:
                # Derived rows and their cursor commit together: a server crash that loses
                # the last commits loses both, and they are indexed again from the node.  No
                # need to wait for the WAL flush.
                tx.execute("SET LOCAL synchronous_commit = off")
                # The merges' estimated costs are guesses (see pgmerge): never pay JIT for them.
                tx.execute("SET LOCAL jit = off")
            _move_cursor(tx, where, expect, cursor, now)
            bulk = bulk_for(tx, where)  # one per transaction: it owns the staging tables
            if undo_above is not None:
                if merged:
                    pgmerge.merge(
                        tx, where, undo_above, pgmerge.NO_END, sign=-1, drop_above=undo_above
                    )
                    _delete_above(tx, where, undo_above)
                else:
                    _undo_above(tx, bulk, where, undo_above)
            bulk.insert(
                "idx_transfers",
                _TRANSFER_INSERT,
                [row for b in blocks for row in _transfer_values(chain, network, b)],
            )
            if merged:
                # The ledger in SQL, from the rows just copied: no state comes back to Python.
                new_contracts = (
                    pgmerge.merge(tx, where, blocks[0].number - 1, blocks[-1].number, sign=1)
                    if blocks
                    else []
                )
            else:
                transfers = [t for b in blocks for t in b.transfers]
                writes = ledger.plan(ledger.effects(transfers), _TxState(bulk))
                _write(bulk, writes)
                new_contracts = writes.new_contracts
            tx.execute(
                "DELETE FROM idx_blocks WHERE chain = ? AND network = ? AND number < ?",
                (chain, network, keep_from),
            )
            bulk.insert(
                "idx_blocks",
                ("chain", "network", "number", "hash", "parent_hash"),
                [
                    (chain, network, b.number, b.hash, b.parent_hash)
                    for b in blocks
                    if b.number >= keep_from
                ],
            )
            return new_contracts

        result: list[ContractRow] = await self.run_transaction(commit)
        return result

    # --- the read model --------------------------------------------------------------------

    async def _read(self, fn: Callable[[Tx], T]) -> T:
        snapshot = self.backend == "postgres"

        def run(tx: Tx) -> T:
            if snapshot:
                tx.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            return fn(tx)

        return await self.run_transaction(run, write=False)

    async def index_cursor(self, chain: str, network: str) -> IndexCursor | None:
        def select(tx: Tx) -> IndexCursor | None:
            return _cursor(tx, (chain, network))

        result: IndexCursor | None = await self._read(select)
        return result

    async def index_balances(
        self, chain: str, network: str, holder: str, offset: int, limit: int
    ) -> tuple[IndexCursor | None, int, list[tuple[str, int]]]:
        """Positive ERC-20 balances of ``holder``: (cursor, total, page of (contract, balance))
        in contract order, contracts known not to be ERC-20s left out of both."""
        params = (chain, network, holder)
        # One filter for the page and its total: the count is what the pages hold.
        filters = (
            "b.chain = ? AND b.network = ? AND b.holder = ? AND b.balance NOT LIKE '-%'"
            " AND NOT EXISTS (SELECT 1 FROM idx_not_erc20 n WHERE n.chain = b.chain"
            " AND n.network = b.network AND n.contract = b.contract)"
        )

        def select(tx: Tx) -> tuple[IndexCursor | None, int, list[tuple[str, int]]]:
            total = tx.query(
                f"SELECT COUNT(*) FROM idx_balances b WHERE {filters}",  # noqa: S608
                params,
            )
            rows = tx.query(
                f"SELECT b.contract, b.balance FROM idx_balances b WHERE {filters}"  # noqa: S608
                " ORDER BY b.contract LIMIT ? OFFSET ?",
                (*params, limit, offset),
            )
            page = [(c, _amount(b)) for c, b in rows]
            return _cursor(tx, (chain, network)), int(total[0][0]), page

        result: tuple[IndexCursor | None, int, list[tuple[str, int]]] = await self._read(select)
        return result

    async def set_erc20_verdicts(
        self, chain: str, network: str, listed: Mapping[str, bool]
    ) -> None:
        """What the metadata service found (lowercase contract -> whether balance lists show
        it): the ones found not to be ERC-20s are left out from now on, the others shown."""
        if not listed:
            return
        shown = sorted(c for c, keep in listed.items() if keep)
        hidden = sorted(c for c, keep in listed.items() if not keep)

        def write(tx: Tx) -> None:
            for start in range(0, len(shown), _CHUNK):
                chunk = shown[start : start + _CHUNK]
                tx.execute(
                    "DELETE FROM idx_not_erc20 WHERE chain = ? AND network = ?"  # noqa: S608
                    f" AND contract IN ({', '.join('?' * len(chunk))})",
                    (chain, network, *chunk),
                )
            if hidden:
                tx.executemany(
                    "INSERT INTO idx_not_erc20 (chain, network, contract) VALUES (?, ?, ?)"
                    " ON CONFLICT (chain, network, contract) DO NOTHING",
                    [(chain, network, contract) for contract in hidden],
                )

        await self.run_transaction(write)

    async def index_nfts_owned(
        self, chain: str, network: str, holder: str, offset: int, limit: int
    ) -> tuple[IndexCursor | None, int, list[tuple[str, int, int, ContractRow]]]:
        """NFTs ``holder`` holds: (cursor, total, page of (contract, token id, quantity,
        contract row)) in (contract, token id) order."""
        params = (chain, network, holder)
        filters = "h.chain = ? AND h.network = ? AND h.holder = ? AND h.quantity NOT LIKE '-%'"

        def select(tx: Tx) -> tuple[IndexCursor | None, int, list[Any]]:
            total = tx.query(
                f"SELECT COUNT(*) FROM idx_nft_holdings h WHERE {filters}",  # noqa: S608
                params,
            )
            rows = tx.query(
                f"SELECT h.token_id, h.quantity, {_CONTRACT_COLUMNS_T}"  # noqa: S608
                " FROM idx_nft_holdings h JOIN idx_contracts t ON t.chain = h.chain"
                " AND t.network = h.network AND t.contract = h.contract"
                f" WHERE {filters} ORDER BY h.contract, h.token_id LIMIT ? OFFSET ?",
                (*params, limit, offset),
            )
            page = [(row[2], int(row[0], 16), _amount(row[1]), _contract(row[2:])) for row in rows]
            return _cursor(tx, (chain, network)), int(total[0][0]), page

        result: tuple[IndexCursor | None, int, list[Any]] = await self._read(select)
        return result

    async def index_contract(
        self, chain: str, network: str, contract: str
    ) -> tuple[IndexCursor | None, ContractRow | None]:
        def select(tx: Tx) -> tuple[IndexCursor | None, ContractRow | None]:
            rows = tx.query(
                f"SELECT {_CONTRACT_COLUMNS} FROM idx_contracts"  # noqa: S608
                " WHERE chain = ? AND network = ? AND contract = ?",
                (chain, network, contract),
            )
            return _cursor(tx, (chain, network)), _contract(rows[0]) if rows else None

        result: tuple[IndexCursor | None, ContractRow | None] = await self._read(select)
        return result

    async def index_token(
        self, chain: str, network: str, contract: str, token_id: int, offset: int, limit: int
    ) -> tuple[IndexCursor | None, ContractRow | None, TokenRow | None, list[tuple[str, int]]]:
        """One NFT: its contract, its supply and holder count, and a page of its holders
        (positive quantities, in address order)."""
        token = token_hex(token_id)

        def select(
            tx: Tx,
        ) -> tuple[IndexCursor | None, ContractRow | None, TokenRow | None, list[tuple[str, int]]]:
            where = (chain, network)
            contracts = tx.query(
                f"SELECT {_CONTRACT_COLUMNS} FROM idx_contracts"  # noqa: S608
                " WHERE chain = ? AND network = ? AND contract = ?",
                (*where, contract),
            )
            tokens = tx.query(
                "SELECT supply, holders FROM idx_nft_tokens"
                " WHERE chain = ? AND network = ? AND contract = ? AND token_id = ?",
                (*where, contract, token),
            )
            holders = tx.query(
                "SELECT holder, quantity FROM idx_nft_holdings WHERE chain = ? AND network = ?"
                " AND contract = ? AND token_id = ? AND quantity NOT LIKE '-%'"
                " ORDER BY holder LIMIT ? OFFSET ?",
                (*where, contract, token, limit, offset),
            )
            return (
                _cursor(tx, where),
                _contract(contracts[0]) if contracts else None,
                TokenRow(_amount(tokens[0][0]), int(tokens[0][1])) if tokens else None,
                [(h, _amount(q)) for h, q in holders],
            )

        return await self._read(select)

    async def index_transfers(
        self,
        chain: str,
        network: str,
        address: str,
        *,
        direction: Direction = "any",
        contract: str | None = None,
        from_block: int | None = None,
        to_block: int | None = None,
        before: tuple[int, int] | None = None,
        limit: int = 50,
    ) -> tuple[IndexCursor | None, list[TransferRow]]:
        """Transfers of ``address`` newest first, strictly before position ``before``
        (block number, seq) when given."""
        conditions = ["chain = ?", "network = ?"]
        params: list[object] = [chain, network]
        if contract is not None:
            conditions.append("contract = ?")
            params.append(contract)
        if from_block is not None:
            conditions.append("block_number >= ?")
            params.append(from_block)
        if to_block is not None:
            conditions.append("block_number <= ?")
            params.append(to_block)
        if before is not None:
            conditions.append("(block_number, seq) < (?, ?)")
            params.extend(before)
        order = "ORDER BY block_number DESC, seq DESC LIMIT ?"
        parts = []
        all_params: list[object] = []
        sides = {"out": ["sender"], "in": ["receiver"], "any": ["sender", "receiver"]}[direction]
        for column in sides:
            where = " AND ".join([*conditions, f"{column} = ?"])
            parts.append(
                f"SELECT * FROM (SELECT {_TRANSFER_COLUMNS} FROM idx_transfers"  # noqa: S608
                f" WHERE {where} {order}) AS {column}_side"
            )
            all_params.extend([*params, address, limit])
        # UNION (not ALL): a transfer to oneself is on both sides and listed once.
        sql = " UNION ".join(parts) + f" {order}"
        all_params.append(limit)

        def select(tx: Tx) -> tuple[IndexCursor | None, list[TransferRow]]:
            rows = tx.query(sql, all_params)
            return _cursor(tx, (chain, network)), [_transfer_row(r) for r in rows]

        result: tuple[IndexCursor | None, list[TransferRow]] = await self._read(select)
        return result

    async def index_contracts_seen(
        self, chain: str, network: str, after: tuple[int, str] | None, limit: int
    ) -> list[ContractRow]:
        """Token contracts in order of first appearance, strictly after (first block, address)."""
        params: list[object] = [chain, network]
        condition = ""
        if after is not None:
            condition = " AND (first_block, contract) > (?, ?)"
            params.extend(after)

        def select(tx: Tx) -> list[ContractRow]:
            rows = tx.query(
                f"SELECT {_CONTRACT_COLUMNS} FROM idx_contracts"  # noqa: S608
                f" WHERE chain = ? AND network = ?{condition}"
                " ORDER BY first_block, contract LIMIT ?",
                (*params, limit),
            )
            return [_contract(r) for r in rows]

        result: list[ContractRow] = await self._read(select)
        return result


def _check_chain(
    expect: IndexCursor | None,
    cursor: IndexCursor,
    blocks: Sequence[DecodedBlock],
    undo_above: int | None,
) -> None:
    """``blocks`` must extend what the commit starts from, one by one, and end at ``cursor``:
    a batch that skips blocks would move the cursor past transfers never applied."""
    if not blocks:
        return
    first = blocks[0]
    if undo_above is not None:
        if first.number != undo_above + 1:
            raise IndexConflict(f"blocks start at {first.number}, not above {undo_above}")
    elif expect is not None and (
        first.number != expect.number + 1 or first.parent_hash != expect.hash
    ):
        raise IndexConflict(f"block {first.number} does not extend the cursor {expect.number}")
    for parent, child in pairwise(blocks):
        if child.number != parent.number + 1 or child.parent_hash != parent.hash:
            raise IndexConflict(f"block {child.number} does not extend block {parent.number}")
    if (blocks[-1].number, blocks[-1].hash) != (cursor.number, cursor.hash):
        raise IndexConflict(f"the cursor {cursor.number} is not the last block's")


def _cursor(tx: Tx, where: tuple[str, str]) -> IndexCursor | None:
    rows = tx.query("SELECT number, hash FROM idx_cursors WHERE chain = ? AND network = ?", where)
    return IndexCursor(int(rows[0][0]), rows[0][1]) if rows else None


# Rows derived from one chain/network: emptied by Store.reset_network.
register_network_table(*INDEX_TABLES)

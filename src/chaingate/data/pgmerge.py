"""The ledger (``chaingate.data.ledger``) as set-based SQL on PostgreSQL: one merge per table.

Applying a batch on PostgreSQL needs no row of state in Python.  The batch's transfers are
COPYed into ``idx_transfers`` first; then each derived table gets one statement that sums the
transfers of a block range (read back from ``idx_transfers`` by its primary key, multiplied by
a sign: +1 applies, -1 undoes), joins the sums to the stored rows, upserts the rows that hold
a value, deletes the ones that became zero, and records which values crossed zero — the same
arithmetic as ``ledger.effects``/``ledger.plan``, on ``numeric`` (exact for any uint256 sum,
printed back as the same decimal text Python's ``str(int)`` gives).  The crossings and
per-contract counters go to two temporary tables of the session (``ON COMMIT DELETE ROWS``:
created once per connection, emptied by every commit); the contracts' merge reads them and
returns the contracts it created, which is all Python gets back.

Order matters exactly as in ``ledger.plan``: balances, holdings (their crossings feed tokens
and owners), tokens, owners, then contracts (every counter).  SQLite keeps the Python ledger:
it has no integer type wide enough to sum uint256 amounts.
"""

from __future__ import annotations

from chaingate.data.ledger import ContractRow
from chaingate.data.transfers import ZERO_ADDRESS
from chaingate.store.tx import Tx

# Above any block number: "to the end" for an undo.
NO_END = 1 << 62

_TEMP_TABLES = (
    "CREATE TEMP TABLE cg_crossed (holder TEXT, contract TEXT, token_id TEXT, c INTEGER)"
    " ON COMMIT DELETE ROWS",
    "CREATE TEMP TABLE cg_counts (contract TEXT, holders BIGINT NOT NULL DEFAULT 0,"
    " supply NUMERIC NOT NULL DEFAULT 0, tokens BIGINT NOT NULL DEFAULT 0,"
    " owners BIGINT NOT NULL DEFAULT 0, erc20 BIGINT NOT NULL DEFAULT 0,"
    " erc721 BIGINT NOT NULL DEFAULT 0, erc1155 BIGINT NOT NULL DEFAULT 0)"
    " ON COMMIT DELETE ROWS",
)

# The transfers of one block range, their amounts signed.  Parameters: sign, chain, network,
# after (exclusive), last (inclusive).
_SOURCE = (
    "SELECT contract, standard, sender, receiver, token_id, amount::numeric * ? AS amount,"
    " block_number, seq FROM idx_transfers"
    " WHERE chain = ? AND network = ? AND block_number > ? AND block_number <= ?"
    " AND contract IS NOT NULL AND standard <> 'native'"
)

_Z = f"'{ZERO_ADDRESS}'"  # a constant of our own, not data


def _sides(keys: str) -> str:
    """Per-key net change from ``src``: the sender loses, the receiver gains (not for the
    zero address: mints come from it, burns go to it)."""
    return (
        f"SELECT {keys}, sum(delta) AS delta FROM ("  # noqa: S608 - constants only
        f"SELECT sender AS holder, contract, token_id, -amount AS delta FROM src"
        f" WHERE sender <> {_Z}"
        f" UNION ALL SELECT receiver, contract, token_id, amount FROM src"
        f" WHERE receiver <> {_Z}) m GROUP BY {keys}"
    )


def _gone(table: str, condition: str) -> str:
    """Delete the looked-up rows whose new value is zero, by the row ids the lookup found (a
    TID scan: no join for the planner to get wrong)."""
    return (
        f"DELETE FROM {table} WHERE ctid = ANY (ARRAY(SELECT row FROM j"  # noqa: S608 - constants
        f" WHERE row IS NOT NULL AND {condition}))"
    )


def _minted(amount: str = "amount") -> str:
    """The change in supply of one transfer: + for a mint, - for a burn, 0 otherwise."""
    return (
        f"CASE WHEN sender = {_Z} AND receiver <> {_Z} THEN {amount}"
        f" WHEN receiver = {_Z} AND sender <> {_Z} THEN -{amount} ELSE 0 END"
    )


# Parameters of each: the source's five, then chain and network for the lookup and the upsert.
_BALANCES = (
    f"WITH src AS ({_SOURCE} AND standard = 'ERC20'),"  # noqa: S608 - constants only
    f" d AS ({_sides('holder, contract')}),"
    " j AS (SELECT d.holder, d.contract, b.row, coalesce(b.balance::numeric, 0) AS before,"
    " coalesce(b.balance::numeric, 0) + d.delta AS after FROM d LEFT JOIN LATERAL"
    " (SELECT ctid AS row, balance FROM idx_balances WHERE chain = ? AND network = ?"
    " AND holder = d.holder AND contract = d.contract LIMIT 1) b ON true WHERE d.delta <> 0),"
    " up AS (INSERT INTO idx_balances (chain, network, holder, contract, balance)"
    " SELECT ?, ?, holder, contract, after::text FROM j WHERE after <> 0"
    " ON CONFLICT (chain, network, holder, contract) DO UPDATE SET balance = excluded.balance),"
    f" gone AS ({_gone('idx_balances', 'after = 0')})"
    " INSERT INTO cg_counts (contract, holders)"
    " SELECT contract, sum(CASE WHEN after > 0 THEN 1 ELSE -1 END) FROM j"
    " WHERE (before > 0) <> (after > 0) GROUP BY contract"
)

_COUNTERS = (
    "INSERT INTO cg_counts (contract, supply, erc20, erc721, erc1155)"  # noqa: S608 - constants only
    f" SELECT contract, sum(CASE WHEN standard = 'ERC20' THEN {_minted()} ELSE 0 END),"
    " count(*) FILTER (WHERE standard = 'ERC20') * ?,"
    " count(*) FILTER (WHERE standard = 'ERC721') * ?,"
    " count(*) FILTER (WHERE standard = 'ERC1155') * ?"
    f" FROM ({_SOURCE}) s GROUP BY contract"
)

_HOLDINGS = (
    f"WITH src AS ({_SOURCE} AND standard IN ('ERC721', 'ERC1155')),"  # noqa: S608 - constants only
    f" d AS ({_sides('holder, contract, token_id')}),"
    " j AS (SELECT d.holder, d.contract, d.token_id, h.row,"
    " coalesce(h.quantity::numeric, 0) AS before,"
    " coalesce(h.quantity::numeric, 0) + d.delta AS after FROM d LEFT JOIN LATERAL"
    " (SELECT ctid AS row, quantity FROM idx_nft_holdings WHERE chain = ? AND network = ?"
    " AND holder = d.holder AND contract = d.contract AND token_id = d.token_id LIMIT 1) h"
    " ON true WHERE d.delta <> 0),"
    " up AS (INSERT INTO idx_nft_holdings (chain, network, holder, contract, token_id, quantity)"
    " SELECT ?, ?, holder, contract, token_id, after::text FROM j WHERE after <> 0"
    " ON CONFLICT (chain, network, holder, contract, token_id)"
    " DO UPDATE SET quantity = excluded.quantity),"
    f" gone AS ({_gone('idx_nft_holdings', 'after = 0')})"
    " INSERT INTO cg_crossed (holder, contract, token_id, c)"
    " SELECT holder, contract, token_id, CASE WHEN after > 0 THEN 1 ELSE -1 END FROM j"
    " WHERE (before > 0) <> (after > 0)"
)

_TOKENS = (
    f"WITH src AS ({_SOURCE} AND standard IN ('ERC721', 'ERC1155')),"  # noqa: S608 - constants only
    " d AS (SELECT contract, token_id, sum(supply) AS supply, sum(holders) AS holders FROM ("
    f"SELECT contract, token_id, {_minted()} AS supply, 0 AS holders FROM src"
    " UNION ALL SELECT contract, token_id, 0, c FROM cg_crossed) m"
    " GROUP BY contract, token_id HAVING sum(supply) <> 0 OR sum(holders) <> 0),"
    " j AS (SELECT d.contract, d.token_id, t.row, coalesce(t.supply::numeric, 0) AS before,"
    " coalesce(t.supply::numeric, 0) + d.supply AS after,"
    " coalesce(t.holders, 0) + d.holders AS holders FROM d LEFT JOIN LATERAL"
    " (SELECT ctid AS row, supply, holders FROM idx_nft_tokens WHERE chain = ? AND network = ?"
    " AND contract = d.contract AND token_id = d.token_id LIMIT 1) t ON true),"
    " up AS (INSERT INTO idx_nft_tokens (chain, network, contract, token_id, supply, holders)"
    " SELECT ?, ?, contract, token_id, after::text, holders FROM j"
    " WHERE after <> 0 OR holders <> 0"
    " ON CONFLICT (chain, network, contract, token_id)"
    " DO UPDATE SET supply = excluded.supply, holders = excluded.holders),"
    f" gone AS ({_gone('idx_nft_tokens', 'after = 0 AND holders = 0')})"
    " INSERT INTO cg_counts (contract, tokens)"
    " SELECT contract, sum(CASE WHEN after > 0 THEN 1 ELSE -1 END) FROM j"
    " WHERE (before > 0) <> (after > 0) GROUP BY contract"
)

_OWNERS = (
    "WITH d AS (SELECT contract, holder, sum(c) AS delta FROM cg_crossed"  # noqa: S608
    " GROUP BY contract, holder HAVING sum(c) <> 0),"
    " j AS (SELECT d.contract, d.holder, o.row, coalesce(o.tokens, 0) AS before,"
    " coalesce(o.tokens, 0) + d.delta AS after FROM d LEFT JOIN LATERAL"
    " (SELECT ctid AS row, tokens FROM idx_nft_owners WHERE chain = ? AND network = ?"
    " AND contract = d.contract AND holder = d.holder LIMIT 1) o ON true),"
    " up AS (INSERT INTO idx_nft_owners (chain, network, contract, holder, tokens)"
    " SELECT ?, ?, contract, holder, after FROM j WHERE after <> 0"
    " ON CONFLICT (chain, network, contract, holder) DO UPDATE SET tokens = excluded.tokens),"
    f" gone AS ({_gone('idx_nft_owners', 'after = 0')})"
    " INSERT INTO cg_counts (contract, owners)"
    " SELECT contract, sum(CASE WHEN after > 0 THEN 1 ELSE -1 END) FROM j"
    " WHERE (before > 0) <> (after > 0) GROUP BY contract"
)

_CONTRACT_VALUES = (
    "standard, first_block, erc20_transfers, erc721_transfers, erc1155_transfers,"
    " holders, supply, tokens, owners"
)

# Parameters: the source's five, chain and network (lookup), chain and network (upsert),
# the drop height (NULL: none) three times.
_CONTRACTS = (
    "WITH n AS (SELECT contract, sum(holders) AS holders, sum(supply) AS supply,"  # noqa: S608
    " sum(tokens) AS tokens, sum(owners) AS owners, sum(erc20) AS erc20,"
    " sum(erc721) AS erc721, sum(erc1155) AS erc1155, min(first) AS first FROM ("
    " SELECT contract, holders, supply, tokens, owners, erc20, erc721, erc1155,"
    " NULL::bigint[] AS first FROM cg_counts"
    " UNION ALL SELECT contract, 0, 0, 0, 0, 0, 0, 0,"
    " ARRAY[block_number, seq, CASE standard WHEN 'ERC20' THEN 0 WHEN 'ERC721' THEN 1 ELSE 2 END]"
    f" FROM ({_SOURCE}) s) m GROUP BY contract),"
    " j AS (SELECT n.contract, t.row, t.row IS NULL AS fresh,"
    " coalesce(t.standard, (ARRAY['ERC20', 'ERC721', 'ERC1155'])[n.first[3] + 1], 'ERC20')"
    " AS standard,"
    " coalesce(t.first_block, n.first[1], 0) AS first_block,"
    " coalesce(t.erc20_transfers, 0) + n.erc20 AS erc20_transfers,"
    " coalesce(t.erc721_transfers, 0) + n.erc721 AS erc721_transfers,"
    " coalesce(t.erc1155_transfers, 0) + n.erc1155 AS erc1155_transfers,"
    " coalesce(t.holders, 0) + n.holders AS holders,"
    " coalesce(t.supply::numeric, 0) + n.supply AS supply,"
    " coalesce(t.tokens, 0) + n.tokens AS tokens,"
    " coalesce(t.owners, 0) + n.owners AS owners"
    " FROM n LEFT JOIN LATERAL (SELECT ctid AS row, * FROM idx_contracts"
    " WHERE chain = ? AND network = ? AND contract = n.contract LIMIT 1) t ON true),"
    f" up AS (INSERT INTO idx_contracts (chain, network, contract, {_CONTRACT_VALUES})"
    f" SELECT ?, ?, contract, {_CONTRACT_VALUES.replace('supply', 'supply::text')} FROM j"
    " WHERE ?::bigint IS NULL OR first_block <= ?::bigint"
    " ON CONFLICT (chain, network, contract) DO UPDATE SET "
    + ", ".join(f"{c.strip()} = excluded.{c.strip()}" for c in _CONTRACT_VALUES.split(","))
    + "),"  # noqa: S608
    " gone AS (DELETE FROM idx_contracts WHERE ctid = ANY (ARRAY(SELECT row FROM j"
    " WHERE row IS NOT NULL AND first_block > ?::bigint)))"
    f" SELECT contract, {_CONTRACT_VALUES} FROM j WHERE fresh ORDER BY contract"
)


def _ensure_temp_tables(tx: Tx) -> None:
    """The session's scratch tables (temporary: no WAL, never seen by another session)."""
    if tx.query("SELECT to_regclass('pg_temp.cg_counts') IS NULL")[0][0]:
        for statement in _TEMP_TABLES:
            tx.execute(statement)


def merge(
    tx: Tx,
    where: tuple[str, str],
    after: int,
    last: int,
    *,
    sign: int,
    drop_above: int | None = None,
) -> list[ContractRow]:
    """Apply (``sign`` 1) or undo (-1) the stored transfers of blocks ``after+1..last`` to
    every derived table; with ``drop_above``, contracts first seen above it are deleted.
    Returns the contracts this merge created (first seen), with their counters."""
    chain, network = where
    source = (sign, chain, network, after, last)
    _ensure_temp_tables(tx)
    tx.execute("DELETE FROM cg_counts")  # a second merge in one transaction (undo, then apply)
    tx.execute("DELETE FROM cg_crossed")
    ours = (chain, network) * 2  # the lookup's, the upsert's
    tx.execute(_BALANCES, (*source, *ours))
    tx.execute(_COUNTERS, (sign, sign, sign, *source))
    tx.execute(_HOLDINGS, (*source, *ours))
    tx.execute(_TOKENS, (*source, *ours))
    tx.execute(_OWNERS, ours)
    rows = tx.query(
        _CONTRACTS,
        (*source, chain, network, chain, network, drop_above, drop_above, drop_above),
    )
    return [
        ContractRow(
            c,
            standard,
            int(first),
            int(t20),
            int(t721),
            int(t1155),
            int(holders),
            int(supply),
            int(tokens),
            int(owners),
        )
        for c, standard, first, t20, t721, t1155, holders, supply, tokens, owners in rows
    ]

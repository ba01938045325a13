"""Rows of ``bundler_receipts``: user operations the EntryPoints' logs report included.

Written by the bundler's follower consumer (``chaingate.bundler.receipts``) for every
``UserOperationEvent`` of a served EntryPoint, keyed by block hash so a replayed block writes
nothing twice and a reorganised one is undone by its hash.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from chaingate.store.base import register_network_table
from chaingate.store.rows import Rows
from chaingate.store.tx import Tx

RECEIPT_TABLES = ("bundler_receipts",)

_COLUMNS = (
    "user_op_hash",
    "block_hash",
    "block_number",
    "tx_hash",
    "entry_point",
    "sender",
    "nonce",
    "paymaster",
    "success",
    "actual_gas_cost",
    "actual_gas_used",
    "reason",
    "logs",
)


class ReceiptRow(msgspec.Struct, frozen=True, kw_only=True):
    user_op_hash: str
    block_hash: str
    block_number: int
    tx_hash: str
    entry_point: str
    sender: str
    nonce: int
    paymaster: str
    success: bool
    actual_gas_cost: int
    actual_gas_used: int
    reason: str
    logs: str  # JSON array


def _values(chain: str, network: str, row: ReceiptRow) -> tuple[Any, ...]:
    return (
        chain,
        network,
        row.user_op_hash,
        row.block_hash,
        row.block_number,
        row.tx_hash,
        row.entry_point,
        row.sender,
        str(row.nonce),
        row.paymaster,
        1 if row.success else 0,
        str(row.actual_gas_cost),
        str(row.actual_gas_used),
        row.reason,
        row.logs,
    )


def _row(values: Sequence[Any]) -> ReceiptRow:
    fields = dict(zip(_COLUMNS, values, strict=True))
    return ReceiptRow(
        user_op_hash=fields["user_op_hash"],
        block_hash=fields["block_hash"],
        block_number=int(fields["block_number"]),
        tx_hash=fields["tx_hash"],
        entry_point=fields["entry_point"],
        sender=fields["sender"],
        nonce=int(fields["nonce"]),
        paymaster=fields["paymaster"],
        success=bool(fields["success"]),
        actual_gas_cost=int(fields["actual_gas_cost"]),
        actual_gas_used=int(fields["actual_gas_used"]),
        reason=fields["reason"],
        logs=fields["logs"],
    )


class BundlerReceiptRows(Rows):
    """The bundler's receipts of included operations over the store engine."""

    async def record_receipts(self, chain: str, network: str, rows: Sequence[ReceiptRow]) -> None:
        if not rows:
            return
        values = [_values(chain, network, row) for row in rows]

        def insert(tx: Tx) -> None:
            tx.executemany(
                f"INSERT INTO bundler_receipts (chain, network, {', '.join(_COLUMNS)})"  # noqa: S608
                f" VALUES ({', '.join('?' * (len(_COLUMNS) + 2))})"
                " ON CONFLICT (chain, network, user_op_hash, block_hash) DO NOTHING",
                values,
            )

        await self.run_transaction(insert)

    async def revert_receipts(self, chain: str, network: str, block_hash: str) -> list[str]:
        """Deletes the receipts of a reorganised block; returns their operations' hashes."""

        def undo(tx: Tx) -> list[str]:
            rows = tx.query(
                "SELECT user_op_hash FROM bundler_receipts"
                " WHERE chain = ? AND network = ? AND block_hash = ?",
                (chain, network, block_hash),
            )
            tx.execute(
                "DELETE FROM bundler_receipts WHERE chain = ? AND network = ? AND block_hash = ?",
                (chain, network, block_hash),
            )
            return [str(r[0]) for r in rows]

        hashes: list[str] = await self.run_transaction(undo)
        return hashes

    async def receipt(self, chain: str, network: str, user_op_hash: str) -> ReceiptRow | None:
        """The operation's receipt in the newest block that holds it (a reorg's old branch is
        deleted when the follower reverts it)."""

        def select(tx: Tx) -> list[tuple[Any, ...]]:
            rows: list[tuple[Any, ...]] = tx.query(
                f"SELECT {', '.join(_COLUMNS)} FROM bundler_receipts"  # noqa: S608
                " WHERE chain = ? AND network = ? AND user_op_hash = ?"
                " ORDER BY block_number DESC LIMIT 1",
                (chain, network, user_op_hash.lower()),
            )
            return rows

        rows = await self.run_transaction(select, write=False)
        return _row(rows[0]) if rows else None


# Rows derived from one chain/network: emptied by Store.reset_network.
register_network_table(*RECEIPT_TABLES)

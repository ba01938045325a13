"""The chain follower's rows: a cursor and a window of recent blocks per chain/network.

A save is one transaction: the blocks that joined, the ones a reorg removed, the pruning of
the window's tail and the cursor move together, so a restart never sees a cursor that
disagrees with the stored blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import msgspec

from chaingate.store.base import register_network_table
from chaingate.store.rows import Rows

T = TypeVar("T")

# The follower's tables: rows derived from one chain/network (Store.reset_network clears them).
CHAIN_TABLES = ("chain_cursors", "chain_blocks")


class ChainCursor(msgspec.Struct, frozen=True):
    number: int
    hash: str
    finalized: int  # -1: nothing finalized yet


class StoredBlock(msgspec.Struct, frozen=True):
    number: int
    hash: str
    parent_hash: str
    body: str  # JSON of chaingate.chain.events.Block


class ChainRows(Rows):
    """The chain follower's rows (cursor and window) over the store engine."""

    async def load_chain(
        self, chain: str, network: str
    ) -> tuple[ChainCursor | None, list[StoredBlock]]:
        """The cursor (None on a first start) and the stored window, oldest block first."""

        def select(tx: Any) -> tuple[ChainCursor | None, list[StoredBlock]]:
            rows = tx.query(
                "SELECT number, hash, finalized FROM chain_cursors WHERE chain = ? AND network = ?",
                (chain, network),
            )
            cursor = ChainCursor(int(rows[0][0]), rows[0][1], int(rows[0][2])) if rows else None
            blocks = tx.query(
                "SELECT number, hash, parent_hash, body FROM chain_blocks"
                " WHERE chain = ? AND network = ? ORDER BY number",
                (chain, network),
            )
            return cursor, [StoredBlock(int(n), h, p, b) for n, h, p, b in blocks]

        result: tuple[ChainCursor | None, list[StoredBlock]] = await self.run_transaction(
            select, write=False
        )
        return result

    async def save_chain(
        self,
        chain: str,
        network: str,
        cursor: ChainCursor,
        added: Sequence[StoredBlock],
        *,
        keep_from: int,
    ) -> None:
        """Move the cursor; store ``added`` (replacing rows at those heights); drop rows above
        the cursor (a reorg to a shorter chain) and below ``keep_from`` (the window's tail)."""
        now = self.clock()
        rows = [(chain, network, b.number, b.hash, b.parent_hash, b.body) for b in added]

        def save(tx: Any) -> None:
            tx.execute(
                "DELETE FROM chain_blocks"
                " WHERE chain = ? AND network = ? AND (number > ? OR number < ?)",
                (chain, network, cursor.number, keep_from),
            )
            if rows:
                tx.execute(
                    "DELETE FROM chain_blocks WHERE chain = ? AND network = ? AND number >= ?",
                    (chain, network, min(b.number for b in added)),
                )
                tx.executemany(
                    "INSERT INTO chain_blocks (chain, network, number, hash, parent_hash, body)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    [r for r in rows if r[2] >= keep_from],
                )
            changed = tx.execute(
                "UPDATE chain_cursors SET number = ?, hash = ?, finalized = ?, updated_at = ?"
                " WHERE chain = ? AND network = ?",
                (cursor.number, cursor.hash, cursor.finalized, now, chain, network),
            )
            if changed == 0:
                tx.execute(
                    "INSERT INTO chain_cursors"
                    " (chain, network, number, hash, finalized, updated_at)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (chain, network, cursor.number, cursor.hash, cursor.finalized, now),
                )

        await self.run_transaction(save)


# Rows derived from one chain/network: emptied by Store.reset_network.
register_network_table(*CHAIN_TABLES)

"""The chain follower's rows: a cursor and a window of recent blocks per chain/network, where
the network's history begins for this deployment (its origin), and the positions of the
follower's consumers that keep no cursor of their own.

A save is one transaction: the blocks that joined, the ones a reorg removed, the pruning of
the window's tail and the cursor move together, so a restart never sees a cursor that
disagrees with the stored blocks.  It is a compare-and-set from the cursor the saver last
wrote or loaded: a process that lost the network's follower role (chaingate.cluster) while a
save was on its way changes nothing, never the new leader's cursor or blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import msgspec

from chaingate.store.base import register_network_table
from chaingate.store.rows import Rows
from chaingate.store.tx import Tx

T = TypeVar("T")

# The follower's tables: rows derived from one chain/network (Store.reset_network clears them).
CHAIN_TABLES = ("chain_cursors", "chain_blocks", "chain_origins", "chain_consumers")


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

        def select(tx: Tx) -> tuple[ChainCursor | None, list[StoredBlock]]:
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

    async def chain_cursor(self, chain: str, network: str) -> tuple[int, str] | None:
        """The stored cursor's (number, hash), without the window: where a new saver starts."""

        def select(tx: Tx) -> tuple[int, str] | None:
            rows = tx.query(
                "SELECT number, hash FROM chain_cursors WHERE chain = ? AND network = ?",
                (chain, network),
            )
            return (int(rows[0][0]), str(rows[0][1])) if rows else None

        found: tuple[int, str] | None = await self.run_transaction(select, write=False)
        return found

    async def save_chain(
        self,
        chain: str,
        network: str,
        cursor: ChainCursor,
        added: Sequence[StoredBlock],
        *,
        keep_from: int,
        expect: tuple[int, str] | None,
    ) -> bool:
        """Move the cursor from ``expect`` (None: no cursor stored yet); store ``added``
        (replacing rows at those heights); drop rows above the cursor (a reorg to a shorter
        chain) and below ``keep_from`` (the window's tail).  False, and nothing changed, when
        the stored cursor is not ``expect`` (another process saved since)."""
        now = self.clock()
        rows = [(chain, network, b.number, b.hash, b.parent_hash, b.body) for b in added]

        def save(tx: Tx) -> bool:
            # The cursor first: its row lock also orders a concurrent saver behind this one.
            if expect is None:
                moved = tx.execute(
                    "INSERT INTO chain_cursors"
                    " (chain, network, number, hash, finalized, updated_at)"
                    " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    (chain, network, cursor.number, cursor.hash, cursor.finalized, now),
                )
            else:
                moved = tx.execute(
                    "UPDATE chain_cursors SET number = ?, hash = ?, finalized = ?, updated_at = ?"
                    " WHERE chain = ? AND network = ? AND number = ? AND hash = ?",
                    (cursor.number, cursor.hash, cursor.finalized, now, chain, network, *expect),
                )
            if moved != 1:
                return False
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
            return True

        saved: bool = await self.run_transaction(save)
        return saved

    async def chain_origin(self, chain: str, network: str) -> int | None:
        """The first block this deployment followed on the network (None: not claimed yet)."""

        def select(tx: Tx) -> int | None:
            rows = tx.query(
                "SELECT number FROM chain_origins WHERE chain = ? AND network = ?",
                (chain, network),
            )
            return int(rows[0][0]) if rows else None

        found: int | None = await self.run_transaction(select, write=False)
        return found

    async def claim_origin(self, chain: str, network: str, number: int) -> int:
        """Record ``number`` as the network's origin unless one is recorded already; the
        origin recorded (the first claim wins: every process agrees on it)."""

        def claim(tx: Tx) -> int:
            tx.execute(
                "INSERT INTO chain_origins (chain, network, number) VALUES (?, ?, ?)"
                " ON CONFLICT DO NOTHING",
                (chain, network, number),
            )
            rows = tx.query(
                "SELECT number FROM chain_origins WHERE chain = ? AND network = ?",
                (chain, network),
            )
            return int(rows[0][0])

        claimed: int = await self.run_transaction(claim)
        return claimed

    async def consumer_position(
        self, consumer: str, chain: str, network: str
    ) -> tuple[int, str] | None:
        """The last block ``consumer`` handled, as it last saved it (None: never saved)."""

        def select(tx: Tx) -> tuple[int, str] | None:
            rows = tx.query(
                "SELECT number, hash FROM chain_consumers"
                " WHERE consumer = ? AND chain = ? AND network = ?",
                (consumer, chain, network),
            )
            return (int(rows[0][0]), str(rows[0][1])) if rows else None

        found: tuple[int, str] | None = await self.run_transaction(select, write=False)
        return found

    async def save_consumer_position(
        self, consumer: str, chain: str, network: str, position: tuple[int, str]
    ) -> None:
        now = self.clock()

        def save(tx: Tx) -> None:
            tx.execute(
                "INSERT INTO chain_consumers (consumer, chain, network, number, hash, updated_at)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (consumer, chain, network) DO UPDATE"
                " SET number = excluded.number, hash = excluded.hash,"
                " updated_at = excluded.updated_at",
                (consumer, chain, network, *position, now),
            )

        await self.run_transaction(save)

    async def claim_consumer_position(
        self, consumer: str, chain: str, network: str, position: tuple[int, str]
    ) -> tuple[int, str]:
        """Save ``position`` for ``consumer`` unless it has one saved already; the one saved
        (the first claim wins: every process agrees on it)."""
        now = self.clock()

        def claim(tx: Tx) -> tuple[int, str]:
            tx.execute(
                "INSERT INTO chain_consumers (consumer, chain, network, number, hash, updated_at)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (consumer, chain, network) DO NOTHING",
                (consumer, chain, network, *position, now),
            )
            rows = tx.query(
                "SELECT number, hash FROM chain_consumers"
                " WHERE consumer = ? AND chain = ? AND network = ?",
                (consumer, chain, network),
            )
            return int(rows[0][0]), str(rows[0][1])

        claimed: tuple[int, str] = await self.run_transaction(claim)
        return claimed


# Rows derived from one chain/network: emptied by Store.reset_network.
register_network_table(*CHAIN_TABLES)

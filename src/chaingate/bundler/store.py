"""Rows of the bundler's mempool (``bundler_ops``) and reputation (``bundler_reputation``).

The service writes every operation through ``save_bundler_entries``: the entries a Mempool
call returned, in one transaction.  A new entry's row is inserted; a known one's lifecycle
columns take the entry's state, so an admission (the new entry, the one it replaced now
``dropped``, those it evicted) and a bundle's moves (its operations submitted, included,
requeued together) are each written whole or not at all.  The accepted ``Entry`` is kept
whole as JSON in ``entry``; the lifecycle columns beside it are authoritative and override
the JSON's copy on load, so a state change never rewrites the JSON.  At start the service
loads the live rows (``bundler_live``) into a new ``Mempool``: a restart loses no accepted
operation.  Finished rows are deleted by age (``bundler_prune``).  ``BundlerRows`` also reads
and writes the receipts of included operations (``receiptstore``): the bundler's one store.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from chaingate.bundler.mempool import FINAL, LIVE, Entry
from chaingate.bundler.receiptstore import BundlerReceiptRows
from chaingate.bundler.reputation import ReputationChanges, ReputationEntry
from chaingate.cluster.roles import RoleKey
from chaingate.cluster.terms import still_current
from chaingate.store.base import register_network_table
from chaingate.store.tx import Tx

BUNDLER_TABLES = ("bundler_ops", "bundler_reputation", "bundler_intents")

MAX_LOAD = 100_000  # a network's live operations loaded at start (the mempool bounds them)

_OP_COLUMNS = (
    "hash",
    "entry_point",
    "version",
    "sender",
    "nonce",
    "max_fee_per_gas",
    "max_priority_fee_per_gas",
    "entry",
    "status",
    "bundle_tx",
    "block_number",
    "block_hash",
    "reason",
    "submitted_at",
    "updated_at",
)
_SELECT_OPS = f"SELECT {', '.join(_OP_COLUMNS)} FROM bundler_ops"  # noqa: S608 - constants only
_LIVE_SQL = "(" + ", ".join(f"'{s}'" for s in LIVE) + ")"
_FINAL_SQL = "(" + ", ".join(f"'{s}'" for s in FINAL) + ")"
# A bounded delete, portable: SQLite has no DELETE ... LIMIT by default, PostgreSQL none.
_PRUNE = (
    "DELETE FROM bundler_ops WHERE chain = ? AND network = ? AND hash IN ("  # noqa: S608
    " SELECT hash FROM bundler_ops WHERE chain = ? AND network = ?"
    f" AND status IN {_FINAL_SQL} AND updated_at < ? LIMIT ?)"
)

# A known row takes only the lifecycle columns: the JSON and the columns fixed at acceptance
# (``submitted_at`` among them) keep what the first write put there.
_LIFECYCLE = ("status", "bundle_tx", "block_number", "block_hash", "reason", "updated_at")
_UPSERT_OP = (
    "INSERT INTO bundler_ops (chain, network, "  # noqa: S608 - constants only
    + ", ".join(_OP_COLUMNS)
    + ") VALUES ("
    + ", ".join("?" * (len(_OP_COLUMNS) + 2))
    + ") ON CONFLICT (chain, network, hash) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _LIFECYCLE)
)

_INTENT = (
    "INSERT INTO bundler_intents (chain, network, tx_hash, nonce, raw, term, created_at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (chain, network, tx_hash) DO NOTHING"
)
_PRUNE_INTENTS = "DELETE FROM bundler_intents WHERE chain = ? AND network = ? AND created_at < ?"


class Intent(msgspec.Struct, frozen=True):
    """A bundle transaction as signed, recorded before it was sent."""

    tx_hash: str
    nonce: int
    raw: bytes
    term: int


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(Entry)


def _op_values(chain: str, network: str, e: Entry, now: int) -> tuple[Any, ...]:
    return (
        chain,
        network,
        e.hash,
        e.entry_point,
        e.version,
        e.sender,
        str(e.nonce),
        str(e.max_fee_per_gas),
        str(e.max_priority_fee_per_gas),
        _ENCODER.encode(e).decode(),
        e.status,
        e.bundle_tx,
        e.block_number,
        e.block_hash,
        e.reason,
        e.submitted_at,
        e.updated_at or now,
    )


def _entry(row: Sequence[Any]) -> Entry:
    cols = dict(zip(_OP_COLUMNS, row, strict=True))
    entry = _DECODER.decode(cols["entry"])
    return entry.with_(
        status=cols["status"],
        bundle_tx=cols["bundle_tx"],
        block_number=None if cols["block_number"] is None else int(cols["block_number"]),
        block_hash=cols["block_hash"],
        reason=cols["reason"],
        submitted_at=int(cols["submitted_at"]),
        updated_at=int(cols["updated_at"]),
    )


class BundlerRows(BundlerReceiptRows):
    """The bundler's mempool, reputation and receipt rows over the store engine."""

    # --- operations ------------------------------------------------------------------------

    async def save_bundler_entries(
        self,
        chain: str,
        network: str,
        entries: Sequence[Entry],
        *,
        term: int | None = None,
        reputation: ReputationChanges | None = None,
    ) -> bool:
        """Write what Mempool calls returned, in one transaction: a new entry's row is
        inserted, a known one's lifecycle columns take the entry's state (its JSON, fixed at
        acceptance, is not rewritten).  ``term``: only while it is still the newest term of
        the network's ``bundler`` role (False: nothing written, a later leader began).
        ``reputation``: changes written in the same transaction (an admission's: one commit,
        not two, per accepted operation)."""
        if not entries and not reputation:
            return True
        now = self.clock()
        rows = [_op_values(chain, network, e, now) for e in sorted(entries, key=lambda e: e.hash)]
        role = RoleKey("bundler", chain, network)
        also = _reputation_writes(chain, network, reputation, now) if reputation else None

        def upsert(tx: Tx) -> bool:
            if term is not None and not still_current(tx, role, term):
                return False
            if rows:
                tx.executemany(_UPSERT_OP, rows)
            if also is not None:
                also(tx)
            return True

        saved: bool = await self.run_transaction(upsert)
        return saved

    async def record_submission(
        self,
        chain: str,
        network: str,
        entries: Sequence[Entry],
        intent: Intent,
        *,
        fenced: bool,
    ) -> bool:
        """The bundle transaction (``intent``) and its operations, now ``submitted`` under its
        hash, in one transaction, before it is sent.  ``fenced``: only while ``intent.term``
        is still the newest term of the network's ``bundler`` role; False (nothing written)
        when a later leader began meanwhile."""
        now = self.clock()
        rows = [_op_values(chain, network, e, now) for e in sorted(entries, key=lambda e: e.hash)]
        role = RoleKey("bundler", chain, network)
        values = (chain, network, intent.tx_hash, intent.nonce, intent.raw.hex(), intent.term, now)

        def record(tx: Tx) -> bool:
            if fenced and not still_current(tx, role, intent.term):
                return False
            tx.execute(_INTENT, values)
            if rows:
                tx.executemany(_UPSERT_OP, rows)
            return True

        recorded: bool = await self.run_transaction(record)
        return recorded

    async def bundler_intent(self, chain: str, network: str, tx_hash: str) -> Intent | None:
        """The recorded bundle transaction of ``tx_hash``, or None (recorded by no one)."""

        def select(tx: Tx) -> list[tuple[Any, ...]]:
            rows: list[tuple[Any, ...]] = tx.query(
                "SELECT tx_hash, nonce, raw, term FROM bundler_intents"
                " WHERE chain = ? AND network = ? AND tx_hash = ?",
                (chain, network, tx_hash),
            )
            return rows

        rows = await self.run_transaction(select, write=False)
        if not rows:
            return None
        tx_hash, nonce, raw, term = rows[0]
        return Intent(str(tx_hash), int(nonce), bytes.fromhex(str(raw)), int(term))

    async def bundler_get(self, chain: str, network: str, user_op_hash: str) -> Entry | None:
        """One operation in any state (the status method's answer), or None."""

        def select(tx: Tx) -> list[tuple[Any, ...]]:
            rows: list[tuple[Any, ...]] = tx.query(
                f"{_SELECT_OPS} WHERE chain = ? AND network = ? AND hash = ?",
                (chain, network, user_op_hash.lower()),
            )
            return rows

        rows = await self.run_transaction(select, write=False)
        return _entry(rows[0]) if rows else None

    async def bundler_live(self, chain: str, network: str, limit: int = MAX_LOAD) -> list[Entry]:
        """The network's pending and submitted operations, oldest first (loaded at start)."""

        def select(tx: Tx) -> list[tuple[Any, ...]]:
            rows: list[tuple[Any, ...]] = tx.query(
                f"{_SELECT_OPS} WHERE chain = ? AND network = ? AND status IN {_LIVE_SQL}"
                " ORDER BY submitted_at, hash LIMIT ?",
                (chain, network, limit),
            )
            return rows

        return [_entry(r) for r in await self.run_transaction(select, write=False)]

    async def bundler_prune(
        self, chain: str, network: str, before_ms: int, *, limit: int = 10_000
    ) -> int:
        """Delete up to ``limit`` finished rows last changed before ``before_ms``."""

        def prune(tx: Tx) -> int:
            count: int = tx.execute(_PRUNE, (chain, network, chain, network, before_ms, limit))
            tx.execute(_PRUNE_INTENTS, (chain, network, before_ms))
            return count

        deleted: int = await self.run_transaction(prune)
        return deleted

    # --- reputation ------------------------------------------------------------------------

    async def bundler_save_reputation(
        self,
        chain: str,
        network: str,
        upserts: Sequence[ReputationEntry],
        deletes: Sequence[str],
        decayed_at_ms: int,
    ) -> None:
        """What ``Reputation.take_changes`` returned, and the table's last decay time."""
        changes = ReputationChanges(list(upserts), list(deletes), decayed_at_ms)
        await self.run_transaction(_reputation_writes(chain, network, changes, self.clock()))

    async def bundler_load_reputation(
        self, chain: str, network: str, limit: int = MAX_LOAD
    ) -> tuple[list[ReputationEntry], int | None]:
        """(the entries, the last decay time in ms or None if the table is empty)."""

        def select(tx: Tx) -> list[tuple[Any, ...]]:
            rows: list[tuple[Any, ...]] = tx.query(
                "SELECT address, ops_seen, ops_included, decayed_at FROM bundler_reputation"
                " WHERE chain = ? AND network = ? ORDER BY address LIMIT ?",
                (chain, network, limit),
            )
            return rows

        rows = await self.run_transaction(select, write=False)
        entries = [ReputationEntry(str(a), int(s), int(i)) for a, s, i, _ in rows]
        decayed = max((int(r[3]) for r in rows), default=None)
        return entries, decayed

    async def bundler_clear_reputation(self, chain: str, network: str) -> int:
        def clear(tx: Tx) -> int:
            count: int = tx.execute(
                "DELETE FROM bundler_reputation WHERE chain = ? AND network = ?", (chain, network)
            )
            return count

        cleared: int = await self.run_transaction(clear)
        return cleared


# Rows derived from one chain/network: emptied by Store.reset_network.
register_network_table(*BUNDLER_TABLES)


def _reputation_writes(
    chain: str, network: str, changes: ReputationChanges, now: int
) -> Callable[[Tx], None]:
    """The writes of ``changes``, to run in a transaction."""
    decayed_at_ms = changes.decayed_at_ms
    rows = [
        (chain, network, e.address.lower(), e.ops_seen, e.ops_included, decayed_at_ms, now)
        for e in sorted(changes.upserts, key=lambda e: e.address)
    ]
    gone = [(chain, network, a.lower()) for a in sorted(changes.deletes)]

    def save(tx: Tx) -> None:
        if gone:
            tx.executemany(
                "DELETE FROM bundler_reputation WHERE chain = ? AND network = ? AND address = ?",
                gone,
            )
        if rows:
            tx.executemany(
                "INSERT INTO bundler_reputation (chain, network, address, ops_seen,"
                " ops_included, decayed_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (chain, network, address) DO UPDATE SET"
                " ops_seen = excluded.ops_seen, ops_included = excluded.ops_included,"
                " decayed_at = excluded.decayed_at, updated_at = excluded.updated_at",
                rows,
            )
        # Every row carries the table's decay time, so an entity unchanged since an
        # earlier decay is not decayed again for the same hours after a restart.
        tx.execute(
            "UPDATE bundler_reputation SET decayed_at = ? WHERE chain = ? AND network = ?"
            " AND decayed_at < ?",
            (decayed_at_ms, chain, network, decayed_at_ms),
        )

    return save

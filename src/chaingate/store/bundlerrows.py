"""Rows of the bundler's mempool (``bundler_ops``) and reputation (``bundler_reputation``).

An operation's row is written when the mempool accepts it (``bundler_insert``: a replacement
deletes the row it replaces and evictions are marked dropped in the same transaction) and
moved through its lifecycle by ``bundler_update`` (many rows, one transaction: a bundle's
operations become submitted together).  The accepted ``Entry`` is kept whole as JSON in
``entry``; the lifecycle columns beside it are authoritative and override the JSON's copy on
load, so a state change never rewrites the JSON.  At start the service loads the live rows
(``bundler_live``) into a new ``Mempool``: a restart loses no accepted operation.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec

from chaingate.bundler.mempool import FINAL, LIVE, Entry, EntryStatus
from chaingate.bundler.reputation import ReputationEntry

BUNDLER_TABLES = ("bundler_ops", "bundler_reputation")

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
_INSERT_OP = (
    "INSERT INTO bundler_ops (chain, network, "  # noqa: S608 - constants only
    + ", ".join(_OP_COLUMNS)
    + ") VALUES ("
    + ", ".join("?" * (len(_OP_COLUMNS) + 2))
    + ")"
)
_LIVE_SQL = "(" + ", ".join(f"'{s}'" for s in LIVE) + ")"
_FINAL_SQL = "(" + ", ".join(f"'{s}'" for s in FINAL) + ")"
# A bounded delete, portable: SQLite has no DELETE ... LIMIT by default, PostgreSQL none.
_PRUNE = (
    "DELETE FROM bundler_ops WHERE chain = ? AND network = ? AND hash IN ("  # noqa: S608
    " SELECT hash FROM bundler_ops WHERE chain = ? AND network = ?"
    f" AND status IN {_FINAL_SQL} AND updated_at < ? LIMIT ?)"
)

_LIFECYCLE = ("status", "bundle_tx", "block_number", "block_hash", "reason", "updated_at")
_UPSERT_OP = (
    _INSERT_OP
    + " ON CONFLICT (chain, network, hash) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _LIFECYCLE)
)

_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(Entry)


class OpChange(msgspec.Struct, frozen=True, kw_only=True):
    """An operation's new lifecycle state; ``from_status`` (if given) guards the move."""

    hash: str
    status: EntryStatus
    bundle_tx: str | None = None
    block_number: int | None = None
    block_hash: str | None = None
    reason: str | None = None
    updated_at: int = 0  # 0: the store's clock
    from_status: tuple[EntryStatus, ...] = ()

    @classmethod
    def of(cls, entry: Entry, *, from_status: tuple[EntryStatus, ...] = ()) -> OpChange:
        """The change that brings a row to ``entry``'s state (what a Mempool call returned)."""
        return cls(
            hash=entry.hash,
            status=entry.status,
            bundle_tx=entry.bundle_tx,
            block_number=entry.block_number,
            block_hash=entry.block_hash,
            reason=entry.reason,
            updated_at=entry.updated_at,
            from_status=from_status,
        )


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


def _update(tx: Any, chain: str, network: str, change: OpChange, now: int) -> int:
    sql = (
        "UPDATE bundler_ops SET status = ?, bundle_tx = ?, block_number = ?, block_hash = ?,"
        " reason = ?, updated_at = ? WHERE chain = ? AND network = ? AND hash = ?"
    )
    params: list[Any] = [
        change.status,
        change.bundle_tx,
        change.block_number,
        change.block_hash,
        change.reason,
        change.updated_at or now,
        chain,
        network,
        change.hash,
    ]
    if change.from_status:
        sql += " AND status IN (" + ", ".join("?" * len(change.from_status)) + ")"
        params.extend(change.from_status)
    count: int = tx.execute(sql, params)
    return count


class BundlerRows:
    """Mixed into Store; relies on its ``run_transaction`` and ``clock``."""

    run_transaction: Callable[..., Awaitable[Any]]
    clock: Callable[[], int]

    # --- operations ------------------------------------------------------------------------

    async def bundler_insert(
        self,
        chain: str,
        network: str,
        entry: Entry,
        *,
        replaces: str | None = None,
        evicted: Sequence[Entry] = (),
    ) -> bool:
        """Keep a newly accepted operation, in one transaction with what its admission did:
        the row of the operation it ``replaces`` deleted, ``evicted`` ones marked dropped.
        False (and nothing written) if a row with this hash already exists."""
        now = self.clock()

        def insert(tx: Any) -> bool:
            exists = tx.query(
                "SELECT 1 FROM bundler_ops WHERE chain = ? AND network = ? AND hash = ?",
                (chain, network, entry.hash),
            )
            if exists:
                return False
            if replaces is not None:
                tx.execute(
                    "DELETE FROM bundler_ops WHERE chain = ? AND network = ? AND hash = ?",
                    (chain, network, replaces.lower()),
                )
            for gone in evicted:
                _update(tx, chain, network, OpChange.of(gone), now)
            tx.execute(_INSERT_OP, _op_values(chain, network, entry, now))
            return True

        inserted: bool = await self.run_transaction(insert)
        return inserted

    async def save_bundler_entries(
        self, chain: str, network: str, entries: Sequence[Entry]
    ) -> None:
        """Write what Mempool calls returned, in one transaction: a new entry's row is
        inserted, a known one's lifecycle columns take the entry's state (its JSON, fixed at
        acceptance, is not rewritten)."""
        if not entries:
            return
        now = self.clock()
        rows = [_op_values(chain, network, e, now) for e in sorted(entries, key=lambda e: e.hash)]

        def upsert(tx: Any) -> None:
            tx.executemany(_UPSERT_OP, rows)

        await self.run_transaction(upsert)

    async def bundler_update(self, chain: str, network: str, changes: Sequence[OpChange]) -> int:
        """Apply lifecycle changes in one transaction; return how many rows moved (a change
        whose ``from_status`` does not match, or of an unknown hash, moves nothing)."""
        if not changes:
            return 0
        now = self.clock()
        ordered = sorted(changes, key=lambda c: c.hash)  # one lock order for every writer

        def update(tx: Any) -> int:
            return sum(_update(tx, chain, network, c, now) for c in ordered)

        moved: int = await self.run_transaction(update)
        return moved

    async def bundler_get(self, chain: str, network: str, user_op_hash: str) -> Entry | None:
        """One operation in any state (the status method's answer), or None."""

        def select(tx: Any) -> list[tuple[Any, ...]]:
            rows: list[tuple[Any, ...]] = tx.query(
                f"{_SELECT_OPS} WHERE chain = ? AND network = ? AND hash = ?",
                (chain, network, user_op_hash.lower()),
            )
            return rows

        rows = await self.run_transaction(select, write=False)
        return _entry(rows[0]) if rows else None

    async def bundler_live(self, chain: str, network: str, limit: int = MAX_LOAD) -> list[Entry]:
        """The network's pending and submitted operations, oldest first (loaded at start)."""

        def select(tx: Any) -> list[tuple[Any, ...]]:
            rows: list[tuple[Any, ...]] = tx.query(
                f"{_SELECT_OPS} WHERE chain = ? AND network = ? AND status IN {_LIVE_SQL}"
                " ORDER BY submitted_at, hash LIMIT ?",
                (chain, network, limit),
            )
            return rows

        return [_entry(r) for r in await self.run_transaction(select, write=False)]

    async def bundler_by_sender(
        self, chain: str, network: str, sender: str, *, live_only: bool = True, limit: int = 100
    ) -> list[Entry]:
        """A sender's operations (live ones by default), by nonce then age."""
        where = f" AND status IN {_LIVE_SQL}" if live_only else ""

        def select(tx: Any) -> list[tuple[Any, ...]]:
            rows: list[tuple[Any, ...]] = tx.query(
                f"{_SELECT_OPS} WHERE chain = ? AND network = ? AND sender = ?{where}"
                " ORDER BY updated_at DESC, hash LIMIT ?",
                (chain, network, sender.lower(), limit),
            )
            return rows

        found = [_entry(r) for r in await self.run_transaction(select, write=False)]
        return sorted(found, key=lambda e: (e.nonce, e.submitted_at))

    async def bundler_in_bundle(self, chain: str, network: str, bundle_tx: str) -> list[Entry]:
        """The operations a bundle transaction carries (to settle or requeue them)."""

        def select(tx: Any) -> list[tuple[Any, ...]]:
            rows: list[tuple[Any, ...]] = tx.query(
                f"{_SELECT_OPS} WHERE chain = ? AND network = ? AND bundle_tx = ?"
                " ORDER BY hash LIMIT ?",
                (chain, network, bundle_tx.lower(), MAX_LOAD),
            )
            return rows

        return [_entry(r) for r in await self.run_transaction(select, write=False)]

    async def bundler_record_inclusion(
        self,
        chain: str,
        network: str,
        user_op_hash: str,
        *,
        block_number: int,
        block_hash: str,
        tx_hash: str,
    ) -> bool:
        """The EntryPoint logged this operation in a block; False if it is not ours."""
        change = OpChange(
            hash=user_op_hash.lower(),
            status="included",
            bundle_tx=tx_hash.lower(),
            block_number=block_number,
            block_hash=block_hash.lower(),
        )
        return await self.bundler_update(chain, network, [change]) == 1

    async def bundler_revert_block(self, chain: str, network: str, block_hash: str) -> list[str]:
        """A reorg orphaned ``block_hash``: its included operations go back to pending; their
        hashes are returned (for the in-memory pool to follow)."""
        now = self.clock()
        block = block_hash.lower()

        def revert(tx: Any) -> list[str]:
            rows = tx.query(
                "SELECT hash FROM bundler_ops WHERE chain = ? AND network = ? AND block_hash = ?"
                " AND status = 'included' ORDER BY hash",
                (chain, network, block),
            )
            tx.execute(
                "UPDATE bundler_ops SET status = 'pending', bundle_tx = NULL,"
                " block_number = NULL, block_hash = NULL, reason = 'reorged', updated_at = ?"
                " WHERE chain = ? AND network = ? AND block_hash = ? AND status = 'included'",
                (now, chain, network, block),
            )
            return [str(r[0]) for r in rows]

        hashes: list[str] = await self.run_transaction(revert)
        return hashes

    async def bundler_prune(
        self, chain: str, network: str, before_ms: int, *, limit: int = 10_000
    ) -> int:
        """Delete up to ``limit`` finished rows last changed before ``before_ms``."""

        def prune(tx: Any) -> int:
            count: int = tx.execute(_PRUNE, (chain, network, chain, network, before_ms, limit))
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
        now = self.clock()
        rows = [
            (chain, network, e.address.lower(), e.ops_seen, e.ops_included, decayed_at_ms, now)
            for e in sorted(upserts, key=lambda e: e.address)
        ]
        gone = [(chain, network, a.lower()) for a in sorted(deletes)]

        def save(tx: Any) -> None:
            if gone:
                tx.executemany(
                    "DELETE FROM bundler_reputation WHERE chain = ? AND network = ?"
                    " AND address = ?",
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

        await self.run_transaction(save)

    async def bundler_load_reputation(
        self, chain: str, network: str, limit: int = MAX_LOAD
    ) -> tuple[list[ReputationEntry], int | None]:
        """(the entries, the last decay time in ms or None if the table is empty)."""

        def select(tx: Any) -> list[tuple[Any, ...]]:
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
        def clear(tx: Any) -> int:
            count: int = tx.execute(
                "DELETE FROM bundler_reputation WHERE chain = ? AND network = ?", (chain, network)
            )
            return count

        cleared: int = await self.run_transaction(clear)
        return cleared

"""The store engine: errors, ids and clocks, migrations, what resets a network's derived rows,
and the accounts, keys and usage of the auth subsystem, written once in portable SQL.

A backend (``sqlite.py``, ``postgres.py``) only knows how to run a synchronous function inside
one transaction on a worker thread (``run_transaction``) and how to serialize migrations.  SQL
(here and in each subsystem's ``store.py``) uses ``?`` placeholders; the PostgreSQL backend
translates them to ``%s``.
Queries take user data as parameters only — the few SQL strings assembled below are joined
from constants at import time.

The store never sees an API key in clear: callers pass its hash and a display prefix.
"""

from __future__ import annotations

import abc
import re
import secrets
import string
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Self, TypeVar

import msgspec

from chaingate.store import migrate as _migrate
from chaingate.store.tx import Clock as Clock
from chaingate.store.tx import Tx as Tx
from chaingate.store.usagelatency import LatencyDelta as LatencyDelta  # the store's API
from chaingate.store.usagelatency import latency_rows, prune_latency, read_latency, write_latency
from chaingate.store.usagerollups import write_rollups

T = TypeVar("T")

Granularity = Literal["minute", "hour", "day"]
BUCKET_MINUTES: Mapping[str, int] = {"minute": 1, "hour": 60, "day": 1440}

_BASE62 = string.digits + string.ascii_letters


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def new_id(prefix: str) -> str:
    """``prefix`` + 20 random base62 characters (~119 bits): unguessable, collision-free."""
    return prefix + "".join(secrets.choice(_BASE62) for _ in range(20))


class StoreError(Exception):
    """The store cannot do what was asked; the message says why (never with secrets)."""


class DuplicateKey(StoreError):
    """A unique column already holds this value (for API keys: the same key_hash)."""


class UnknownAccount(StoreError):
    """A row refers to an account that does not exist."""


class Account(msgspec.Struct, frozen=True):
    id: str
    email: str
    plan: str
    limits: str | None  # JSON text: per-account overrides of the plan's limits
    created_at: int
    updated_at: int


class KeyRow(msgspec.Struct, frozen=True, kw_only=True):
    account_id: str
    name: str
    prefix: str  # display prefix, e.g. svc_test_Ab12 — never the key
    key_hash: str
    environment: str  # live | test
    scopes: str = ""  # space-separated; '' means all
    # Left empty by callers of insert_key: the store fills them in.
    id: str = ""
    created_at: int = 0
    updated_at: int = 0
    last_used_at: int | None = None
    revoked_at: int | None = None
    allowlists: str | None = None  # JSON (chaingate.auth.allowlists); None: no lists


class UsageDelta(msgspec.Struct, frozen=True):
    """Counts to ADD to one (key, network, method, minute) bucket."""

    key_id: str
    account_id: str
    method: str
    minute: int  # epoch minutes
    requests: int = 0
    compute_units: int = 0
    errors: int = 0
    network: str = ""  # the endpoint's chain/network; '' for REST calls


class UsageLatencyRow(msgspec.Struct, frozen=True):
    period: int  # epoch minutes at the period's start
    network: str
    method: str
    counts: list[int]  # 16


class UsageRow(msgspec.Struct, frozen=True):
    period_start: int  # epoch minutes at the start of the minute/hour/UTC day
    method: str
    requests: int
    compute_units: int
    errors: int


_ACCOUNT_COLUMNS = "id, email, plan, limits, created_at, updated_at"
_KEY_COLUMNS = (
    "id, account_id, name, prefix, key_hash, environment, scopes,"
    " created_at, updated_at, last_used_at, revoked_at, allowlists"
)
_SELECT_ACCOUNT = f"SELECT {_ACCOUNT_COLUMNS} FROM accounts"  # noqa: S608 - constants only
_SELECT_KEY = f"SELECT {_KEY_COLUMNS} FROM api_keys"  # noqa: S608 - constants only

_UPSERT_USAGE = """
INSERT INTO usage_minutes
    (key_id, account_id, network, method, minute, requests, compute_units, errors)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (key_id, network, method, minute) DO UPDATE SET
    requests = usage_minutes.requests + excluded.requests,
    compute_units = usage_minutes.compute_units + excluded.compute_units,
    errors = usage_minutes.errors + excluded.errors
"""

# Integer division then multiplication buckets portably (both engines truncate BIGINT / INT).
_USAGE = """
SELECT (minute / ?) * ? AS period, method,
       SUM(requests), SUM(compute_units), SUM(errors)
FROM usage_minutes
WHERE account_id = ? AND minute >= ? AND minute < ?
GROUP BY period, method
ORDER BY period, method
"""

_DAY_TOTALS = """
SELECT account_id, SUM(requests), SUM(compute_units)
FROM usage_minutes
WHERE minute >= ? AND minute < ?
GROUP BY account_id
"""


def _account(row: tuple[Any, ...]) -> Account:
    return Account(*row)


def _key(row: tuple[Any, ...]) -> KeyRow:
    names = ("id", "account_id", "name", "prefix", "key_hash", "environment", "scopes")
    times = ("created_at", "updated_at", "last_used_at", "revoked_at", "allowlists")
    return KeyRow(**dict(zip(names + times, row, strict=True)))


# Tables of rows derived from one chain/network's data, emptied for it by Store.reset_network.
_NETWORK_TABLES: list[str] = []
_TABLE_NAME = re.compile(r"[a-z_][a-z0-9_]*")


def register_network_table(*tables: str) -> None:
    """Declare tables whose rows ``Store.reset_network`` deletes (see its contract)."""
    for table in tables:
        if not _TABLE_NAME.fullmatch(table):  # names are spliced into SQL: identifiers only
            raise ValueError(f"not a table name: {table!r}")
        if table not in _NETWORK_TABLES:
            _NETWORK_TABLES.append(table)


def network_tables() -> tuple[str, ...]:
    return tuple(_NETWORK_TABLES)


# Columns derived from the chain in rows that are records of their own (a sponsorship outlives
# the chain it was settled on; its settlement does not): set to NULL by Store.reset_network.
_NETWORK_COLUMNS: dict[str, tuple[str, ...]] = {}


def register_network_columns(table: str, *columns: str) -> None:
    """Declare ``table``'s columns that ``Store.reset_network`` forgets (the first one is
    non-NULL exactly when the row holds such state; the rows themselves stay)."""
    for name in (table, *columns):
        if not _TABLE_NAME.fullmatch(name):  # spliced into SQL: identifiers only
            raise ValueError(f"not an identifier: {name!r}")
    if not columns:
        raise ValueError(f"{table}: name the columns to forget")
    _NETWORK_COLUMNS[table] = columns


class ChainClaim(msgspec.Struct, frozen=True):
    """What ``Store.claim_chain`` found and did."""

    previous: str | None  # the identity recorded before (None: none was)
    reset: bool  # the state derived from another chain was reset
    deleted: dict[str, int]  # rows deleted, per table (only tables that had some)


def _delete_network(tx: Tx, chain: str, network: str) -> dict[str, int]:
    deleted = {}
    for table in _NETWORK_TABLES:
        count = tx.execute(
            f"DELETE FROM {table} WHERE chain = ? AND network = ?",  # noqa: S608 - checked names
            (chain, network),
        )
        if count > 0:
            deleted[table] = count
    for table, columns in _NETWORK_COLUMNS.items():
        count = tx.execute(
            f"UPDATE {table} SET {', '.join(f'{c} = NULL' for c in columns)}"  # noqa: S608
            f" WHERE chain = ? AND network = ? AND {columns[0]} IS NOT NULL",
            (chain, network),
        )
        if count > 0:
            deleted[f"{table}.{columns[0]}"] = count  # rows kept, their chain state cleared
    return deleted


class Store(abc.ABC):
    """The store engine: connections, transactions, migrations, and the auth subsystem's
    accounts, keys and usage.  Every other subsystem keeps its rows beside it
    (``chaingate.<subsystem>.store``), built on this engine's ``run_transaction``.

    Use as ``async with store:``.
    """

    backend: str
    # Where the data lives, safe to print (passwords removed).
    display_url: str
    # What this process's sessions are named by (PostgreSQL's application_name), so another
    # process can end them all (chaingate.cluster: a leader silent past its lease).
    session_tag: str = ""

    def __init__(self, *, clock: Clock = now_ms) -> None:
        self.clock = clock

    # --- what a backend provides -----------------------------------------------------------

    @abc.abstractmethod
    async def open(self) -> None:
        """Connect.  Raises StoreError when the database cannot be reached or opened."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Close connections, after operations in flight have finished."""

    @abc.abstractmethod
    async def run_transaction(self, fn: Callable[[Tx], T], *, write: bool = True) -> T:
        """Run ``fn(tx)`` on a worker thread inside one transaction; commit if it returns.

        Cancellation waits for the thread: a transaction is never abandoned half-done.
        """

    @abc.abstractmethod
    def lock_migrations(self, tx: Tx) -> None:
        """Hold, until ``tx`` ends, a lock that every process migrating this database takes."""

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # --- schema ----------------------------------------------------------------------------

    async def migrate(self) -> list[int]:
        """Apply pending migrations in order; return the versions this call applied."""
        return await _migrate.apply_pending(self)

    async def applied_migrations(self) -> list[_migrate.AppliedMigration]:
        return await _migrate.applied(self)

    # --- accounts --------------------------------------------------------------------------

    async def create_account(
        self, email: str, plan: str, limits_json: str | None = None
    ) -> Account:
        now = self.clock()
        account = Account(new_id("acct_"), email, plan, limits_json, now, now)

        def insert(tx: Tx) -> None:
            tx.execute(
                f"INSERT INTO accounts ({_ACCOUNT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",  # noqa: S608
                msgspec.structs.astuple(account),
            )

        await self.run_transaction(insert)
        return account

    async def get_account(self, account_id: str) -> Account | None:
        def select(tx: Tx) -> list[tuple[Any, ...]]:
            return tx.query(f"{_SELECT_ACCOUNT} WHERE id = ?", (account_id,))

        rows = await self.run_transaction(select, write=False)
        return _account(rows[0]) if rows else None

    async def find_account_by_email(self, email: str) -> Account | None:
        """The oldest account with exactly this email (the store does not normalize it)."""

        def select(tx: Tx) -> list[tuple[Any, ...]]:
            return tx.query(
                f"{_SELECT_ACCOUNT} WHERE email = ? ORDER BY created_at, id LIMIT 1", (email,)
            )

        rows = await self.run_transaction(select, write=False)
        return _account(rows[0]) if rows else None

    async def set_plan(self, account_id: str, plan: str, limits_json: str | None) -> bool:
        """Change an account's plan and overrides; False if there is no such account."""
        now = self.clock()

        def update(tx: Tx) -> int:
            return tx.execute(
                "UPDATE accounts SET plan = ?, limits = ?, updated_at = ? WHERE id = ?",
                (plan, limits_json, now, account_id),
            )

        return await self.run_transaction(update) == 1

    async def accounts_changed_since(self, updated_at_ms: int) -> list[Account]:
        """Accounts with updated_at >= the cursor, oldest change first (for polling caches)."""

        def select(tx: Tx) -> list[tuple[Any, ...]]:
            return tx.query(
                f"{_SELECT_ACCOUNT} WHERE updated_at >= ? ORDER BY updated_at, id",
                (updated_at_ms,),
            )

        return [_account(row) for row in await self.run_transaction(select, write=False)]

    # --- API keys --------------------------------------------------------------------------

    async def insert_key(self, row: KeyRow) -> KeyRow:
        """Store a key (hash and prefix only); return it with id and timestamps filled in.

        Raises DuplicateKey if the key_hash exists, UnknownAccount if the account does not.
        """
        now = self.clock()
        key = msgspec.structs.replace(
            row,
            id=row.id or new_id("key_"),
            created_at=row.created_at or now,
            updated_at=row.updated_at or now,
        )
        values = (
            key.id,
            key.account_id,
            key.name,
            key.prefix,
            key.key_hash,
            key.environment,
            key.scopes,
            key.created_at,
            key.updated_at,
            key.last_used_at,
            key.revoked_at,
            key.allowlists,
        )

        def insert(tx: Tx) -> None:
            tx.execute(
                f"INSERT INTO api_keys ({_KEY_COLUMNS})"  # noqa: S608 - constants only
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                values,
            )

        try:
            await self.run_transaction(insert)
        except DuplicateKey as exc:
            raise DuplicateKey(f"an API key with this key_hash (or id) exists: {exc}") from None
        return key

    async def list_keys(self, account_id: str | None = None) -> list[KeyRow]:
        """Keys (revoked ones included) of one account, or of all accounts; oldest first."""

        def select(tx: Tx) -> list[tuple[Any, ...]]:
            if account_id is None:
                return tx.query(f"{_SELECT_KEY} ORDER BY created_at, id")
            return tx.query(
                f"{_SELECT_KEY} WHERE account_id = ? ORDER BY created_at, id", (account_id,)
            )

        return [_key(row) for row in await self.run_transaction(select, write=False)]

    async def revoke_key(self, key_id: str, now_ms: int | None = None) -> bool:
        """Revoke a key; False if there is no such key or it was already revoked."""
        now = self.clock() if now_ms is None else now_ms

        def update(tx: Tx) -> int:
            return tx.execute(
                "UPDATE api_keys SET revoked_at = ?, updated_at = ?"
                " WHERE id = ? AND revoked_at IS NULL",
                (now, now, key_id),
            )

        return await self.run_transaction(update) == 1

    async def update_key_allowlists(
        self, key_id: str, change: Callable[[str | None], str | None]
    ) -> KeyRow | None:
        """Replace a key's allowlists JSON by ``change(current)``, read and written in one
        transaction (two concurrent edits cannot lose each other's lists); the key's
        updated_at moves, so every key registry reloads it.  None if there is no such key."""
        now = self.clock()

        def update(tx: Tx) -> tuple[Any, ...] | None:
            rows = tx.query(f"{_SELECT_KEY} WHERE id = ?", (key_id,))
            if not rows:
                return None
            current = _key(rows[0])
            new = change(current.allowlists)
            tx.execute(
                "UPDATE api_keys SET allowlists = ?, updated_at = ? WHERE id = ?",
                (new, max(now, current.updated_at + 1), key_id),
            )
            return tx.query(f"{_SELECT_KEY} WHERE id = ?", (key_id,))[0]

        row = await self.run_transaction(update)
        return None if row is None else _key(row)

    async def keys_changed_since(self, updated_at_ms: int) -> list[KeyRow]:
        """Keys with updated_at >= the cursor, oldest change first (for polling caches)."""

        def select(tx: Tx) -> list[tuple[Any, ...]]:
            return tx.query(
                f"{_SELECT_KEY} WHERE updated_at >= ? ORDER BY updated_at, id", (updated_at_ms,)
            )

        return [_key(row) for row in await self.run_transaction(select, write=False)]

    async def touch_keys_last_used(self, last_used: Mapping[str, int]) -> None:
        """Record when keys were last used, in one transaction; times only move forward.

        updated_at is left alone on purpose: use is not a change the key caches must reload.
        """
        # Sorted ids: concurrent batches lock rows in the same order, so they cannot deadlock.
        rows = [(ms, key_id, ms) for key_id, ms in sorted(last_used.items())]
        if not rows:
            return

        def update(tx: Tx) -> None:
            tx.executemany(
                "UPDATE api_keys SET last_used_at = ?"
                " WHERE id = ? AND (last_used_at IS NULL OR last_used_at < ?)",
                rows,
            )

        await self.run_transaction(update)

    # --- usage -----------------------------------------------------------------------------

    async def add_usage(
        self, deltas: Sequence[UsageDelta], latency: Sequence[LatencyDelta] = ()
    ) -> None:
        """Add the deltas to their (key, network, method, minute) counters and the latency
        to its (account, network, method) minute, hour and day histograms, all in one
        transaction.  ValueError, with nothing written, for latency counts that are not
        one per bucket."""
        latency_upserts = latency_rows(latency)  # checked before anything is written
        merged: dict[tuple[str, str, str, int], list[Any]] = {}
        for d in deltas:
            slot = merged.get((d.key_id, d.network, d.method, d.minute))
            if slot is None:
                merged[(d.key_id, d.network, d.method, d.minute)] = [
                    d.key_id,
                    d.account_id,
                    d.network,
                    d.method,
                    d.minute,
                    d.requests,
                    d.compute_units,
                    d.errors,
                ]
            else:
                slot[5] += d.requests
                slot[6] += d.compute_units
                slot[7] += d.errors
        # Primary-key order, so concurrent flushes lock rows in one order (no deadlocks).
        rows = [merged[k] for k in sorted(merged)]
        if not rows and not latency_upserts:
            return

        def upsert(tx: Tx) -> None:
            if rows:
                tx.executemany(_UPSERT_USAGE, rows)
                write_rollups(tx, rows)  # the dashboard's hours and days, in the same transaction
            if latency_upserts:
                write_latency(tx, latency_upserts)

        await self.run_transaction(upsert)

    async def usage_latency(
        self, account_id: str, granularity: Granularity, first: int, end: int
    ) -> list[UsageLatencyRow]:
        """An account's latency histograms per period, network and method, periods of the
        granularity in [first, end) (epoch minutes)."""
        size = BUCKET_MINUTES[granularity]

        def select(tx: Tx) -> list[tuple[int, str, str, list[int]]]:
            return read_latency(tx, account_id, size, first, end)

        return [UsageLatencyRow(*row) for row in await self.run_transaction(select, write=False)]

    async def prune_usage_latency(self, now_minute: int) -> int:
        """Delete latency by the minute and by the hour older than the pages read
        (``usagelatency.KEEP_MINUTES``); the rows deleted."""

        def prune(tx: Tx) -> int:
            return prune_latency(tx, now_minute)

        return await self.run_transaction(prune)

    async def usage(
        self,
        account_id: str,
        from_minute: int,
        to_minute: int,
        granularity: Granularity = "minute",
    ) -> list[UsageRow]:
        """Usage of an account over minutes [from_minute, to_minute), per period and method.

        Periods are aligned to the epoch, so "day" means the UTC day.
        """
        size = BUCKET_MINUTES[granularity]
        params = (size, size, account_id, from_minute, to_minute)

        def select(tx: Tx) -> list[tuple[Any, ...]]:
            return tx.query(_USAGE, params)

        rows = await self.run_transaction(select, write=False)
        # int(): PostgreSQL's SUM(BIGINT) is NUMERIC, which arrives as Decimal.
        return [UsageRow(int(p), m, int(r), int(c), int(e)) for p, m, r, c, e in rows]

    async def day_totals(self, day_start_minute: int) -> dict[str, tuple[int, int]]:
        """Per account: (requests, compute units) in the UTC day starting at this minute."""
        params = (day_start_minute, day_start_minute + 1440)

        def select(tx: Tx) -> list[tuple[Any, ...]]:
            return tx.query(_DAY_TOTALS, params)

        rows = await self.run_transaction(select, write=False)
        return {account: (int(r), int(c)) for account, r, c in rows}

    # --- what the store derived from a chain ------------------------------------------------

    async def reset_network(self, chain: str, network: str) -> dict[str, int]:
        """Delete everything the store derived from one chain/network's data, in one
        transaction; return the rows deleted per table (tables that had none are left out).

        The contract for every subsystem that keeps such state (the chain follower's cursor
        and window today; an indexer, wallets, webhooks later): its table has TEXT columns
        ``chain`` and ``network``, and the module that owns it calls
        ``register_network_table("its_table")`` once, at import (or, for columns of rows that
        are records of their own, ``register_network_columns``).  After a reset the subsystem
        finds no rows for that network and must start as on its very first start.  Rows that
        are not derived from the chain (accounts, keys, usage) are never registered.  Called
        when the chain a network serves is not the one the state was built from
        (``claim_chain``); a reset never touches another network's rows.
        """

        def reset(tx: Tx) -> dict[str, int]:
            return _delete_network(tx, chain, network)

        return await self.run_transaction(reset)

    async def chain_identity(self, chain: str, network: str) -> str | None:
        """The identity recorded by the last ``claim_chain`` of this network, if any."""

        def select(tx: Tx) -> list[tuple[Any, ...]]:
            return tx.query(
                "SELECT identity FROM chain_identities WHERE chain = ? AND network = ?",
                (chain, network),
            )

        rows = await self.run_transaction(select, write=False)
        return str(rows[0][0]) if rows else None

    async def claim_chain(self, chain: str, network: str, identity: str) -> ChainClaim:
        """Record that ``chain``/``network`` is now the chain named ``identity`` (opaque here).

        When the store's derived state may come from another chain — another identity is
        recorded, or none is while derived rows exist (state kept before identities were) —
        that state is reset (``reset_network``) in the same transaction, so nothing reads a
        mix of two chains.  The same identity again changes nothing.
        """
        now = self.clock()

        def claim(tx: Tx) -> ChainClaim:
            rows = tx.query(
                "SELECT identity FROM chain_identities WHERE chain = ? AND network = ?",
                (chain, network),
            )
            previous = str(rows[0][0]) if rows else None
            if previous == identity:
                return ChainClaim(previous, False, {})
            deleted = _delete_network(tx, chain, network)
            if previous is None:
                tx.execute(
                    "INSERT INTO chain_identities (chain, network, identity, updated_at)"
                    " VALUES (?, ?, ?, ?)",
                    (chain, network, identity, now),
                )
            else:
                tx.execute(
                    "UPDATE chain_identities SET identity = ?, updated_at = ?"
                    " WHERE chain = ? AND network = ?",
                    (identity, now, chain, network),
                )
            return ChainClaim(previous, previous is not None or bool(deleted), deleted)

        return await self.run_transaction(claim)

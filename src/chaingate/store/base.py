"""The store engine: errors, ids and clocks, migrations, and what resets a network's derived
rows.  Every subsystem keeps its own tables' SQL beside it (``chaingate.<subsystem>.store``),
built on this engine's ``run_transaction`` (``chaingate.store.rows.Rows``).

A backend (``sqlite.py``, ``postgres.py``) only knows how to run a synchronous function inside
one transaction on a worker thread (``run_transaction``) and how to serialize migrations.  SQL
(here and in each subsystem's ``store.py``) uses ``?`` placeholders; the PostgreSQL backend
translates them to ``%s``.
Queries take user data as parameters only — the few SQL strings assembled below are joined
from constants at import time.
"""

from __future__ import annotations

import abc
import re
import secrets
import string
import time
from collections.abc import Callable
from typing import Any, Protocol, Self, TypeVar

import msgspec

from chaingate.store import migrate as _migrate
from chaingate.store.tx import Clock as Clock
from chaingate.store.tx import Tx as Tx

T = TypeVar("T")

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


class Listener(Protocol):
    """A session hearing a channel's notifications (``Store.listener``)."""

    async def run(self) -> None:
        """Listen until cancelled."""


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
    """The store engine: connections, transactions, migrations.  Every subsystem keeps its
    rows beside it (``chaingate.<subsystem>.store``; accounts, keys and usage in
    ``chaingate.auth.store``), built on this engine's ``run_transaction``.

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

    # --- wake-ups across processes sharing the database -----------------------------------

    def notify(self, tx: Tx, channel: str) -> None:
        """In a writing transaction: wake ``channel``'s listeners (``listener``) at commit,
        never for a rolled-back write.  Nothing on a backend no other process shares."""
        return None

    def listener(self, channel: str, wake: Callable[[], None]) -> Listener | None:
        """A session of its own that calls ``wake`` whenever a process sharing the database
        notifies ``channel`` (``nursery.start_soon(listener.run)``); None on a backend no
        other process shares."""
        return None

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

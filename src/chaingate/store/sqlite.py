"""The embedded backend: one SQLite file (stdlib sqlite3) in WAL mode.

One connection, used by one worker thread at a time (a CapacityLimiter of 1).  SQLite lets only
one writer into a database at once anyway, so more connections would only make our own tasks
wait on each other's locks (SQLITE_BUSY) instead of in a fair trio queue; a ``:memory:``
database exists per connection, so tests need exactly one; and trio's worker threads come and
go, so per-thread connections would need their own lifecycle.  Reads queue behind writes,
which is fine: store calls are batched background work (cache polls, usage flushes), never one
per request.  Other processes sharing the file are handled by WAL (readers never block the
writer) and the busy timeout (writers wait for each other instead of failing).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import trio

from chaingate.store.base import Clock, DuplicateKey, Store, StoreError, Tx, UnknownAccount, now_ms
from chaingate.store.guard import Check, current_guard, require

T = TypeVar("T")

MEMORY = ":memory:"
BUSY_TIMEOUT_S = 5.0


def _translate(exc: sqlite3.IntegrityError) -> StoreError:
    # The message names the table and column ("UNIQUE constraint failed: api_keys.key_hash"),
    # never the value.
    if "FOREIGN KEY" in str(exc):
        return UnknownAccount(str(exc))
    if "UNIQUE" in str(exc):
        return DuplicateKey(str(exc))
    return StoreError(str(exc))


class _SqliteTx:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[object] = ()) -> int:
        try:
            return self._conn.execute(sql, params).rowcount
        except sqlite3.IntegrityError as exc:
            raise _translate(exc) from None

    def executemany(self, sql: str, rows: Sequence[Sequence[object]]) -> None:
        try:
            self._conn.executemany(sql, rows)
        except sqlite3.IntegrityError as exc:
            raise _translate(exc) from None

    def query(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        return self._conn.execute(sql, params).fetchall()


MIN_SQLITE = (3, 32, 0)


class SqliteStore(Store):
    backend = "sqlite"

    def __init__(self, path: str, *, clock: Clock = now_ms) -> None:
        super().__init__(clock=clock)
        self.path = path
        # An absolute path or ":memory:"; both print back as the URL they came from.
        self.display_url = f"sqlite://{path}" if path.startswith("/") else f"sqlite:///{path}"
        self._conn: sqlite3.Connection | None = None
        self._limiter = trio.CapacityLimiter(1)

    async def open(self) -> None:
        if self._conn is None:
            self._conn = await trio.to_thread.run_sync(self._connect, limiter=self._limiter)

    def _connect(self) -> sqlite3.Connection:
        if sqlite3.sqlite_version_info < MIN_SQLITE:
            # The index's bulk writes bind thousands of values per statement (999 before 3.32;
            # also UPSERT and row values): refuse at once rather than fail every commit.
            raise StoreError(
                f"SQLite {sqlite3.sqlite_version} is too old: chaingate needs "
                f"{'.'.join(map(str, MIN_SQLITE))} or newer"
            )
        try:
            if self.path != MEMORY:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: no implicit transactions; run_transaction says BEGIN itself.
            # timeout= is sqlite3_busy_timeout: wait for another process's write lock.
            conn = sqlite3.connect(
                self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
            )
            try:
                conn.execute("PRAGMA journal_mode = WAL")
                # Off by default in SQLite; on, so REFERENCES behaves as on PostgreSQL.
                conn.execute("PRAGMA foreign_keys = ON")
            except BaseException:
                conn.close()
                raise
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open SQLite database {self.path}: {exc}") from exc
        return conn

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            # Through the limiter: waits for the operation in flight, if any.
            await trio.to_thread.run_sync(conn.close, limiter=self._limiter)

    async def run_transaction(self, fn: Callable[[Tx], T], *, write: bool = True) -> T:
        if self._conn is None:
            raise StoreError("store is not open (use `async with store:` or `await store.open()`)")
        guard = current_guard() if write else None
        return await trio.to_thread.run_sync(
            self._run_sync, self._conn, fn, write, guard, limiter=self._limiter
        )

    @staticmethod
    def _run_sync(
        conn: sqlite3.Connection, fn: Callable[[Tx], T], write: bool, guard: Check | None
    ) -> T:
        require(guard)
        # IMMEDIATE takes the write lock up front: a deferred transaction that later tries to
        # write can fail with SQLITE_BUSY at once instead of waiting out the busy timeout.
        conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            result = fn(_SqliteTx(conn))
            require(guard)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return result

    def lock_migrations(self, tx: Tx) -> None:
        """Nothing to do: the BEGIN IMMEDIATE of a write transaction is the lock."""

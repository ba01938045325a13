"""The PostgreSQL backend: psycopg 3 (sync API) with a ConnectionPool, driven from trio threads.

Each operation borrows a pooled connection on a worker thread.  The CapacityLimiter is as large
as the pool, so a thread never waits inside the pool for a connection: the waiting happens in
trio, where it can be cancelled.
"""

from __future__ import annotations

import functools
import os
import re
import secrets
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import psycopg
import psycopg.errors
import trio
from psycopg_pool import ConnectionPool

from chaingate.store import notify as wakeups
from chaingate.store.base import Clock, DuplicateKey, Store, StoreError, Tx, UnknownAccount, now_ms
from chaingate.store.guard import Check, current_guard, require

T = TypeVar("T")

CONNECT_TIMEOUT_S = 10
# Key of the advisory lock every migrating process takes: "chaingat" in ASCII.
MIGRATION_LOCK_ID = 0x6368_6169_6E67_6174

# Sessions are named ``chaingate/<tag>`` (the leadership's own: ``chaingate-leases/<tag>``).
APPLICATION = "chaingate"

_QUOTED_OR_MARK = re.compile(r"'(?:[^']|'')*'|\?|%")


@functools.lru_cache(maxsize=256)
def to_pyformat(sql: str) -> str:
    """``?`` placeholders to psycopg's ``%s``; a literal ``%`` becomes ``%%``.

    Question marks inside string literals are left alone.
    """

    def swap(match: re.Match[str]) -> str:
        found = match[0]
        if found == "?":
            return "%s"
        if found == "%":
            return "%%"
        return found.replace("%", "%%")  # a quoted literal: only its % needs escaping

    return _QUOTED_OR_MARK.sub(swap, sql)


def redact(url: str) -> str:
    """The URL without password or query (which may hold one), for printing."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        netloc = netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _translate(exc: psycopg.errors.IntegrityError) -> StoreError:
    # Only the constraint's name: PostgreSQL's own message quotes the offending value.
    constraint = exc.diag.constraint_name or "?"
    if isinstance(exc, psycopg.errors.ForeignKeyViolation):
        return UnknownAccount(f"foreign key violated ({constraint})")
    if isinstance(exc, psycopg.errors.UniqueViolation):
        return DuplicateKey(f"unique constraint violated ({constraint})")
    return StoreError(f"integrity constraint violated ({constraint})")


class _PgTx:
    def __init__(self, cursor: psycopg.Cursor[tuple[Any, ...]]) -> None:
        self._cursor = cursor

    def execute(self, sql: str, params: Sequence[object] = ()) -> int:
        try:
            if params:
                self._cursor.execute(to_pyformat(sql), params)
            else:
                # No parameters: sent as written (migration scripts, DDL).
                self._cursor.execute(sql)
        except psycopg.errors.IntegrityError as exc:
            raise _translate(exc) from None
        return self._cursor.rowcount

    def executemany(self, sql: str, rows: Sequence[Sequence[object]]) -> None:
        try:
            self._cursor.executemany(to_pyformat(sql), rows)  # pipelined by psycopg
        except psycopg.errors.IntegrityError as exc:
            raise _translate(exc) from None

    def query(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        if params:
            self._cursor.execute(to_pyformat(sql), params)
        else:
            self._cursor.execute(sql)
        return self._cursor.fetchall()

    def copy_rows(self, target: str, rows: Iterable[Sequence[object]]) -> None:
        with self._cursor.copy(f"COPY {target} FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)


class PostgresStore(Store):
    backend = "postgres"

    def __init__(self, url: str, *, pool_size: int = 8, clock: Clock = now_ms) -> None:
        super().__init__(clock=clock)
        self.display_url = redact(url)
        self._url = url
        self._pool: ConnectionPool | None = None
        self._pool_size = pool_size
        self._limiter = trio.CapacityLimiter(pool_size)
        # The pid for people, a random token for uniqueness across machines.
        self.session_tag = f"{os.getpid()}-{secrets.token_hex(4)}"

    @property
    def url(self) -> str:
        """The URL connections are made with: for a session of one's own (LISTEN)."""
        return self._url

    async def open(self) -> None:
        if self._pool is None:
            self._pool = await trio.to_thread.run_sync(self._connect, limiter=self._limiter)

    def _connect(self) -> ConnectionPool:
        # One direct connection first: a wrong host, password or database then fails at once
        # with libpq's own message, instead of as a pool timeout.
        try:
            psycopg.connect(self._url, connect_timeout=CONNECT_TIMEOUT_S).close()
        except psycopg.Error as exc:
            raise StoreError(f"cannot connect to PostgreSQL at {self.display_url}: {exc}") from None
        pool = ConnectionPool(
            self._url,
            min_size=1,
            max_size=self._pool_size,
            # Autocommit: each operation opens its own transaction with conn.transaction().
            kwargs={
                "autocommit": True,
                "connect_timeout": CONNECT_TIMEOUT_S,
                "application_name": f"{APPLICATION}/{self.session_tag}",
            },
            # Verify a connection on checkout: one that died (server restart) is replaced
            # instead of failing the operation.
            check=ConnectionPool.check_connection,
            open=False,
        )
        try:
            pool.open(wait=True, timeout=CONNECT_TIMEOUT_S)
        except BaseException:
            pool.close()
            raise
        return pool

    async def aclose(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await trio.to_thread.run_sync(pool.close)

    async def run_transaction(self, fn: Callable[[Tx], T], *, write: bool = True) -> T:
        if self._pool is None:
            raise StoreError("store is not open (use `async with store:` or `await store.open()`)")
        guard = current_guard() if write else None
        return await trio.to_thread.run_sync(
            self._run_sync, self._pool, fn, guard, limiter=self._limiter
        )

    @staticmethod
    def _run_sync(pool: ConnectionPool, fn: Callable[[Tx], T], guard: Check | None) -> T:
        require(guard)
        try:
            with pool.connection() as conn, conn.transaction(), conn.cursor() as cursor:
                result = fn(_PgTx(cursor))
                require(guard)  # raised inside the transaction: rolled back
                return result
        except psycopg.OperationalError as exc:
            # The session died (a server restart, or another process ended it): a store
            # failure to retry, not a bug.
            raise StoreError(f"PostgreSQL session lost: {str(exc).strip()[:200]}") from None

    def lock_migrations(self, tx: Tx) -> None:
        # Transaction-scoped: released by COMMIT/ROLLBACK, so a crash can never leave it held.
        tx.query("SELECT pg_advisory_xact_lock(?)", (MIGRATION_LOCK_ID,))

    def notify(self, tx: Tx, channel: str) -> None:
        wakeups.notify(tx, channel)

    def listener(self, channel: str, wake: Callable[[], None]) -> wakeups.Listener:
        return wakeups.Listener(self._url, channel, wake)

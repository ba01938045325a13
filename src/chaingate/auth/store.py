"""The auth subsystem's rows: accounts, API keys and their usage (per minute, with its hourly
and daily rollups and latency histograms), in portable SQL over the store engine.

Every other subsystem reads them through ``AuthRows`` (the dashboard's pages, the webhooks'
mail), never by naming these tables.  The store never sees an API key in clear: callers pass
its hash and a display prefix.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import msgspec

from chaingate.auth.usagelatency import LatencyDelta as LatencyDelta  # the rows' API
from chaingate.auth.usagelatency import latency_rows, prune_latency, read_latency, write_latency
from chaingate.auth.usagerollups import write_rollups
from chaingate.store.base import DuplicateKey, new_id
from chaingate.store.rows import Rows
from chaingate.store.tx import Tx

Granularity = Literal["minute", "hour", "day"]
BUCKET_MINUTES: Mapping[str, int] = {"minute": 1, "hour": 60, "day": 1440}


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


class AccountSummary(msgspec.Struct, frozen=True):
    """A row of the operator's page: an account, its live keys and its usage of one day."""

    id: str
    email: str
    plan: str
    created_at: int
    active_keys: int = 0
    requests: int = 0
    compute_units: int = 0
    errors: int = 0


class UsageTotal(msgspec.Struct, frozen=True):
    period: int  # epoch minutes
    key_id: str
    method: str
    requests: int
    compute_units: int
    errors: int
    network: str = ""  # chain/network; '' for REST calls and usage metered before 0017


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


def _in(values: Sequence[str]) -> str:
    return ", ".join("?" for _ in values)


def _account(row: tuple[Any, ...]) -> Account:
    return Account(*row)


def _key(row: tuple[Any, ...]) -> KeyRow:
    names = ("id", "account_id", "name", "prefix", "key_hash", "environment", "scopes")
    times = ("created_at", "updated_at", "last_used_at", "revoked_at", "allowlists")
    return KeyRow(**dict(zip(names + times, row, strict=True)))


class AuthRows(Rows):
    """Accounts, keys and usage over a shared engine (``chaingate.store.Store``)."""

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

    async def usage_totals(
        self,
        account_id: str | None,
        granularity: str,
        first: int,
        last: int,
        key_id: str = "",
    ) -> list[UsageTotal]:
        """Usage per period, key, network and method over minutes [first, last): minutes from
        usage_minutes (an hour's worth at most), hours and days from their rollups.
        ``account_id`` None: every account (operators); ``key_id``: that key's only."""
        if granularity == "minute":
            table, period = "usage_minutes", "minute"
        elif granularity == "hour":
            table, period = "usage_hours", "period"
        else:
            table, period = "usage_days", "period"
        where = f"{period} >= ? AND {period} < ?"
        params: tuple[Any, ...] = (first, last)
        if account_id is not None:
            where = "account_id = ? AND " + where
            params = (account_id, first, last)
        if key_id:
            where += " AND key_id = ?"
            params = (*params, key_id)
        sql = (
            f"SELECT {period}, key_id, method, SUM(requests), SUM(compute_units), SUM(errors),"  # noqa: S608
            f" network FROM {table} WHERE {where} GROUP BY {period}, key_id, network, method"
            f" ORDER BY {period}, key_id, network, method"
        )
        rows = await self.run_transaction(lambda tx: tx.query(sql, params), write=False)
        return [
            UsageTotal(int(p), str(k), str(m), int(r), int(c), int(e), str(n))
            for p, k, m, r, c, e, n in rows
        ]

    async def account_summaries(
        self, limit: int, offset: int, day: int, email_contains: str = ""
    ) -> list[AccountSummary]:
        """Accounts newest first, a page at a time, with their live keys and their usage of
        ``day`` (epoch minutes) counted and summed by the database."""

        def read(tx: Any) -> list[AccountSummary]:
            where, params = "", []
            if email_contains:
                where, params = " WHERE LOWER(email) LIKE ?", [f"%{email_contains.lower()}%"]
            accounts = tx.query(
                f"SELECT id, email, plan, created_at FROM accounts{where}"  # noqa: S608
                " ORDER BY created_at DESC, id DESC LIMIT ? OFFSET ?",
                (*params, limit, offset),
            )
            ids = [str(row[0]) for row in accounts]
            if not ids:
                return []
            keys = dict(
                tx.query(
                    "SELECT account_id, COUNT(*) FROM api_keys"  # noqa: S608 - placeholders
                    f" WHERE revoked_at IS NULL AND account_id IN ({_in(ids)})"
                    " GROUP BY account_id",
                    ids,
                )
            )
            usage = {
                row[0]: row[1:]
                for row in tx.query(
                    "SELECT account_id, SUM(requests), SUM(compute_units), SUM(errors)"  # noqa: S608
                    f" FROM usage_days WHERE period = ? AND account_id IN ({_in(ids)})"
                    " GROUP BY account_id",
                    (day, *ids),
                )
            }
            return [
                AccountSummary(
                    str(a),
                    str(email),
                    str(plan),
                    int(created),
                    int(keys.get(a, 0)),
                    *(int(v) for v in usage.get(a, (0, 0, 0))),
                )
                for a, email, plan, created in accounts
            ]

        result: list[AccountSummary] = await self.run_transaction(read, write=False)
        return result

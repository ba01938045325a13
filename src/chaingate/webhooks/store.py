"""The webhook subsystem's rows: subscriptions and the matcher's cursors.

The outbox (``outbox.py``) is written in the same transaction as the matcher's cursor
(``commit_matches``): a crash leaves both as they were, and the replayed block derives the
same event ids, which ``ON CONFLICT DO NOTHING`` keeps once.  ``WebhookRows`` inherits the
outbox's queries, so the service holds one rows object.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from chaingate.config.network import Network
from chaingate.store.base import register_network_table
from chaingate.webhooks.outbox import (
    EVENT_SELECT,
    INSERT_EVENT,
    OUTBOX_CHANNEL,
    NewEvent,
    OutboxRows,
    Render,
    RenderRemoval,
    event_from_row,
    event_values,
    next_sequence,
    write_events,
)

WEBHOOK_TABLES = ("webhook_cursors",)


class WebhookCursorMoved(Exception):
    """The matcher's stored cursor is not where this writer left it (another process led the
    network meanwhile): nothing was written; reload the cursor and go on from there."""


class WebhookLimitReached(Exception):
    """The account has as many webhooks as its limit allows."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"this account already has {limit} webhooks (its limit)")
        self.limit = limit


class WebhookRow(msgspec.Struct, kw_only=True):
    id: str
    account_id: str
    url: str
    chain: str
    network: str
    chain_label: str
    event_type: str
    config: str  # JSON
    confirmations: int
    status: str
    status_reason: str | None
    secret: str
    previous_secret: str | None
    previous_secret_until: int | None
    sequence: int
    matched_from: int | None
    created_at: int
    updated_at: int


_WEBHOOK_COLUMNS = tuple(WebhookRow.__struct_fields__)
_WEBHOOK_SELECT = f"SELECT {', '.join(_WEBHOOK_COLUMNS)} FROM webhooks"  # noqa: S608
_UPDATABLE = frozenset({"url", "status", "config", "confirmations", "status_reason"})
_REFILTERING = frozenset({"status", "config", "confirmations"})


def _webhook(row: Sequence[Any]) -> WebhookRow:
    return WebhookRow(**dict(zip(_WEBHOOK_COLUMNS, row, strict=True)))


def _bump_filters(tx: Any, chain: str, network: str) -> int | None:
    """Bump the network's filters version (locking its cursor row on PostgreSQL until commit)
    and return the first block the matcher will match from now on (None: it has matched
    nothing yet, so from wherever it starts)."""
    changed = tx.execute(
        "UPDATE webhook_cursors SET filters_version = filters_version + 1"
        " WHERE chain = ? AND network = ?",
        (chain, network),
    )
    if changed == 0:
        tx.execute(
            "INSERT INTO webhook_cursors (chain, network, block_number, block_hash,"
            " filters_version) VALUES (?, ?, NULL, NULL, 1)"
            " ON CONFLICT (chain, network) DO UPDATE"
            " SET filters_version = webhook_cursors.filters_version + 1",
            (chain, network),
        )
    rows = tx.query(
        "SELECT block_number FROM webhook_cursors WHERE chain = ? AND network = ?",
        (chain, network),
    )
    number = rows[0][0] if rows else None
    return int(number) + 1 if number is not None else None


class WebhookRows(OutboxRows):
    """Webhooks and their cursors (and, inherited, the delivery outbox) over the store engine."""

    # --- subscriptions ---------------------------------------------------------------------

    async def create_webhook(self, row: WebhookRow, *, limit: int) -> WebhookRow:
        """Insert ``row`` (its ``matched_from`` is set here) unless the account already has
        ``limit`` webhooks (0: no limit): WebhookLimitReached."""

        def insert(tx: Any) -> WebhookRow:
            if limit:
                count = tx.query(
                    "SELECT COUNT(*) FROM webhooks WHERE account_id = ?", (row.account_id,)
                )[0][0]
                if int(count) >= limit:
                    raise WebhookLimitReached(limit)
            stored = msgspec.structs.replace(
                row, matched_from=_bump_filters(tx, row.chain, row.network)
            )
            tx.execute(
                f"INSERT INTO webhooks ({', '.join(_WEBHOOK_COLUMNS)})"  # noqa: S608
                f" VALUES ({', '.join('?' * len(_WEBHOOK_COLUMNS))})",
                [getattr(stored, c) for c in _WEBHOOK_COLUMNS],
            )
            return stored

        created: WebhookRow = await self.run_transaction(insert)
        return created

    async def get_webhook(self, account_id: str, webhook_id: str) -> WebhookRow | None:
        def select(tx: Any) -> WebhookRow | None:
            rows = tx.query(
                f"{_WEBHOOK_SELECT} WHERE id = ? AND account_id = ?", (webhook_id, account_id)
            )
            return _webhook(rows[0]) if rows else None

        found: WebhookRow | None = await self.run_transaction(select, write=False)
        return found

    async def list_webhooks(
        self, account_id: str, status: str | None, *, offset: int, limit: int
    ) -> tuple[list[WebhookRow], int]:
        where = "account_id = ?"
        params: tuple[Any, ...] = (account_id,)
        if status is not None:
            where += " AND status = ?"
            params += (status,)

        def select(tx: Any) -> tuple[list[WebhookRow], int]:
            total = tx.query(f"SELECT COUNT(*) FROM webhooks WHERE {where}", params)[0][0]  # noqa: S608
            rows = tx.query(
                f"{_WEBHOOK_SELECT} WHERE {where} ORDER BY created_at, id LIMIT ? OFFSET ?",
                (*params, limit, offset),
            )
            return [_webhook(r) for r in rows], int(total)

        result: tuple[list[WebhookRow], int] = await self.run_transaction(select, write=False)
        return result

    async def update_webhook(
        self, account_id: str, webhook_id: str, changes: dict[str, Any], now: int
    ) -> WebhookRow | None:
        """Apply ``changes`` (url, status, status_reason, config, confirmations).  A change of
        what is matched (status, config, confirmations) sets ``matched_from``: the first block
        matched with the new settings."""
        unknown = set(changes) - _UPDATABLE
        if unknown:
            raise ValueError(f"not updatable: {sorted(unknown)}")

        def update(tx: Any) -> WebhookRow | None:
            rows = tx.query(
                f"{_WEBHOOK_SELECT} WHERE id = ? AND account_id = ?", (webhook_id, account_id)
            )
            if not rows:
                return None
            current = _webhook(rows[0])
            values = dict(changes)
            if _REFILTERING & set(changes):
                values["matched_from"] = _bump_filters(tx, current.chain, current.network)
            values["updated_at"] = now
            names = sorted(values)
            tx.execute(
                f"UPDATE webhooks SET {', '.join(f'{n} = ?' for n in names)}"  # noqa: S608
                " WHERE id = ?",
                (*[values[n] for n in names], webhook_id),
            )
            return msgspec.structs.replace(current, **values)

        result: WebhookRow | None = await self.run_transaction(update)
        return result

    async def rotate_webhook_secret(
        self, account_id: str, webhook_id: str, secret: str, previous_until: int, now: int
    ) -> WebhookRow | None:
        """The new secret signs from now on; the old one also signs until ``previous_until``."""

        def rotate(tx: Any) -> WebhookRow | None:
            rows = tx.query(
                f"{_WEBHOOK_SELECT} WHERE id = ? AND account_id = ?", (webhook_id, account_id)
            )
            if not rows:
                return None
            current = _webhook(rows[0])
            tx.execute(
                "UPDATE webhooks SET secret = ?, previous_secret = ?, previous_secret_until = ?,"
                " updated_at = ? WHERE id = ?",
                (secret, current.secret, previous_until, now, webhook_id),
            )
            return msgspec.structs.replace(
                current,
                secret=secret,
                previous_secret=current.secret,
                previous_secret_until=previous_until,
                updated_at=now,
            )

        result: WebhookRow | None = await self.run_transaction(rotate)
        return result

    async def delete_webhook(self, account_id: str, webhook_id: str) -> bool:
        """The webhook, its outbox and its delivery log (permanent)."""

        def delete(tx: Any) -> bool:
            rows = tx.query(
                "SELECT chain, network FROM webhooks WHERE id = ? AND account_id = ?",
                (webhook_id, account_id),
            )
            if not rows:
                return False
            _bump_filters(tx, rows[0][0], rows[0][1])
            tx.execute("DELETE FROM webhook_attempts WHERE webhook_id = ?", (webhook_id,))
            tx.execute("DELETE FROM webhook_events WHERE webhook_id = ?", (webhook_id,))
            tx.execute("DELETE FROM webhooks WHERE id = ?", (webhook_id,))
            return True

        deleted: bool = await self.run_transaction(delete)
        return deleted

    # --- the matcher -----------------------------------------------------------------------

    async def load_webhook_filters(
        self, chain: str, network: str
    ) -> tuple[int, tuple[int, str] | None, list[WebhookRow]]:
        """The network's filters version, the matcher's cursor (number, hash) and its active
        webhooks: what one matching pass works from."""

        def select(tx: Any) -> tuple[int, tuple[int, str] | None, list[WebhookRow]]:
            cursor = tx.query(
                "SELECT filters_version, block_number, block_hash FROM webhook_cursors"
                " WHERE chain = ? AND network = ?",
                (chain, network),
            )
            rows = tx.query(
                f"{_WEBHOOK_SELECT} WHERE chain = ? AND network = ? AND status = 'active'"
                " ORDER BY id",
                (chain, network),
            )
            version, number, block_hash = cursor[0] if cursor else (0, None, None)
            at = (int(number), str(block_hash)) if number is not None else None
            return int(version), at, [_webhook(r) for r in rows]

        result: tuple[int, tuple[int, str] | None, list[WebhookRow]]
        result = await self.run_transaction(select, write=False)
        return result

    async def webhook_cursor(self, chain: str, network: str) -> tuple[int, str] | None:
        """The matcher's cursor (number, hash) alone; None: nothing matched yet."""

        def select(tx: Any) -> tuple[int, str] | None:
            rows = tx.query(
                "SELECT block_number, block_hash FROM webhook_cursors"
                " WHERE chain = ? AND network = ? AND block_number IS NOT NULL",
                (chain, network),
            )
            return (int(rows[0][0]), str(rows[0][1])) if rows else None

        found: tuple[int, str] | None = await self.run_transaction(select, write=False)
        return found

    async def commit_matches(
        self,
        chain: str,
        network: str,
        version: int,
        cursor: tuple[int, str],
        events: Sequence[NewEvent],
        render: Render,
        *,
        expect: tuple[int, str] | None,
    ) -> bool:
        """Write ``events`` (those not written before) and move the cursor from ``expect`` to
        ``cursor``, in one transaction — only if the network's filters are still at
        ``version``; False (and nothing written) when they changed: match again with the new
        ones.  ``WebhookCursorMoved`` (nothing written) when the stored cursor is not
        ``expect``."""
        now = self.clock()
        set_based = self.backend == "postgres"

        def commit(tx: Any) -> bool:
            where = (chain, network)
            if _set_cursor(tx, where, expect, cursor, version) == 0:
                row = tx.query(
                    "SELECT filters_version, block_number, block_hash FROM webhook_cursors"
                    " WHERE chain = ? AND network = ?",
                    where,
                )
                if row:
                    at = (int(row[0][1]), str(row[0][2])) if row[0][1] is not None else None
                    if at != expect:
                        raise _cursor_moved(where, expect, tx)
                    return False  # the filters changed
                if expect is not None:
                    raise _cursor_moved(where, expect, tx)
                if version != 0:
                    return False
                # No row yet (no webhook was ever created here): make it, at version 0.
                made = tx.execute(
                    "INSERT INTO webhook_cursors (chain, network, block_number, block_hash,"
                    " filters_version) VALUES (?, ?, ?, ?, 0) ON CONFLICT DO NOTHING",
                    (chain, network, cursor[0], cursor[1]),
                )
                if made == 0:
                    return False
            if write_events(tx, events, render, now, set_based=set_based) and set_based:
                self.store.notify(tx, OUTBOX_CHANNEL)
            return True

        done: bool = await self.run_transaction(commit)
        return done

    async def revert_matches(
        self,
        chain: str,
        network: str,
        block_hash: str,
        parent: tuple[int, str],
        render_removal: RenderRemoval,
        removal_id: Callable[[str], str],
        *,
        expect: tuple[int, str] | None,
    ) -> tuple[int, int]:
        """``block_hash`` left the chain: its events that no attempt has touched are cancelled,
        the others get a compensating event each (sequence after every event so far); the
        cursor moves from ``expect`` to ``parent`` (``WebhookCursorMoved``, nothing done, if
        it is not at ``expect``).  (cancelled, compensated)."""
        now = self.clock()
        set_based = self.backend == "postgres"

        def revert(tx: Any) -> tuple[int, int]:
            # The cursor first: a writer that is not the one this matcher follows changes
            # nothing (and its row lock orders a concurrent writer behind this one).
            if _set_cursor(tx, (chain, network), expect, parent) == 0:
                raise _cursor_moved((chain, network), expect, tx)
            cancelled = tx.execute(
                "UPDATE webhook_events SET state = 'cancelled', finished_at = ?"
                " WHERE chain = ? AND network = ? AND block_hash = ? AND original_id IS NULL"
                " AND state = 'pending' AND attempts = 0 AND lease_until <= ?",
                (now, chain, network, block_hash, now),
            )
            touched = tx.query(
                f"{EVENT_SELECT} WHERE e.chain = ? AND e.network = ? AND e.block_hash = ?"
                " AND e.original_id IS NULL AND e.state <> 'cancelled'"
                " ORDER BY e.webhook_id, e.sequence",
                (chain, network, block_hash),
            )
            compensated = 0
            for row in touched:
                original = event_from_row(row)
                new_id = removal_id(original.id)
                exists = tx.query("SELECT 1 FROM webhook_events WHERE id = ?", (new_id,))
                if exists:
                    continue
                sequence = next_sequence(tx, original.webhook_id, 1)
                if sequence is None:
                    continue  # the webhook was deleted meanwhile
                removal = NewEvent(
                    id=new_id,
                    webhook_id=original.webhook_id,
                    event_type=original.event_type,
                    block_number=original.block_number,
                    block_hash=original.block_hash,
                )
                body = render_removal(original.body, new_id, sequence, now)
                hook = (original.account_id, original.chain, original.network)
                tx.execute(
                    INSERT_EVENT,
                    event_values(removal, hook, sequence, body, now, original_id=original.id),
                )
                compensated += 1
            if compensated and set_based:
                self.store.notify(tx, OUTBOX_CHANNEL)
            return cancelled, compensated

        result: tuple[int, int] = await self.run_transaction(revert)
        return result

    async def matched_blocks(
        self, chain: str, network: str, from_number: int
    ) -> list[tuple[int, str]]:
        """(number, hash) of the blocks at or above ``from_number`` that have events not
        cancelled, newest first: what a matcher coming back checks against the chain."""

        def select(tx: Any) -> list[tuple[int, str]]:
            rows = tx.query(
                "SELECT DISTINCT block_number, block_hash FROM webhook_events"
                " WHERE chain = ? AND network = ? AND block_number >= ?"
                " AND original_id IS NULL AND state <> 'cancelled'"
                " ORDER BY block_number DESC",
                (chain, network, from_number),
            )
            return [(int(n), str(h)) for n, h in rows]

        found: list[tuple[int, str]] = await self.run_transaction(select, write=False)
        return found

    async def move_webhook_cursor(
        self,
        chain: str,
        network: str,
        cursor: tuple[int, str],
        *,
        expect: tuple[int, str] | None,
    ) -> None:
        """Move the matcher's cursor from ``expect`` to ``cursor`` without writing events
        (after undoing orphaned blocks); ``WebhookCursorMoved`` if it is not at ``expect``."""

        def move(tx: Any) -> None:
            if _set_cursor(tx, (chain, network), expect, cursor) == 0:
                raise _cursor_moved((chain, network), expect, tx)

        await self.run_transaction(move)


def _set_cursor(
    tx: Any,
    where: tuple[str, str],
    expect: tuple[int, str] | None,
    cursor: tuple[int, str],
    version: int | None = None,
) -> int:
    """Compare-and-set the network's cursor from ``expect`` to ``cursor`` (and, given a
    ``version``, only at that filters version): the rows changed, 0 or 1."""
    sql = (
        "UPDATE webhook_cursors SET block_number = ?, block_hash = ?"
        " WHERE chain = ? AND network = ?"
    )
    args: list[Any] = [cursor[0], cursor[1], *where]
    if version is not None:
        sql += " AND filters_version = ?"
        args.append(version)
    if expect is None:
        sql += " AND block_number IS NULL"
    else:
        sql += " AND block_number = ? AND block_hash = ?"
        args += [expect[0], expect[1]]
    changed: int = tx.execute(sql, tuple(args))
    return changed


def _stored_cursor(tx: Any, where: tuple[str, str]) -> tuple[int, str] | None:
    rows = tx.query(
        "SELECT block_number, block_hash FROM webhook_cursors WHERE chain = ? AND network = ?",
        where,
    )
    if not rows or rows[0][0] is None:
        return None
    return int(rows[0][0]), str(rows[0][1])


def _cursor_moved(where: tuple[str, str], expect: tuple[int, str] | None, tx: Any) -> Exception:
    at = _stored_cursor(tx, where)
    return WebhookCursorMoved(f"{Network(*where)}: the cursor is at {at}, not {expect}")


# Rows derived from one chain/network: emptied by Store.reset_network.
register_network_table(*WEBHOOK_TABLES)

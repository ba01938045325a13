"""The webhook outbox's rows: events waiting to be sent, their delivery attempts, the quota.

Delivery workers lease due events (``claim_due_events``: ``FOR UPDATE SKIP LOCKED`` on
PostgreSQL, so processes share the outbox; SQLite's one writer serialises claims) and write
each attempt and its outcome in one transaction (``finish_attempts``).  On PostgreSQL a
transaction that writes due events also wakes the other processes' dispatchers at commit
(``Store.notify`` on ``OUTBOX_CHANNEL``).  Events matched on a block are written by the
matcher's cursor move (``store.WebhookRows.commit_matches``) through ``write_events``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from chaingate.auth.store import AuthRows
from chaingate.store.rows import Rows
from chaingate.store.tx import copying

# What a write of due events notifies: every process's dispatcher listens (``service.py``).
OUTBOX_CHANNEL = "chaingate_outbox"

MAX_CLAIM = 1000


class NewEvent(msgspec.Struct, frozen=True, kw_only=True):
    """An event to write; its body is rendered in the transaction, which gives the sequence."""

    id: str
    webhook_id: str
    event_type: str
    block_number: int | None = None
    block_hash: str | None = None
    deliver_at_block: int | None = None
    # Only for the variant's renderer: what the body is made of (a Match, or a ping).
    payload: Any = None


# (event, its sequence number, now) -> the body; run in the store's worker thread.
Render = Callable[[NewEvent, int, int], str]
# (the original event's body, the removal's id, its sequence number, now) -> the body.
RenderRemoval = Callable[[str, str, int, int], str]


class OutboxEvent(msgspec.Struct, kw_only=True):
    id: str
    webhook_id: str
    account_id: str
    chain: str
    network: str
    sequence: int
    event_type: str
    block_number: int | None
    block_hash: str | None
    deliver_at_block: int | None
    original_id: str | None
    body: str
    state: str
    attempts: int
    retries: int
    next_attempt_at: int
    lease_until: int
    created_at: int
    finished_at: int | None
    last_status: int | None
    last_error: str | None


class Due(msgspec.Struct, frozen=True):
    """A leased event and what sending it needs from its webhook."""

    event: OutboxEvent
    url: str
    secret: str
    previous_secret: str | None  # sign with both while the rotation's overlap lasts
    event_type: str


class Attempt(msgspec.Struct, kw_only=True):
    event_id: str
    attempt: int
    webhook_id: str
    started_at: int
    url: str
    request_headers: str  # JSON [[name, value], ...]
    status: int | None
    response_body: str | None
    latency_ms: int
    error: str | None


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    """An attempt and what it decided: ``state`` (pending again with ``next_attempt_at``, or
    delivered/failed), and the webhook's new status when the attempt moved it (paused after
    the last retry in variant A, disabled by a 410)."""

    attempt: Attempt
    state: str
    retries: int
    next_attempt_at: int
    webhook_status: str | None = None
    webhook_status_reason: str | None = None


_EVENT_COLUMNS = tuple(OutboxEvent.__struct_fields__)
EVENT_SELECT = f"SELECT {', '.join('e.' + c for c in _EVENT_COLUMNS)} FROM webhook_events e"  # noqa: S608
_ATTEMPT_COLUMNS = tuple(Attempt.__struct_fields__)
# The claim's plan on PostgreSQL: the due index in order, never a sort of every due row (the
# outbox holds tens of thousands while a backlog drains); no JIT, which compiled the query for
# most of a second per claim once its estimated cost passed jit_above_cost.
_CLAIM_PLAN = (
    "SET LOCAL enable_sort = off",
    "SET LOCAL enable_bitmapscan = off",
    "SET LOCAL jit = off",
)
# A leased row as the claim returns it: lease_until as it was before the lease.
_LEASED_COLUMNS = tuple("e.held_until" if c == "lease_until" else f"e.{c}" for c in _EVENT_COLUMNS)
# PostgreSQL array types of the attempt columns (finish_attempts binds one array per column).
_ATTEMPT_ARRAYS = (
    "text[]",
    "integer[]",
    "text[]",
    "bigint[]",
    "text[]",
    "text[]",
    "integer[]",
    "text[]",
    "integer[]",
    "text[]",
)


def event_from_row(row: Sequence[Any]) -> OutboxEvent:
    return OutboxEvent(**dict(zip(_EVENT_COLUMNS, row, strict=True)))


def _attempt(row: Sequence[Any]) -> Attempt:
    return Attempt(**dict(zip(_ATTEMPT_COLUMNS, row, strict=True)))


_INSERT_EVENT_COLUMNS = (
    "id, webhook_id, account_id, chain, network, sequence, event_type, block_number,"
    " block_hash, deliver_at_block, original_id, body, state, attempts, retries,"
    " next_attempt_at, lease_until, created_at"
)
_EVENT_STAGE = "cg_event_stage"  # a session's scratch table for COPY (PostgreSQL)
INSERT_EVENT = (
    f"INSERT INTO webhook_events ({_INSERT_EVENT_COLUMNS})"  # noqa: S608 - constants only
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', 0, 0, ?, 0, ?)"
)


def event_values(
    event: NewEvent,
    hook: tuple[str, str, str],
    sequence: int,
    body: str,
    now: int,
    original_id: str | None = None,
) -> tuple[Any, ...]:
    account_id, chain, network = hook
    return (
        event.id,
        event.webhook_id,
        account_id,
        chain,
        network,
        sequence,
        event.event_type,
        event.block_number,
        event.block_hash,
        event.deliver_at_block,
        original_id,
        body,
        now,
        now,
    )


class OutboxRows(Rows):
    """The outbox: events written outside a block, leased, attempted, replayed, pruned."""

    async def add_events(self, events: Sequence[NewEvent], render: Render) -> int:
        """Events that come from no block (a ping, a pending transaction): written now, with
        no cursor.  Returns how many were new."""
        now = self.clock()

        set_based = self.backend == "postgres"

        def insert(tx: Any) -> int:
            written = write_events(tx, events, render, now, set_based=set_based)
            if written and set_based:
                self.store.notify(tx, OUTBOX_CHANNEL)
            return written

        count: int = await self.run_transaction(insert)
        return count

    # --- delivery --------------------------------------------------------------------------

    async def claim_due_events(self, now: int, limit: int, lease_ms: int) -> list[Due]:
        """Lease up to ``limit`` events due at ``now`` for ``lease_ms``: pending, of an active
        webhook, past any confirmations, and (a compensating event) once its original is no
        longer pending — oldest due first, then by sequence."""
        limit = max(1, min(limit, MAX_CLAIM))
        # The due ids first, narrow and in the outbox's order (locked, and skipping rows other
        # processes hold, on PostgreSQL), then their rows: sorting whole rows (bodies) is what
        # a planner with stale statistics would otherwise do.
        locking = " FOR UPDATE SKIP LOCKED" if self.backend == "postgres" else ""
        due_ids = (
            "SELECT i.id FROM webhook_events i"  # noqa: S608 - constants only
            " WHERE i.state = 'pending' AND i.next_attempt_at <= ? AND i.lease_until <= ?"
            " AND EXISTS (SELECT 1 FROM webhooks a WHERE a.id = i.webhook_id"
            " AND a.status = 'active')"
            " AND (i.deliver_at_block IS NULL OR i.deliver_at_block <= (SELECT c.block_number"
            " FROM webhook_cursors c WHERE c.chain = i.chain AND c.network = i.network))"
            " AND (i.original_id IS NULL OR NOT EXISTS (SELECT 1 FROM webhook_events o"
            " WHERE o.id = i.original_id AND o.state = 'pending'))"
            f" ORDER BY i.next_attempt_at, i.sequence LIMIT ?{locking}"
        )
        sql = (
            f"SELECT {', '.join('e.' + c for c in _EVENT_COLUMNS)}, w.url, w.secret,"  # noqa: S608
            " w.previous_secret, w.previous_secret_until FROM webhook_events e"
            " JOIN webhooks w ON w.id = e.webhook_id"
            f" WHERE e.id IN ({due_ids}) ORDER BY e.next_attempt_at, e.sequence"
        )

        set_based = self.backend == "postgres"
        if set_based:
            # One statement: lock the due ids, lease them, return their rows (with the lease
            # they had, as the two-step form returns them) and their webhooks'.  The webhook's
            # status is a per-row subquery, not a join: with a join PostgreSQL drove the claim
            # from the webhooks, reading every event of every webhook (the whole outbox, dead
            # rows included) per claim; this way it walks the due index in order and stops at
            # the limit (with sorting and bitmap scans off, and no JIT: see claim()).
            due_ids = due_ids.replace(
                "EXISTS (SELECT 1 FROM webhooks a WHERE a.id = i.webhook_id"
                " AND a.status = 'active')",
                "(SELECT a.status FROM webhooks a WHERE a.id = i.webhook_id) = 'active'",
            )
            assert "EXISTS (SELECT 1 FROM webhooks" not in due_ids
            sql = (
                f"WITH due AS ({due_ids.replace('SELECT i.id', 'SELECT i.id, i.lease_until')}),"  # noqa: S608
                " leased AS (UPDATE webhook_events e SET lease_until = ? FROM due"
                " WHERE e.id = due.id RETURNING e.*, due.lease_until AS held_until)"
                f" SELECT {', '.join(_LEASED_COLUMNS)}, w.url, w.secret,"
                " w.previous_secret, w.previous_secret_until FROM leased e"
                " JOIN webhooks w ON w.id = e.webhook_id ORDER BY e.next_attempt_at, e.sequence"
            )

        def claim(tx: Any) -> list[Due]:
            if set_based:
                for setting in _CLAIM_PLAN:
                    tx.execute(setting)
                rows = tx.query(sql, (now, now, limit, now + lease_ms))
            else:
                rows = tx.query(sql, (now, now, limit))
            if not rows:
                return []
            due = []
            width = len(_EVENT_COLUMNS)
            for row in rows:
                event = event_from_row(row[:width])
                url, secret, previous, until = row[width:]
                due.append(
                    Due(
                        event,
                        url,
                        secret,
                        previous if previous is not None and (until or 0) > now else None,
                        event.event_type,
                    )
                )
            if not set_based:
                tx.executemany(
                    "UPDATE webhook_events SET lease_until = ? WHERE id = ?",
                    [(now + lease_ms, d.event.id) for d in due],
                )
            return due

        claimed: list[Due] = await self.run_transaction(claim)
        return claimed

    async def finish_attempts(self, outcomes: Sequence[Outcome]) -> list[str]:
        """Record attempts and what they decided, all in one transaction.  Returns the ids of
        the webhooks whose status this call moved (from ``active``): of all the processes
        whose attempts exhaust at once, exactly one learns it paused the webhook."""
        if not outcomes:
            return []
        now = self.clock()

        # One outcome per event (an event is held until its outcome is written): then one
        # statement per table on PostgreSQL, arrays in, instead of one per outcome.
        set_based = self.backend == "postgres" and len(
            {o.attempt.event_id for o in outcomes}
        ) == len(outcomes)
        attempts = [[getattr(o.attempt, c) for c in _ATTEMPT_COLUMNS] for o in outcomes]
        updates = [
            (
                o.state,
                o.retries,
                o.next_attempt_at,
                o.attempt.status,
                o.attempt.error,
                now if o.state != "pending" else None,
                o.attempt.event_id,
            )
            for o in outcomes
        ]

        def finish(tx: Any) -> list[str]:
            if set_based:
                tx.execute(
                    f"INSERT INTO webhook_attempts ({', '.join(_ATTEMPT_COLUMNS)})"  # noqa: S608
                    " SELECT * FROM unnest("
                    + ", ".join(f"?::{t}" for t in _ATTEMPT_ARRAYS)
                    + ") ON CONFLICT (event_id, attempt) DO NOTHING",
                    [list(column) for column in zip(*attempts, strict=True)],
                )
                tx.execute(
                    "UPDATE webhook_events e SET state = d.state, attempts = e.attempts + 1,"
                    " retries = d.retries, next_attempt_at = d.next, lease_until = 0,"
                    " last_status = d.status, last_error = d.error, finished_at = d.finished"
                    " FROM unnest(?::text[], ?::integer[], ?::bigint[], ?::integer[],"
                    " ?::text[], ?::bigint[], ?::text[])"
                    " AS d(state, retries, next, status, error, finished, id) WHERE e.id = d.id",
                    [list(column) for column in zip(*updates, strict=True)],
                )
            else:
                tx.executemany(
                    f"INSERT INTO webhook_attempts ({', '.join(_ATTEMPT_COLUMNS)})"  # noqa: S608
                    f" VALUES ({', '.join('?' * len(_ATTEMPT_COLUMNS))})"
                    " ON CONFLICT (event_id, attempt) DO NOTHING",
                    attempts,
                )
                tx.executemany(
                    "UPDATE webhook_events SET state = ?, attempts = attempts + 1,"
                    " retries = ?, next_attempt_at = ?, lease_until = 0, last_status = ?,"
                    " last_error = ?, finished_at = ? WHERE id = ?",
                    updates,
                )
            moved = []
            for o in outcomes:
                if o.webhook_status is None:
                    continue
                changed = tx.execute(
                    "UPDATE webhooks SET status = ?, status_reason = ?, updated_at = ?"
                    " WHERE id = ? AND status = 'active'",
                    (o.webhook_status, o.webhook_status_reason, now, o.attempt.webhook_id),
                )
                if changed == 1:
                    moved.append(o.attempt.webhook_id)
            return moved

        moved: list[str] = await self.run_transaction(finish)
        return moved

    async def hold_events(self, event_ids: Sequence[str], until: int) -> None:
        """Give leased events back, due again at ``until`` (a quota reached, a shutdown)."""
        if not event_ids:
            return

        set_based = self.backend == "postgres"
        # Given back due now (a shutdown): the other processes may take them at once.
        due_now = until <= self.clock()

        def hold(tx: Any) -> None:
            if set_based:
                tx.execute(
                    "UPDATE webhook_events SET lease_until = 0, next_attempt_at = ?"
                    " WHERE id = ANY(?::text[])",
                    (until, list(event_ids)),
                )
                if due_now:
                    self.store.notify(tx, OUTBOX_CHANNEL)
                return
            tx.executemany(
                "UPDATE webhook_events SET lease_until = 0, next_attempt_at = ? WHERE id = ?",
                [(until, event_id) for event_id in event_ids],
            )

        await self.run_transaction(hold)

    async def take_delivery_quota(self, account_id: str, day: int, limit: int) -> bool:
        """Count one delivery of the account's ``day`` if fewer than ``limit`` were counted."""

        def take(tx: Any) -> bool:
            tx.execute(
                "INSERT INTO webhook_quota (account_id, day, deliveries) VALUES (?, ?, 0)"
                " ON CONFLICT (account_id, day) DO NOTHING",
                (account_id, day),
            )
            taken = tx.execute(
                "UPDATE webhook_quota SET deliveries = deliveries + 1"
                " WHERE account_id = ? AND day = ? AND deliveries < ?",
                (account_id, day, limit),
            )
            return bool(taken == 1)

        taken: bool = await self.run_transaction(take)
        return taken

    async def webhook_owner_email(self, webhook_id: str) -> tuple[str, str] | None:
        """(email, url) of the webhook's account, for the pause notice (the email is auth's:
        asked of its rows)."""

        def select(tx: Any) -> tuple[str, str] | None:
            rows = tx.query("SELECT account_id, url FROM webhooks WHERE id = ?", (webhook_id,))
            return (str(rows[0][0]), str(rows[0][1])) if rows else None

        found: tuple[str, str] | None = await self.run_transaction(select, write=False)
        if found is None:
            return None
        account = await AuthRows(self.store).get_account(found[0])
        return None if account is None else (account.email, found[1])

    # --- the delivery log and replays ------------------------------------------------------

    async def list_webhook_events(
        self,
        webhook_id: str,
        state: str | None,
        *,
        offset: int,
        limit: int,
    ) -> tuple[list[OutboxEvent], int]:
        where = "e.webhook_id = ?"
        params: tuple[Any, ...] = (webhook_id,)
        if state is not None:
            where += " AND e.state = ?"
            params += (state,)

        def select(tx: Any) -> tuple[list[OutboxEvent], int]:
            total = tx.query(
                f"SELECT COUNT(*) FROM webhook_events e WHERE {where}",  # noqa: S608
                params,
            )[0][0]
            rows = tx.query(
                f"{EVENT_SELECT} WHERE {where} ORDER BY e.sequence DESC LIMIT ? OFFSET ?",
                (*params, limit, offset),
            )
            return [event_from_row(r) for r in rows], int(total)

        result: tuple[list[OutboxEvent], int] = await self.run_transaction(select, write=False)
        return result

    async def get_webhook_event(self, webhook_id: str, event_id: str) -> OutboxEvent | None:
        def select(tx: Any) -> OutboxEvent | None:
            rows = tx.query(
                f"{EVENT_SELECT} WHERE e.id = ? AND e.webhook_id = ?", (event_id, webhook_id)
            )
            return event_from_row(rows[0]) if rows else None

        found: OutboxEvent | None = await self.run_transaction(select, write=False)
        return found

    async def list_webhook_attempts(
        self, webhook_id: str, event_id: str | None, *, offset: int, limit: int
    ) -> tuple[list[Attempt], int]:
        where = "webhook_id = ?"
        params: tuple[Any, ...] = (webhook_id,)
        if event_id is not None:
            where += " AND event_id = ?"
            params += (event_id,)

        def select(tx: Any) -> tuple[list[Attempt], int]:
            total = tx.query(
                f"SELECT COUNT(*) FROM webhook_attempts WHERE {where}",  # noqa: S608
                params,
            )[0][0]
            rows = tx.query(
                f"SELECT {', '.join(_ATTEMPT_COLUMNS)} FROM webhook_attempts"  # noqa: S608
                f" WHERE {where} ORDER BY started_at DESC, attempt DESC LIMIT ? OFFSET ?",
                (*params, limit, offset),
            )
            return [_attempt(r) for r in rows], int(total)

        result: tuple[list[Attempt], int] = await self.run_transaction(select, write=False)
        return result

    async def replay_events(
        self, webhook_id: str, *, event_id: str | None = None, failed_since: int | None = None
    ) -> int:
        """Send again: one event (any state but cancelled), or every failed event created at
        or after ``failed_since``.  A new round of retries each; returns how many.  An event
        leased by a delivery worker is left alone: replaying it would free it for a second
        worker while the first attempt is still unanswered (a copy sent twice at once)."""
        now = self.clock()
        if event_id is not None:
            where = "webhook_id = ? AND id = ? AND state <> 'cancelled'"
            params: tuple[Any, ...] = (webhook_id, event_id)
        else:
            where = "webhook_id = ? AND state = 'failed' AND created_at >= ?"
            params = (webhook_id, failed_since or 0)

        set_based = self.backend == "postgres"

        def replay(tx: Any) -> int:
            # One statement: on PostgreSQL a claim that commits first is seen by the
            # re-checked WHERE (the row is locked, then re-read), never overwritten.
            replayed = int(
                tx.execute(
                    "UPDATE webhook_events SET state = 'pending', retries = 0,"  # noqa: S608
                    f" next_attempt_at = ?, lease_until = 0, finished_at = NULL WHERE {where}"
                    " AND lease_until <= ?",
                    (now, *params, now),
                )
            )
            if replayed and set_based:
                self.store.notify(tx, OUTBOX_CHANNEL)
            return replayed

        count: int = await self.run_transaction(replay)
        return count

    async def prune_webhook_history(self, before: int) -> int:
        """Delete finished events and attempts older than ``before`` (retention)."""

        def prune(tx: Any) -> int:
            tx.execute("DELETE FROM webhook_attempts WHERE started_at < ?", (before,))
            return int(
                tx.execute(
                    "DELETE FROM webhook_events WHERE state <> 'pending' AND created_at < ?",
                    (before,),
                )
            )

        count: int = await self.run_transaction(prune)
        return count

    async def analyze_outbox(self) -> None:
        """Refresh the planner's statistics of the outbox.  It grows by thousands of rows a
        block and drains as fast: with the statistics of an emptier table, PostgreSQL plans
        the claim as a sort of every due row instead of an ordered index scan."""

        def analyze(tx: Any) -> None:
            tx.execute("ANALYZE webhook_events")

        await self.run_transaction(analyze)


def next_sequence(tx: Any, webhook_id: str, count: int) -> int | None:
    """Reserve ``count`` sequence numbers of the webhook; the first, or None if it is gone."""
    if (
        tx.execute("UPDATE webhooks SET sequence = sequence + ? WHERE id = ?", (count, webhook_id))
        == 0
    ):
        return None
    last = int(tx.query("SELECT sequence FROM webhooks WHERE id = ?", (webhook_id,))[0][0])
    return last - count + 1


def write_events(
    tx: Any, events: Sequence[NewEvent], render: Render, now: int, *, set_based: bool
) -> int:
    """Insert the events not written before, numbering each webhook's in order; how many
    were.  On PostgreSQL (``set_based``) in a fixed number of round trips: one UPDATE reserves
    every webhook's numbers, one COPY stages the events and one INSERT ... ON CONFLICT DO
    NOTHING keeps those another transaction did not write meanwhile (the check below takes
    no lock; a numbered event skipped so leaves a gap in its webhook's sequence)."""
    if not events:
        return 0
    ids = [e.id for e in events]
    existing: set[str] = set()
    for start in range(0, len(ids), 400):
        chunk = ids[start : start + 400]
        found = tx.query(
            f"SELECT id FROM webhook_events WHERE id IN ({', '.join('?' * len(chunk))})",  # noqa: S608
            chunk,
        )
        existing.update(r[0] for r in found)
    fresh: dict[str, list[NewEvent]] = {}
    seen: set[str] = set()
    for event in events:
        if event.id in existing or event.id in seen:
            continue
        seen.add(event.id)
        fresh.setdefault(event.webhook_id, []).append(event)
    if set_based:
        reserved = _reserve_sequences(tx, {w: len(batch) for w, batch in fresh.items()})
    else:
        reserved = {}
        for webhook_id, batch in fresh.items():
            first = next_sequence(tx, webhook_id, len(batch))
            if first is None:
                continue  # deleted since it was matched
            hook = tx.query(
                "SELECT account_id, chain, network FROM webhooks WHERE id = ?", (webhook_id,)
            )[0]
            reserved[webhook_id] = (first, tuple(hook))
    rows: list[tuple[Any, ...]] = []
    for webhook_id, batch in fresh.items():
        if webhook_id not in reserved:
            continue  # deleted since it was matched
        first, hook = reserved[webhook_id]
        for offset, event in enumerate(batch):
            sequence = first + offset
            body = render(event, sequence, now)
            rows.append(event_values(event, hook, sequence, body, now))
    if not rows:
        return 0
    copier = copying(tx) if set_based else None
    if copier is None:
        tx.executemany(INSERT_EVENT, rows)
        return len(rows)
    # COPY (the bodies stream in, no statement per event) into a scratch table: COPY itself
    # cannot skip an id another writer inserted since the check.
    if tx.query(f"SELECT to_regclass('pg_temp.{_EVENT_STAGE}') IS NULL")[0][0]:
        tx.execute(
            f"CREATE TEMP TABLE {_EVENT_STAGE} ON COMMIT DELETE ROWS"  # noqa: S608 - constants
            f" AS SELECT {_INSERT_EVENT_COLUMNS} FROM webhook_events WITH NO DATA"
        )
    else:
        tx.execute(f"DELETE FROM {_EVENT_STAGE}")  # noqa: S608 - a write earlier in this tx
    copier.copy_rows(
        f"{_EVENT_STAGE} ({_INSERT_EVENT_COLUMNS})",
        ((*row[:12], "pending", 0, 0, row[12], 0, row[13]) for row in rows),
    )
    inserted: int = tx.execute(
        f"INSERT INTO webhook_events ({_INSERT_EVENT_COLUMNS})"  # noqa: S608 - constants only
        f" SELECT {_INSERT_EVENT_COLUMNS} FROM {_EVENT_STAGE} ON CONFLICT (id) DO NOTHING"
    )
    return inserted


def _reserve_sequences(
    tx: Any, counts: dict[str, int]
) -> dict[str, tuple[int, tuple[str, str, str]]]:
    """Reserve ``counts[webhook]`` sequence numbers of each webhook in one statement
    (PostgreSQL): webhook -> (first number, (account, chain, network)); deleted ones absent."""
    if not counts:
        return {}
    ids = sorted(counts)
    rows = tx.query(
        "UPDATE webhooks w SET sequence = w.sequence + d.n"
        " FROM unnest(?::text[], ?::bigint[]) AS d(id, n) WHERE w.id = d.id"
        " RETURNING w.id, w.sequence - d.n + 1, w.account_id, w.chain, w.network",
        (ids, [counts[i] for i in ids]),
    )
    return {str(r[0]): (int(r[1]), (str(r[2]), str(r[3]), str(r[4]))) for r in rows}

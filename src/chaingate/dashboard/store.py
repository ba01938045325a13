"""The dashboard's rows: credentials, sessions, one-time sign-in links, flashes and the
deployment's latency rollups (accounts, keys and usage are auth's: the pages read them through
``chaingate.auth.store.AuthRows``).  Portable SQL run through the store's ``run_transaction``,
like every subsystem's rows; tokens are kept as SHA-256 digests, never in clear.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from typing import Any

import msgspec

from chaingate.auth.usagelatency import BUCKETS, KEEP_MINUTES
from chaingate.store import Store

# latency_rollups has the layout of the accounts' usage_latency: one column per bucket.
LATENCY_COLUMNS = ", ".join(f"b{i}" for i in range(BUCKETS))


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Credentials(msgspec.Struct, frozen=True):
    account_id: str
    password_hash: str | None
    operator: bool


class Session(msgspec.Struct, frozen=True):
    id: str
    account_id: str
    operator: bool
    csrf: str
    address: str
    user_agent: str
    created_at: int
    last_seen_at: int
    expires_at: int
    revoked_at: int | None
    credential: str = ""  # admin-token sessions: the token's fingerprint (``web``)


_SESSION_COLUMNS = (
    "id, account_id, operator, csrf, address, user_agent, created_at, last_seen_at,"
    " expires_at, revoked_at, credential"
)


def _session(row: Sequence[Any]) -> Session:
    values = list(row)
    values[2] = bool(values[2])
    return Session(*values)


# What the prune keeps: ended sessions a week (the account page lists only live ones), and
# the deployment's latency as auth keeps each account's (auth/usagelatency.py: by the
# minute 2 days, by the hour 32).
ENDED_SESSION_KEEP_MS = 7 * 86_400_000


class DashboardRows:
    def __init__(self, store: Store) -> None:
        self.store = store

    # --- credentials -------------------------------------------------------------------------

    async def credentials(self, account_id: str) -> Credentials | None:
        rows = await self.store.run_transaction(
            lambda tx: tx.query(
                "SELECT account_id, password_hash, operator FROM dashboard_credentials"
                " WHERE account_id = ?",
                (account_id,),
            ),
            write=False,
        )
        if not rows:
            return None
        account, password_hash, operator = rows[0]
        return Credentials(account, password_hash, bool(operator))

    async def set_credentials(
        self, account_id: str, *, password_hash: str | None = None, operator: bool | None = None
    ) -> None:
        """Set the password (when given) and/or the operator flag (when given); setting a
        password ends every session of the account."""
        now = self.store.clock()

        def write(tx: Any) -> None:
            found = tx.query(
                "SELECT password_hash, operator FROM dashboard_credentials WHERE account_id = ?",
                (account_id,),
            )
            old_hash, old_operator = found[0] if found else (None, 0)
            new_hash = password_hash if password_hash is not None else old_hash
            new_operator = int(operator) if operator is not None else int(old_operator)
            if found:
                tx.execute(
                    "UPDATE dashboard_credentials SET password_hash = ?, operator = ?,"
                    " updated_at = ? WHERE account_id = ?",
                    (new_hash, new_operator, now, account_id),
                )
            else:
                tx.execute(
                    "INSERT INTO dashboard_credentials"
                    " (account_id, password_hash, operator, updated_at) VALUES (?, ?, ?, ?)",
                    (account_id, new_hash, new_operator, now),
                )
            if password_hash is not None:
                tx.execute(
                    "UPDATE dashboard_sessions SET revoked_at = ?"
                    " WHERE account_id = ? AND revoked_at IS NULL",
                    (now, account_id),
                )

        await self.store.run_transaction(write)

    # --- sessions ----------------------------------------------------------------------------

    async def create_session(
        self,
        account_id: str,
        operator: bool,
        address: str,
        user_agent: str,
        max_ms: int,
        credential: str = "",
    ) -> tuple[str, Session]:
        """A new session: the cookie's token (to send once) and the row (its digest)."""
        token = secrets.token_urlsafe(32)
        now = self.store.clock()
        session = Session(
            digest(token),
            account_id,
            operator,
            secrets.token_urlsafe(32),
            address[:64],
            user_agent[:200],
            now,
            now,
            now + max_ms,
            None,
            credential,
        )
        values = list(msgspec.structs.astuple(session))
        values[2] = int(operator)
        await self.store.run_transaction(
            lambda tx: tx.execute(
                f"INSERT INTO dashboard_sessions ({_SESSION_COLUMNS})"  # noqa: S608 - constants
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                values,
            )
        )
        return token, session

    async def live_session(self, token: str, idle_ms: int) -> Session | None:
        """The session of a cookie token, if it is neither revoked, expired nor idle too long.
        Its last-seen time moves at most once a minute: a page view within the minute is a
        read only, the first one after it also a small write transaction (on SQLite,
        serialised with every other writer)."""
        now = self.store.clock()
        session_id = digest(token)
        rows = await self.store.run_transaction(
            lambda tx: tx.query(
                f"SELECT {_SESSION_COLUMNS} FROM dashboard_sessions WHERE id = ?",  # noqa: S608
                (session_id,),
            ),
            write=False,
        )
        if not rows:
            return None
        session = _session(rows[0])
        if (
            session.revoked_at is not None
            or session.expires_at <= now
            or session.last_seen_at + idle_ms <= now
        ):
            return None
        if now - session.last_seen_at > 60_000:
            await self.store.run_transaction(
                lambda tx: tx.execute(
                    "UPDATE dashboard_sessions SET last_seen_at = ? WHERE id = ?",
                    (now, session_id),
                )
            )
        return session

    async def sessions_of(self, account_id: str) -> list[Session]:
        now = self.store.clock()
        rows = await self.store.run_transaction(
            lambda tx: tx.query(
                f"SELECT {_SESSION_COLUMNS} FROM dashboard_sessions"  # noqa: S608 - constants
                " WHERE account_id = ? AND revoked_at IS NULL AND expires_at > ?"
                " ORDER BY created_at DESC LIMIT 50",
                (account_id, now),
            ),
            write=False,
        )
        return [_session(row) for row in rows]

    async def revoke_session(self, session_id: str, account_id: str) -> bool:
        now = self.store.clock()
        changed = await self.store.run_transaction(
            lambda tx: tx.execute(
                "UPDATE dashboard_sessions SET revoked_at = ?"
                " WHERE id = ? AND account_id = ? AND revoked_at IS NULL",
                (now, session_id, account_id),
            )
        )
        return bool(changed)

    # --- one-time sign-in links --------------------------------------------------------------

    # --- one-time flashes ----------------------------------------------------------------------

    async def put_flash(self, session_id: str, body: str, ttl_ms: int) -> str:
        flash_id = secrets.token_urlsafe(16)
        expires = self.store.clock() + ttl_ms
        await self.store.run_transaction(
            lambda tx: tx.execute(
                "INSERT INTO dashboard_flashes (id, session_id, body, expires_at)"
                " VALUES (?, ?, ?, ?)",
                (flash_id, session_id, body, expires),
            )
        )
        return flash_id

    async def take_flash(self, flash_id: str, session_id: str) -> str | None:
        """A flash of this session, once: it is deleted as it is read."""
        now = self.store.clock()

        def take(tx: Any) -> str | None:
            rows = tx.query(
                "SELECT body, expires_at FROM dashboard_flashes WHERE id = ? AND session_id = ?",
                (flash_id, session_id),
            )
            if not rows:
                return None
            tx.execute("DELETE FROM dashboard_flashes WHERE id = ?", (flash_id,))
            body, expires_at = rows[0]
            return str(body) if int(expires_at) > now else None

        result: str | None = await self.store.run_transaction(take)
        return result

    async def create_signin_link(self, account_id: str, ttl_ms: int) -> str:
        token = secrets.token_urlsafe(32)
        now = self.store.clock()
        await self.store.run_transaction(
            lambda tx: tx.execute(
                "INSERT INTO dashboard_signin_links (id, account_id, created_at, expires_at,"
                " used_at) VALUES (?, ?, ?, ?, NULL)",
                (digest(token), account_id, now, now + ttl_ms),
            )
        )
        return token

    async def use_signin_link(self, token: str) -> str | None:
        """The account a link signs in, once: the first use marks it used (atomically)."""
        now = self.store.clock()
        link_id = digest(token)

        def use(tx: Any) -> str | None:
            changed = tx.execute(
                "UPDATE dashboard_signin_links SET used_at = ?"
                " WHERE id = ? AND used_at IS NULL AND expires_at > ?",
                (now, link_id, now),
            )
            if not changed:
                return None
            rows = tx.query(
                "SELECT account_id FROM dashboard_signin_links WHERE id = ?", (link_id,)
            )
            return str(rows[0][0]) if rows else None

        return await self.store.run_transaction(use)

    async def prune(self) -> dict[str, int]:
        """Delete what no page reads any more: ended sessions, used or expired sign-in links
        and flashes, and the deployment's fine-grained latency past what the pages show (each
        account's is pruned by the usage writer, which writes it)."""
        now = self.store.clock()
        minute = now // 60_000
        ended = now - ENDED_SESSION_KEEP_MS

        def delete(tx: Any) -> dict[str, int]:
            counts = {
                "sessions": tx.execute(
                    "DELETE FROM dashboard_sessions WHERE expires_at < ? OR revoked_at < ?",
                    (ended, ended),
                ),
                "signin_links": tx.execute(
                    "DELETE FROM dashboard_signin_links WHERE used_at IS NOT NULL"
                    " OR expires_at < ?",
                    (now,),
                ),
                "flashes": tx.execute("DELETE FROM dashboard_flashes WHERE expires_at < ?", (now,)),
                "latency": 0,
            }
            for granularity, keep in KEEP_MINUTES.items():
                counts["latency"] += tx.execute(
                    "DELETE FROM latency_rollups WHERE granularity = ? AND period < ?",
                    (granularity, minute - keep),
                )
            return counts

        result: dict[str, int] = await self.store.run_transaction(delete)
        return result

    async def add_latency(self, samples: Sequence[tuple[int, str, Sequence[int]]]) -> None:
        """Add (minute, route, 16 bucket counts) samples to the minute, hour and day rollups."""
        rows: dict[tuple[int, int, str], list[int]] = {}
        for minute, route, counts in samples:
            for size in (1, 60, 1440):
                slot = rows.setdefault((size, (minute // size) * size, route), [0] * BUCKETS)
                for i, count in enumerate(counts):
                    slot[i] += count
        if not rows:
            return
        updates = ", ".join(f"b{i} = latency_rollups.b{i} + excluded.b{i}" for i in range(BUCKETS))
        sql = (
            f"INSERT INTO latency_rollups (granularity, period, route, {LATENCY_COLUMNS})"  # noqa: S608
            f" VALUES (?, ?, ?, {', '.join('?' * BUCKETS)})"
            f" ON CONFLICT (granularity, period, route) DO UPDATE SET {updates}"
        )
        values = [(*key, *counts) for key, counts in sorted(rows.items())]
        await self.store.run_transaction(lambda tx: tx.executemany(sql, values))

    async def latency(
        self, granularity: int, first: int, last: int
    ) -> list[tuple[int, str, list[int]]]:
        sql = (
            f"SELECT period, route, {LATENCY_COLUMNS} FROM latency_rollups"  # noqa: S608
            " WHERE granularity = ? AND period >= ? AND period < ? ORDER BY period, route"
        )
        rows = await self.store.run_transaction(
            lambda tx: tx.query(sql, (granularity, first, last)), write=False
        )
        return [(int(row[0]), str(row[1]), [int(v) for v in row[2:]]) for row in rows]

"""A PostgreSQL session of its own, for session-level advisory locks (who leads which role).

Never one of the store's pooled connections: a session lock lives and dies with its session,
so the session is the lease.  Every method blocks (run it on a thread, with a timeout of the
caller's: ``chaingate.cluster.leases``); a failure of the connection or the server is
``SessionLost``, after which the session is only good for ``close``.  Locks are
``(class, key)`` pairs of 32-bit integers (PostgreSQL's two-key form).
"""

from __future__ import annotations

import contextlib
from typing import Any

import psycopg

# A member's lock is taken shared, a role's exclusive: both on keys of one class.
_LOOK = (
    "SELECT"
    " (SELECT count(DISTINCT pid) FROM pg_locks WHERE locktype = 'advisory'"
    "   AND database = d.oid AND classid = %(cls)s AND objid = %(member)s AND objsubid = 2"
    "   AND granted),"
    " ARRAY(SELECT objid::bigint FROM pg_locks WHERE locktype = 'advisory'"
    "   AND database = d.oid AND classid = %(cls)s AND objid <> %(member)s AND objsubid = 2"
    "   AND granted AND mode = 'ExclusiveLock'),"
    " ARRAY(SELECT objid::bigint FROM pg_locks WHERE locktype = 'advisory'"
    "   AND database = d.oid AND classid = %(cls)s AND objid <> %(member)s AND objsubid = 2"
    "   AND granted AND mode = 'ExclusiveLock' AND pid = pg_backend_pid()),"
    # Members silent past the lease: their last query ended that long ago (a query still
    # running that long is silence too: its own client gives up on it much sooner).
    " ARRAY(SELECT a.pid || ' ' || coalesce(a.application_name, '') FROM pg_stat_activity a"
    "   WHERE a.pid <> pg_backend_pid()"
    "   AND a.state_change < now() - %(silence)s * interval '1 second'"
    "   AND a.pid IN (SELECT pid FROM pg_locks WHERE locktype = 'advisory'"
    "     AND database = d.oid AND classid = %(cls)s AND objid = %(member)s AND objsubid = 2"
    "     AND granted))"
    " FROM pg_database d WHERE d.datname = current_database()"
)
# Ends the given sessions, and every other session named as one of ``names``.
_END_SESSIONS = (
    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    " AND (pid = ANY(%(pids)s) OR application_name = ANY(%(names)s))"
)


class SessionLost(Exception):
    """The lock session failed (connection, server or a refused query): its locks are, or
    will be, gone."""


class NotPermitted(Exception):
    """The server refused a privileged call (ending another user's session)."""


class Look:
    """One look at the locks of a class, as ``LockSession.look`` returns it."""

    __slots__ = ("held_anywhere", "held_here", "members", "silent")

    def __init__(
        self, members: int, held_anywhere: list[int], held_here: list[int], silent: list[str]
    ) -> None:
        self.members = members  # sessions holding the member key (shared)
        self.held_anywhere = held_anywhere  # other keys locked exclusively, by anyone
        self.held_here = held_here  # … by this session
        self.silent = silent  # "<pid> <application name>" of members silent too long


class LockSession:
    """One autocommit session; blocking calls, each a single statement."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn

    @classmethod
    def connect(cls, url: str, *, application_name: str, timeout: float) -> LockSession:
        try:
            conn = psycopg.connect(
                url,
                autocommit=True,
                connect_timeout=int(timeout) + 1,
                application_name=application_name,
                # A peer that vanished (not a closed socket) is noticed within seconds.
                keepalives=1,
                keepalives_idle=2,
                keepalives_interval=1,
                keepalives_count=3,
            )
        except psycopg.Error as exc:
            raise SessionLost(str(exc)) from exc
        return cls(conn)

    @property
    def backend_pid(self) -> int:
        """The server process of this session (what another session would end)."""
        return int(self._conn.info.backend_pid)

    def schema(self) -> str:
        """The session's current schema ("" if none): what scopes its lock keys."""
        row = self._one("SELECT current_schema()")
        return str(row[0]) if row and row[0] else ""

    def lock_shared(self, cls: int, key: int) -> None:
        """Wait for ``(cls, key)`` shared (with every other holder of it shared)."""
        self._one("SELECT pg_advisory_lock_shared(%s, %s)", (cls, key))

    def try_lock(self, cls: int, key: int) -> bool:
        """Take ``(cls, key)`` exclusively if nobody holds it; whether it was taken."""
        row = self._one("SELECT pg_try_advisory_lock(%s, %s)", (cls, key))
        return bool(row and row[0])

    def unlock(self, cls: int, key: int) -> None:
        self._one("SELECT pg_advisory_unlock(%s, %s)", (cls, key))

    def look(self, cls: int, member: int, silence: float) -> Look:
        """Who holds what in ``cls``: members (holders of ``member``), the exclusive keys
        held anywhere and here, and the members whose session has been silent ``silence``
        seconds (by the server's clock: no clock of ours compared with another's)."""
        row = self._one(_LOOK, {"cls": cls, "member": member, "silence": silence})
        assert row is not None  # one row: the current database's
        return Look(int(row[0]), list(row[1]), list(row[2]), list(row[3]))

    def end_sessions(self, pids: list[int], names: list[str]) -> int:
        """End the sessions ``pids`` and every session named one of ``names``; how many."""
        try:
            row = self._one(_END_SESSIONS, {"pids": pids, "names": names})
        except SessionLost as exc:
            if isinstance(exc.__cause__, psycopg.errors.InsufficientPrivilege):
                raise NotPermitted(str(exc.__cause__).strip()) from exc.__cause__
            raise
        return int(row[0]) if row else 0

    def close(self, *, cancel: bool = False, timeout: float) -> None:
        """Close the session (its locks go with it); ``cancel``: first cancel the query it
        may be running (a thread given up on)."""
        if cancel:
            with contextlib.suppress(psycopg.Error):
                self._conn.cancel_safe(timeout=timeout)
        self._conn.close()

    def _one(self, sql: str, params: Any = None) -> tuple[Any, ...] | None:
        try:
            row: tuple[Any, ...] | None = self._conn.execute(sql, params).fetchone()
        except psycopg.Error as exc:
            raise SessionLost(str(exc)) from exc
        return row

"""Wake-ups across processes sharing a PostgreSQL store (``LISTEN``/``NOTIFY``), offered by
the engine as ``Store.notify`` and ``Store.listener``.

A process that writes something the others poll for says so in its transaction (``notify``,
delivered at commit, never for a rolled-back write); each process keeps one session of its own
listening (``Listener``) and calls its ``wake``.  The payload is the writer's schema:
deployments sharing a database in schemas of their own do not wake each other.  A lost
session is opened again; meanwhile the subsystem's poll still finds everything (a wake-up is
only ever a shortcut).  The webhook outbox is the user: see ``chaingate.webhooks.delivery``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

import psycopg
import trio

from chaingate.store.tx import Tx

log = logging.getLogger("chaingate.store.notify")

# How long one wait for notifications lasts in its thread: a cancelled listener's thread ends
# within this (it is abandoned, not interrupted).
WAIT_SLICE = 0.5
CONNECT_TIMEOUT = 5
RECONNECT = (0.5, 5.0)  # first pause after a lost session, doubling to the second


_CHANNEL = re.compile(r"[a-z_][a-z0-9_]*")


def checked_channel(channel: str) -> str:
    """The channel's name, spliced into SQL: an identifier only."""
    if not _CHANNEL.fullmatch(channel):
        raise ValueError(f"not a channel name: {channel!r}")
    return channel


def notify(tx: Tx, channel: str) -> None:
    """In a writing transaction (PostgreSQL): wake the channel's listeners of this schema at
    commit."""
    tx.execute(f"SELECT pg_notify('{checked_channel(channel)}', current_schema())")


class Listener:
    """Calls ``wake`` whenever a process sharing the store notifies ``channel``."""

    def __init__(self, url: str, channel: str, wake: Callable[[], None]) -> None:
        self._url = url
        self._channel = checked_channel(channel)
        self._wake = wake
        self.heard = 0
        self.connects = 0

    async def run(self) -> None:
        """Listen until cancelled, reconnecting after a lost session."""
        pause = RECONNECT[0]
        while True:
            connects = self.connects
            try:
                await self._listen()
            except (psycopg.Error, OSError) as exc:
                log.warning(
                    "store: wake-ups lost; polling meanwhile",
                    extra={
                        "fields": {"channel": self._channel, "error": str(exc), "retry_s": pause}
                    },
                )
            if self.connects != connects:
                pause = RECONNECT[0]  # that session worked: a new loss starts the backoff over
            await trio.sleep(pause)
            pause = min(pause * 2, RECONNECT[1])

    async def _listen(self) -> None:
        conn = await trio.to_thread.run_sync(self._connect, abandon_on_cancel=True)
        try:
            schema = await trio.to_thread.run_sync(lambda: _schema(conn))
            self.connects += 1
            # Events written while this session was down are found by the poll; one claim
            # now covers the gap without waiting for it.
            self._wake()
            while True:
                heard = await trio.to_thread.run_sync(
                    lambda: _wait(conn, schema), abandon_on_cancel=True
                )
                if heard:
                    self.heard += heard
                    self._wake()
        finally:
            # The abandoned wait may still hold the connection for up to WAIT_SLICE: close it
            # in a thread of its own, which waits for it.
            with trio.CancelScope(shield=True), trio.move_on_after(2 * WAIT_SLICE):
                await trio.to_thread.run_sync(conn.close, abandon_on_cancel=True)

    def _connect(self) -> psycopg.Connection[Any]:
        conn = psycopg.connect(
            self._url,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT,
            application_name=f"chaingate-listener/{self._channel}",
            # A vanished server (not a closed socket) is noticed within seconds.
            keepalives=1,
            keepalives_idle=5,
            keepalives_interval=2,
            keepalives_count=3,
        )
        try:
            conn.execute(f"LISTEN {self._channel}")
        except BaseException:
            conn.close()
            raise
        return conn


def _schema(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("SELECT current_schema()").fetchone()
    return str(row[0]) if row and row[0] is not None else ""


def _wait(conn: psycopg.Connection[Any], schema: str) -> int:
    """Notifications for ``schema`` heard within WAIT_SLICE: returns with the first packet
    that brings any (a burst of commits is one wake-up)."""
    return sum(
        notify.payload == schema for notify in conn.notifies(timeout=WAIT_SLICE, stop_after=1)
    )

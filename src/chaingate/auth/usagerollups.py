"""Hourly and daily rollups of usage, written in the same transaction as the minutes.

``usage_minutes`` holds one row per key, network, method and minute: the dashboard's day and
30-day views would have to sum tens of thousands of them.  ``usage_hours`` and ``usage_days``
hold the same counts per hour and per UTC day (per account, key, network and method);
``add_usage`` adds every delta to all three, so they never disagree and no background job
has to catch up.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

ROLLUP_TABLES = {"hour": ("usage_hours", 60), "day": ("usage_days", 1440)}


class _Tx(Protocol):
    def executemany(self, sql: str, rows: Sequence[Sequence[object]]) -> None: ...


def _upsert(table: str) -> str:
    return (
        f"INSERT INTO {table}"  # noqa: S608 - table names are constants
        " (account_id, key_id, network, method, period, requests, compute_units, errors)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (account_id, period, key_id, network, method) DO UPDATE SET"
        f" requests = {table}.requests + excluded.requests,"
        f" compute_units = {table}.compute_units + excluded.compute_units,"
        f" errors = {table}.errors + excluded.errors"
    )


_UPSERTS = {name: _upsert(table) for name, (table, _) in ROLLUP_TABLES.items()}


def write_rollups(tx: _Tx, rows: Sequence[Sequence[Any]]) -> None:
    """Add minute rows ``[key_id, account_id, network, method, minute, requests, units,
    errors]`` to the hour and day rollups (merged per period first; sorted, so concurrent
    writers lock rows in one order)."""
    for name, (_, size) in ROLLUP_TABLES.items():
        merged: dict[tuple[str, int, str, str, str], list[int]] = {}
        for key_id, account_id, network, method, minute, requests, units, errors in rows:
            slot = merged.setdefault(
                (account_id, (minute // size) * size, key_id, network, method), [0, 0, 0]
            )
            slot[0] += requests
            slot[1] += units
            slot[2] += errors
        tx.executemany(
            _UPSERTS[name],
            [
                (account, key_id, network, method, period, *counts)
                for (account, period, key_id, network, method), counts in sorted(merged.items())
            ],
        )

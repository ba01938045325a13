"""Request latency per account, network, method and period (issue 23: the overview's latency
is the account's own).

The gateway keeps a histogram per (account, network, method, minute) beside the usage meter
(the fast lane's ``LatencyMeter``) — counts per bucket of
``chaingate.obs.metrics.LATENCY_BUCKETS`` and one above, the layout of ``latency_rollups`` —
and ``add_usage`` adds it here, to minute, hour and day rows, in the usage rows' own
transaction.  Histograms add up: every process adds its own, and a page sums rows into
buckets and reads percentiles from them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from chaingate.store.tx import Tx

TABLE = "usage_latency"
BUCKETS = 16  # the 15 bounds of LATENCY_BUCKETS and one above (test_usage_writer checks both)
GRANULARITIES = (1, 60, 1440)  # minutes per period: minute, hour, day rows
# What the prune keeps: minutes 2 days and hours 32 (pages read the last hour by the minute,
# the last day by the hour, 30 days by the day); days are kept, as usage_days are.  The
# dashboard prunes latency_rollups by the same policy.
KEEP_MINUTES = {1: 2 * 1440, 60: 32 * 1440}

_COLUMNS = ", ".join(f"b{i}" for i in range(BUCKETS))
_ADD = ", ".join(f"b{i} = {TABLE}.b{i} + excluded.b{i}" for i in range(BUCKETS))
_UPSERT = (
    f"INSERT INTO {TABLE} (account_id, granularity, period, network, method, {_COLUMNS})"  # noqa: S608 - constants
    f" VALUES (?, ?, ?, ?, ?, {', '.join('?' * BUCKETS)})"
    f" ON CONFLICT (account_id, granularity, period, network, method) DO UPDATE SET {_ADD}"
)
_SELECT = (
    f"SELECT period, network, method, {_COLUMNS} FROM {TABLE}"  # noqa: S608 - constants
    " WHERE account_id = ? AND granularity = ? AND period >= ? AND period < ?"
    " ORDER BY period, network, method"
)
_PRUNE = f"DELETE FROM {TABLE} WHERE granularity = ? AND period < ?"  # noqa: S608 - constants


class LatencyDelta(msgspec.Struct, frozen=True):
    """Request latencies to ADD to one (account, network, method, minute): counts per bucket
    of chaingate.obs.metrics.LATENCY_BUCKETS (16; the last is above the last bound)."""

    account_id: str
    network: str  # chain/network; '' for REST calls
    method: str  # JSON-RPC method, "batch" for a batch request, REST route key, ...
    minute: int  # epoch minutes
    counts: tuple[int, ...]


# (account_id, granularity, period, network, method): the primary key's order.
_Key = tuple[str, int, int, str, str]


def latency_rows(deltas: Iterable[LatencyDelta]) -> list[tuple[Any, ...]]:
    """The upsert's rows: every delta added to its minute, hour and day, merged per key and
    sorted (concurrent writers lock rows in one order).  ValueError, before anything is
    written, for counts that are not one per bucket."""
    merged: dict[_Key, list[int]] = {}
    for d in deltas:
        if len(d.counts) != BUCKETS:
            raise ValueError(f"latency counts: expected {BUCKETS} buckets, got {len(d.counts)}")
        for size in GRANULARITIES:
            key = (d.account_id, size, d.minute // size * size, d.network, d.method)
            slot = merged.setdefault(key, [0] * BUCKETS)
            for i, count in enumerate(d.counts):
                slot[i] += count
    return [(*key, *merged[key]) for key in sorted(merged)]


def write_latency(tx: Tx, rows: Sequence[tuple[Any, ...]]) -> None:
    """Add ``latency_rows`` to the table (bucket counts add up)."""
    tx.executemany(_UPSERT, rows)


def read_latency(
    tx: Tx, account_id: str, size: int, first: int, end: int
) -> list[tuple[int, str, str, list[int]]]:
    """(period, network, method, counts) of one account's rows of ``size`` minutes whose
    period is in [first, end)."""
    return [
        (int(row[0]), str(row[1]), str(row[2]), [int(v) for v in row[3:]])
        for row in tx.query(_SELECT, (account_id, size, first, end))
    ]


def prune_latency(tx: Tx, now_minute: int) -> int:
    """Delete minute and hour rows past ``KEEP_MINUTES``; the rows deleted."""
    return sum(tx.execute(_PRUNE, (size, now_minute - keep)) for size, keep in KEEP_MINUTES.items())

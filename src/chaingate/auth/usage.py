"""The usage meter's way to the store: drained every few seconds, written in one batch.

Requests record into an in-memory meter (compiled), per key, network, method and minute, and
their latencies per account, network, method and minute; this task moves both to the store off
the request path, in one transaction.  A failed write keeps them for the next round rather than
losing them; last-used times of keys are written in the same rhythm.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import trio

from chaingate.auth.store import AuthRows, LatencyDelta, UsageDelta

log = logging.getLogger("chaingate.usage")

PRUNE_SECONDS = 3600.0


class UsageWriter:
    def __init__(self, store: AuthRows, meter: Any, latency: Any, registry: Any) -> None:
        self._store = store
        self._meter = meter  # the limiter twin's UsageMeter
        self._latency = latency  # the fast-lane twin's LatencyMeter
        self._registry = registry
        self.flushes = 0
        self.failures = 0

    async def flush(self) -> None:
        meter = self._meter
        rows = meter.drain()
        histograms = self._latency.drain()
        if rows or histograms:
            deltas = [
                UsageDelta(
                    key_id=key_id,
                    account_id=account_id,
                    network=network,
                    method=method,
                    minute=minute,
                    requests=requests,
                    compute_units=units,
                    errors=errors,
                )
                for key_id, account_id, network, method, minute, requests, units, errors in rows
            ]
            latency = [LatencyDelta(*histogram) for histogram in histograms]
            try:
                await self._store.add_usage(deltas, latency)
            except BaseException as exc:
                # Given back for the next round; a cancellation can only come before the
                # store's thread began (it is never abandoned), so nothing was written.
                for row in rows:
                    meter.record(*row)
                for histogram in histograms:
                    self._latency.add(*histogram)
                if not isinstance(exc, Exception):
                    raise
                self.failures += 1
                log.exception("usage write failed; keeping the counters for the next round")
                return
        # Emptied in place: the fast lane holds this very set (a new one would never be read).
        used = set(self._registry.used)
        self._registry.used.clear()
        if used:
            now = int(time.time() * 1000)
            try:
                await self._store.touch_keys_last_used(dict.fromkeys(used, now))
            except Exception:
                log.exception("last-used update failed")
        self.flushes += 1

    async def prune(self) -> None:
        """Latency by the minute and by the hour past what is kept (the writer's: it writes
        them whether or not a dashboard reads them)."""
        try:
            await self._store.prune_usage_latency(int(time.time() // 60))
        except Exception:
            log.exception("usage latency not pruned")

    async def run(self, interval: float) -> None:
        """Flush every ``interval``; prune after the first flush (not at start: a process
        starting is busy enough) and then about hourly."""
        flushes_per_prune = max(1, int(PRUNE_SECONDS // max(interval, 1e-3)))
        try:
            count = 0
            while True:
                await trio.sleep(interval)
                await self.flush()
                if count % flushes_per_prune == 0:
                    await self.prune()
                count += 1
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await self.flush()  # what was metered before shutdown is not lost

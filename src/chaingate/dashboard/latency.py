"""The whole deployment's latency over time, for the operator's page: the edge's
request-latency histogram (one per route class — rpc, bundler, rest, ...), sampled once a
minute and added to ``latency_rollups``.  (Each account's latency is timed per request and
written by the usage writer: ``auth/usagelatency.py``.)
The same task prunes the dashboard's tables about hourly (``DashboardRows.prune``).

The hot path already pays for the histogram (one bisect per request); sampling it costs
nothing per request.  Each process adds its own deltas, so with N processes the rollups hold
the sum — histograms add up.  Percentiles are read from the buckets (interpolated inside
the bucket that holds them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import trio

from chaingate.obs.metrics import LATENCY_BUCKETS, LatencySeries

log = logging.getLogger("chaingate.dashboard")

BUCKETS = len(LATENCY_BUCKETS) + 1  # and one above the last
PRUNE_SECONDS = 3600.0


def percentile(counts: Sequence[int], q: float) -> float | None:
    """The q-quantile (0..1) in seconds of a bucketed sample, None when it is empty."""
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    running = 0
    for i, count in enumerate(counts):
        if count and running + count >= rank:
            low = LATENCY_BUCKETS[i - 1] if i > 0 else 0.0
            high = LATENCY_BUCKETS[i] if i < len(LATENCY_BUCKETS) else LATENCY_BUCKETS[-1] * 2
            return low + (high - low) * max(0.0, rank - running) / count
        running += count
    return LATENCY_BUCKETS[-1]


class LatencySampler:
    def __init__(
        self, rows: Any, series: Mapping[str, LatencySeries], clock: Callable[[], float]
    ) -> None:
        self._rows = rows
        self._series = series  # route -> chaingate.obs.metrics.LatencySeries
        self._clock = clock  # seconds
        self._last = {route: list(s.counts) for route, s in series.items()}
        self.pruned = trio.Event()  # the first prune is done (or failed)

    async def sample(self) -> None:
        minute = int(self._clock() // 60)
        samples = []
        for route, series in self._series.items():
            now = list(series.counts)
            delta = [a - b for a, b in zip(now, self._last[route], strict=True)]
            if any(delta):
                samples.append((minute, route, delta))
            self._last[route] = now
        if samples:
            try:
                await self._rows.add_latency(samples)
            except Exception:
                log.exception("latency sample not written")

    async def prune(self) -> None:
        try:
            deleted = await self._rows.prune()
        except Exception:
            log.exception("dashboard tables not pruned")
            return
        if any(deleted.values()):
            log.info("dashboard tables pruned: %s", deleted)

    async def run(self, interval: float = 60.0) -> None:
        """Sample every ``interval``; prune the dashboard's tables at start and then about
        hourly (each process does, and a delete of what is gone already costs little)."""
        samples_per_prune = max(1, int(PRUNE_SECONDS // max(interval, 1e-3)))
        try:
            await self.prune()
            self.pruned.set()
            count = 0
            while True:
                await trio.sleep(interval)
                await self.sample()
                count += 1
                if count % samples_per_prune == 0:
                    await self.prune()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                await self.sample()

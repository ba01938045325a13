"""The usage writer (auth/usage.py): usage counters and latency histograms drained together
and written in one transaction; a write that fails or is cancelled gives both back for the
next round; it prunes the latency it writes (whether or not a dashboard reads it) — both
twins, both stores.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import trio

from chaingate.auth import usagelatency
from chaingate.auth.store import AuthRows, LatencyDelta, UsageDelta
from chaingate.auth.usage import UsageWriter
from chaingate.dashboard import latency as dashboard_latency
from chaingate.obs.metrics import LATENCY_BUCKETS
from chaingate.store import open_store
from chaingate.twins import Impl


def test_every_latency_table_has_the_buckets_the_meter_counts() -> None:
    """A drift would make every usage write fail (the store refuses other lengths)."""
    assert len(LATENCY_BUCKETS) + 1 == usagelatency.BUCKETS == dashboard_latency.BUCKETS


class FlakyStore:
    """The real store, whose next ``add_usage`` calls fail (``fail``) or never begin
    (``hang``: parked as a call waiting for the store's thread is)."""

    def __init__(self, store: AuthRows) -> None:
        self.store = store
        self.fail = 0
        self.hang = False

    async def add_usage(
        self, deltas: Sequence[UsageDelta], latency: Sequence[LatencyDelta] = ()
    ) -> None:
        if self.hang:
            await trio.sleep_forever()
        if self.fail:
            self.fail -= 1
            raise OSError("the database went away")
        await self.store.add_usage(deltas, latency)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


@asynccontextmanager
async def writer_on(
    impl: Impl, store_url: str, tmp_path: Path
) -> AsyncIterator[tuple[UsageWriter, FlakyStore, Any, Any]]:
    store = open_store(store_url, tmp_path)
    async with store:
        await store.migrate()
        flaky = FlakyStore(AuthRows(store))
        meter = impl.limiter.UsageMeter()
        latency = impl.fastlane.LatencyMeter(LATENCY_BUCKETS)
        registry = SimpleNamespace(used=set())
        yield UsageWriter(flaky, meter, latency, registry), flaky, meter, latency


def traffic(meter: Any, latency: Any, minute: int) -> None:
    for seconds in (0.0004, 0.003, 0.2):
        meter.record("key_1", "acct_1", "eth/main", "eth_call", minute, 1, 26, 0)
        latency.observe("acct_1", "eth/main", "eth_call", minute, seconds)
    latency.observe("acct_1", "eth/main", "batch", minute, 0.01)


async def written(store: AuthRows, minute: int) -> tuple[int, dict[str, int]]:
    usage = await store.usage("acct_1", minute, minute + 1)
    rows = await store.usage_latency("acct_1", "minute", minute, minute + 1)
    return sum(u.requests for u in usage), {r.method: sum(r.counts) for r in rows}


async def test_a_failed_write_gives_usage_and_latency_back(
    impl: Impl, store_url: str, tmp_path: Path
) -> None:
    minute = int(time.time() // 60)
    async with writer_on(impl, store_url, tmp_path) as (writer, flaky, meter, latency):
        traffic(meter, latency, minute)
        flaky.fail = 1
        await writer.flush()
        assert writer.failures == 1
        assert await written(flaky.store, minute) == (0, {})
        traffic(meter, latency, minute)  # more meanwhile: added to what came back
        await writer.flush()
        assert await written(flaky.store, minute) == (6, {"eth_call": 6, "batch": 2})
        await writer.flush()  # nothing twice
        assert await written(flaky.store, minute) == (6, {"eth_call": 6, "batch": 2})


async def test_a_cancelled_write_gives_usage_and_latency_back(
    impl: Impl, store_url: str, tmp_path: Path
) -> None:
    minute = int(time.time() // 60)
    async with writer_on(impl, store_url, tmp_path) as (writer, flaky, meter, latency):
        traffic(meter, latency, minute)
        flaky.hang = True
        with trio.move_on_after(0.1) as waited:
            await writer.flush()
        assert waited.cancelled_caught and writer.failures == 0
        flaky.hang = False
        await writer.flush()
        assert await written(flaky.store, minute) == (3, {"eth_call": 3, "batch": 1})


async def test_the_writer_prunes_the_latency_it_writes(
    impl: Impl, store_url: str, tmp_path: Path
) -> None:
    now = int(time.time() // 60)
    async with writer_on(impl, store_url, tmp_path) as (writer, flaky, meter, latency):
        for minute in (now - 3 * 1440, now - 10):
            latency.observe("acct_1", "eth/main", "eth_call", minute, 0.001)
        await writer.flush()
        await writer.prune()
        minutes = await flaky.store.usage_latency("acct_1", "minute", 0, now + 1)
        assert [r.period for r in minutes] == [now - 10]  # the 3-day-old minute is gone
        days = await flaky.store.usage_latency("acct_1", "day", 0, now + 1)
        assert sum(sum(r.counts) for r in days) == 2  # days are kept


async def test_the_writer_prunes_after_its_first_flush(
    impl: Impl, store_url: str, tmp_path: Path
) -> None:
    now = int(time.time() // 60)
    async with writer_on(impl, store_url, tmp_path) as (writer, flaky, meter, latency):
        old = LatencyDelta("acct_1", "eth/main", "eth_call", now - 3 * 1440, (1,) + (0,) * 15)
        await flaky.store.add_usage([], [old])
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run, 0.05)
            with trio.fail_after(5):
                while await flaky.store.usage_latency("acct_1", "minute", 0, now + 1):
                    await trio.sleep(0.02)
            nursery.cancel_scope.cancel()

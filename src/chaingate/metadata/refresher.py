"""The background queue of metadata documents: claim what is due, fetch, record, retry.

The store is the queue.  A row is due when its ``next_retry_at`` has passed; the scanner claims
due rows (clients' first) as workers free up, each under a lease, and hands them to
``concurrency`` workers.  A worker's fetch either returns the new data (``ok``) or raises
``Unavailable``: the row then keeps whatever data it had (``stale``) or becomes ``failed``, with
``last_error`` and the next attempt from the retry schedule (``next_retry_at``).  After
``max_attempts`` automatic attempts nothing is scheduled; the service makes the row due again
when a client asks for it — a failure is retried, never remembered as final.

Requests wake the scanner (``poke``) instead of waiting for its next round, and can wait
(``wait_for``) until their keys have been attempted.  Restart-safe: a row claimed by a process
that died is due again when its lease ends.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence

import msgspec
import trio

from chaingate.metadata.store import MetaRows, NftRow
from chaingate.store import StoreError

log = logging.getLogger("chaingate.metadata")

Key = tuple[str, str]  # (contract, token id hex or '' for the contract's document)
LEASE_SECONDS = 300.0
# One fetch (URI call, every gateway, parsing) must end well inside its lease.
JOB_TIMEOUT = 120.0


class Unavailable(Exception):
    """No document this time; the message becomes ``last_error``."""


def next_retry_at(
    attempts: int, now_ms: int, schedule: Sequence[float], max_attempts: int
) -> int | None:
    """When attempt ``attempts + 1`` is due after ``attempts`` failures (None: no more
    automatic attempts).  The schedule's last delay repeats."""
    if attempts >= max_attempts or not schedule:
        return None
    delay = schedule[min(max(attempts, 1), len(schedule)) - 1]
    return now_ms + round(delay * 1000)


def failed_row(
    row: NftRow, error: str, now_ms: int, schedule: Sequence[float], max_attempts: int
) -> NftRow:
    attempts = row.attempts + 1
    return msgspec.structs.replace(
        row,
        status="stale" if row.fetched_at is not None else "failed",
        last_error=error[:1000],
        attempts=attempts,
        next_retry_at=next_retry_at(attempts, now_ms, schedule, max_attempts),
        priority=0,
        updated_at=now_ms,
    )


def done_row(fetched: NftRow, now_ms: int) -> NftRow:
    return msgspec.structs.replace(
        fetched,
        status="ok",
        last_error=None,
        attempts=0,
        fetched_at=now_ms,
        next_retry_at=None,
        priority=0,
        updated_at=now_ms,
    )


Fetch = Callable[[NftRow], Awaitable[NftRow]]


class Refresher:
    def __init__(
        self,
        store: MetaRows,
        chain: str,
        network: str,
        fetch: Fetch,
        *,
        concurrency: int,
        schedule: Sequence[float],
        max_attempts: int,
        scan_interval: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.chain = chain
        self.network = network
        self._fetch = fetch
        self.concurrency = concurrency
        self.schedule = list(schedule)
        self.max_attempts = max_attempts
        self.scan_interval = scan_interval
        self._clock = clock
        self._wake = trio.Event()
        self._busy: set[Key] = set()
        self._done: dict[Key, trio.Event] = {}
        self.fetched = 0  # successful fetches (tests and metrics read these)
        self.failures = 0

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    @property
    def in_flight(self) -> int:
        return len(self._busy)

    def poke(self) -> None:
        """Something became due: scan now rather than at the next round."""
        self._wake.set()

    def watch(self, keys: Sequence[Key]) -> list[trio.Event]:
        """Events set when each key's next attempt ends.  Watch *before* reading the rows, so
        an attempt that ends in between is not missed."""
        return [self._done.setdefault(key, trio.Event()) for key in keys]

    @staticmethod
    async def wait(events: Sequence[trio.Event], seconds: float) -> None:
        with trio.move_on_after(seconds):
            for event in events:
                await event.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        send, receive = trio.open_memory_channel[NftRow](0)
        async with trio.open_nursery() as nursery, send, receive:
            for _ in range(self.concurrency):
                nursery.start_soon(self._worker, receive.clone())
            task_status.started()
            await self._scan(send)

    async def _scan(self, send: trio.MemorySendChannel[NftRow]) -> None:
        while True:
            self._wake = trio.Event()
            free = self.concurrency - len(self._busy)
            rows: list[NftRow] = []
            if free > 0:
                now = self.now_ms()
                try:
                    rows = await self.store.claim_nft_rows(
                        self.chain,
                        self.network,
                        now,
                        now + round(LEASE_SECONDS * 1000),
                        free,
                        frozenset(self._busy),
                    )
                except StoreError as exc:
                    log.warning("metadata queue unreadable", extra={"fields": {"error": str(exc)}})
            for row in rows:
                self._busy.add((row.contract, row.token_id))
                await send.send(row)
            if rows and len(rows) == free:
                continue  # maybe more due: claim again once a worker frees up (it pokes)
            self._prune_watches()
            with trio.move_on_after(self.scan_interval):
                await self._wake.wait()

    def _prune_watches(self) -> None:
        # Keys watched but found fetched already leave events nobody waits on.
        if len(self._done) > 1000:
            for key, event in list(self._done.items()):
                if event.statistics().tasks_waiting == 0:
                    del self._done[key]

    async def _worker(self, rows: trio.MemoryReceiveChannel[NftRow]) -> None:
        async with rows:
            async for row in rows:
                key = (row.contract, row.token_id)
                try:
                    await self._attempt(row)
                finally:
                    self._busy.discard(key)
                    event = self._done.pop(key, None)
                    if event is not None:
                        event.set()
                    self.poke()

    async def _attempt(self, row: NftRow) -> None:
        outcome: NftRow | None = None
        error = f"no answer within {JOB_TIMEOUT:g} s"
        with trio.move_on_after(JOB_TIMEOUT):
            try:
                outcome = done_row(await self._fetch(row), self.now_ms())
            except Unavailable as exc:
                error = str(exc) or type(exc).__name__
            except Exception as exc:  # a bug must cost one row, not the worker
                log.exception("metadata fetch failed", extra={"fields": {"contract": row.contract}})
                error = f"internal error: {type(exc).__name__}"
        if outcome is None:
            self.failures += 1
            outcome = failed_row(row, error, self.now_ms(), self.schedule, self.max_attempts)
        else:
            self.fetched += 1
        try:
            await self.store.save_nft_row(self.chain, self.network, outcome, row.updated_at)
        except StoreError as exc:
            # The lease runs out and the row is claimed again: nothing is lost but time.
            log.warning("metadata not saved", extra={"fields": {"error": str(exc)}})

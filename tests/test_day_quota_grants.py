"""Day-quota grants (``chaingate.auth.dayquotas``) across restarts, crashes, Redis stalls and
starved processes, on real Redis.

Each "process" is what ``chaingate serve`` runs per worker: a ``KeyRegistry`` on one shared
store (SQLite here), its ``KeyGate`` (compiled or pure twins) and ``SharedLimits`` syncing with
Redis every 50 ms.  A process "crashes" when its sync loop is cancelled without the exit path
(Redis then sees what a killed process leaves behind).  A stall goes through a TCP proxy in
front of Redis that, when told, swallows Redis's replies (the commands still run).

Invariant checked after each story: the units Redis counts as granted are exactly the requests
admitted plus the units the live processes still hold unused.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import coredis
import pytest
import trio

from chaingate import twins as impl_module
from chaingate.auth import admin, dayquotas, shared
from chaingate.auth.dayquotas import utc_day
from chaingate.auth.keygate import KeyGate, KeyRegistry
from chaingate.auth.plans import Plans
from chaingate.auth.shared import SharedLimits
from chaingate.auth.store import AuthRows
from chaingate.store import Store, open_store

REDIS_URL = os.environ.get("CHAINGATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
PLANS = Plans.load(Path(__file__).resolve().parent.parent / "config" / "plans.toml")
PEPPER = b"p" * 32
SYNC = 0.05


class Process:
    """One worker's key registry, gate and shared limits, on the common store and Redis."""

    def __init__(self, store: Store, impl: impl_module.Impl, redis_url: str = REDIS_URL) -> None:
        self.registry = KeyRegistry(AuthRows(store), PLANS, PEPPER, impl.limiter)
        self.gate = KeyGate(self.registry, impl.limiter, impl.fastlane)
        self.shared = SharedLimits(redis_url, self.registry, interval=SYNC)
        self.gate.shared = self.registry.shared = self.shared
        self.admitted = 0
        self._scope: trio.CancelScope | None = None
        self._done = trio.Event()

    async def start(self, nursery: trio.Nursery, *, crash: bool = False) -> None:
        """Loads the keys and starts syncing; ``crash``: stopping skips the exit path."""
        await self.registry.load()
        self._scope = trio.CancelScope()
        nursery.start_soon(self._run, crash)

    async def _run(self, crash: bool) -> None:
        assert self._scope is not None
        with self._scope:
            try:
                await self._sync(crash)
            finally:
                self._done.set()

    async def _sync(self, crash: bool) -> None:
        if not crash:
            await self.shared.run()
            return
        client = coredis.Redis.from_url(REDIS_URL, decode_responses=False)
        async with client:
            await self.shared._loop(client)

    async def stop(self) -> None:
        """Stops syncing, and returns once the exit path (if any) is done."""
        assert self._scope is not None
        self._scope.cancel()
        await self._done.wait()

    def admit(self, key: str, n: int = 1) -> int:
        principal = self.registry.lookup(key.encode())
        assert principal is not None
        ok = sum(self.gate.admit(principal, True, False, 1, 1, 1) is None for _ in range(n))
        self.admitted += ok
        return ok

    def room(self, account_id: str) -> int:
        return int(self.registry.account_quota(account_id).room(utc_day(time.time())))


@asynccontextmanager
async def account_with_quota(
    tmp_path: Path, quota: int, rps: int = 0
) -> AsyncIterator[tuple[Store, str, str]]:
    """(store, account id, key) of a new account with ``quota`` requests a day (and ``rps``
    requests per second; 0: unlimited)."""
    async with open_store(f"sqlite:///{tmp_path}/grants.db", tmp_path) as store:
        await store.migrate()
        account = await admin.ensure_account(
            AuthRows(store), f"g-{secrets.token_hex(4)}@q", "enterprise"
        )
        limits = f'{{"requests_per_day": {quota}, "requests_per_second": {rps}}}'
        assert await AuthRows(store).set_plan(account.id, "enterprise", limits)
        key, _ = await admin.create_key(AuthRows(store), PEPPER, account.id, "k", "test")
        try:
            yield store, account.id, key
        finally:
            client = coredis.Redis.from_url(REDIS_URL, decode_responses=False)
            async with client:
                day = utc_day(time.time())
                await client.delete([b"cg:dq:%d:%s" % (day, account.id.encode())])
                await client.delete([b"cg:dq:%d:%s:h" % (day, account.id.encode())])


async def granted(account_id: str) -> int:
    client = coredis.Redis.from_url(REDIS_URL, decode_responses=False)
    async with client:
        raw = await client.get(b"cg:dq:%d:%s" % (utc_day(time.time()), account_id.encode()))
    return int(raw or 0)


async def admit_until(
    process: Process, key: str, want: int, seconds: float = 5.0, step: int = 1
) -> int:
    """Admits on ``process`` (syncing between tries) until ``want`` were admitted or time is up."""
    got = 0
    deadline = time.monotonic() + seconds
    while got < want and time.monotonic() < deadline:
        got += process.admit(key, min(step, want - got))
        await trio.sleep(SYNC / 2)
    return got


def assert_exact(processes: list[Process], account_id: str, total: int) -> None:
    held = sum(p.room(account_id) for p in processes if p.shared.quotas.holds(account_id))
    admitted = sum(p.admitted for p in processes)
    assert total == admitted + held, (total, admitted, held)


async def test_an_unused_account_is_not_granted_and_an_exit_gives_back(
    tmp_path: Path, impl: impl_module.Impl
) -> None:
    """Nothing is granted to an account no request used; a graceful exit gives back every
    unit held, so a restart costs the account nothing (quota 100: 3 served, then a fresh
    process can serve the other 97)."""
    async with (
        account_with_quota(tmp_path, 100) as (store, account_id, key),
        trio.open_nursery() as nursery,
    ):
        first = Process(store, impl)
        await first.start(nursery)
        await trio.sleep(SYNC * 4)
        assert await granted(account_id) == 0  # loaded, not used: not granted
        assert first.admit(key, 3) == 3
        await trio.sleep(SYNC * 4)
        assert await granted(account_id) > 3  # the first use got a grant
        await first.stop()
        assert await granted(account_id) == 3  # only what was served stays granted
        async with trio.open_nursery() as nursery:
            second = Process(store, impl)
            await second.start(nursery)
            assert await admit_until(second, key, 100, step=8) == 97
            assert second.admit(key) == 0
            await second.stop()


async def test_a_crashed_process_units_are_taken_back(
    tmp_path: Path, impl: impl_module.Impl
) -> None:
    """A process killed while holding units (no exit path): once its liveness mark expires,
    the next grant takes its unused units back, and the survivors serve the whole quota."""
    async with (
        account_with_quota(tmp_path, 60) as (store, account_id, key),
        trio.open_nursery() as nursery,
    ):
        crashed, survivor = Process(store, impl), Process(store, impl)
        await crashed.start(nursery, crash=True)
        await survivor.start(nursery)
        assert crashed.admit(key, 2) == 2
        await trio.sleep(SYNC * 4)
        held = crashed.room(account_id)
        assert held > 0
        await crashed.stop()
        await trio.sleep(dayquotas.LIVE_TTL + 0.2)
        assert await admit_until(survivor, key, 60, step=8) == 58
        assert survivor.admit(key) == 0
        print(f"\ncrash: {held} units held by the dead process taken back")
        assert_exact([survivor], account_id, await granted(account_id) - 2)
        await survivor.stop()


class ReplyEater:
    """A TCP proxy to Redis that, while ``eat`` is set, forwards commands but swallows the
    replies (the commands run; the client hears nothing: a stalled Redis)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.url = f"redis://127.0.0.1:{self.listener.getsockname()[1]}/0"
        self.eat = threading.Event()
        self._stop = threading.Event()
        self._sockets: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn = self.listener.accept()[0]
            except TimeoutError:
                continue
            upstream = socket.create_connection(("127.0.0.1", 6379))
            self._sockets += [conn, upstream]
            for src, dst, replies in ((conn, upstream, False), (upstream, conn, True)):
                threading.Thread(target=self._pump, args=(src, dst, replies), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        try:
            while data := src.recv(65536):
                if not (replies and self.eat.is_set()):
                    dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                s.close()

    def reset(self) -> None:
        """Closes every connection (the clients reconnect, with no stale reply in flight)."""
        for s in self._sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._sockets.clear()

    def close(self) -> None:
        self._stop.set()
        self.reset()
        self._thread.join()
        self.listener.close()


async def end_stall(eater: ReplyEater, process: Process, key: str) -> None:
    """Redis answers ``process`` again: once its sync is back, one more request, and a few
    syncs for what it admitted meanwhile to be charged."""
    eater.eat.clear()
    eater.reset()
    while not process.shared.up:
        await trio.sleep(SYNC)
    process.admit(key)
    await trio.sleep(SYNC * 6)


@pytest.fixture
def eater() -> Iterator[ReplyEater]:
    proxy = ReplyEater()
    yield proxy
    proxy.close()


async def test_a_redis_stall_does_not_reopen_an_exhausted_quota(
    tmp_path: Path, impl: impl_module.Impl, eater: ReplyEater
) -> None:
    """Quota 40 used up by two processes; Redis then stalls for one of them (its replies
    lost, the grants in them included): released to its own view, it admits nothing, since
    every unit was granted.  Back on Redis, the units its lost replies granted come back and
    the accounting is exact again."""
    async with (
        account_with_quota(tmp_path, 40) as (store, account_id, key),
        trio.open_nursery() as nursery,
    ):
        stalled, other = Process(store, impl, eater.url), Process(store, impl)
        await stalled.start(nursery)
        await other.start(nursery)
        assert await admit_until(stalled, key, 15, step=4) == 15
        assert await admit_until(other, key, 40, step=4) < 40
        # Exhausted: every unit granted (the last ones may sit with ``stalled``).
        await admit_until(stalled, key, 40, seconds=1.0, step=4)
        assert stalled.admit(key) == other.admit(key) == 0
        assert stalled.admitted + other.admitted == 40
        await trio.sleep(SYNC * 4)  # a refused request keeps ``stalled`` asking
        eater.eat.set()
        failures = stalled.shared.failures
        while stalled.shared.failures == failures:
            assert stalled.admit(key) == 0
            await trio.sleep(SYNC)
        assert not stalled.shared.quotas.holds(account_id)  # released: its own view
        assert stalled.admit(key, 50) == 0, "the stall reopened the quota"
        eater.eat.clear()
        eater.reset()
        while not stalled.shared.up:
            await trio.sleep(SYNC)
        assert stalled.admit(key, 5) == 0
        await trio.sleep(SYNC * 4)
        assert_exact([stalled, other], account_id, await granted(account_id))
        await stalled.stop()
        await other.stop()


async def test_admissions_during_a_stall_are_charged_and_lost_grants_come_back(
    tmp_path: Path, impl: impl_module.Impl, eater: ReplyEater
) -> None:
    """Quota 200, far from its end: a process whose Redis stalls keeps serving on its own
    view (fail-open) and, once Redis is back, what it served meanwhile is charged and the
    grants whose replies were lost come back: granted = admitted + held, exactly."""
    async with (
        account_with_quota(tmp_path, 200) as (store, account_id, key),
        trio.open_nursery() as nursery,
    ):
        stalled, other = Process(store, impl, eater.url), Process(store, impl)
        await stalled.start(nursery)
        await other.start(nursery)
        assert await admit_until(stalled, key, 10) == 10
        assert await admit_until(other, key, 10) == 10
        eater.eat.set()
        failures = stalled.shared.failures
        while stalled.shared.failures == failures:  # keeps asking: replies swallowed
            stalled.admit(key)
            await trio.sleep(SYNC)
        assert stalled.admit(key, 7) == 7  # fail-open: served on its own view
        await end_stall(eater, stalled, key)
        assert_exact([stalled, other], account_id, await granted(account_id))
        await stalled.stop()
        await other.stop()


async def test_an_ask_in_flight_leaves_the_account_admitting(
    tmp_path: Path, impl: impl_module.Impl, eater: ReplyEater
) -> None:
    """An account changes hands only with Redis's answer: while its first ask is in flight
    (here: a stalled Redis, up to the sync's timeout) it is admitted on the process's own
    view as before (was: refused — the account had been taken over before the ask was sent,
    and requests got "daily request quota exhausted" far from the quota's end).  The ask
    never answered is taken as never made; once Redis answers again, what was admitted
    meanwhile is charged: granted = admitted + held."""
    async with (
        account_with_quota(tmp_path, 500) as (store, account_id, key),
        trio.open_nursery() as nursery,
    ):
        process = Process(store, impl, eater.url)
        await process.start(nursery)
        await trio.sleep(SYNC * 4)  # connected, syncing, the account not yet used
        eater.eat.set()
        failures = process.shared.failures
        assert process.admit(key) == 1
        await trio.sleep(SYNC * 4)  # a sync has sent the account's first ask: no answer
        assert process.shared.failures == failures, "the stall outlasted the sync's timeout"
        assert not process.shared.quotas.holds(account_id)
        assert process.admit(key, 30) == 30, "refused while its first ask was in flight"
        while process.shared.failures == failures:
            await trio.sleep(SYNC)
        assert process.admit(key, 10) == 10  # released: its own view
        await end_stall(eater, process, key)
        assert process.shared.quotas.holds(account_id)
        assert_exact([process], account_id, await granted(account_id))
        await process.stop()


async def test_a_starved_process_keeps_asking_and_gets_the_idle_units(
    tmp_path: Path, impl: impl_module.Impl, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Quota 60: ``starved`` refuses while ``busy`` still uses its units, for longer than a
    key stays active without admissions and a starved mark lasts (both shortened here).
    Once ``busy`` goes idle, ``starved`` — still asked, still refusing — gets its spare
    units: refusals keep a process asking."""
    monkeypatch.setattr(shared, "ACTIVE_SECONDS", 0.3)
    monkeypatch.setattr(dayquotas, "STARVED_SECONDS", 0.5)
    async with (
        account_with_quota(tmp_path, 60) as (store, account_id, key),
        trio.open_nursery() as nursery,
    ):
        starved, busy = Process(store, impl), Process(store, impl)
        await starved.start(nursery)
        await busy.start(nursery)
        # ``busy`` admits every 0.1 s (in use: it keeps its units); ``starved`` takes
        # what it can, then is refused for 1.2 s.
        refused_since = None
        next_busy = 0.0
        while refused_since is None or time.monotonic() - refused_since < 1.2:
            if time.monotonic() >= next_busy:
                busy.admit(key)
                next_busy = time.monotonic() + 0.1
            if starved.admit(key, 4) == 0 and refused_since is None:
                refused_since = time.monotonic()
            await trio.sleep(SYNC / 2)
        spare = busy.room(account_id)
        assert spare > 0, "busy used everything: nothing left to move"
        got = 0
        end = time.monotonic() + 2.0
        while not got and time.monotonic() < end:
            got = starved.admit(key)
            await trio.sleep(0.1)
        print(f"\nstarved: got units back ({spare} spare on the idle process)")
        assert got, "the starved process never got the idle process's units"
        await starved.stop()
        await busy.stop()


async def test_a_first_look_charges_at_most_a_second_of_the_rate(
    tmp_path: Path, impl: impl_module.Impl
) -> None:
    """A key at 20 requests/s with a long history in Redis (5,000 requests), last used by
    another process just now: a fresh process's first look charges one second's worth of the
    rate, not the whole history (the debt floor: a second of refusals), so the key is served
    again within that second."""
    async with (
        account_with_quota(tmp_path, 0, rps=20) as (store, _account_id, key),
        trio.open_nursery() as nursery,
    ):
        fresh = Process(store, impl)
        await fresh.start(nursery)
        principal = fresh.registry.lookup(key.encode())
        assert principal is not None
        client = coredis.Redis.from_url(REDIS_URL, decode_responses=False)
        name = b"cg:rl:" + principal.key_id.encode()
        async with client:
            await client.hset(name, {b"r": 5000, b"c": 5000, b"t": int(time.time() * 1000)})
            try:
                assert fresh.admit(key) == 1
                await trio.sleep(SYNC * 3)  # the first look: charged
                admitted = 0
                end = time.monotonic() + 1.0
                while time.monotonic() < end:
                    admitted += fresh.admit(key)
                    await trio.sleep(0.02)
            finally:
                await client.delete([name])
        print(f"\nfirst look: {admitted} admitted in the second after it")
        assert admitted >= 10, "the first look charged the key's whole history"
        await fresh.stop()

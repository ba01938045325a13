"""Leadership on real PostgreSQL: roles split between sessions, handed over when one dies,
stopped at once when the lock's connection is lost, taken from a leader silent past its lease
(which then writes nothing); one process on SQLite leads everything."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
import trio

from chaingate.cluster.leases import LocalLeadership, PgLeadership
from chaingate.cluster.roles import LOCK_CLASS, MEMBER_ROLE, RoleKey, lock_key, role_keys
from chaingate.config.leases import MIN_LEADER_TIMEOUT, min_lease_timeout
from chaingate.store import Store, open_store
from chaingate.store.base import StoreError
from chaingate.store.guard import Deposed
from tests.conftest import pg_schema

KEYS = role_keys(["ethereum/devnet"], ("follower", "indexer", "webhooks", "bundler"))
TICK = 0.1


def _leadership(url: str) -> PgLeadership:
    leadership = PgLeadership(url, tick=TICK)
    for key in KEYS:
        leadership.register(key)
    return leadership


async def _until(condition: object, limit: float = 10.0) -> float:
    """Seconds until ``condition()`` holds (fails the test after ``limit``)."""
    start = time.monotonic()
    with trio.fail_after(limit):
        while not condition():  # type: ignore[operator]
            await trio.sleep(0.02)
    return time.monotonic() - start


class Runs:
    """What ``lead`` ran: per role, how many terms began, and how many run right now."""

    def __init__(self) -> None:
        self.started: Counter[RoleKey] = Counter()
        self.running: Counter[RoleKey] = Counter()
        self.overlaps = 0

    def work(self, key: RoleKey) -> object:
        async def run() -> None:
            self.started[key] += 1
            self.running[key] += 1
            if self.running[key] > 1:
                self.overlaps += 1
            try:
                await trio.sleep_forever()
            finally:
                self.running[key] -= 1

        return run


def test_local_leadership_leads_every_role() -> None:
    local = LocalLeadership()
    for key in KEYS:
        local.register(key)
    assert local.leads() == [k.label for k in KEYS]
    assert all(held for _, held in local.roles())


@pytest.mark.trio
async def test_two_sessions_split_the_roles_and_one_takes_all_when_the_other_dies() -> None:
    with pg_schema() as url:
        first, second = _leadership(url), _leadership(url)
        runs = Runs()
        async with trio.open_nursery() as nursery:
            await nursery.start(first.run)
            for key in KEYS:
                nursery.start_soon(first.lead, key, runs.work(key))
            await _until(lambda: len(first.leads()) == len(KEYS))

            second_scope = trio.CancelScope()

            async def run_second() -> None:
                with second_scope:
                    async with trio.open_nursery() as inner:
                        await inner.start(second.run)
                        for key in KEYS:
                            inner.start_soon(second.lead, key, runs.work(key))

            nursery.start_soon(run_second)
            await _until(lambda: len(first.leads()) == 2 and len(second.leads()) == 2)
            assert set(first.leads()).isdisjoint(second.leads())
            assert first.members == 2

            # The second session ends (its process died): the first takes everything back.
            second_scope.cancel()
            took = await _until(lambda: len(first.leads()) == len(KEYS))
            assert took < 5.0
            await trio.sleep(0.2)
            assert runs.overlaps == 0
            assert all(runs.running[key] == 1 for key in KEYS)
            nursery.cancel_scope.cancel()


@pytest.mark.trio
async def test_a_lost_connection_stops_every_role_at_once_and_they_are_taken_again() -> None:
    with pg_schema() as url:
        leadership = _leadership(url)
        runs = Runs()
        async with trio.open_nursery() as nursery:
            await nursery.start(leadership.run)
            for key in KEYS:
                nursery.start_soon(leadership.lead, key, runs.work(key))
            await _until(lambda: len(leadership.leads()) == len(KEYS))
            with psycopg.connect(url, autocommit=True) as admin:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE application_name LIKE 'chaingate-leases/%' AND pid <> pg_backend_pid()"
                    " AND datname = current_database()"
                )
            await _until(lambda: leadership.stats["lost"] >= 1)
            await _until(lambda: len(leadership.leads()) == len(KEYS))
            assert all(runs.started[key] == 2 for key in KEYS)
            assert runs.overlaps == 0
            nursery.cancel_scope.cancel()


def _lock_held(url: str, leadership: PgLeadership, key: RoleKey) -> bool:
    with psycopg.connect(url, autocommit=True) as admin:
        row = admin.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
            " WHERE d.datname = current_database() AND l.locktype = 'advisory'"
            " AND l.classid = %s AND l.objid::bigint = %s AND l.objsubid = 2 AND l.granted",
            (LOCK_CLASS, leadership._lock_of(key)),
        ).fetchone()
    return bool(row and row[0])


@pytest.mark.trio
async def test_shutdown_keeps_the_lock_until_a_write_on_its_way_ends_then_allows_none() -> None:
    """The follower's saves run under ``writing``: at shutdown the lock (so the role) is not
    freed under one on its way, and none starts once it is."""
    follower = next(k for k in KEYS if k.role == "follower")
    with pg_schema() as url:
        leadership = _leadership(url)
        async with trio.open_nursery() as nursery:
            run_scope = trio.CancelScope()

            async def run(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
                with run_scope:
                    await leadership.run(task_status=task_status)

            await nursery.start(run)
            await _until(lambda: leadership.holds(follower))
            writing, release = trio.Event(), trio.Event()

            async def save() -> None:
                with leadership.writing(follower) as leads:
                    assert leads
                    writing.set()
                    await release.wait()

            nursery.start_soon(save)
            await writing.wait()
            run_scope.cancel()  # the process shuts down
            await trio.sleep(0.5)
            assert _lock_held(url, leadership, follower)  # not freed under the save
            release.set()
            await _until(lambda: not _lock_held(url, leadership, follower), limit=5)
            with leadership.writing(follower) as leads:
                assert not leads  # no save starts once the session is closed


@pytest.mark.trio
async def test_a_connect_that_fails_leaves_no_session_behind_to_count_as_a_member() -> None:
    """The member lock cannot be had (held exclusively here): the connect times out.  Its
    session is closed, not left waiting for the member lock (which it would take as a
    phantom member, skewing every process's share, once free)."""
    with pg_schema() as url, psycopg.connect(url, autocommit=True) as blocker:
        row = blocker.execute("SELECT current_schema()").fetchone()
        assert row is not None
        member = (LOCK_CLASS, lock_key(MEMBER_ROLE, str(row[0])))
        blocker.execute("SELECT pg_advisory_lock(%s, %s)", member)

        def waiting() -> int:
            found = blocker.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s"
                " AND objid::bigint = %s AND objsubid = 2 AND NOT granted",
                member,
            ).fetchone()
            return int(found[0]) if found else 0

        leadership = _leadership(url)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(leadership.run)
            await _until(lambda: leadership.stats["connects"] >= 2, limit=15)
            await trio.sleep(1.0)  # the second attempt waits for the lock by now
            assert waiting() == 1  # only the second attempt's session
            blocker.execute("SELECT pg_advisory_unlock(%s, %s)", member)
            await _until(lambda: leadership.connected, limit=15)
            await trio.sleep(5 * TICK)
            assert leadership.members == 1
            nursery.cancel_scope.cancel()


@pytest.mark.trio
async def test_work_slow_to_stop_keeps_its_lock_while_the_ticks_go_on() -> None:
    """A handover waits a bounded time for the role's work to stop; work still busy keeps
    the lock (never an overlap) while the leadership keeps looking, and is unlocked once it
    stops."""
    with pg_schema() as url:
        leadership = PgLeadership(url, tick=TICK, handover_wait=0.3)
        for key in KEYS:
            leadership.register(key)
        release = trio.Event()

        async def stubborn() -> None:
            try:
                await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True):
                    await release.wait()  # e.g. a shielded commit

        async with trio.open_nursery() as nursery:
            await nursery.start(leadership.run)
            for key in KEYS:
                nursery.start_soon(leadership.lead, key, stubborn)
            await _until(lambda: len(leadership.leads()) == len(KEYS))
            with psycopg.connect(url, autocommit=True) as other:
                # A second member: this process is now above its share and hands over.
                other.execute(
                    "SELECT pg_advisory_lock_shared(%s, %s)", (LOCK_CLASS, leadership._member_key)
                )
                await _until(lambda: leadership.stats["handovers_delayed"] >= 1)
                looks = leadership.stats["looks"]
                await trio.sleep(10 * TICK)
                assert leadership.stats["looks"] >= looks + 3  # the ticks go on
                given_up = [k for k in KEYS if not leadership.holds(k)]
                assert given_up and all(_lock_held(url, leadership, k) for k in given_up)
                assert leadership.stats["handed_over"] == 0
                release.set()
                await _until(lambda: leadership.stats["handed_over"] >= 1)
                await _until(lambda: not _lock_held(url, leadership, given_up[0]))
                nursery.cancel_scope.cancel()


LEASE = min_lease_timeout(TICK)  # seconds: the shortest lease, so the test is short


def test_a_lease_outlasts_a_slow_look_and_two_ticks() -> None:
    """A look may take QUERY_TIMEOUT before its process counts its connection lost: a lease
    shorter than that and two ticks would depose a process that is only slow."""
    with pytest.raises(ValueError, match="shorter than"):
        PgLeadership("postgresql://unused", tick=0.5, lease_timeout=3.0)
    PgLeadership("postgresql://unused", tick=0.5, lease_timeout=MIN_LEADER_TIMEOUT)


class Writer:
    """A role's work that writes a row every few milliseconds, as a single writer does, and
    counts the writes refused."""

    def __init__(self, store: Store, name: str) -> None:
        self.store = store
        self.name = name
        self.refused = 0

    async def run(self) -> None:
        def insert(tx: object) -> None:
            tx.execute(  # type: ignore[attr-defined]
                "INSERT INTO stall_writes (writer, at) VALUES (?, clock_timestamp())",
                (self.name,),
            )

        while True:
            try:
                await self.store.run_transaction(insert)
            except Deposed:
                self.refused += 1
            except StoreError:
                pass  # its sessions were ended: a new one next time
            await trio.sleep(0.01)


async def test_a_leader_silent_past_its_lease_is_deposed_and_writes_nothing_more(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leader's renewals stall (its looks wait, their timeouts too, as in a stopped
    process) while its role's work goes on writing.  The
    other session ends its sessions once it is silent past the lease and takes the role; no
    row of the stalled leader is written after the new leader's first; when its renewals
    resume it learns it lost everything, connects again, and leads again once the other
    is gone."""
    role = RoleKey("webhooks", "ethereum", "devnet")
    with pg_schema() as url:
        async with open_store(url, tmp_path) as setup:  # type: ignore[arg-type]
            await setup.migrate()

            def table(tx: object) -> None:
                tx.execute("CREATE TABLE stall_writes (writer TEXT, at TIMESTAMPTZ)")  # type: ignore[attr-defined]

            await setup.run_transaction(table)
        async with (
            open_store(url, tmp_path) as first_store,  # type: ignore[arg-type]
            open_store(url, tmp_path) as second_store,  # type: ignore[arg-type]
            trio.open_nursery() as nursery,
        ):
            # Each leadership names its process's store sessions (ended with its lease's).
            stalled = PgLeadership(
                url, tick=TICK, lease_timeout=LEASE, session_tag=first_store.session_tag
            )
            other = PgLeadership(
                url, tick=TICK, lease_timeout=LEASE, session_tag=second_store.session_tag
            )
            first, second = Writer(first_store, "stalled"), Writer(second_store, "other")
            stalled.register(role)
            other.register(role)
            await nursery.start(stalled.run)
            nursery.start_soon(stalled.lead, role, first.run)
            await _until(lambda: stalled.holds(role))
            other_scope = trio.CancelScope()

            async def run_other() -> None:
                with other_scope:
                    async with trio.open_nursery() as inner:
                        await inner.start(other.run)
                        inner.start_soon(other.lead, role, second.run)

            nursery.start_soon(run_other)
            await _until(lambda: other.members == 2)
            assert stalled.holds(role) and not other.holds(role)

            resumed = trio.Event()
            look = stalled._call

            async def stopped(fn: Callable[[], Any]) -> Any:
                with trio.CancelScope(shield=True):  # stopped: not even its timeouts run
                    await resumed.wait()
                return await look(fn)

            monkeypatch.setattr(stalled, "_call", stopped)  # its renewals stall from here on
            try:
                stalled_at = time.monotonic()
                took = await _until(lambda: other.holds(role), limit=LEASE + 5)
                # Silent past the lease, then a tick or two.
                assert took <= LEASE + 1.0, took
                assert other.stats["deposed"] >= 1
                await _until(lambda: first.refused >= 3)  # it went on trying, refused
                assert not stalled.holds(role)  # its lease lapsed by its own clock
                assert time.monotonic() - stalled_at < LEASE + 5
            finally:
                resumed.set()
            # Renewals resume: the next look finds its session ended; every role stops.
            await _until(lambda: stalled.stats["lost"] >= 1)
            await _until(lambda: stalled.connected)  # a member again: a candidate
            await _until(lambda: other.members == 2)
            assert other.holds(role) and not stalled.holds(role)

            def rows(tx: object) -> list[tuple[str, object]]:
                return tx.query("SELECT writer, at FROM stall_writes ORDER BY at")  # type: ignore[attr-defined,no-any-return]

            written = await second_store.run_transaction(rows, write=False)
            first_other = next(at for writer, at in written if writer == "other")
            late = [at for writer, at in written if writer == "stalled" and at >= first_other]
            assert late == []  # nothing of the old leader's after the new one's first write

            other_scope.cancel()  # the other process goes: the stalled one leads again
            await _until(lambda: stalled.holds(role))
            nursery.cancel_scope.cancel()

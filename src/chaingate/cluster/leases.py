"""Who leads each role: PostgreSQL session-level advisory locks, or this process alone.

``PgLeadership`` keeps one session of its own (``chaingate.store.locksession``: never the
store's pool, since a session lock lives and dies with its session). Every tick it asks
PostgreSQL, in one query, how many chaingate processes share the database (each holds the
member lock shared), which role locks anyone holds, and which this session holds; then it
takes or hands over roles by the fair share (``roles.decide``). A query that fails or hangs
means the connection is lost: every role's work is cancelled at once and the locks are taken
again once connected — PostgreSQL frees a dead session's locks itself, which is also how a
``kill -9``'d leader's roles come free.

Work runs through ``lead(key, work)``: started when the role is granted, cancelled when it is
lost or handed over; a handover waits for the work to stop before it unlocks, so two
processes never run one role's writer at once.

**A lease, renewed by every look.**  A session lock outlives a process that stopped without
dying (SIGSTOP, a hung event loop): its session stays open, and its roles would be held for
ever.  So each look is also a renewal: PostgreSQL records when each session's last query
ended (``pg_stat_activity.state_change``, the server's clock — no clock of ours compared with
another's).  A chaingate session silent past ``lease_timeout`` (``server.leader_timeout``,
5 s; at least ``min_lease_timeout``, ``chaingate.config.leases``) is deposed by whichever
other process looks next: it ends that session and every other
session of that process (``pg_terminate_backend``: they are named ``…/<session tag>``, so a
transaction the stalled process left open does not hold its row locks meanwhile); the locks
come free, and the fair share hands them out within a tick or two.  The stalled process
holds its lease only ``lease_timeout`` minus a margin after its last answered query was sent,
by its own monotonic clock (which runs on through a stop): after that, ``holds`` is False and
every write its role work makes is refused (``chaingate.store.guard``, checked before a
transaction begins and again before it commits) — so when it resumes it writes nothing
under its old leadership, whichever of its tasks runs first; its next look fails (its
session was ended), every role stops, and it connects again as a member, a candidate like
any other.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Protocol, TypeVar

import trio

from chaingate.cluster.roles import LOCK_CLASS, MEMBER_ROLE, RoleKey, decide, lock_key
from chaingate.config.leases import QUERY_TIMEOUT, TICK, min_lease_timeout
from chaingate.store.guard import guarded
from chaingate.store.locksession import LockSession, NotPermitted, SessionLost
from chaingate.store.postgres import APPLICATION

log = logging.getLogger("chaingate.cluster")

T = TypeVar("T")

RECONNECT_BACKOFF = (0.2, 0.5, 1.0, 2.0)
# How long a handover waits for the role's work to stop before it keeps the lock for now
# (work that is slow to honour cancellation, e.g. a shielded commit) and ticks on.
HANDOVER_WAIT = 2 * QUERY_TIMEOUT
SHUTDOWN_GRACE = 0.2  # seconds for the roles' last writes to start as the process stops
WORK_RETRY = 1.0  # seconds before work that crashed runs again (the role stays held)
# A process whose lease connection is silent this long is deposed (``server.leader_timeout``).
LEASE_TIMEOUT = 5.0
# The lease connection's application_name, before ``/<session tag>``.
LEASES_APPLICATION = "chaingate-leases"

Work = Callable[[], Awaitable[object]]


class Leadership(Protocol):
    # Whether other processes may lead these roles (then writers fence what they write).
    shared: bool
    # Looks, roles taken and handed over, connections lost, processes deposed.
    stats: Counter[str]

    def register(self, key: RoleKey) -> None: ...

    def holds(self, key: RoleKey) -> bool: ...

    def writing(self, key: RoleKey) -> contextlib.AbstractContextManager[bool]: ...

    def leads(self) -> list[str]: ...

    def roles(self) -> list[tuple[RoleKey, bool]]: ...

    def hold_first_grant(self, until: trio.Event) -> None: ...

    async def lead(self, key: RoleKey, work: Work) -> None: ...

    async def run(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None: ...


class _Role:
    def __init__(self, key: RoleKey) -> None:
        self.key = key
        self.held = False
        # Whether this process's session holds the role's lock (from taking it until it is
        # unlocked or the session ends): a handover stops the work (``held`` False) before
        # it unlocks, and the work's last writes may still be made meanwhile.
        self.locked = False
        self.granted = trio.Event()
        # The role's work now running (a role may have several, e.g. the bundler's loop
        # and its receipt tracker), and an event set whenever none runs.
        self.scopes: set[trio.CancelScope] = set()
        # Writes made under ``writing`` now on their way (the follower's saves).
        self.writes = 0
        self.idle = trio.Event()
        self.idle.set()

    def busy(self) -> None:
        if self.idle.is_set():
            self.idle = trio.Event()

    def done(self) -> None:
        if not self.scopes and not self.writes:
            self.idle.set()

    def grant(self) -> None:
        self.held = True
        self.granted.set()

    def revoke(self) -> None:
        """Not ours any more: the work stops at its next checkpoint."""
        self.held = False
        if self.granted.is_set():  # an unset one may have a waiter: it stays
            self.granted = trio.Event()
        for scope in self.scopes:
            scope.cancel()


class _Roles:
    """The registered roles and the ``lead`` loop both kinds of leadership share."""

    shared = False

    def __init__(self) -> None:
        self._roles: dict[RoleKey, _Role] = {}
        # Set by ``hold_first_grant``: no role is taken before it is set.
        self._hold: trio.Event | None = None
        self.stats: Counter[str] = Counter()

    def hold_first_grant(self, until: trio.Event) -> None:
        """Take no role until ``until`` is set (call before ``run``): a leadership lock won
        late, for tests of what a late first term must still see."""
        self._hold = until

    def _held_back(self) -> bool:
        return self._hold is not None and not self._hold.is_set()

    def register(self, key: RoleKey) -> None:
        if key not in self._roles:
            self._roles[key] = _Role(key)

    def holds(self, key: RoleKey) -> bool:
        role = self._roles.get(key)
        return role is not None and role.held

    @contextlib.contextmanager
    def writing(self, key: RoleKey) -> Iterator[bool]:
        """Whether ``key`` is held here (write only if so); until the block ends the role
        counts as busy, so it is not handed over, nor its lock freed at shutdown, under a
        write on its way."""
        role = self._roles.get(key)
        if role is None or not self.holds(key):
            yield False
            return
        role.busy()
        role.writes += 1
        try:
            yield True
        finally:
            role.writes -= 1
            role.done()

    def leads(self) -> list[str]:
        return [r.key.label for r in self._roles.values() if r.held]

    def roles(self) -> list[tuple[RoleKey, bool]]:
        return [(r.key, r.held) for r in self._roles.values()]

    async def lead(self, key: RoleKey, work: Work) -> None:
        """Run ``work`` whenever ``key`` is held here; until cancelled."""
        self.register(key)
        role = self._roles[key]
        while True:
            await role.granted.wait()
            if not role.held:  # revoked before this task woke up
                continue
            role.busy()
            scope = trio.CancelScope()
            role.scopes.add(scope)
            try:
                with scope, self._guard(role):
                    log.info("leading", extra={"fields": {"role": key.label}})
                    try:
                        await work()
                    except Exception:
                        log.exception("role work crashed", extra={"fields": {"role": key.label}})
                    # Work runs until cancelled; one that ended is started again, not at once.
                    await trio.sleep(WORK_RETRY)
            finally:
                role.scopes.discard(scope)
                role.done()
            if not role.held:
                log.info("no longer leading", extra={"fields": {"role": key.label}})

    def _guard(self, role: _Role) -> contextlib.AbstractContextManager[None]:
        """What the role's work writes under (nothing to check: one process)."""
        del role
        return contextlib.nullcontext()


class LocalLeadership(_Roles):
    """One process (SQLite): every role is led here, from the start."""

    def register(self, key: RoleKey) -> None:
        super().register(key)
        if not self._held_back():
            self._roles[key].grant()

    def hold_first_grant(self, until: trio.Event) -> None:
        super().hold_first_grant(until)
        for role in self._roles.values():
            role.revoke()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        if self._hold is not None:
            await self._hold.wait()
            for role in self._roles.values():
                role.grant()


class PgLeadership(_Roles):
    shared = True

    def __init__(
        self,
        url: str,
        *,
        tick: float = TICK,
        handover_wait: float = HANDOVER_WAIT,
        lease_timeout: float = LEASE_TIMEOUT,
        session_tag: str = "",
    ) -> None:
        """``session_tag``: what this process's store sessions are named by (ended with the
        lease's own when the process is deposed)."""
        super().__init__()
        shortest = min_lease_timeout(tick)
        if not lease_timeout >= shortest:
            raise ValueError(f"a lease of {lease_timeout}s is shorter than {shortest}s")
        self._url = url
        self.tick = tick
        # A handover's wait is a tick without a look: short beside the lease, which the
        # looks renew (work slower to stop keeps its lock until a later tick).
        self.handover_wait = min(handover_wait, lease_timeout / 4)
        self.lease_timeout = lease_timeout
        # The lease is ours this long after a look was sent (by our monotonic clock): less
        # than the silence after which another process deposes us.
        self._lease = lease_timeout - min(1.0, lease_timeout / 5)
        self._renewed = -float("inf")
        self.session_tag = session_tag or secrets.token_hex(4)
        # Roles given up whose work had not stopped within ``handover_wait``: their locks
        # are kept (no overlap) and freed on a later tick, once the work has stopped.
        self._handing: set[RoleKey] = set()
        self._session: LockSession | None = None
        # One thread at a time on the session (a connection is not shared mid-query).
        self._limiter = trio.CapacityLimiter(1)
        self._free_ticks: Counter[RoleKey] = Counter()
        self._namespace = ""
        self._member_key = 0
        self._by_lock: dict[int, RoleKey] = {}
        self._members = 0
        self._stable = 0
        self.connected = False
        self._warned_privilege = False

    def register(self, key: RoleKey) -> None:
        super().register(key)
        self._by_lock[self._lock_of(key)] = key

    def holds(self, key: RoleKey) -> bool:
        return super().holds(key) and self._lease_held()

    def _lease_held(self) -> bool:
        return time.monotonic() - self._renewed < self._lease

    def _guard(self, role: _Role) -> contextlib.AbstractContextManager[None]:
        # Read on the store's worker threads: attributes only.
        return guarded(lambda: role.locked and self._lease_held())

    @property
    def members(self) -> int:
        """Processes sharing the roles, as of the last look (0 while disconnected)."""
        return self._members if self.connected else 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect (started once connected), then look and act every tick, until cancelled."""
        failures = 0
        try:
            while True:
                try:
                    await self._connect()
                except (SessionLost, OSError, trio.TooSlowError) as exc:
                    if failures == 0:
                        log.warning(
                            "leadership: cannot connect to PostgreSQL; retrying",
                            extra={"fields": {"error": str(exc)}},
                        )
                    await self._close()
                    await trio.sleep(RECONNECT_BACKOFF[min(failures, len(RECONNECT_BACKOFF) - 1)])
                    failures += 1
                    continue
                failures = 0
                task_status.started()
                task_status = trio.TASK_STATUS_IGNORED
                try:
                    while True:
                        await self._step()
                        await trio.sleep(self.tick)
                except (SessionLost, OSError, trio.TooSlowError) as exc:
                    self.stats["lost"] += 1
                    log.warning(
                        "leadership: connection lost; every role stops",
                        extra={"fields": {"error": str(exc), "leads": self.leads()}},
                    )
                    self._lose_all()
                    # A session that is only slow would keep its locks: end it.
                    await self._close()
        finally:
            # Stopping (the process shuts down): the roles' tasks unwind, and a follower's
            # last save starts as its task does (under ``writing``): a moment for those to
            # begin, then until every role's work and writes have ended.  Then every role is
            # given up, so no write starts any more, and the session closes, which frees the
            # locks: nothing of this process's is written after that.
            with trio.CancelScope(shield=True):
                with trio.move_on_after(QUERY_TIMEOUT):
                    await trio.sleep(SHUTDOWN_GRACE)
                    for role in self._roles.values():
                        await role.idle.wait()
                for role in self._roles.values():
                    role.revoke()
                await self._close()

    async def _connect(self) -> None:
        self.stats["connects"] += 1
        # A thread given up on (a hung query) keeps its limiter token: a new connection gets
        # a limiter of its own.
        self._limiter = trio.CapacityLimiter(1)

        def connect() -> LockSession:
            return LockSession.connect(
                self._url,
                application_name=f"{LEASES_APPLICATION}/{self.session_tag}",
                timeout=QUERY_TIMEOUT,
            )

        session = await self._call(connect)
        try:
            namespace = await self._call(session.schema)
            member = lock_key(MEMBER_ROLE, namespace)
            await self._call(lambda: session.lock_shared(LOCK_CLASS, member))
        except BaseException:
            # A session left behind might still take the member lock (a phantom member
            # that skews every process's share): its query cancelled (a backend waiting
            # for a lock does not notice its client left), then closed, never reused.
            await _close_session(session, cancel=True)
            raise
        # Only a session that holds the member lock is this process's.
        self._namespace = namespace
        self._member_key = member
        self._by_lock = {self._lock_of(key): key for key in self._roles}
        self._session = session
        self.connected = True

    async def _call(self, fn: Callable[[], T]) -> T:
        """``fn`` on a thread, given up after QUERY_TIMEOUT (then the connection is lost).
        One that answered renews the lease from when it was sent."""
        sent = time.monotonic()
        with trio.fail_after(QUERY_TIMEOUT):
            result = await trio.to_thread.run_sync(
                fn, abandon_on_cancel=True, limiter=self._limiter
            )
        self._renewed = max(self._renewed, sent)
        return result

    def _lock_of(self, key: RoleKey) -> int:
        return lock_key(key.label, self._namespace)

    async def _close(self) -> None:
        session, self._session = self._session, None
        self.connected = False
        self._handing.clear()  # closing the session frees every lock it holds
        for role in self._roles.values():
            role.locked = False
        if session is not None:
            await _close_session(session)

    def _lose_all(self) -> None:
        for role in self._roles.values():
            role.locked = False
            if role.held:
                role.revoke()
        self.connected = False
        self._members = 0

    async def _step(self) -> None:
        session = self._session
        if session is None:
            raise SessionLost("no session")

        look = await self._call(
            lambda: session.look(LOCK_CLASS, self._member_key, self.lease_timeout)
        )
        members, anywhere, ours, silent = (
            look.members,
            look.held_anywhere,
            look.held_here,
            look.silent,
        )
        self.stats["looks"] += 1
        if silent:
            await self._depose(session, silent)
        self._stable = self._stable + 1 if members == self._members else 0
        self._members = members
        held_here = {self._by_lock[n] for n in ours if n in self._by_lock}
        for key in sorted(self._handing, key=lambda k: k.label):
            if key not in held_here:
                self._handing.discard(key)
            elif self._roles[key].idle.is_set():  # its work stopped at last: unlock now
                self._handing.discard(key)
                await self._unlock(session, self._roles[key])
        for role in self._roles.values():
            # A lock this session no longer holds (unlocked behind our back): not ours.
            if role.held and role.key not in held_here:
                log.warning("leadership: lock gone", extra={"fields": {"role": role.key.label}})
                role.revoke()
        anywhere_set = {self._by_lock[n] for n in anywhere if n in self._by_lock}
        registered = list(self._roles)
        for key in registered:
            free = key not in anywhere_set
            self._free_ticks[key] = self._free_ticks[key] + 1 if free else 0
        mine = {key for key in registered if self._roles[key].held}
        decision = decide(registered, mine, anywhere_set, members, self._free_ticks, self._stable)
        for key in decision.release:
            await self._hand_over(session, self._roles[key])
        for key in [] if self._held_back() else decision.take:
            await self._try_take(session, self._roles[key])

    async def _try_take(self, session: LockSession, role: _Role) -> None:
        if await self._call(lambda: session.try_lock(LOCK_CLASS, self._lock_of(role.key))):
            self.stats["taken"] += 1
            self._free_ticks[role.key] = 0
            role.locked = True
            role.grant()

    async def _hand_over(self, session: LockSession, role: _Role) -> None:
        """Stop the role's work, then unlock: the next leader never overlaps this one.  Work
        that has not stopped within ``handover_wait`` keeps the lock, and the ticks go on
        (noticing a lost connection, other handovers); a later tick unlocks it."""
        role.revoke()
        with trio.move_on_after(self.handover_wait):
            await role.idle.wait()
        if not role.idle.is_set():
            self.stats["handovers_delayed"] += 1
            self._handing.add(role.key)
            log.warning(
                "leadership: the role's work has not stopped yet; its lock is kept for now",
                extra={"fields": {"role": role.key.label}},
            )
            return
        await self._unlock(session, role)

    async def _unlock(self, session: LockSession, role: _Role) -> None:
        role.locked = False  # from here on, none of its writes
        await self._call(lambda: session.unlock(LOCK_CLASS, self._lock_of(role.key)))
        self.stats["handed_over"] += 1
        self._stable = 0
        log.info("handed over", extra={"fields": {"role": role.key.label}})

    async def _depose(self, session: LockSession, silent: list[str]) -> None:
        """End the sessions of members silent past the lease, and their processes' others:
        their locks come free (taken from the next tick on)."""
        pids: list[int] = []
        names: list[str] = []
        for entry in silent:
            pid, _, name = entry.partition(" ")
            pids.append(int(pid))
            application, _, tag = name.partition("/")
            if application == LEASES_APPLICATION and tag:
                names.append(f"{APPLICATION}/{tag}")

        try:
            ended = await self._call(lambda: session.end_sessions(pids, names))
        except NotPermitted as exc:
            if not self._warned_privilege:
                self._warned_privilege = True
                log.error(
                    "leadership: a process is silent past its lease but its sessions cannot be"
                    " ended (pg_terminate_backend needs the same database user, or"
                    " pg_signal_backend); its roles stay with it",
                    extra={"fields": {"pids": pids, "error": str(exc)}},
                )
            return
        if ended == 0:
            return  # ended by an earlier look (or by another process) already
        self.stats["deposed"] += 1
        log.warning(
            "leadership: a process silent past its lease is deposed; its sessions are ended",
            extra={"fields": {"pids": pids, "lease_timeout": self.lease_timeout, "ended": ended}},
        )


async def _close_session(session: LockSession, *, cancel: bool = False) -> None:
    """Close ``session`` (its locks go with it), given up after twice QUERY_TIMEOUT."""
    with trio.CancelScope(shield=True), trio.move_on_after(2 * QUERY_TIMEOUT):
        await trio.to_thread.run_sync(
            lambda: session.close(cancel=cancel, timeout=QUERY_TIMEOUT), abandon_on_cancel=True
        )


def leadership_for(
    store_backend: str,
    url: str,
    keys: Sequence[RoleKey],
    *,
    lease_timeout: float = LEASE_TIMEOUT,
    session_tag: str = "",
) -> Leadership:
    """PostgreSQL's locks when the store is PostgreSQL, else every role led here."""
    leadership: Leadership = (
        PgLeadership(url, lease_timeout=lease_timeout, session_tag=session_tag)
        if store_backend == "postgres"
        else LocalLeadership()
    )
    for key in keys:
        leadership.register(key)
    return leadership
